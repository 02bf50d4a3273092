"""The sync-strategy registry: ``sync.strategy`` name -> :class:`Strategy`.

A sync strategy decides, before each inter-DC round, what every DC does in it: how
many local steps it runs (K_d), whether it takes part in the exchange, and how much
of the new global model it adopts afterwards. That per-DC data is a
:class:`RoundPlan`; the strategy computes it from a small JSON-serialisable
:class:`ScheduleState` (rounds done, K_base, the losses its rule needs) with pure
functions, in the style of optax. Each module of :mod:`hfl.sync.strategies`
registers its strategy when imported::

    registry.register(registry.Strategy(name='periodic', plan=plan))

and the package imports every module of its folder (:func:`hfl.plugins.import_modules`),
so a new strategy is one new file there: config validation (``sync.strategy``, the
strategy's own ``hyper`` fields and its ``check`` rules), the K schedule
(:mod:`hfl.sync.schedule`), the loop and the clock, and the registry-wide tests
(``tests/test_strategies.py``) all pick it up.

What the loop does with a plan, per round (:mod:`hfl.train`, :mod:`hfl.step`,
:mod:`hfl.cost`): DC d runs ``k_d[d]`` iterations (SPMD: ``max(k_d)`` iterations,
DC d masked after its ``k_d[d]``-th); the DCs with ``takes_part`` (and not out by
``sync.faults``) send their pseudo-gradients, aggregated with FedAvg weights
renormalised over them (:mod:`hfl.sync.aggregation`); the outer optimizer steps the
global model; then DC d's model becomes ``adopt[d] x_global' + (1 - adopt[d]) x_d``
(1: the new global model; 0: it keeps training its own). The clock charges each DC
its own timeline: a DC that neither takes part nor adopts anything does not wait
for the round (:func:`hfl.network.advance_round`).

This is the bottom layer of the strategies: numpy and the standard library only.
"""

from typing import Any, Callable, Mapping, NamedTuple, Optional

import numpy as np


class ScheduleState(NamedTuple):
  """State of a K schedule; plain Python values, JSON-serialisable.

  Attributes:
    round: number of rounds completed (losses passed to ``next_round``).
    k_base: current K_base (AdaComm: current tau), int in [1, K_max].
    history: finite train losses observed since ``k_base`` last changed
      (progress-aware only; at most ``progress_window + 1``, or ``2 *
      progress_window`` with ``progress_test='window_means'``, oldest first).
    loss0: AdaComm's F(x_0), the first finite train loss observed; None before.
  """
  round: int
  k_base: int
  history: tuple[float, ...]
  loss0: Optional[float]


class RoundPlan(NamedTuple):
  """What one inter-DC round runs, per DC.

  Attributes:
    k_d: int64 [D], intra-DC iterations (local steps) of each DC in the round (>= 1).
    k_base: the K_base the plan was derived from (int).
    takes_part: bool [D], the DCs that send their pseudo-gradient this round; None:
      every DC (``sync.faults`` may still leave some out).
    adopt: float32 [D] in [0, 1], how much of the new global model each DC takes:
      x_d <- adopt_d x_global' + (1 - adopt_d) x_d; None: 1 for every DC.
  """
  k_d: np.ndarray
  k_base: int
  takes_part: Optional[np.ndarray] = None
  adopt: Optional[np.ndarray] = None


class Settings(NamedTuple):
  """A schedule's validated settings (:func:`hfl.sync.schedule.make_schedule`).

  Attributes:
    strategy: the ``sync.strategy`` name.
    num_dcs: D.
    k0: the initial K_base (``sync.k``; 1 for 'sync').
    k_max: ``sync.k_max``.
    t: float [D] seconds per intra-DC iteration (strategies with ``needs_times``).
    c: float [D] seconds of inter-DC communication per round (``needs_times``).
    progress_aware, window, threshold, factor, progress_test: the progress-aware rule
      (``sync.progress_*``, :mod:`hfl.sync.schedule`).
    k_min_ratio: ``sync.k_min_ratio`` (semi_sync).
    k_cap: the bound of every K_d: k_max, or ``hfl.sync.schedule.K_CEILING`` with
      ``sync.k_max_scope='k_base'``.
    hyper: ``{field: value}`` of the strategy's own ``config.sync`` fields
      (:attr:`Strategy.hyper`).
  """
  strategy: str
  num_dcs: int
  k0: int
  k_max: int
  t: Optional[np.ndarray]
  c: Optional[np.ndarray]
  progress_aware: bool
  window: int
  threshold: float
  factor: float
  k_min_ratio: float = 0.0
  progress_test: str = 'endpoints'
  k_cap: int = 0
  hyper: Mapping[str, Any] = {}


