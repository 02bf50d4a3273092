"""Runs a sync strategy round after round: the K schedule's state and the progress-aware rule.

A :class:`Schedule` is a NamedTuple of pure functions over a small, JSON-
serialisable :class:`ScheduleState`, in the style of optax. For each inter-DC
round it returns the strategy's :class:`RoundPlan`: how many intra-DC iterations
``k_d`` each DC runs, which DCs take part and how much of the new global model
each adopts. The strategies themselves (``sync.strategy``) are one module each in
:mod:`hfl.sync.strategies`, registered by name: 'sync' (K = 1), 'periodic'
(K_base = ``sync.k``), 'semi_sync' (per-DC K_d of equal finish time from the
network model's times), 'adacomm' (K falling with the loss) and 'partial' (a cyclic
fraction of the DCs exchanges each round); see each module for its rule and source.

Progress-aware adjustment (``sync.progress_aware``, for 'sync', 'periodic' and
'semi_sync'; the seed thesis' progress-aware rule): raise K_base as training plateaus.
The schedule keeps the train losses observed since K_base last changed. Once it
holds ``W + 1`` of them (``W = sync.progress_window``), with ``L_old`` the oldest
of the last ``W + 1`` and ``L_new`` the latest, the relative improvement is::

    rel = (L_old - L_new) / max(|L_old|, 1e-12)

and if ``rel < sync.progress_threshold``::

    K_base <- min(K_max, max(K_base + 1, floor(K_base * sync.progress_factor)))

after which the history is cleared, so the next decision waits ``W + 1`` rounds
at the new K_base (losses measured under the old K are not reused). K_base never
exceeds ``sync.k_max`` and never decreases.

``sync.k_max_scope`` says which K the cap ``sync.k_max`` bounds under 'semi_sync'.
``'every_dc'`` (the default, the thesis's rule) clips every K_d at K_max, so once
K_base nears K_max the faster DCs are clipped too and wait: the round degenerates
to periodic K = K_max. ``'k_base'`` bounds only K_base, the slowest DC's K; the
faster DCs keep the equal-finish-time split above it, K_d up to
:data:`K_CEILING` (``optimal_k(t, c, K_max, K_CEILING)``'s largest entry is the
most any DC runs).

``sync.progress_test`` chooses how ``L_old`` and ``L_new`` are read off the
round losses. ``'endpoints'`` (the default, the rule above) compares two single
rounds, so one noisy round loss decides: a round's train loss is a mini-batch
mean, and when its noise is comparable to ``threshold`` times the loss, a curve
that is still falling is taken for a plateau (docs/semisync.md measures this).
``'window_means'`` waits for ``2 W`` losses and compares the mean of the older
W with the mean of the newer W (``rel`` as above), which divides the noise of
the difference by sqrt(W) for the same span of rounds.

Non-finite losses (NaN/inf) carry no information and are ignored (the round
counter still advances); ``None`` means "no loss measured this round".

Training-loop contract (deterministic, so a resumed run reproduces the
schedule; the schedule depends only on its state and the observed losses)::

    sched = from_config(config.sync, num_dcs, t=t_d, c=c_d)   # t, c: semi_sync
    state = sched.init()              # or: state_from_json(checkpointed_text)
    plan = sched.plan(state)          # RoundPlan for the round about to start
    for each round:
      # run max(plan.k_d) SPMD iterations; DC d's updates are masked after
      # its plan.k_d[d]-th iteration; the clock charges DC d k_d[d] * t_d.
      plan, state = sched.next_round(state, train_loss_of_that_round)
      # checkpoint state_to_json(state); on resume: plan = sched.plan(state)

``t``/``c`` are fixed when the schedule is built; if the network model changes
(e.g. another WAN compressor), build a new schedule and keep the same state.
Host-side Python/numpy; no JAX.
"""

import functools
import json
import math
from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence

import numpy as np

from hfl import metrics
from hfl.sync import frequency
from hfl.sync import strategies
from hfl.sync.strategies import RoundPlan, ScheduleState  # noqa: F401 (this module's API)

# The registered strategies (hfl.sync.strategies: one module each), built-in ones first.
STRATEGIES = tuple(strategies.REGISTRY)
PROGRESS_TESTS = ('endpoints', 'window_means')

_STATE_VERSION = 1


