"""Comparison 2 on configs/cifar10.py: bidirectional top-k 2% + bf16 small tensors vs
uncompressed, 1 Gbit/s LAN, seeds 0-2; the compressed broadcast (issue 48) at 2%, 1% and
0.3%, and top-k 1.5% with the round's correction in 4-bit E3M0 (added 2026-12-08;
configs/sweeps/workloads.py). The results page also shows these runs on a 100 Mbit/s
LAN by re-costing their simulated clock (hfl.report.runs.lan_recost, exact for them: the
LAN changes no training here; tests/test_report.py checks it against Fashion-MNIST runs
trained on both LANs), so they are not trained twice.

  python -m hfl.sweep --sweep=configs/sweeps/cifar10_compression.py \\
      --root=workdirs/cifar10_compression
"""

from configs.sweeps import workloads


def get_sweep():
  return 'configs/cifar10.py', workloads.compression((0.02, 0.01, 0.003), e3m0_correction_densities=(0.015,))
