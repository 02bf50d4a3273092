"""CO3 in the paper's own training setup: a synchronous PS over IID data.

The CO3 paper ("How to Attain Communication-Efficient DNN Training? Convert,
Compress, Correct"; hfl.compress.co3) trains data-parallel workers that push their gradients
to a parameter server every iteration, on IID shards, with SGD at lr 0.01.
configs/sweeps/co3_paper.py ran the γ grid in hfl's default experiment instead
(non-IID Dirichlet shards, periodic sync every K = 4), where each round's
averaging of non-IID DC models makes the test accuracy swing by ±2 points and
three seeds could not resolve the ~0.6-point gap. This sweep removes exactly those
two differences: ``dataset.partition = 'iid'`` and ``sync.k = 1`` (every
iteration is an inter-DC round, i.e. one synchronous PS over all 8 workers);
optimizer, model, batch (32 per worker), 600 iterations and the 1 Gbit/s LAN are
as in co3_paper. Order: the headline pair (uncompressed vs fp4 γ = 0.9) over
seeds 0-2 first, then γ = 0 over seeds 0-2, then γ = 0.5 and 1.0 (seed 0, then
seeds 1-2).

  python -m hfl.sweep --sweep=configs/sweeps/co3_iid.py --root=workdirs/co3_iid --parallel=2
"""

from configs.sweeps.co3_paper import SGD

IID = dict(SGD, **{'dataset.partition': 'iid', 'sync.k': 1, 'train.eval_every': 25})
NONE = {'compression.uplink.name': 'identity'}


def _co3(gamma):
  return {'compression.uplink.name': 'co3', 'compression.uplink.fmt': 'fp4',
          'compression.uplink.gamma': gamma}


def get_sweep():
  runs = []
  for seed in (0, 1, 2):
    runs += [dict(IID, seed=seed, **NONE), dict(IID, seed=seed, **_co3(0.9))]
  runs += [dict(IID, seed=seed, **_co3(0.0)) for seed in (0, 1, 2)]
  runs += [dict(IID, seed=0, **_co3(g)) for g in (0.5, 1.0)]
  runs += [dict(IID, seed=seed, **_co3(g)) for g in (0.5, 1.0) for seed in (1, 2)]
  return 'configs/default.py', runs