class Schedule(NamedTuple):
  """A K schedule: pure functions over :class:`ScheduleState`.

  Attributes:
    strategy: the ``sync.strategy`` name.
    init: ``() -> ScheduleState``.
    plan: ``(state) -> RoundPlan`` for the round about to start.
    next_round: ``(state, train_loss: float | None) -> (RoundPlan, state)``:
      records the loss of the round just finished and returns the plan of the
      next round with the new state.
  """
  strategy: str
  init: Callable[[], ScheduleState]
  plan: Callable[[ScheduleState], RoundPlan]
  next_round: Callable[[ScheduleState, Optional[float]],
                       tuple[RoundPlan, ScheduleState]]


def state_to_json(state: ScheduleState) -> str:
  """Serialises a state to a JSON string (floats round-trip exactly).

  Args:
    state: a :class:`ScheduleState`.

  Returns:
    A JSON object string.
  """
  return metrics.dumps({
      'version': _STATE_VERSION,
      'round': int(state.round),
      'k_base': int(state.k_base),
      'history': [float(x) for x in state.history],
      'loss0': None if state.loss0 is None else float(state.loss0),
  }, where='schedule state')


def state_from_json(text: str) -> ScheduleState:
  """Inverse of :func:`state_to_json`.

  Args:
    text: a JSON string written by :func:`state_to_json`.

  Returns:
    The :class:`ScheduleState`.

  Raises:
    ValueError: if the text is not a valid schedule state.
  """
  try:
    d = json.loads(text)
    if d.get('version') != _STATE_VERSION:
      raise ValueError(f'unsupported version {d.get("version")!r}')
    state = ScheduleState(
        round=int(d['round']), k_base=int(d['k_base']),
        history=tuple(float(x) for x in d['history']),
        loss0=None if d['loss0'] is None else float(d['loss0']))
  except (TypeError, KeyError, AttributeError, json.JSONDecodeError) as e:
    raise ValueError(f'Not a schedule state: {text!r} ({e}).') from e
  if state.round < 0 or state.k_base < 1:
    raise ValueError(f'Not a schedule state: {text!r}.')
  return state


K_MAX_SCOPES = ('every_dc', 'k_base')
K_CEILING = 2 ** 20  # K_d bound under k_max_scope='k_base': no round holds more iterations


def most_k(strategy: str, k_max: int, t=None, c=None, k_max_scope: str = 'every_dc') -> int:
  """The most iterations any DC runs in a round of a schedule whose K_base may reach
  ``k_max``: ``k_max``, or with 'semi_sync' and ``k_max_scope='k_base'`` the largest
  K_d of :func:`hfl.sync.frequency.optimal_k` at K_base = ``k_max`` (t, c: float [D]
  seconds per iteration and per round's communication)."""
  if strategy != 'semi_sync' or k_max_scope == 'every_dc':
    return int(k_max)
  return int(np.max(frequency.optimal_k(t, c, k_max, K_CEILING)))


def _raise_k(k: int, factor: float, k_max: int) -> int:
  """Progress-aware increase: ``min(k_max, max(k + 1, floor(k * factor)))``."""
  return min(k_max, max(k + 1, int(math.floor(k * factor + 1e-9))))


