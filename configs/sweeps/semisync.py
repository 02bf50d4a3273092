"""Sync strategies on heterogeneous DCs (hfl.sync.frequency, issue 4): the thesis comparison.

Baseline: ``sync`` (K = 1, the synchronous hierarchical PS). Against it:
``periodic`` (K = 4), ``semi_sync`` (K_base = 4, per-DC K_d from the frequency
optimiser), ``semi_sync`` + progress-aware K, and AdaComm. Evaluations are spaced
by about 40 intra-DC iterations for every strategy. Every point also runs with
seeds 1 and 2 (seed 0 is the default config's), so that each verdict of the
results page rests on three paired seeds.

  python -m hfl.sweep --sweep=configs/sweeps/semisync.py --root=workdirs/semisync
"""


def get_sweep():
  runs = [
      {'sync.strategy': 'sync', 'train.eval_every': 40},
      {'sync.strategy': 'periodic', 'train.eval_every': 10},
      {'sync.strategy': 'semi_sync', 'train.eval_every': 4},
      {'sync.strategy': 'semi_sync', 'sync.progress_aware': True, 'train.eval_every': 2},
      {'sync.strategy': 'adacomm', 'train.eval_every': 10},
  ]
  return 'configs/semisync.py', runs + [dict(run, seed=[1, 2]) for run in runs]
