"""'partial': partial participation, a cyclic subset of the DCs exchanging each round.

Each round, m = ceil(``sync.participation`` x D) DCs, taken in turn (round r, from 0,
takes DCs r m, r m + 1, ..., r m + m - 1 modulo D: cyclic participation, Cho et al.,
"On the Convergence of Federated Averaging with Cyclic Client Participation", ICML
2023), run K = ``sync.k`` local steps, send their pseudo-gradients Δ_d = x_global - x_d
(FedAvg weights renormalised over them) and adopt the new global model. The other
DCs keep training their own model through the round: they send nothing, adopt
nothing, and do not wait for the exchange (the clock charges them their own
iterations only). A DC that sat out sends, when its turn comes, the difference of its
model from the current global one, so with the averaging outer optimizer
(``sync.outer.name='avg'``, lr 1) the new global model is the FedAvg-weighted mean of
the participants' models. Unlike Cho et al.'s clients, which idle while out, a DC's
compute is not left unused.

``sync.participation`` = 1 is 'periodic' exactly. Refused with FedNova (its τ_d would
be the steps since the DC last adopted, which the round weights do not track), with
SCAFFOLD and with a compressed broadcast through the downlink (both assume every DC
adopts the new global model), here in :func:`check`; Streaming DiLoCo is refused for
every strategy but 'periodic' by ``hfl.config.validate_streaming``.
"""

import math

import numpy as np

from hfl.compress import policy
from hfl.sync.strategies import registry


def participants(settings: registry.Settings, round_index: int) -> np.ndarray:
  """bool [D]: the DCs taking part in round ``round_index`` (0-based)."""
  d = settings.num_dcs
  m = max(1, math.ceil(float(settings.hyper['participation']) * d - 1e-9))
  mask = np.zeros(d, bool)
  mask[(round_index * m + np.arange(min(m, d))) % d] = True
  return mask


def plan(settings: registry.Settings, state: registry.ScheduleState) -> registry.RoundPlan:
  """K_base local steps for every DC; this round's participants exchange and adopt."""
  takes_part = participants(settings, state.round)
  return registry.uniform(settings, state.k_base)._replace(
      takes_part=takes_part, adopt=takes_part.astype(np.float32))


def check(config) -> None:
  """Raises ValueError for ``sync.participation`` outside (0, 1] or the combinations
  the module docstring refuses."""
  s = config.sync
  p = s.get('participation', 1.0)
  if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
    raise ValueError(f'sync.participation={p!r} must be a number in (0, 1]: the fraction of '
                     "the DCs exchanging each round under sync.strategy='partial'")
  if s.aggregation == 'fednova':
    raise ValueError("sync.aggregation='fednova' is not supported with sync.strategy="
                     "'partial': a DC that sat out has run more steps than the round's K, "
                     "which FedNova's weights do not track; use 'fedavg' or 'samples'")
  if s.get('control_variates', 'none') != 'none':
    raise ValueError(f"sync.control_variates={s.control_variates!r} is not supported with "
                     "sync.strategy='partial' (SCAFFOLD assumes every DC adopts the global "
                     "model); set it to 'none'")
  c = config.compression
  if c.get('broadcast', 'gather') == 'downlink' and policy.lossy_correction(c):
    raise ValueError(f"compression.broadcast='downlink' with a lossy downlink "
                     f"({c.downlink.name!r}, correction "
                     f"{policy.correction_name(c) or 'the downlink'!r}, small leaves "
                     f"{c.get('small', 'float32')!r}) is "
                     "not supported with sync.strategy='partial' (the correction assumes "
                     "every DC adopts the global model); set compression.broadcast='gather', "
                     "or an identity downlink and correction (compression.correction.name='') "
                     "with float32 small leaves")


STRATEGY = registry.register(registry.Strategy(
    name='partial', plan=plan, check=check, hyper={'participation': 1.0}, partial=True))
