"""Comparison 2 on configs/shakespeare.py: bidirectional top-k 2% + bf16 small tensors vs
uncompressed, 1 Gbit/s LAN, seeds 0-2; the compressed broadcast (issue 48) at 2%
(configs/sweeps/workloads.py).

  python -m hfl.sweep --sweep=configs/sweeps/shakespeare_compression.py \\
      --root=workdirs/shakespeare_compression
"""

from configs.sweeps import workloads


def get_sweep():
  return 'configs/shakespeare.py', workloads.compression()
