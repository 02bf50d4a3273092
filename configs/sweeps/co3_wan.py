"""CO3 as the WAN compressor of the pseudo-gradient (hfl.compress.co3, issue 5).

Each DC sends its round's pseudo-gradient Δ_d = x_global − x_d through CO3 fp4
(GenNorm scale, Huffman code) with the decaying memory p = Δ_d + γ e_d over the
WAN; intra-DC links stay uncompressed. Setting as configs/sweeps/co3_iid.py (SGD
lr 0.01, IID shards, 600 iterations, 1 Gbit/s LAN) but with K = 4 local iterations
per round, so that the WAN carries a multi-step pseudo-gradient;
uncompressed vs γ ∈ {0, 0.9} (seed 0), then uncompressed and γ = 0.9 with seeds 1 and 2.

  python -m hfl.sweep --sweep=configs/sweeps/co3_wan.py --root=workdirs/co3_wan
"""

from configs.sweeps.co3_iid import IID

BASE = dict(IID, **{'sync.k': 4, 'train.eval_every': 10})


def get_sweep():
  return 'configs/default.py', [
      dict(BASE, **{'compression.wan.name': 'identity'}),
      dict(BASE, **{'compression.wan.name': 'co3', 'compression.wan.fmt': 'fp4',
                    'compression.wan.gamma': [0.9, 0.0]}),
      dict(BASE, seed=[1, 2], **{'compression.wan.name': 'identity'}),
      dict(BASE, seed=[1, 2], **{'compression.wan.name': 'co3', 'compression.wan.fmt': 'fp4',
                                 'compression.wan.gamma': 0.9}),
  ]
