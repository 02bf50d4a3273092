"""Comparison 1 on configs/cifar10.py: synchronous HPS vs periodic K = 4 vs semi-sync on 4
heterogeneous DCs, seeds 0-2 (configs/sweeps/workloads.py).

  python -m hfl.sweep --sweep=configs/sweeps/cifar10_semisync.py \\
      --root=workdirs/cifar10_semisync
"""

from configs.sweeps import workloads


def get_sweep():
  return 'configs/cifar10.py', workloads.semisync(eval_iters=500)
