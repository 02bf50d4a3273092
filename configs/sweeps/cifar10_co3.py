"""Comparison 3 on configs/cifar10.py: CO3 fp4 (γ = 0 and 0.9) vs uncompressed on a synchronous
PS over IID shards, seeds 0-2 (configs/sweeps/workloads.py).

  python -m hfl.sweep --sweep=configs/sweeps/cifar10_co3.py --root=workdirs/cifar10_co3
"""

from configs.sweeps import workloads


def get_sweep():
  return 'configs/cifar10.py', workloads.co3(paper_optimizer=True)
