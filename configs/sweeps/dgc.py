"""DGC's techniques on top of bidirectional top-k at the highest compressions.

configs/sweeps/compression.py finds plain top-k + error feedback losing 2.6 points
at density 0.1% (≈ 244× fewer intra-DC bytes). DGC (Lin et al., ICLR 2018) reports
270–600× without loss thanks to momentum correction (the workers accumulate and
sparsify the momentum velocity, with momentum-factor masking) and a density
warm-up. This sweep runs them at densities 0.3% and 0.1% on both links, with plain
SGD on the workers (momentum correction replaces the optimizer's momentum 0.9 at
the same learning rate, so the uncompressed momentum-SGD run of the compression
sweep is the reference), warm-up over the first 100 of 600 iterations from 25% in
4 stages. All else as in the compression sweep (1 Gbit/s LAN, bf16 small tensors).

  python -m hfl.sweep --sweep=configs/sweeps/dgc.py --root=workdirs/dgc
"""

from configs.sweeps.compression import FIXED


def get_sweep():
  run = dict(FIXED, **{
      'compression.uplink.name': 'topk', 'compression.downlink.name': 'topk',
      'compression.small': 'bfloat16', 'compression.small_threshold': 16384,
      'optimizer.name': 'sgd', 'compression.dgc.momentum': 0.9,
      'compression.dgc.warmup_steps': 100, 'compression.dgc.initial_density': 0.25,
      'compression.dgc.num_stages': 4,
      # The round's model re-gathered, as these runs (docs/dgc.md) ran before issue 48.
      'compression.broadcast': 'gather'})
  return 'configs/default.py', [
      dict(run, **{'compression.uplink.density': d, 'compression.downlink.density': d})
      for d in (0.003, 0.001)]
