"""Measured inter-DC round time over an emulated WAN vs the network model's prediction.

For each WAN payload and K, the same run is made twice with one process per DC:
over a shaped link (launch/emulated_wan.py: network namespaces, rate and one-way
delay) and over loopback (launch/local_multiprocess.py). Each run times its own
iterations (summary.json ``step_wall_s``: median wall-clock of the round
iterations, compilations left out), so

  measured C = median round iteration over the WAN - the same over loopback

is the wall-clock the inter-DC exchange adds to a round. It is compared with the
model's C_d = max(egress, ingress) / bandwidth + 2 x one-way latency
(``hfl.network.round_comm_time``, from the bits the run counted).

XLA:CPU sends a bf16 collective as f32 (it upcasts it in the compiled program),
so on CPU a bf16 WAN payload puts the *f32* bytes on the wire; the half-precision
row here is fp16, which XLA:CPU keeps 16-bit. Root and Linux network namespaces
are required.

  python bench/wan_model_check.py [--wan_mbps=100] [--wan_latency_ms=20] [--ks=1,4,16]
      [--wans=identity,fp16] [--rounds=10]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from hfl import network  # pylint: disable=g-import-not-at-top,wrong-import-position


def run(cmd, workdir):
  out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800)
  if out.returncode:
    raise RuntimeError(f'{" ".join(cmd)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}')
  with open(os.path.join(workdir, 'summary.json')) as f:
    return json.load(f)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument('--wan_mbps', type=float, default=100.0)
  ap.add_argument('--wan_latency_ms', type=float, default=20.0)
  ap.add_argument('--rounds', type=int, default=10, help='inter-DC rounds per run')
  ap.add_argument('--ks', default='1,4,16')
  ap.add_argument('--wans', default='identity,fp16')
  args = ap.parse_args()
  root = tempfile.mkdtemp(prefix='hfl_wan_')
  rows = []
  for wan in args.wans.split(','):
    for k in [int(x) for x in args.ks.split(',')]:
      common = ['--config=configs/smoke.py', f'--config.sync.k={k}',
                f'--config.train.num_steps={args.rounds * k}', '--config.train.eval_every=100000',
                '--config.train.checkpoint_every=0', '--config.train.log_every=100000',
                f'--config.compression.wan.name={wan}',
                f'--config.network.wan_bandwidth_mbps={args.wan_mbps}',
                f'--config.network.wan_latency_s={args.wan_latency_ms / 1000}']
      shaped = os.path.join(root, f'wan_{wan}_k{k}')
      s_wan = run([sys.executable, 'launch/emulated_wan.py', f'--wan_mbps={args.wan_mbps}',
                   f'--wan_latency_ms={args.wan_latency_ms}', '--',
                   *common, f'--workdir={shaped}'], shaped)
      with open(os.path.join(shaped, 'wan_info.json')) as f:
        info = json.load(f)
      loop = os.path.join(root, f'loop_{wan}_k{k}')
      s_loop = run([sys.executable, 'launch/local_multiprocess.py', '--num_processes=2', '--',
                    *common, f'--workdir={loop}'], loop)
      rounds = s_wan['inter_dc_rounds']
      num_dcs = 2
      # Bits each DC put on the WAN per round (the counted payload; each DC's reaches
      # the one other DC), and the model's C_d for them.
      per_dc_bits = s_wan['bytes']['inter_dc'] * 8 / rounds / num_dcs
      net = network.NetworkModel(
          compute_s=np.zeros(num_dcs), lan_bps=1e12, lan_latency_s=0.0,
          wan_bps=args.wan_mbps * 1e6, wan_latency_s=float(info['one_way_delay_ms']) / 1000)
      model = float(np.max(network.round_comm_time(net, np.full(num_dcs, per_dc_bits))))
      measured = s_wan['step_wall_s']['round_median'] - s_loop['step_wall_s']['round_median']
      rows.append((wan, k, rounds, s_wan['step_wall_s']['round_n'], per_dc_bits / 8,
                   s_wan['step_wall_s']['round_median'], s_loop['step_wall_s']['round_median'],
                   measured, model, info['delay_method']))
      print(rows[-1], flush=True)
  print('| WAN payload | K | rounds (timed) | bytes per DC per round | round iteration, WAN (ms) '
        '| round iteration, loopback (ms) | measured C (ms) | model C_d (ms) | measured / model '
        '| delay |')
  print('|---|---|---|---|---|---|---|---|---|---|')
  for wan, k, rounds, n, b, ww, wl, meas, mod, how in rows:
    print(f'| {wan} | {k} | {rounds} ({n}) | {b / 1e6:.3f} MB | {ww * 1e3:.1f} | {wl * 1e3:.1f} '
          f'| {meas * 1e3:.1f} | {mod * 1e3:.1f} | {meas / mod:.2f} | {how} |')


if __name__ == '__main__':
  main()
