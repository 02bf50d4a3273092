"""Streaming DiLoCo on the character LM (issue 14), seeds 0-2, the LM config's 2,000
iterations:

1. data parallel: ``sync.strategy = 'sync'`` (K = 1, FedAvg of one step: every
   iteration's update crosses the WAN uncompressed);
2. DiLoCo: K = H = 16, Nesterov outer optimizer (lr 0.7, Douillard et al. 2023)
   with momentum 0.5, uncompressed float32 pseudo-gradients. The published momentum
   0.9 was tuned for H = 500; at H = 16 it ended 0.078 nats above K = 1 in the LM's
   DiLoCo check, momentum 0.5 within 0.01 (configs/sweeps/shakespeare_diloco.py,
   whose ``DILOCO_H16`` both arms here use: chosen before this sweep ran, not tuned
   on it);
3. Streaming DiLoCo (Douillard et al. 2025, arXiv:2501.18512): the same H = 16
   and outer optimizer, P = 4 fragments (one every 4 iterations; the transformer's
   four blocks, the embeddings and head joining the first and last), each merged
   τ = 1 iteration after its sync with α = 0.5, outer gradients of every matrix in
   4-bit E3M0 (``compression.wan.name = 'e3m0'``; 1-D leaves stay float32) with
   WAN error feedback.

Everything else is configs/shakespeare.py (AdamW, warm-up + cosine over 2,000
iterations, 2 DCs x 4 workers, 100 Mbit/s WAN at 20 ms). Arms 1 and 2 are exactly
the DiLoCo check's K = 1 and momentum-0.5 points (same overrides, hence the same
workdir names and the same runs): a run finished under either sweep's root can be
copied to the other's instead of being trained twice. Evaluations every 400
iterations for every arm (``train.eval_every`` counts rounds, which hold 1, 16 and
H / P = 4 iterations). A first attempt at 512 iterations was stopped after its
data-parallel and DiLoCo runs of seed 0: at 512 iterations DiLoCo still trailed
data parallel by 2.3% (2.059 vs 2.013 nats), far more than at the LM's full length.
Cost on the shared 2-core machine (another job running): 17-19 minutes of wall time
for a data-parallel or DiLoCo run, 22 for a streaming one (seed 0). Each run's
summary.json holds the table's columns: ``final_test_loss``, ``bytes.inter_dc``,
``peak_wan_bytes_per_sync``, ``exposed_wan_s``, ``compute_utilisation`` and
``wan_mbps_for_95pct_utilisation``.

  python -m hfl.sweep --sweep=configs/sweeps/shakespeare_streaming.py \\
      --root=workdirs/shakespeare_streaming
  python3 docs/results/make_results.py --no-run   # the results page's section
"""

from configs.sweeps.shakespeare_diloco import DILOCO_H16, H16, K1
from configs.sweeps.workloads import SEEDS

DP = K1
DILOCO = dict(DILOCO_H16, **H16)
STREAMING = dict(DILOCO, **{'sync.fragments': 4, 'sync.overlap_steps': 1,
                            'sync.mixing_alpha': 0.5, 'compression.wan.name': 'e3m0',
                            'train.eval_every': 100})


def get_sweep():
  return 'configs/shakespeare.py', [dict(DP, seed=SEEDS), dict(DILOCO, seed=SEEDS),
                                    dict(STREAMING, seed=SEEDS)]
