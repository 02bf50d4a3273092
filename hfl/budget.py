"""When a run stops: after ``train.num_steps`` iterations, or at a simulated-time budget.

Exactly one of the two fields of the ``train`` section governs a run; the other is
*unset*, written as 0:

- ``train.num_steps = N > 0`` and ``train.sim_time_budget_s = 0`` (the default,
  and every config written before the budget existed): the run stops after N
  intra-DC iterations of the fastest DC (a round that would cross N is cut short
  at N, as before).
- ``train.num_steps = 0`` and ``train.sim_time_budget_s = B > 0`` (seconds of the
  simulated clock, :mod:`hfl.network`): rounds run whole, and a round starts only
  while the simulated clock reads strictly less than B. Rounds are atomic (every
  DC ends a round at the same simulated instant T = max_d(K_d t_d + C_d)), so the
  round that reaches or crosses B *is run* and is the last one: the run stops at
  the end of the first round whose end time is >= B, and its final simulated time
  lies in [B, B + that round's length). A run whose clock lands exactly on B
  stops there.

Either way the global model is evaluated at the stop. Comparing strategies "at
equal simulated time" then means: each strategy's last evaluation at or before
the same instant (``summary.json``'s ``eval_history`` lists every evaluation with
its ``step``, ``round`` and ``sim_time_s``); the overshoot past B is at most one
round and is reported (``sim_time_s``).

With a budget there is no iteration count to stretch a learning-rate schedule
over, so a decaying ``optimizer.schedule`` needs an explicit
``optimizer.decay_steps``; and an ``optimizer.warmup_steps`` must be below
:func:`max_iterations`, the most iterations the budget allows, estimated from the
network model's times (:func:`hfl.config.check_budget_warmup`: from the config
alone in :func:`hfl.config.validate`, then with the payloads'
:func:`hfl.train.planned_times` in :func:`hfl.train.setup`), as it must be below
``train.num_steps``.
"""

import math
from typing import NamedTuple

GOVERNED_BY = ('num_steps', 'sim_time_budget_s')


class Stop(NamedTuple):
  """The stopping rule of a run (see the module docstring).

  Attributes:
    num_steps: intra-DC iterations of the fastest DC (int; 0 = unset).
    sim_time_budget_s: simulated seconds (float; 0.0 = unset).
  """
  num_steps: int
  sim_time_budget_s: float

  @property
  def governed_by(self) -> str:
    """``'num_steps'`` or ``'sim_time_budget_s'``: the field that stops the run."""
    return 'sim_time_budget_s' if self.sim_time_budget_s > 0 else 'num_steps'

  def finished(self, step: int, now_s: float) -> bool:
    """Whether a run at ``step`` iterations and simulated time ``now_s`` (seconds,
    the slowest DC's clock, ``hfl.network.Clock.now``) has stopped."""
    if self.governed_by == 'num_steps':
      return step >= self.num_steps
    return now_s >= self.sim_time_budget_s

  def step_cap(self) -> int | None:
    """The iteration at which a round is cut short (None: rounds run whole)."""
    return self.num_steps if self.governed_by == 'num_steps' else None

  def to_json(self) -> dict:
    """The summary.json entry ``stop``."""
    return dict(governed_by=self.governed_by, num_steps=self.num_steps,
                sim_time_budget_s=self.sim_time_budget_s)


def _value(train, name, default):
  return train.get(name, default) if hasattr(train, 'get') else getattr(train, name, default)


MAX_STEPS = 2**31 - 1  # iterations: optax counts optimizer steps in int32


def from_config(train, optimizer=None) -> Stop:
  """The validated :class:`Stop` of a ``train`` config section.

  Args:
    train: the ``train`` section (``num_steps``; ``sim_time_budget_s``, absent in
      configs written before it existed: 0.0).
    optimizer: the ``optimizer`` section, to check its schedule under a budget
      (None: not checked).

  Raises:
    ValueError: naming the field: ``train.num_steps`` not an integer in
      [0, :data:`MAX_STEPS`],
      ``train.sim_time_budget_s`` not a finite number >= 0, both set or both
      unset, or a decaying ``optimizer.schedule`` without
      ``optimizer.decay_steps`` under a budget.
  """
  n = _value(train, 'num_steps', 0)
  b = _value(train, 'sim_time_budget_s', 0.0)
  if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_STEPS:
    raise ValueError(f'train.num_steps={n!r} must be an integer in [0, {MAX_STEPS}] (0 = '
                     'unset: train.sim_time_budget_s governs; optax counts steps in int32)')
  if isinstance(b, bool) or not isinstance(b, (int, float)) or not 0 <= b < math.inf:
    raise ValueError(f'train.sim_time_budget_s={b!r} must be a finite number of simulated '
                     'seconds >= 0 (0 = unset: train.num_steps governs)')
  if (n > 0) == (b > 0):
    raise ValueError(
        f'train.num_steps={n} and train.sim_time_budget_s={b}: exactly one of them must be '
        '> 0 (it stops the run); set the other to 0, e.g. --config.train.num_steps=0 '
        '--config.train.sim_time_budget_s=60')
  if b > 0 and optimizer is not None:
    sched = _value(optimizer, 'schedule', 'constant')
    if sched != 'constant' and not _value(optimizer, 'decay_steps', 0):
      raise ValueError(
          f'optimizer.schedule={sched!r} decays over optimizer.decay_steps, which is 0 '
          f'(= train.num_steps), but train.sim_time_budget_s={b} governs this run and '
          'train.num_steps=0: set optimizer.decay_steps > 0')
  return Stop(int(n), float(b))


def max_iterations(budget_s: float, iteration_s: float, round_comm_s: float,
                   round_iterations: int) -> int | None:
  """At most how many iterations (optimizer steps) a DC runs before a budget stops the run.

  A round starts only while the clock reads less than B and lasts at least
  ``K_d t + C`` for each DC present in it (its ``K_d <= K`` iterations of at least
  ``t`` seconds, then at least ``C`` seconds of communication; :mod:`hfl.network`).
  So the n iterations a DC ran before the last round took at least
  ``n (t + C / K) < B`` seconds, and the last round adds at most K. (An absent DC's
  iterations are discarded, :mod:`hfl.sync.faults`.)

  Args:
    budget_s: B, ``train.sim_time_budget_s``.
    iteration_s: t, a lower bound on any DC's iteration time (seconds).
    round_comm_s: C, a lower bound on a round's communication time (seconds).
    round_iterations: K >= 1, the most iterations a DC runs in one round.

  Returns:
    ``floor(B / (t + C / K)) + K``, or None when ``t + C / K`` is 0 (no bound).
  """
  per_iteration = iteration_s + round_comm_s / round_iterations
  if per_iteration <= 0:
    return None
  return math.floor(budget_s / per_iteration + 1e-9) + int(round_iterations)
