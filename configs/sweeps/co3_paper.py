"""CO3 under the paper's optimizer setting: plain SGD, lr 0.01 (hfl.compress.co3).

The CO3 paper trains with SGD at lr 0.01. configs/sweeps/co3.py (momentum 0.9) and
configs/sweeps/co3_sgd.py (SGD, lr 0.1) found error feedback hurting fp4 CO3; this
sweep repeats the issue's γ grid, γ ∈ {0, 0.5, 0.9, 1.0}, against uncompressed at the
paper's learning rate, all else as in the default experiment (600 iterations,
1 Gbit/s LAN); every point also with seeds 1 and 2 (15 runs).

  python -m hfl.sweep --sweep=configs/sweeps/co3_paper.py --root=workdirs/co3_paper
"""

from configs.sweeps.compression import FIXED

SGD = dict(FIXED, **{'optimizer.name': 'sgd', 'optimizer.learning_rate': 0.01})


def get_sweep():
  return 'configs/default.py', [
      dict(SGD, **{'compression.uplink.name': 'identity'}),
      dict(SGD, **{'compression.uplink.name': 'co3', 'compression.uplink.fmt': 'fp4',
                   'compression.uplink.gamma': [0.0, 0.5, 0.9, 1.0]}),
      # Seeds 1 and 2 of every point, so that each γ's verdict rests on three seeds.
      dict(SGD, seed=[1, 2], **{'compression.uplink.name': 'identity'}),
      dict(SGD, seed=[1, 2], **{'compression.uplink.name': 'co3', 'compression.uplink.fmt': 'fp4',
                                'compression.uplink.gamma': [0.0, 0.5, 0.9, 1.0]}),
  ]