def make_schedule(strategy: str,
                  num_dcs: int,
                  k: int,
                  k_max: int,
                  *,
                  t: Optional[Sequence[float]] = None,
                  c: Optional[Sequence[float]] = None,
                  progress_aware: bool = False,
                  progress_window: int = 3,
                  progress_threshold: float = 0.01,
                  progress_factor: float = 2.0,
                  k_min_ratio: float = 0.0,
                  progress_test: str = 'endpoints',
                  k_max_scope: str = 'every_dc',
                  hyper: Optional[Mapping[str, Any]] = None) -> Schedule:
  """Builds the K schedule of a sync strategy.

  Args:
    strategy: ``sync.strategy``, a registered strategy (:data:`STRATEGIES`:
      'sync', 'periodic', 'semi_sync', 'adacomm', 'partial', ...).
    num_dcs: number of DCs D (``mesh.num_dcs``), >= 1.
    k: ``sync.k``: initial K_base (AdaComm: tau_0), >= 1. Ignored by 'sync'.
    k_max: ``sync.k_max``: upper bound of every K_d, >= k (>= 1 for 'sync').
    t: float [D], seconds per intra-DC iteration of each DC; required by
      strategies that plan with the network model ('semi_sync'), ignored otherwise.
    c: float [D], seconds of inter-DC communication per round of each DC; as ``t``.
    progress_aware: ``sync.progress_aware``; not allowed with 'adacomm'.
    progress_window: ``sync.progress_window`` (rounds), >= 1.
    progress_threshold: ``sync.progress_threshold``, finite (relative loss
      improvement below which K_base is raised).
    progress_factor: ``sync.progress_factor``, finite and > 1.
    k_min_ratio: ``sync.k_min_ratio`` in [0, 1]: 'semi_sync' raises every K_d to
      at least this fraction of the round's largest (:func:`hfl.sync.frequency.floor_k`).
    progress_test: ``sync.progress_test``, one of :data:`PROGRESS_TESTS` (the
      plateau test, module docstring).
    k_max_scope: ``sync.k_max_scope``, one of :data:`K_MAX_SCOPES`: whether
      ``k_max`` bounds every K_d or only K_base (module docstring; 'semi_sync').
    hyper: the strategy's own fields (``Strategy.hyper``); absent ones take their
      defaults.

  Returns:
    A :class:`Schedule`.

  Raises:
    ValueError: naming the offending config field (``sync.strategy``,
      ``sync.k``, ``sync.k_max``, ``sync.progress_*``, ``mesh.num_dcs``,
      ``network.*`` for bad/missing t and c).
  """
  strat = strategies.get(strategy)
  num_dcs = _check_num_dcs(num_dcs)
  k0, k_max = frequency.check_k(1 if strategy == 'sync' else k, k_max)
  t_arr, c_arr = _check_times(strat, num_dcs, t, c)
  progress_aware = bool(progress_aware)
  if progress_aware:
    _check_progress(strat, progress_window, progress_threshold, progress_factor)
  if (isinstance(k_min_ratio, bool) or not isinstance(k_min_ratio, (int, float))
      or not 0 <= k_min_ratio <= 1):
    raise ValueError(f'sync.k_min_ratio must be a number in [0, 1] (0: off), got {k_min_ratio!r}.')
  if progress_test not in PROGRESS_TESTS:
    raise ValueError(f'sync.progress_test must be one of {PROGRESS_TESTS}, got {progress_test!r}.')
  if k_max_scope not in K_MAX_SCOPES:
    raise ValueError(f'sync.k_max_scope must be one of {K_MAX_SCOPES}, got {k_max_scope!r}.')
  k_cap = K_CEILING if strategy == 'semi_sync' and k_max_scope == 'k_base' else k_max
  p = strategies.Settings(strategy, num_dcs, k0, k_max, t_arr, c_arr, progress_aware,
                          int(progress_window), float(progress_threshold),
                          float(progress_factor), float(k_min_ratio), progress_test, k_cap,
                          {**strat.hyper, **dict(hyper or {})})
  return Schedule(strategy=strategy, init=functools.partial(_init, p),
                  plan=functools.partial(_plan, p),
                  next_round=functools.partial(_next_round, p))


def _check_num_dcs(num_dcs) -> int:
  """``num_dcs`` as an int >= 1; else ValueError naming ``mesh.num_dcs``."""
  if isinstance(num_dcs, bool) or not isinstance(num_dcs, (int, np.integer)):
    raise ValueError(f'mesh.num_dcs must be an integer, got {num_dcs!r}.')
  num_dcs = int(num_dcs)
  if num_dcs < 1:
    raise ValueError(f'mesh.num_dcs must be >= 1, got {num_dcs}.')
  return num_dcs


def _check_times(strat: strategies.Strategy, num_dcs: int, t, c):
  """(t, c) as float arrays [D] for a strategy that plans with them ('semi_sync'),
  (None, None) otherwise.

  Raises:
    ValueError: such a strategy without t or c, or with a length other than D.
  """
  if not strat.needs_times:
    return None, None
  if t is None or c is None:
    raise ValueError(
        f'sync.strategy="{strat.name}" needs per-DC iteration times t and '
        'inter-DC times c from the network model (network.*).')
  t_arr, c_arr = frequency.check_times(t, c)
  if t_arr.shape != (num_dcs,):
    raise ValueError(
        f't and c must have one entry per DC (mesh.num_dcs = {num_dcs}; '
        f'check network.dc_speed), got {t_arr.shape[0]}.')
  return t_arr, c_arr


