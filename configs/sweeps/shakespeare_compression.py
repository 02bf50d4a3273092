"""Comparison 2 on configs/shakespeare.py: bidirectional top-k 2% + bf16 small tensors vs
uncompressed, 1 Gbit/s LAN, seeds 0-2; the compressed broadcast (issue 48) at 2%
(configs/sweeps/workloads.py); and what was tried to make top-k work under AdamW on the
workers (issue 48, docs/compression_adam.md), each with the compressed broadcast:

- ``DENSE_START``: a density warm-up that starts dense, 100% -> 2% in 4 stages over 250
  iterations (DGC, Lin et al. 2018, sec. 3.3);
- ``DENSE_EMBEDDINGS``: the token and position embeddings left dense (bfloat16);
- both.

18 runs, 20-25 minutes each on a 2-core CPU. The results page also shows them on a
100 Mbit/s LAN by re-costing their simulated clock (hfl.report.runs.lan_recost).

  python -m hfl.sweep --sweep=configs/sweeps/shakespeare_compression.py \\
      --root=workdirs/shakespeare_compression
"""

from configs.sweeps import workloads

DENSE_START = {'compression.dgc.warmup_steps': 250, 'compression.dgc.initial_density': 1.0}
DENSE_EMBEDDINGS = {'compression.dense_leaves': 'embed'}


def get_sweep():
  points = workloads.compression()
  broadcast = points[-1]  # top-k 2% with the compressed broadcast
  return 'configs/shakespeare.py', points + [
      dict(broadcast, **extra) for extra in
      (DENSE_START, DENSE_EMBEDDINGS, dict(DENSE_START, **DENSE_EMBEDDINGS))]
