"""Comparison 2 on configs/shakespeare.py: bidirectional top-k 2% + bf16 small tensors vs
uncompressed, 1 Gbit/s LAN, seeds 0-2; the compressed broadcast (issue 48) at 2%
(configs/sweeps/workloads.py); and what was tried to make top-k work under AdamW on the
workers (issue 48, docs/compression_adam.md), each with the compressed broadcast:

- ``DENSE_START``: a density warm-up that starts dense, 100% -> 2% in 4 stages over 250
  iterations (DGC, Lin et al. 2018, sec. 3.3);
- ``DENSE_EMBEDDINGS``: the token and position embeddings left dense (bfloat16);
- both;

and, since quantisation updates every coordinate at every iteration (no bursts for
Adam's second moment to average), CO3 fp4 (GenNorm-designed fp4 with Huffman coding and
error feedback with memory decay 0.9, hfl.compress.co3) on the uplink, the downlink and
the round's correction, the thesis's bidirectional compression with its own quantiser:
``CO3_BIDIRECTIONAL`` with the small leaves in bfloat16 below 2^14 entries and with only
the 1-D leaves in bfloat16 (``small_threshold`` 0: 2-D leaves, embeddings included, go
through CO3, which the bytes bar of 10x needs; a 500-iteration screen at 2^14 saved 89.8%).

24 runs, 20-25 minutes each on a 2-core CPU (a CO3 run about twice that). The results page also shows them on a
100 Mbit/s LAN by re-costing their simulated clock (hfl.report.runs.lan_recost).

  python -m hfl.sweep --sweep=configs/sweeps/shakespeare_compression.py \\
      --root=workdirs/shakespeare_compression
"""

from configs.sweeps import workloads

DENSE_START = {'compression.dgc.warmup_steps': 250, 'compression.dgc.initial_density': 1.0}
DENSE_EMBEDDINGS = {'compression.dense_leaves': 'embed'}
CO3_BIDIRECTIONAL = {
    'network.lan_bandwidth_gbps': 1.0, 'seed': workloads.SEEDS,
    'compression.uplink.name': 'co3', 'compression.downlink.name': 'co3',
    'compression.uplink.fmt': 'fp4', 'compression.downlink.fmt': 'fp4',
    'compression.uplink.gamma': 0.9, 'compression.downlink.gamma': 0.9,
    'compression.small': 'bfloat16', 'compression.broadcast': 'downlink'}


def get_sweep():
  points = workloads.compression()
  broadcast = points[-1]  # top-k 2% with the compressed broadcast
  return 'configs/shakespeare.py', points + [
      dict(broadcast, **extra) for extra in
      (DENSE_START, DENSE_EMBEDDINGS, dict(DENSE_START, **DENSE_EMBEDDINGS))] + [
      dict(CO3_BIDIRECTIONAL, **{'compression.small_threshold': t}) for t in (0, 16384)]
