"""Comparison 3 on configs/shakespeare.py: CO3 fp4 (γ = 0 and 0.9) vs uncompressed on a synchronous
PS over IID shards, seeds 0-2 (configs/sweeps/workloads.py).

  python -m hfl.sweep --sweep=configs/sweeps/shakespeare_co3.py --root=workdirs/shakespeare_co3
"""

from configs.sweeps import workloads


def get_sweep():
  return 'configs/shakespeare.py', workloads.co3(paper_optimizer=False)
