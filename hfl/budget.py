"""When a run stops: after ``train.num_steps`` iterations, at a simulated-time budget,
or at a sample budget (equal work).

Exactly one of three fields of the ``train`` section governs a run; the other two
are *unset*, written as 0:

- ``train.num_steps = N > 0`` (the default, and every config written before the
  budgets existed): the run stops after N intra-DC iterations of the fastest DC
  (a round that would cross N is cut short at N, as before).
- ``train.sim_time_budget_s = B > 0`` (seconds of the simulated clock,
  :mod:`hfl.network`): rounds run whole, and a round starts only while the
  simulated clock reads strictly less than B. Rounds are atomic (every DC ends a
  round at the same simulated instant T = max_d(K_d t_d + C_d)), so the round that
  reaches or crosses B *is run* and is the last one: the run stops at the end of
  the first round whose end time is >= B, and its final simulated time lies in
  [B, B + that round's length). A run whose clock lands exactly on B stops there.
- ``train.sample_budget = S > 0`` (training samples processed, summed over all DCs
  and workers): the same rule on the run's sample count instead of its clock. In a
  round DC d processes K_d x W x B samples (``mesh.workers_per_dc`` W,
  ``train.batch_size`` B; an absent DC 0, its work discarded, :mod:`hfl.sync.faults`):
  metrics.jsonl's ``dc_rounds[*].samples``, whose sums the loop state carries
  (``hfl.cost.LoopState.samples``). A round starts only while the samples
  processed so far are < S; the run stops at the end of the first round whose
  cumulative samples are >= S, so it processes [S, S + that round's samples)
  samples: the overshoot is at most one round. ``E`` epochs of a training set of n
  samples are ``S = E x n`` (n: the dataset's training split, e.g. 60,000 for
  Fashion-MNIST; every sample counts once per time it is drawn, so an epoch here
  is a count of samples, not a pass over each one).

Either way the global model is evaluated at the stop. Comparing strategies "at
equal simulated time" then means: each strategy's last evaluation at or before
the same instant (``summary.json``'s ``eval_history`` lists every evaluation with
its ``step``, ``round``, ``sim_time_s`` and ``samples``); the overshoot past B is at
most one round and is reported (``sim_time_s``); "at equal work" likewise, with
``samples``.

With a budget there is no iteration count to stretch a learning-rate schedule
over, so a decaying ``optimizer.schedule`` needs an explicit
``optimizer.decay_steps``; and an ``optimizer.warmup_steps`` must be below the
most iterations the budget allows (:func:`max_iterations` for the time budget,
estimated from the network model's times; :func:`max_iterations_of_samples` for
the sample budget, from the mesh and batch size;
:func:`hfl.config.check_budget_warmup`: from the config alone in
:func:`hfl.config.validate`, then with the run's K schedule in
:func:`hfl.setup.setup`), as it must be below ``train.num_steps``.
"""

import math
from typing import NamedTuple

GOVERNED_BY = ('num_steps', 'sim_time_budget_s', 'sample_budget')


class Stop(NamedTuple):
  """The stopping rule of a run (see the module docstring).

  Attributes:
    num_steps: intra-DC iterations of the fastest DC (int; 0 = unset).
    sim_time_budget_s: simulated seconds (float; 0.0 = unset).
    sample_budget: training samples summed over all DCs and workers (int; 0 = unset).
  """
  num_steps: int
  sim_time_budget_s: float
  sample_budget: int = 0

  @property
  def governed_by(self) -> str:
    """The field of :data:`GOVERNED_BY` that stops the run."""
    if self.sample_budget > 0:
      return 'sample_budget'
    return 'sim_time_budget_s' if self.sim_time_budget_s > 0 else 'num_steps'

  def finished(self, step: int, now_s: float, samples: int | None = None) -> bool:
    """Whether a run at ``step`` iterations, simulated time ``now_s`` (seconds, the
    slowest DC's clock, ``hfl.network.Clock.now``) and ``samples`` processed (all
    DCs; None: unknown) has stopped.

    Raises:
      ValueError: ``samples`` is None under ``train.sample_budget``.
    """
    if self.governed_by == 'num_steps':
      return step >= self.num_steps
    if self.governed_by == 'sim_time_budget_s':
      return now_s >= self.sim_time_budget_s
    if samples is None:
      raise ValueError(f'train.sample_budget={self.sample_budget} governs this run, but the '
                       'samples it has processed are unknown')
    return samples >= self.sample_budget

  def step_cap(self) -> int | None:
    """The iteration at which a round is cut short (None: rounds run whole)."""
    return self.num_steps if self.governed_by == 'num_steps' else None

  def to_json(self) -> dict:
    """The summary.json entry ``stop``."""
    return dict(governed_by=self.governed_by, num_steps=self.num_steps,
                sim_time_budget_s=self.sim_time_budget_s, sample_budget=self.sample_budget)


