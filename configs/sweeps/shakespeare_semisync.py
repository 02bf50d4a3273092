"""Comparison 1 on configs/shakespeare.py: synchronous HPS vs periodic K = 4 vs semi-sync on 4
heterogeneous DCs, seeds 0-2 (configs/sweeps/workloads.py).

  python -m hfl.sweep --sweep=configs/sweeps/shakespeare_semisync.py \\
      --root=workdirs/shakespeare_semisync
"""

from configs.sweeps import workloads


def get_sweep():
  return 'configs/shakespeare.py', workloads.semisync(eval_iters=400)
