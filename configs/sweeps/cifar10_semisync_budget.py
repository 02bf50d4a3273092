"""Sync strategies on heterogeneous DCs at equal simulated time, on CIFAR-10 (issue 15).

configs/cifar10.py (the CIFAR CNN) on the heterogeneous setting of
configs/sweeps/workloads.py (4 DCs x 2 workers, 100 Mbit/s WAN, 20 ms) at two
heterogeneity levels, DC speeds 3x apart (3 : 2 : 1.5 : 1) and 10x apart
(10 : 4 : 2 : 1), seeds 0, 1, 2, for ``sync`` (K = 1, the baseline),
``periodic`` (K = 4), ``semi_sync`` (K_base = 4), ``semi_sync`` + progress-aware
K and ``adacomm`` (tau_0 = 4): 30 runs, the Fashion-MNIST sweep
(configs/sweeps/semisync_budget.py) on the second image workload.

Every run stops at the same simulated-time budget: SIM_BUDGET_S is 4,799.5 rounds
of ``sync`` (SYNC_ROUND_S = max_d(t_d + C_d), hfl.setup.planned_times with the
CIFAR CNN's payloads: the slowest DC's 0.0581 s iteration + 0.6396 s of WAN
exchange and LAN fan-out; the same at both levels, since the slowest DC has speed
1), so ``sync`` runs exactly configs/cifar10.py's 4,800 iterations and every
other strategy the same simulated time. The learning rate is constant after the
warm-up for every arm: a cosine over 4,800 steps would reach its floor after
4,800 local steps, long before the budget's end on the fast DCs of the
strategies that run more iterations. Evaluations about every 300 iterations of
the fastest DC.

Cost: ``semi_sync`` runs ~10-20 iterations of the fastest DC per round, i.e.
~35,000-75,000 iterations against ``sync``'s 4,800. On the 2-core CPU machine the
CIFAR CNN trains ~590 images/s (8 workers x 32 images per iteration): hours per
run, so this sweep is sized for a GPU.

  python -m hfl.sweep --sweep=configs/sweeps/cifar10_semisync_budget.py \\
      --root=workdirs/cifar10_semisync_budget
"""

from configs.sweeps import workloads

SYNC_ROUND_S = 0.6977584704  # hfl.setup.planned_times: max_d(t_d + C_d) of sync
SIM_BUDGET_S = round(4799.5 * SYNC_ROUND_S, 3)  # 3,348.892 s: sync runs 4,800 rounds
SPEEDS = [(3.0, 2.0, 1.5, 1.0), (10.0, 4.0, 2.0, 1.0)]
STRATEGIES = [  # train.eval_every counts rounds
    {'sync.strategy': 'sync', 'train.eval_every': 300},
    {'sync.strategy': 'periodic', 'train.eval_every': 75},
    {'sync.strategy': 'semi_sync', 'train.eval_every': 20},
    {'sync.strategy': 'semi_sync', 'sync.progress_aware': True, 'train.eval_every': 20},
    {'sync.strategy': 'adacomm', 'train.eval_every': 75},
]


def get_sweep():
  fixed = dict(workloads.HETEROGENEOUS, **{
      'train.num_steps': 0, 'train.sim_time_budget_s': SIM_BUDGET_S,
      'optimizer.schedule': 'constant', 'seed': workloads.SEEDS})
  return 'configs/cifar10.py', [dict(fixed, **s, **{'network.dc_speed': speed})
                                for speed in SPEEDS for s in STRATEGIES]
