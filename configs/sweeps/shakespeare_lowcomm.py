"""The 2025-26 low-communication methods on the character LM (issue 53), 3 seeds each,
paired against data parallel (K = 1): DiLoCo (Nesterov outer, H = 16), SparseLoCo
(configs/sparseloco.py), MuLoCo (Muon inner, DiLoCo outer) with float32 and with 2-bit
chunked pseudo-gradients, and MuLoCo with SparseLoCo's sparsity on top of the 2-bit values
(``SPARSE_TWO_BIT``: chunked top-k 1%, the 1-D leaves in bfloat16; about the densest
setting of hfl's compressors that sends >= 100x fewer bytes than DiLoCo on this model,
108.6x by hfl's accounting, where SparseLoCo's 2% with float32 1-D leaves sends 55.1x
fewer). 18 runs, 17-37 minutes each on a 2-core CPU with two runs sharing it.

  python -m hfl.sweep --sweep=configs/sweeps/shakespeare_lowcomm.py \\
      --root=workdirs/shakespeare_lowcomm
"""

DILOCO = {'sync.outer.name': 'nesterov', 'sync.outer.learning_rate': 0.7,
          'sync.outer.momentum': 0.5}
# Muon as MuLoCo and Muon's reference use it: on the hidden layers' weight kernels
# (attention's projections included), AdamW at the LM's own learning rate on the
# embeddings, the output head, biases and norms. (With optax's default rule, Muon on
# every 2-D leaf and its AdamW at Muon's 0.02, seed 0 ended at 2.45 nats/char: the
# embeddings under Muon and the attention kernels, 3-D, under AdamW at 10x the LM's
# learning rate.)
MUON = {'optimizer.name': 'muon', 'optimizer.momentum': 0.95, 'optimizer.learning_rate': 0.02,
        'optimizer.weight_decay': 0.0, 'optimizer.muon_adam_learning_rate': 2e-3,
        'optimizer.muon_leaves': 'kernels',
        'optimizer.muon_exclude': r"^\['(Embed_0|pos_embedding|Dense_0)'\]"}
TWO_BIT = {'compression.wan.name': 'chunked_topk', 'compression.wan.density': 1.0,
           'compression.wan.value_bits': 2, 'compression.wan.gamma': 1.0}

SPARSE_TWO_BIT = dict(TWO_BIT, **{'compression.wan.density': 0.01, 'compression.small': 'bfloat16'})


def get_sweep():
  seeds = {'seed': [0, 1, 2]}
  return 'configs/shakespeare.py', [
      dict(seeds, **{'sync.k': 1}),
      dict(seeds, **DILOCO),
      dict(seeds, **{'sync.outer.name': 'sgd', 'sync.outer.learning_rate': 1.0,
                     'sync.outer.momentum': 0.0, 'compression.wan.name': 'chunked_topk',
                     'compression.wan.density': 0.02, 'compression.wan.gamma': 0.95}),
      dict(seeds, **DILOCO, **MUON),
      dict(seeds, **DILOCO, **MUON, **TWO_BIT),
      dict(seeds, **DILOCO, **MUON, **SPARSE_TWO_BIT),
  ]
