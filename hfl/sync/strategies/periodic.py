"""'periodic': local SGD / FedAvg / DiLoCo's inner loop, every DC K local steps a round.

Every DC runs K_base = ``sync.k`` iterations, then all exchange (periodic averaging,
McMahan et al., AISTATS 2017, FedAvg with full participation; with the Nesterov outer
optimizer DiLoCo, Douillard et al. 2023, arXiv:2311.08105; with ``sync.fragments`` > 1
Streaming DiLoCo, :mod:`hfl.sync.streaming`). ``sync.progress_aware`` raises K_base as
the loss plateaus (:mod:`hfl.sync.schedule`).
"""

from hfl.sync.strategies import registry


def plan(settings: registry.Settings, state: registry.ScheduleState) -> registry.RoundPlan:
  """Every DC runs K_base iterations."""
  return registry.uniform(settings, state.k_base)


STRATEGY = registry.register(registry.Strategy(
    name='periodic', plan=plan))
