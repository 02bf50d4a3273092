"""'adacomm': AdaComm, which lowers K as the loss falls.

Wang & Joshi, "Adaptive Communication Strategies to Achieve the Best Error-Runtime
Trade-off in Local-Update SGD", SysML 2019, Eq. (14)::

    tau_l = ceil( sqrt(F(x_l) / F(x_0)) * tau_0 ),   clipped to [1, K_max]

with ``tau_0 = sync.k``, F(x_0) the first finite train loss observed and F(x_l) the
latest round's; every DC runs tau_l iterations. Simplification: the paper re-evaluates
tau every fixed wall-clock interval T_0, here after every round. Needs positive losses;
``sync.progress_aware`` is refused (it moves K the other way).
"""

import math

from hfl.sync.strategies import registry


def plan(settings: registry.Settings, state: registry.ScheduleState) -> registry.RoundPlan:
  """Every DC runs the current tau (``state.k_base``)."""
  return registry.uniform(settings, state.k_base)


def observe(settings: registry.Settings, state: registry.ScheduleState, loss: float):
  """``(tau, history, F(x_0))`` after a round whose train loss was ``loss`` (finite).

  Raises:
    ValueError: the first loss, F(x_0), is not positive.
  """
  loss0 = state.loss0
  if loss0 is None:
    if loss <= 0:
      raise ValueError(
          f'sync.strategy="adacomm" needs a positive train loss for F(x_0), got {loss}.')
    loss0 = loss
  tau = math.ceil(math.sqrt(max(loss, 0.0) / loss0) * settings.k0 - 1e-9)
  return min(settings.k_max, max(1, tau)), tuple(state.history), loss0


STRATEGY = registry.register(registry.Strategy(
    name='adacomm', plan=plan, observe=observe, progress_aware=False))
