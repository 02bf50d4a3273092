"""Issue 48 on the character LM: what makes top-k 2% (both intra-DC links, the round's
update through the downlink) work under AdamW, 3 seeds each at full length
(docs/compression_adam.md has the seed-0 screening that chose these arms). The
baselines are configs/sweeps/shakespeare_compression.py's uncompressed and
compressed-broadcast runs (same base config, LAN, seeds), so they are not repeated here.

  python -m hfl.sweep --sweep=configs/sweeps/shakespeare_adam.py \\
      --root=workdirs/shakespeare_adam

Arms: a density warm-up that starts dense (100% -> 2% in 4 stages over 250 iterations:
DGC, Lin et al. 2018, sec. 3.3), the embeddings left dense (bfloat16), and both.
9 runs, about 25 minutes each on a 2-core CPU.
"""

from configs.sweeps import workloads

DENSE_START = {'compression.dgc.warmup_steps': 250, 'compression.dgc.initial_density': 1.0}
DENSE_EMBEDDINGS = {'compression.dense_leaves': 'embed'}


def get_sweep():
  lan = {'network.lan_bandwidth_gbps': 1.0}
  topk = {'compression.uplink.name': 'topk', 'compression.downlink.name': 'topk',
          'compression.uplink.density': 0.02, 'compression.downlink.density': 0.02,
          'compression.small': 'bfloat16', 'compression.small_threshold': 16384,
          'compression.broadcast': 'downlink'}
  seeds = {'seed': workloads.SEEDS}
  return 'configs/shakespeare.py', [dict(lan, **topk, **seeds, **DENSE_START),
                                    dict(lan, **topk, **seeds, **DENSE_EMBEDDINGS),
                                    dict(lan, **topk, **seeds, **DENSE_START,
                                         **DENSE_EMBEDDINGS)]