def _check_progress(strat: strategies.Strategy, window, threshold, factor) -> None:
  """Raises ValueError naming the ``sync.progress_*`` field that is invalid."""
  if not strat.progress_aware:
    raise ValueError(
        f'sync.progress_aware must be False with sync.strategy="{strat.name}" '
        '(it sets K itself by its own rule).')
  if (isinstance(window, bool) or not isinstance(window, (int, np.integer))
      or window < 1):
    raise ValueError(
        f'sync.progress_window must be an integer >= 1, got {window!r}.')
  if not math.isfinite(float(threshold)):
    raise ValueError(f'sync.progress_threshold must be finite, got {threshold!r}.')
  if not math.isfinite(float(factor)) or factor <= 1.0:
    raise ValueError(f'sync.progress_factor must be finite and > 1, got {factor!r}.')


def _init(p: strategies.Settings) -> ScheduleState:
  return ScheduleState(round=0, k_base=p.k0, history=(), loss0=None)


def _plan(p: strategies.Settings, state: ScheduleState) -> RoundPlan:
  kb = int(state.k_base)
  if not 1 <= kb <= p.k_max:
    raise ValueError(
        f'Schedule state has K_base = {kb} outside [1, sync.k_max = {p.k_max}] '
        '(restored from a run with another sync.k_max?).')
  return strategies.get(p.strategy).plan(p, state)


def _next_round(p: strategies.Settings, state: ScheduleState, train_loss: Optional[float]
                ) -> tuple[RoundPlan, ScheduleState]:
  loss = None if train_loss is None else float(train_loss)
  if loss is not None and not math.isfinite(loss):
    loss = None
  kb, history, loss0 = int(state.k_base), tuple(state.history), state.loss0
  observe = strategies.get(p.strategy).observe
  if observe is not None and loss is not None:
    kb, history, loss0 = observe(p, state, loss)
  elif p.progress_aware and loss is not None:
    kb, history = _progress_step(p, kb, history + (loss,))
  new_state = ScheduleState(round=int(state.round) + 1, k_base=kb,
                            history=history, loss0=loss0)
  return _plan(p, new_state), new_state


def _progress_step(p: strategies.Settings, kb: int, history: tuple) -> tuple[int, tuple]:
  """The plateau test on ``history`` (the new loss last): ``(K_base, history)``."""
  need = p.window + 1 if p.progress_test == 'endpoints' else 2 * p.window
  history = history[-need:]
  if len(history) < need or kb >= p.k_max:
    return kb, history
  if p.progress_test == 'endpoints':
    old, new = history[0], history[-1]
  else:
    old, new = sum(history[:p.window]) / p.window, sum(history[p.window:]) / p.window
  rel = (old - new) / max(abs(old), 1e-12)
  if rel < p.threshold:
    return _raise_k(kb, p.factor, p.k_max), ()
  return kb, history


def from_config(sync_config, num_dcs: int,
                t: Optional[Sequence[float]] = None,
                c: Optional[Sequence[float]] = None) -> Schedule:
  """Builds the schedule from the ``config.sync`` ConfigDict.

  Args:
    sync_config: ``config.sync`` (fields strategy, k, k_max, progress_aware,
      progress_window, progress_threshold, progress_factor, k_min_ratio,
      progress_test, k_max_scope, and the strategy's own ``hyper`` fields).
    num_dcs: ``config.mesh.num_dcs``.
    t: float [D] seconds per intra-DC iteration (semi_sync).
    c: float [D] seconds of inter-DC communication per round (semi_sync).

  Returns:
    A :class:`Schedule`.

  Raises:
    ValueError: as :func:`make_schedule`.
  """
  strat = strategies.get(sync_config.strategy)
  return make_schedule(
      sync_config.strategy, num_dcs, sync_config.k, sync_config.k_max,
      t=t, c=c,
      progress_aware=sync_config.progress_aware,
      progress_window=sync_config.progress_window,
      progress_threshold=sync_config.progress_threshold,
      progress_factor=sync_config.progress_factor,
      k_min_ratio=sync_config.get('k_min_ratio', 0.0),
      progress_test=sync_config.get('progress_test', 'endpoints'),
      k_max_scope=sync_config.get('k_max_scope', 'every_dc'),
      hyper={f: sync_config.get(f, v) for f, v in strat.hyper.items()})
