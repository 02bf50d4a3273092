"""SparseLoCo on the character LM: DiLoCo whose pseudo-gradients cross the WAN as
chunked top-k with 2-bit values, error feedback in place of the outer momentum.

SparseLoCo (Sarfi et al., arXiv:2508.15706, 2025; hfl.compress.chunked): each DC
accumulates its pseudo-gradient into an error-feedback buffer e <- β e + Δ, sends the
top 2% of each chunk of 4096 entries of it with 2-bit values, keeps the rest, and the
global model takes a plain outer step θ <- θ − α mean(Δ̂) (``sync.outer.name='sgd'``,
momentum 0). β = ``compression.wan.gamma``. Everything else is configs/shakespeare.py
(AdamW inner, H = K = 16). 1-D leaves (biases, norms) cross the WAN dense in float32.

  python main.py --config=configs/sparseloco.py --workdir=workdirs/sparseloco

MuLoCo (Thérien et al., arXiv:2505.23725) is not this outer loop: it is DiLoCo's
(Nesterov outer step) with Muon as the inner optimizer on the hidden layers' weight
kernels and AdamW on the rest. Its exact settings are the ``MUON`` and ``DILOCO``
overrides of configs/sweeps/shakespeare_lowcomm.py (Muon needs them: with optax's
default leaf rule the LM ends far worse; docs/lowcomm.md).
"""

from configs import shakespeare


def get_config(arg: str | None = None):
  c = shakespeare.get_config(arg)
  c.sync.outer.name = 'sgd'
  c.sync.outer.learning_rate = 1.0
  c.sync.outer.momentum = 0.0
  c.compression.wan.name = 'chunked_topk'
  c.compression.wan.density = 0.02
  c.compression.wan.chunk_size = 4096
  c.compression.wan.value_bits = 2
  c.compression.wan.gamma = 0.95
  return c
