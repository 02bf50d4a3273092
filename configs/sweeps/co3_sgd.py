"""CO3 with plain SGD on the workers (the CO3 paper's optimizer), a follow-up check.

In configs/sweeps/co3.py (momentum 0.9 on the workers) error feedback made CO3 fp4
*worse* as γ grew. This sweep repeats uncompressed, γ = 0 and γ = 0.9 with plain SGD
(lr 0.1), all else equal, to test whether the worker-side momentum is the cause.

  python -m hfl.sweep --sweep=configs/sweeps/co3_sgd.py --root=workdirs/co3_sgd --parallel=3
"""

from configs.sweeps.compression import FIXED

SGD = dict(FIXED, **{'optimizer.name': 'sgd', 'optimizer.learning_rate': 0.1})


def get_sweep():
  return 'configs/default.py', [
      dict(SGD, **{'compression.uplink.name': 'identity'}),
      dict(SGD, **{'compression.uplink.name': 'co3', 'compression.uplink.fmt': 'fp4',
                   'compression.uplink.gamma': [0.0, 0.9]}),
  ]
