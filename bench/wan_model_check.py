"""Measured inter-DC round time over an emulated WAN vs the network model's prediction.

For each K and WAN compressor, the same run is made twice with one process per DC:
over a shaped link (launch/emulated_wan.py: network namespaces + tc) and over
loopback (launch/local_multiprocess.py). The extra wall-clock per inter-DC round,
(wall_WAN - wall_loopback) / rounds, is compared with the model's C_d
(hfl.network.round_comm_time, from the bytes the run counted). Root and Linux
network namespaces are required. The link is shaped with netem (rate + delay)
where the kernel has it, else tbf (rate only; the model's latency is then set to 0
to match).

  python bench/wan_model_check.py [--wan_mbps=100] [--steps=64] [--ks=1,4,16]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
  ap.add_argument('--steps', type=int, default=64)
  ap.add_argument('--ks', default='1,4,16')
  ap.add_argument('--wans', default='identity,bf16')
  args = ap.parse_args()
  root = tempfile.mkdtemp(prefix='hfl_wan_')
  rows = []
  for wan in args.wans.split(','):
    for k in [int(x) for x in args.ks.split(',')]:
      common = ['--config=configs/smoke.py', f'--config.sync.k={k}',
                f'--config.train.num_steps={args.steps}', '--config.train.eval_every=100000',
                '--config.train.checkpoint_every=0', f'--config.compression.wan.name={wan}',
                f'--config.network.wan_bandwidth_mbps={args.wan_mbps}']
      shaped = os.path.join(root, f'wan_{wan}_k{k}')
      s_wan = run([sys.executable, 'launch/emulated_wan.py', f'--wan_mbps={args.wan_mbps}',
                   f'--wan_latency_ms={args.wan_latency_ms}', '--',
                   *common, f'--workdir={shaped}'], shaped)
      with open(os.path.join(shaped, 'wan_info.json')) as f:
        info = json.load(f)
      latency_s = float(info.get('one_way_delay_ms', 0.0)) / 1000
      loop = os.path.join(root, f'loop_{wan}_k{k}')
      s_loop = run([sys.executable, 'launch/local_multiprocess.py', '--num_processes=2', '--',
                    *common, f'--workdir={loop}'], loop)
      rounds = s_wan['inter_dc_rounds']
      per_dc_bits = s_wan['bytes']['inter_dc'] * 8 / rounds / 2  # 2 DCs, one peer each
      model = per_dc_bits / (args.wan_mbps * 1e6) + 2 * latency_s
      measured = (s_wan['wall_time_s'] - s_loop['wall_time_s']) / rounds
      rows.append((wan, k, rounds, per_dc_bits / 8, s_wan['wall_time_s'], s_loop['wall_time_s'],
                   measured, model, info.get('qdisc')))
  print(f'| WAN payload | K | rounds | bytes per DC per round | wall, WAN (s) | wall, loopback (s) '
        f'| measured extra per round (ms) | model C_d (ms) | measured / model | qdisc |')
  print('|---|---|---|---|---|---|---|---|---|---|')
  for wan, k, rounds, b, ww, wl, meas, mod, q in rows:
    print(f'| {wan} | {k} | {rounds} | {b / 1e6:.3f} MB | {ww:.1f} | {wl:.1f} | {meas * 1e3:.1f} '
          f'| {mod * 1e3:.1f} | {meas / mod:.2f} | {q} |')


if __name__ == '__main__':
  main()
