"""Heterogeneous DCs for the semi-synchronous comparison (hfl.sync.frequency, issue 4).

4 DCs x 2 workers whose compute speeds are spread 3x apart, a 100 Mbit/s WAN with
20 ms latency, non-IID Fashion-MNIST (Dirichlet 0.5). Pick the strategy with
``--config.sync.strategy=sync|periodic|semi_sync|adacomm`` (and
``--config.sync.progress_aware=True``).

  python main.py --config=configs/semisync.py --workdir=/tmp/hfl_semisync
"""

from configs import default


def get_config(arg: str | None = None):
  c = default.get_config(arg)
  c.mesh.num_dcs = 4
  c.mesh.workers_per_dc = 2
  c.network.dc_speed = (3.0, 2.0, 1.5, 1.0)   # fastest / slowest = 3x
  c.network.wan_bandwidth_mbps = 100.0
  c.network.wan_latency_s = 0.02
  c.sync.strategy = 'semi_sync'
  c.sync.k = 4
  c.sync.k_max = 32
  c.train.num_steps = 600
  c.train.eval_every = 5
  c.train.target_accuracy = 0.85
  return c
