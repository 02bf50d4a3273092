"""Synchronisation strategies across datacenters (FedAvg, DiLoCo, FedNova, semi-sync K_d).

Modules:
  strategies:  the sync strategies, one module each, registered by name (sync,
               periodic, semi_sync, adacomm, partial): each round's per-DC plan.
  frequency:   K_d frequency optimisation (closed form + exact search), round time.
  schedule:    runs a strategy round after round: JSON-serialisable state, the
               progress-aware K rule.
  aggregation: inter-DC weights: FedAvg (renormalised over present DCs), FedNova
               (JAX, jit-compatible).
  outer:       outer optimizers on the pseudo-gradient (avg, sgd, DiLoCo nesterov).
  faults:      the ``sync.faults`` outage spec -> ``present(round) -> bool [D]``.
  scaffold:    SCAFFOLD's control variates between DCs (``sync.control_variates``;
               the device side is hfl.step.scaffold_round).
  streaming:   Streaming DiLoCo: fragments of the model by layer order, which
               fragment syncs / merges at which iteration (hfl.step.stream_event).

How the training loop uses them, per inter-DC round r::

    plan = schedule.plan(state)                  # RoundPlan: k_d, takes_part, adopt
    present, adopt, waits = strategies.round_masks(plan, faults_present(r))
    # run max(plan.k_d) SPMD intra-DC iterations; DC d stops updating after
    # plan.k_d[d] (masked); the clock charges DC d plan.k_d[d] * t_d + C_d.
    p = fedavg_weights(n_d, present)             # f32 [D], 0 where not exchanging
    scale = aggregation_scale(cfg.sync.aggregation, p, plan.k_d)
    delta = sum_d scale_d (x_prev - x_d)         # psum over 'dc'
    x_new, outer_state = apply_outer(tx, x_prev, delta, outer_state)
    # DC d: x_d <- adopt_d x_new + (1 - adopt_d) x_d (a DC that is down restarts
    # from x_new); the DCs in waits read the slowest exchanging DC's clock
    plan, state = schedule.next_round(state, train_loss_r)
"""

from hfl.sync.aggregation import aggregation_scale
from hfl.sync.aggregation import AGGREGATIONS
from hfl.sync.aggregation import fedavg_scale
from hfl.sync.aggregation import fedavg_weights
from hfl.sync.aggregation import fednova_scale
from hfl.sync.aggregation import weighted_sum
from hfl.sync.faults import make_present_fn
from hfl.sync.faults import Outage
from hfl.sync.faults import parse_faults
from hfl.sync.faults import present_mask
from hfl.sync.frequency import optimal_k
from hfl.sync.frequency import optimal_k_exact
from hfl.sync.frequency import round_time
from hfl.sync.frequency import target_round_time
from hfl.sync.outer import apply_outer
from hfl.sync.outer import make_outer
from hfl.sync.outer import OUTER_OPTIMIZERS
from hfl.sync.schedule import from_config as schedule_from_config
from hfl.sync.schedule import make_schedule
from hfl.sync.schedule import RoundPlan
from hfl.sync.schedule import Schedule
from hfl.sync.schedule import ScheduleState
from hfl.sync.schedule import state_from_json
from hfl.sync.schedule import state_to_json
from hfl.sync.schedule import STRATEGIES
