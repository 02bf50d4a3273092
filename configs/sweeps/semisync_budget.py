"""Sync strategies on heterogeneous DCs at equal simulated time (issue 15).

configs/semisync.py (4 DCs x 2 workers, Fashion-MNIST, Dirichlet 0.5, 100 Mbit/s WAN,
20 ms) at two heterogeneity levels — DC speeds 3x apart (3 : 2 : 1.5 : 1, as
configs/semisync.py) and 10x apart (10 : 4 : 2 : 1) — with seeds 0, 1, 2 for
``sync`` (K = 1, the baseline), ``periodic`` (K = 4), ``semi_sync`` (K_base = 4),
``semi_sync`` + progress-aware K, and ``adacomm`` (tau_0 = 4): 30 runs.

Every run stops at the same simulated-time budget (``train.sim_time_budget_s``,
hfl.budget): SIM_BUDGET_S is 599.5 rounds of ``sync`` (0.50317 s each: the slowest
DC's 0.0556 s iteration + 0.4476 s of WAN exchange and LAN fan-out, from
hfl.network with the CNN's payloads; the same at both levels, since the slowest DC
has speed 1), so ``sync`` stops after exactly its usual 600 iterations (the round
that crosses the budget is run) and every other strategy trains for the same
simulated time. One run gives both comparisons: the final accuracy is at equal
simulated time, and the accuracy after 600 iterations of the fastest DC
(``acc_at_iters`` on the results page, interpolated between evaluations) at equal
iterations. Evaluations about every 40 iterations of the fastest DC for ``sync``
and ``periodic``, every 2 rounds (semi_sync) or every round (progress-aware).

Cost: ``semi_sync`` runs ~450 rounds of 9 (3x) or 20 (10x) iterations of the fastest
DC, i.e. ~4,000-9,000 iterations, against ``sync``'s 600.

  python -m hfl.sweep --sweep=configs/sweeps/semisync_budget.py --root=workdirs/semisync_budget
"""

SEEDS = [0, 1, 2]
SYNC_ROUND_S = 0.5031718464  # hfl.network: max_d(t_d + C_d) of sync on configs/semisync.py
SIM_BUDGET_S = round(599.5 * SYNC_ROUND_S, 3)  # 301.652 s: sync runs exactly 600 rounds
SPEEDS = [(3.0, 2.0, 1.5, 1.0), (10.0, 4.0, 2.0, 1.0)]
STRATEGIES = [
    {'sync.strategy': 'sync', 'train.eval_every': 40},
    {'sync.strategy': 'periodic', 'train.eval_every': 10},
    {'sync.strategy': 'semi_sync', 'train.eval_every': 2},
    {'sync.strategy': 'semi_sync', 'sync.progress_aware': True, 'train.eval_every': 1},
    {'sync.strategy': 'adacomm', 'train.eval_every': 10},
]


def get_sweep():
  budget = {'train.num_steps': 0, 'train.sim_time_budget_s': SIM_BUDGET_S, 'seed': SEEDS,
            'train.checkpoint_every': 100}
  return 'configs/semisync.py', [dict(budget, **s, **{'network.dc_speed': speed})
                                 for speed in SPEEDS for s in STRATEGIES]
