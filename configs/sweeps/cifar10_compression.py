"""Comparison 2 on configs/cifar10.py: bidirectional top-k 2% + bf16 small tensors vs
uncompressed, 1 Gbit/s LAN, seeds 0-2 (configs/sweeps/workloads.py).

  python -m hfl.sweep --sweep=configs/sweeps/cifar10_compression.py \\
      --root=workdirs/cifar10_compression
"""

from configs.sweeps import workloads


def get_sweep():
  return 'configs/cifar10.py', workloads.compression()
