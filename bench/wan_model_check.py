"""Measured inter-DC round time over an emulated WAN vs the network model's prediction.

For each WAN payload and K, the same run is made twice with one process per DC:
over a shaped link (launch/emulated_wan.py: network namespaces, rate and one-way
delay) and over loopback (launch/local_multiprocess.py). Each run times its own
iterations (summary.json ``step_wall_s``: median wall-clock of the round
iterations, compilations left out), so

  measured C = median round iteration over the WAN - the same over loopback

is the wall-clock the inter-DC exchange adds to a round. It is compared with the
model's C_d = max(egress, ingress) / bandwidth + H x one-way latency
(``hfl.network.round_comm_time``, from the bits the run counted). First H is
calibrated on K=1 without compression, from runs without and with the delay
(H = (C(delay) - C(0)) / delay; C(0) also checks the bandwidth term); then every
(payload, K) is compared with the model at the default H=2 and at the fitted H.

XLA:CPU sends a bf16 collective as f32 (it upcasts it in the compiled program),
so on CPU a bf16 WAN payload puts the *f32* bytes on the wire; the half-precision
row here is fp16, which XLA:CPU keeps 16-bit. Root and Linux network namespaces
are required.

  python bench/wan_model_check.py [--wan_mbps=100] [--wan_latency_ms=20] [--ks=1,4,16]
      [--wans=identity,fp16] [--rounds=10]

Each run writes its rounds' timing to a temporary workdir (removed at the end
unless --keep); about 13 runs of ~20 s.
"""

import argparse
import json
import os
import shutil
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
  ap = argparse.ArgumentParser(
      description='Measured inter-DC round time over an emulated WAN (root, network '
      'namespaces) vs the network model: calibrates H (one-way latencies per round) and '
      'prints a markdown table of measured / model per K and WAN payload. About 13 runs '
      'of ~20 s each.', formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  ap.add_argument('--wan_mbps', type=float, default=100.0, help='WAN rate per DC, Mbit/s')
  ap.add_argument('--wan_latency_ms', type=float, default=20.0, help='one-way WAN delay, ms')
  ap.add_argument('--rounds', type=int, default=10, help='inter-DC rounds per run')
  ap.add_argument('--ks', default='1,4,16', help='comma-separated K (local steps per round)')
  ap.add_argument('--wans', default='identity,fp16',
                  help='comma-separated WAN compressors (compression.wan.name)')
  ap.add_argument('--keep', action='store_true', help='keep the runs\' temporary workdirs')
  ap.add_argument('--config', default='configs/smoke.py',
                  help='experiment config (its model sets the WAN payload arrays; one '
                  'process per DC)')
  args = ap.parse_args()
  root = tempfile.mkdtemp(prefix='hfl_wan_')
  sys.path.insert(0, os.path.join(REPO, 'launch'))
  import emulated_wan  # pylint: disable=g-import-not-at-top
  num_dcs = emulated_wan.config_value([f'--config={args.config}'], 'mesh.num_dcs', 2)
  try:
    bench(args, root, num_dcs)
  finally:
    if not args.keep:
      shutil.rmtree(root, ignore_errors=True)


def bench(args, root, num_dcs):
  """Runs the calibration and the table (see the module docstring)."""
  loops = {}

  def measure(wan, k, latency_ms):
    """(measured C, bits per DC per round, timed rounds, delay method) of one WAN run."""
    common = [f'--config={args.config}', f'--config.sync.k={k}',
              f'--config.train.num_steps={args.rounds * k}', '--config.train.eval_every=100000',
              '--config.train.checkpoint_every=0', '--config.train.log_every=100000',
              f'--config.compression.wan.name={wan}',
              f'--config.network.wan_bandwidth_mbps={args.wan_mbps}',
              f'--config.network.wan_latency_s={latency_ms / 1000}']
    if (wan, k) not in loops:  # the loopback reference does not depend on the latency
      loop = os.path.join(root, f'loop_{wan}_k{k}')
      loops[wan, k] = run([sys.executable, 'launch/local_multiprocess.py',
                           f'--num_processes={num_dcs}', '--', *common, f'--workdir={loop}'], loop)
    shaped = os.path.join(root, f'wan_{wan}_k{k}_{latency_ms:g}ms')
    s_wan = run([sys.executable, 'launch/emulated_wan.py', f'--wan_mbps={args.wan_mbps}',
                 f'--wan_latency_ms={latency_ms}', '--', *common, f'--workdir={shaped}'], shaped)
    with open(os.path.join(shaped, 'wan_info.json')) as f:
      info = json.load(f)
    if latency_ms and not info['one_way_delay_ms']:
      raise RuntimeError(f'no delay could be added ({info}); cannot measure latencies.')
    measured = s_wan['step_wall_s']['round_median'] - loops[wan, k]['step_wall_s']['round_median']
    # Bits of each DC's payload per round (the counted payload; inter_dc counts each
    # DC's payload once per receiving DC, hfl.network.link_bytes).
    bits = s_wan['bytes']['inter_dc'] * 8 / s_wan['inter_dc_rounds'] / (num_dcs * (num_dcs - 1))
    return measured, bits, s_wan['step_wall_s']['round_n'], info['delay_method']

  def model(bits, latency_ms, hops):
    net = network.NetworkModel(
        compute_s=np.zeros(num_dcs), lan_bps=1e12, lan_latency_s=0.0,
        wan_bps=args.wan_mbps * 1e6, wan_latency_s=latency_ms / 1000,
        wan_latencies_per_round=hops)
    return float(np.max(network.round_comm_time(net, np.full(num_dcs, bits))))

  # ---- 1. Calibration: K=1, uncompressed, without and with the delay.
  lat = args.wan_latency_ms
  c0, bits0, _, _ = measure('identity', 1, 0.0)
  c1, _, _, how = measure('identity', 1, lat)
  hops = (c1 - c0) / (lat / 1000)
  print(f'Calibration (K=1, identity, {bits0 / 8e6:.3f} MB per DC per round): '
        f'C at 0 ms = {c0 * 1e3:.1f} ms (model bandwidth term {model(bits0, 0, 0) * 1e3:.1f} ms, '
        f'ratio {c0 / model(bits0, 0, 0):.2f}); C at {lat:g} ms = {c1 * 1e3:.1f} ms '
        f'-> H = {hops:.1f} one-way latencies per round ({how}).', flush=True)

  # ---- 2. Validation over K and WAN payloads at the configured delay.
  rows = []
  for wan in args.wans.split(','):
    for k in [int(x) for x in args.ks.split(',')]:
      c, bits, n, how = (c1, bits0, None, how) if (wan, k) == ('identity', 1) else \
          measure(wan, k, lat)
      rows.append((wan, k, n, bits / 8, c, model(bits, lat, 2.0), model(bits, lat, hops), how))
      print(rows[-1], flush=True)
  print(f'| WAN payload | K | bytes per DC per round | measured C (ms) | model, H=2 (ms) '
        f'| measured / model | model, H={hops:.1f} (ms) | measured / model | delay |')
  print('|---|---|---|---|---|---|---|---|---|')
  for wan, k, n, b, c, m2, mh, how in rows:
    print(f'| {wan} | {k} | {b / 1e6:.3f} MB | {c * 1e3:.1f} | {m2 * 1e3:.1f} | {c / m2:.2f} '
          f'| {mh * 1e3:.1f} | {c / mh:.2f} | {how} |')


if __name__ == '__main__':
  main()