class Strategy(NamedTuple):
  """One sync strategy: pure functions of :class:`Settings` and :class:`ScheduleState`.

  Attributes:
    name: the ``sync.strategy`` value that selects it.
    plan: ``(settings, state) -> RoundPlan`` for the round about to start (state.round
      rounds done). K_base is ``state.k_base``, which the schedule checks to lie in
      [1, k_max]; a plan's K_d must be >= 1.
    observe: ``(settings, state, loss) -> (k_base, history, loss0)`` after a round
      with a finite train loss ``loss``: the strategy's own K rule (AdaComm). None:
      K_base changes only by the progress-aware rule (``sync.progress_aware``).
    check: ``(config) -> None``: the strategy's config rules, raising ValueError that
      names the field, what was wrong and what is allowed. None: no rules.
    hyper: ``{field: default}``, the strategy's own ``config.sync`` fields (the default
      config carries them, ``settings.hyper`` holds their values); another strategy
      refuses a value other than the default ("has no effect").
    needs_times: the plan reads ``settings.t`` and ``settings.c`` (the network model's
      per-DC iteration and round times).
    progress_aware: ``sync.progress_aware`` is allowed.
    partial: plans may set ``takes_part`` or ``adopt`` (the step is then built to
      mix each DC's model with the global one, :func:`hfl.step.make_step`'s
      ``adoption``).

  The module that registers a strategy says in its docstring what it does and cites
  its source (paper, equation).
  """
  name: str
  plan: Callable[[Settings, ScheduleState], RoundPlan]
  observe: Optional[Callable[[Settings, ScheduleState, float], tuple]] = None
  check: Optional[Callable[[Any], None]] = None
  hyper: Mapping[str, Any] = {}
  needs_times: bool = False
  progress_aware: bool = True
  partial: bool = False


REGISTRY: dict[str, Strategy] = {}


def register(strategy: Strategy) -> Strategy:
  """Registers ``strategy`` under its name (overwrites an existing one).

  Raises:
    ValueError: the name is not a non-empty identifier, or a ``hyper`` field is
      another registered strategy's with another default.
  """
  if not isinstance(strategy.name, str) or not strategy.name.isidentifier():
    raise ValueError(f'register: a strategy name must be an identifier, got {strategy.name!r}')
  for field, default in strategy.hyper.items():
    for other in REGISTRY.values():
      if other.name != strategy.name and field in other.hyper and other.hyper[field] != default:
        raise ValueError(f'register({strategy.name!r}): sync.{field} is also '
                         f'{other.name!r}\'s, with default {other.hyper[field]!r}')
  REGISTRY[strategy.name] = strategy
  return strategy


def get(name: str) -> Strategy:
  """The registered strategy ``name``.

  Raises:
    ValueError: no strategy of that name (the message lists them).
  """
  if name not in REGISTRY:
    raise ValueError(f'sync.strategy must be one of {tuple(REGISTRY)}, got {name!r}.')
  return REGISTRY[name]


def hyper_defaults() -> dict:
  """``{field: default}`` of every registered strategy's own ``config.sync`` fields."""
  return {f: v for s in REGISTRY.values() for f, v in s.hyper.items()}


def round_masks(plan: RoundPlan, up: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """What a round's plan means for each DC, given the DCs ``up`` (bool [D],
  ``sync.faults``, :mod:`hfl.sync.faults`).

  Returns:
    ``(present, adopt, waits)``: bool [D], the DCs that exchange (up and taking
    part); float32 [D], each DC's adoption of the new global model (1 for a DC that
    is down: its round's work is discarded and it restarts from the global model);
    bool [D], the DCs that wait for the round's result (all but those that are up,
    sit out and adopt nothing).
  """
  up = np.asarray(up, bool)
  present = up if plan.takes_part is None else up & np.asarray(plan.takes_part, bool)
  adopt = (np.ones(up.shape, np.float32) if plan.adopt is None
           else np.asarray(plan.adopt, np.float32))
  adopt = np.where(up, adopt, np.float32(1)).astype(np.float32)
  return present, adopt, present | (adopt > 0)


def uniform(settings: Settings, k: int) -> RoundPlan:
  """The plan where every DC runs ``k`` local steps and takes part as usual."""
  return RoundPlan(k_d=np.full((settings.num_dcs,), int(k), dtype=np.int64), k_base=int(k))
