"""CO3 on the uplink: fp4 [1,2,1] + GenNorm-designed Huffman, error-feedback decay γ.

The CO3 comparison (convert, compress, correct: hfl.compress.co3; issue 5) on the default experiment: CO3 fp4 with
γ ∈ {0, 0.5, 0.9, 1.0} (1-D leaves stay float32). The uncompressed baseline is
the identity run of configs/sweeps/compression.py (same config: FIXED is shared).

  python -m hfl.sweep --sweep=configs/sweeps/co3.py --root=workdirs/co3
"""

from configs.sweeps.compression import FIXED


def get_sweep():
  return 'configs/default.py', dict(
      FIXED, **{'compression.uplink.name': 'co3', 'compression.uplink.fmt': 'fp4',
                'compression.uplink.gamma': [0.0, 0.5, 0.9, 1.0]})
