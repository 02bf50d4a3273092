"""CO3 at the paper's SGD lr 0.01, three times longer (1800 iterations).

At 600 iterations (configs/sweeps/co3_paper.py) the runs are far from converged
(≈ 83% for uncompressed); this checks whether the gap between CO3 fp4 with
γ = 0.9 and uncompressed closes as training goes on, as the paper's claim
(γ = 0.9 ≈ uncompressed at convergence) needs.

  python -m hfl.sweep --sweep=configs/sweeps/co3_paper_long.py --root=workdirs/co3_paper_long --parallel=2
"""

from configs.sweeps.co3_paper import SGD

LONG = dict(SGD, **{'train.num_steps': 1800, 'train.eval_every': 25})


def get_sweep():
  return 'configs/default.py', [
      dict(LONG, **{'compression.uplink.name': 'identity'}),
      dict(LONG, **{'compression.uplink.name': 'co3', 'compression.uplink.fmt': 'fp4',
                    'compression.uplink.gamma': 0.9}),
  ]
