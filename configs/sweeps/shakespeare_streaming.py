"""Streaming DiLoCo on the character LM (issue 14), seeds 0-2, 512 iterations:

1. data parallel: ``sync.strategy = 'sync'`` (K = 1, FedAvg of one step: every
   iteration's update crosses the WAN uncompressed);
2. DiLoCo: K = H = 16, Nesterov outer optimizer (lr 0.7, Douillard et al. 2023)
   with momentum 0.5, uncompressed float32 pseudo-gradients. The published momentum
   0.9 was tuned for H = 500; at H = 16 it ended 0.078 nats above K = 1 in the LM's
   DiLoCo check (configs/sweeps/shakespeare_diloco.py, seed 0), momentum 0.5 within
   0.01, so both arms here use that check's ``DILOCO_H16`` (chosen before this sweep
   ran, not tuned on it);
3. Streaming DiLoCo (Douillard et al. 2025, arXiv:2501.18512): the same H = 16
   and outer optimizer, P = 4 fragments (one every 4 iterations; the transformer's
   four blocks, the embeddings and head joining the first and last), each merged
   τ = 1 iteration after its sync with α = 0.5, outer gradients of every matrix in
   4-bit E3M0 (``compression.wan.name = 'e3m0'``; 1-D leaves stay float32) with
   WAN error feedback.

Everything else is configs/shakespeare.py (AdamW, warm-up + cosine, 2 DCs x 4
workers, 100 Mbit/s WAN at 20 ms) with ``train.num_steps = 512`` (a multiple of
H and H / P; the warm-up stays 100 iterations, the cosine decay ends at 512) to
keep the nine runs affordable on a 2-core machine: 128 iterations of the
streaming arm took 474 s of wall time on the shared, busy machine (compilation
of its 9 programs and one evaluation included; median local iteration 1.15 s),
so a run is roughly 10-15 minutes there. Evaluations every 128 iterations for
every arm (``train.eval_every`` counts rounds, which hold 1, 16 and 4
iterations). Each run's summary.json holds the table's columns:
``final_test_loss``, ``bytes.inter_dc``, ``peak_wan_bytes_per_sync``,
``exposed_wan_s``, ``compute_utilisation`` and ``wan_mbps_for_95pct_utilisation``.

  python -m hfl.sweep --sweep=configs/sweeps/shakespeare_streaming.py \\
      --root=workdirs/shakespeare_streaming
  python3 docs/results/make_results.py --no-run   # the results page's section
"""

from configs.sweeps.shakespeare_diloco import DILOCO_H16
from configs.sweeps.workloads import SEEDS

STEPS = {'train.num_steps': 512}
DILOCO = dict(DILOCO_H16, **{'sync.k': 16})
STREAMING = {'sync.fragments': 4, 'sync.overlap_steps': 1, 'sync.mixing_alpha': 0.5,
             'compression.wan.name': 'e3m0'}


def get_sweep():
  return 'configs/shakespeare.py', [
      dict(STEPS, **{'seed': SEEDS, 'sync.strategy': 'sync', 'sync.k': 1,
                     'train.eval_every': 128}),
      dict(STEPS, **DILOCO, **{'seed': SEEDS, 'train.eval_every': 8}),
      dict(STEPS, **DILOCO, **STREAMING, **{'seed': SEEDS, 'train.eval_every': 32}),
  ]
