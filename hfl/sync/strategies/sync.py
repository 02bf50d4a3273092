"""'sync': the synchronous hierarchical parameter server, one local step per round.

Every DC runs K = 1 iteration and exchanges after it (``sync.k`` is ignored and
K_base starts at 1; with ``sync.progress_aware`` it may grow). The baseline of the
seed thesis's hierarchical PS (../DESIGN.md's "synchronous HPS"; data parallelism
across DCs when the outer optimizer is plain averaging).
"""

from hfl.sync.strategies import registry


def plan(settings: registry.Settings, state: registry.ScheduleState) -> registry.RoundPlan:
  """Every DC runs K_base iterations (1 until the progress-aware rule raises it)."""
  return registry.uniform(settings, state.k_base)


STRATEGY = registry.register(registry.Strategy(
    name='sync', plan=plan))
