"""Sync strategies on heterogeneous DCs at equal work, on CIFAR-10 (issue 49).

configs/sweeps/semisync_work.py's question on the second image workload:
configs/cifar10.py (the CIFAR CNN) on configs/sweeps/workloads.py's heterogeneous
setting (4 DCs x 2 workers, 100 Mbit/s WAN, 20 ms) at DC speeds 3x apart
(3 : 2 : 1.5 : 1), seeds 0, 1, 2. Every run stops once the DCs together have
processed SAMPLES training samples (``train.sample_budget``, hfl.budget): what
``sync`` processes in configs/cifar10.py's 4,800 iterations (4,800 x 4 DCs x 2
workers x 32 = 1,228,800), so ``sync`` runs its usual length and every other arm
does the same training work, spread over the DCs as its schedule decides. The
learning rate is constant after the warm-up for every arm (a cosine over 4,800
steps would end at different points of each arm's training).

Arms: ``sync`` (K = 1, the baseline), ``periodic`` (K = 4), ``semi_sync``
(K_base = 4), ``semi_sync`` with the thesis's progress-aware K, and ``semi_sync`` with
K_base = 2, the arm that kept Fashion-MNIST's accuracy at equal work and 3x
(docs/semisync.md), and progress-aware K as issue 49 designs it (``sync.k_max`` caps
only the slowest DC's K, the window-means plateau test over 8 rounds; added later,
trained at a later commit than the first 15). 18 runs. Evaluations about every 300 iterations of the fastest DC.

Cost, measured on the 2-core CPU: a ``sync`` run of configs/cifar10.py takes 13-16
minutes (docs/results/runs/cifar10_semisync); a semi_sync run of the same work costs
about 1.6x that (the masked lockstep, docs/semisync.md): about 4.5 hours in all.

  python -m hfl.sweep --sweep=configs/sweeps/cifar10_semisync_work.py \\
      --root=workdirs/cifar10_semisync_work
"""

from configs.sweeps import workloads

SAMPLES = 4800 * 4 * 2 * 32  # sync's 4,800 iterations of configs/cifar10.py: 1,228,800
STRATEGIES = [  # train.eval_every counts rounds
    {'sync.strategy': 'sync', 'train.eval_every': 300},
    {'sync.strategy': 'periodic', 'train.eval_every': 75},
    {'sync.strategy': 'semi_sync', 'train.eval_every': 30},
    {'sync.strategy': 'semi_sync', 'sync.progress_aware': True, 'train.eval_every': 15},
    {'sync.strategy': 'semi_sync', 'sync.k': 2, 'train.eval_every': 60},
    # Issue 49's progress-aware design: the cap on the slowest DC's K only, window-means test.
    {'sync.strategy': 'semi_sync', 'sync.progress_aware': True, 'sync.k_max_scope': 'k_base',
     'sync.progress_test': 'window_means', 'sync.progress_window': 8, 'train.eval_every': 15},
]


def get_sweep():
  fixed = dict(workloads.HETEROGENEOUS, **{
      'train.num_steps': 0, 'train.sample_budget': SAMPLES, 'train.checkpoint_every': 100,
      'optimizer.schedule': 'constant', 'seed': workloads.SEEDS})
  return 'configs/cifar10.py', [dict(fixed, **s) for s in STRATEGIES]
