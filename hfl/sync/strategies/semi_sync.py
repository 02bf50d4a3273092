"""'semi_sync': heterogeneity-aware semi-synchronous rounds, per-DC K_d of equal finish time.

The slowest DC runs K_base iterations and each faster DC as many as fit the same
round time: ``k_d = optimal_k(t, c, K_base, K_cap)`` (:mod:`hfl.sync.frequency`, the
seed thesis's per-DC frequency, ../DESIGN.md), with t_d the DC's seconds per
iteration and c_d its seconds of inter-DC communication per round from the network
model; ``sync.k_min_ratio`` raises every K_d to at least that fraction of the round's
largest (:func:`hfl.sync.frequency.floor_k`); ``sync.k_max_scope`` says whether
``sync.k_max`` caps every K_d or only K_base (:mod:`hfl.sync.schedule`).
"""

from hfl.sync import frequency
from hfl.sync.strategies import registry


def plan(settings: registry.Settings, state: registry.ScheduleState) -> registry.RoundPlan:
  """K_d of equal finish time from K_base (the slowest DC's), floored and capped."""
  kb = int(state.k_base)
  k_d = frequency.floor_k(frequency.optimal_k(settings.t, settings.c, kb, settings.k_cap),
                          settings.k_min_ratio, settings.k_cap)
  return registry.RoundPlan(k_d=k_d, k_base=kb)


STRATEGY = registry.register(registry.Strategy(
    name='semi_sync', plan=plan, needs_times=True))
