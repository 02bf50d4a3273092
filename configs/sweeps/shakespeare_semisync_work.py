"""Sync strategies on heterogeneous DCs at equal work, on the character LM (issue 49).

configs/sweeps/semisync_work.py's question on configs/shakespeare.py (the
character-level transformer, AdamW) on configs/sweeps/workloads.py's heterogeneous
setting (4 DCs x 2 workers, 100 Mbit/s WAN, 20 ms) at DC speeds 3x apart
(3 : 2 : 1.5 : 1), seeds 0, 1, 2. Every run stops once the DCs together have processed
SAMPLES training windows (``train.sample_budget``, hfl.budget): what ``sync``
processes in configs/shakespeare.py's 2,000 iterations (2,000 x 4 DCs x 2 workers x 4
windows of 128 characters = 64,000), so every arm does the same training work. The
learning rate is constant after the warm-up for every arm (configs/shakespeare.py's
cosine over 2,000 steps would end at different points of each DC's training).

Arms: ``sync`` (K = 1, the baseline), ``periodic`` (K = 4), ``semi_sync`` (K_base = 4),
and ``semi_sync`` with K_base = 2, the arm that kept Fashion-MNIST's accuracy at equal
work and 3x (docs/semisync.md), and progress-aware K as issue 49 designs it
(``sync.k_max`` caps only the slowest DC's K, the window-means plateau test over 8
rounds). 15 runs. Judged on the final validation loss ("within 1%
of sync's").

Cost, measured on the 2-core CPU: a ``sync`` run of configs/shakespeare.py takes 10-12
minutes (docs/results/runs/shakespeare_semisync), a semi_sync run of the same work
about 1.6x that: about 2.7 hours in all.

  python -m hfl.sweep --sweep=configs/sweeps/shakespeare_semisync_work.py \\
      --root=workdirs/shakespeare_semisync_work
"""

from configs.sweeps import workloads

SAMPLES = 2000 * 4 * 2 * 4  # sync's 2,000 iterations of configs/shakespeare.py: 64,000
STRATEGIES = [  # train.eval_every counts rounds
    {'sync.strategy': 'sync', 'train.eval_every': 400},
    {'sync.strategy': 'periodic', 'train.eval_every': 100},
    {'sync.strategy': 'semi_sync', 'train.eval_every': 40},
    {'sync.strategy': 'semi_sync', 'sync.k': 2, 'train.eval_every': 80},
    # Issue 49's progress-aware design: the cap on the slowest DC's K only, window-means test.
    {'sync.strategy': 'semi_sync', 'sync.progress_aware': True, 'sync.k_max_scope': 'k_base',
     'sync.progress_test': 'window_means', 'sync.progress_window': 8, 'train.eval_every': 10},
]


def get_sweep():
  fixed = dict(workloads.HETEROGENEOUS, **{
      'train.num_steps': 0, 'train.sample_budget': SAMPLES, 'train.checkpoint_every': 100,
      'optimizer.schedule': 'constant', 'seed': workloads.SEEDS})
  return 'configs/shakespeare.py', [dict(fixed, **s) for s in STRATEGIES]