def _value(train, name, default):
  return train.get(name, default) if hasattr(train, 'get') else getattr(train, name, default)


MAX_STEPS = 2**31 - 1  # iterations: optax counts optimizer steps in int32


def from_config(train, optimizer=None) -> Stop:
  """The validated :class:`Stop` of a ``train`` config section.

  Args:
    train: the ``train`` section (``num_steps``; ``sim_time_budget_s`` and
      ``sample_budget``, absent in configs written before they existed: 0).
    optimizer: the ``optimizer`` section, to check its schedule under a budget
      (None: not checked).

  Raises:
    ValueError: naming the field: ``train.num_steps`` not an integer in
      [0, :data:`MAX_STEPS`], ``train.sim_time_budget_s`` not a finite number
      >= 0, ``train.sample_budget`` not an integer >= 0, not exactly one of the
      three > 0, or a decaying ``optimizer.schedule`` without
      ``optimizer.decay_steps`` under a budget.
  """
  n = _value(train, 'num_steps', 0)
  b = _value(train, 'sim_time_budget_s', 0.0)
  s = _value(train, 'sample_budget', 0)
  if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_STEPS:
    raise ValueError(f'train.num_steps={n!r} must be an integer in [0, {MAX_STEPS}] (0 = '
                     'unset: train.sim_time_budget_s or train.sample_budget governs; optax '
                     'counts steps in int32)')
  if isinstance(b, bool) or not isinstance(b, (int, float)) or not 0 <= b < math.inf:
    raise ValueError(f'train.sim_time_budget_s={b!r} must be a finite number of simulated '
                     'seconds >= 0 (0 = unset)')
  if isinstance(s, bool) or not isinstance(s, int) or s < 0:
    raise ValueError(f'train.sample_budget={s!r} must be an integer number of training '
                     'samples >= 0, summed over all DCs and workers (0 = unset; E epochs of '
                     'n training samples: E x n, e.g. 10 x 60000 = 600000)')
  set_ = [f'train.{name}={v}' for name, v in (('num_steps', n), ('sim_time_budget_s', b),
                                               ('sample_budget', s)) if v > 0]
  if len(set_) != 1:
    raise ValueError(
        f'train.num_steps={n}, train.sim_time_budget_s={b} and train.sample_budget={s}: '
        f'exactly one of them must be > 0 (it stops the run; {len(set_)} are); set the '
        'others to 0, e.g. --config.train.num_steps=0 --config.train.sample_budget=600000')
  if (b > 0 or s > 0) and optimizer is not None:
    sched = _value(optimizer, 'schedule', 'constant')
    if sched != 'constant' and not _value(optimizer, 'decay_steps', 0):
      raise ValueError(
          f'optimizer.schedule={sched!r} decays over optimizer.decay_steps, which is 0 '
          f'(= train.num_steps), but {set_[0]} governs this run and train.num_steps=0: set '
          'optimizer.decay_steps > 0')
  return Stop(int(n), float(b), int(s))


def max_iterations(budget_s: float, iteration_s: float, round_comm_s: float,
                   round_iterations: int) -> int | None:
  """At most how many iterations (optimizer steps) a DC runs before a time budget
  stops the run.

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


def max_iterations_of_samples(budget: int, iteration_samples: int, round_iterations: int,
                              min_present: int) -> int:
  """At most how many iterations (optimizer steps) a DC runs before a sample budget
  stops the run.

  In a round where DC e runs ``k_e <= K`` iterations, each of the P >= ``min_present``
  DCs present runs at least one (``hfl.sync.schedule.RoundPlan.k_d`` >= 1) of
  ``iteration_samples`` = W x B samples, so the round processes at least
  ``W B (k_e + P - 1) >= W B k_e (K + P - 1) / K`` samples ((k + P - 1) / k falls
  as k grows). A round starts only while fewer than S samples are processed, so the
  n iterations a DC ran before the last round satisfy
  ``n W B (K + P - 1) / K < S``, and the last round adds at most K. With every DC
  running the same K each round (sync, periodic) and all D present, that is
  ``n < S / (D W B)``; semi-sync's fastest DC gets the most, up to
  ``S K / (W B (K + D - 1))``. (An absent DC's iterations are discarded,
  :mod:`hfl.sync.faults`: with outages P can be 1, and then n < S / (W B).)

  Args:
    budget: S, ``train.sample_budget``.
    iteration_samples: W x B, one DC's samples per iteration.
    round_iterations: K >= 1, the most iterations a DC runs in one round.
    min_present: the fewest DCs present in a round (>= 1).

  Returns:
    ``floor((S K - 1) / (W B (K + P - 1))) + K``, the largest n with
    ``n W B (K + P - 1) < S K``, plus K (exact integer arithmetic).
  """
  k = int(round_iterations)
  return (int(budget) * k - 1) // (int(iteration_samples) * (k + int(min_present) - 1)) + k
