"""Measured inter-DC round time over an emulated WAN vs the network model's prediction.

For each WAN payload, K and one-way latency, the same run is made with one
process per DC over a shaped link (launch/emulated_wan.py: network namespaces,
rate and delay) and, once per (payload, K), over loopback
(launch/local_multiprocess.py). Each run times its own round iterations
(summary.json ``step_wall_s``: the step with the inter-DC exchange plus the host
loop's gather of the round's metrics, compilations left out), so

  measured C = round iteration over the WAN - the same over loopback

is the wall-clock the WAN adds to a round. On a shared machine the load drifts
between runs and within them, so each round is paired with its own local
iterations, run moments before: summary.json's ``excess_median`` is the median
over rounds of (round iteration - median of that round's local iterations), and

  measured C = excess over the WAN - excess over loopback

(medians over ``--repeats`` interleaved repetitions). K must be >= 2 for the
pairing; the difference of plain round medians is shown for reference. It is compared with the model's
C_d = max(egress, ingress) / bandwidth + H x one-way latency
(``hfl.network.round_comm_time``, from the bits the run counted), with ONE H for
all latencies and K, not fitted: H = ``hfl.network.gloo_round_latencies`` of the
round's collectives (derived from gloo's algorithms: a fused ring all-reduce for
linear WAN payloads, a fused all-gather for the others, and the metrics gather).
The default H=2 (one exchange) is shown alongside.

XLA:CPU sends a bf16 collective as f32 (it upcasts it in the compiled program),
so on CPU a bf16 WAN payload puts the *f32* bytes on the wire; use fp16 for a
16-bit row. Root and Linux network namespaces are required.

  sudo python3 bench/wan_model_check.py [--wan_mbps=100] [--latencies_ms=10,20]
      [--ks=2,8] [--wans=identity] [--rounds=10] [--repeats=3]

Each run writes to a temporary workdir (removed at the end unless --keep); per
(payload, K) one loopback and one WAN run per latency, ~1 min each on a busy
2-core machine.
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
sys.path.insert(0, os.path.join(REPO, 'launch'))
import common  # launch/common.py  # pylint: disable=g-import-not-at-top,wrong-import-position
from hfl import network  # pylint: disable=g-import-not-at-top,wrong-import-position
from hfl.compress import policy  # pylint: disable=g-import-not-at-top,wrong-import-position
sys.path.insert(0, os.path.join(REPO, 'bench'))
from arg_types import (  # pylint: disable=g-import-not-at-top,wrong-import-position
    existing_path, int_at_least, int_list, names_in, number_in, number_list)


def run(cmd, workdir):
  out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
  if out.returncode:
    raise RuntimeError(f'{" ".join(cmd)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}')
  with open(os.path.join(workdir, 'summary.json')) as f:
    return json.load(f)


def round_latencies(config: str, wan: str, num_dcs: int) -> int:
  """H of the configured run's round over gloo (hfl.network.gloo_round_latencies).

  The round's inter-DC collectives follow hfl.step / hfl.collectives: the linear
  (identity, cast) WAN payloads are all-reduced in one buffer per dtype, each of
  the W workers sending its 1/W slice; all others are all-gathered in one byte
  buffer; the host loop adds one metrics gather.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from hfl import config as config_lib, models  # pylint: disable=g-import-not-at-top
  from hfl import setup as setup_lib  # pylint: disable=g-import-not-at-top
  from hfl.compress import policy  # pylint: disable=g-import-not-at-top
  cfg = config_lib.apply_overrides(config_lib.load_file(config), {'compression.wan.name': wan})
  workers = cfg.mesh.workers_per_dc
  net = models.get_model(cfg.model.name, 10)
  shape = {'fashion_mnist': (1, 28, 28, 1), 'cifar10': (1, 32, 32, 3)}[cfg.dataset.name]
  params = jax.eval_shape(lambda: net.init(jax.random.PRNGKey(0), jnp.zeros(shape))['params'])
  comps = setup_lib.build_compressors(cfg, params)
  per_dtype, gathers = {}, 0
  for c in comps.wan:
    leaves = jax.tree.leaves(policy.payload_shape(c))
    if c.linear:
      for leaf in leaves:
        per_dtype.setdefault(jnp.dtype(leaf.dtype), 0)
        per_dtype[jnp.dtype(leaf.dtype)] += int(np.prod(leaf.shape))
    else:
      gathers = 1
  buffers = [-(-n // workers) * d.itemsize for d, n in per_dtype.items()]
  return network.gloo_round_latencies(num_dcs, allreduce_bytes=buffers, allgathers=gathers)


def main():
  ap = argparse.ArgumentParser(
      description='Measured inter-DC round time over an emulated WAN (root, network '
      'namespaces) vs the network model with one H derived from gloo\'s algorithms, at '
      'several latencies and K; prints a markdown table.',
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  ap.add_argument('--wan_mbps', type=number_in(0, lo_open=True), default=100.0,
                  help='WAN rate per DC, Mbit/s')
  ap.add_argument('--latencies_ms', type=number_list(0), default='10,20',
                  help='comma-separated one-way delays, ms')
  ap.add_argument('--rounds', type=int_at_least(1), default=10, help='inter-DC rounds per run')
  ap.add_argument('--repeats', type=int_at_least(1), default=3,
                  help='runs of each (payload, K, latency), interleaved with the loopback '
                  'runs; medians are taken over them (a shared machine\'s load drifts)')
  ap.add_argument('--ks', type=int_list(2), default='2,8',
                  help='comma-separated K >= 2 (local steps per round; the local iterations '
                  'are the paired reference of each round)')
  ap.add_argument('--wans', type=names_in(policy.REGISTRY, 'compressor'), default='identity',
                  help='comma-separated WAN compressors (compression.wan.name)')
  ap.add_argument('--keep', action='store_true', help='keep the runs\' temporary workdirs')
  ap.add_argument('--config', type=existing_path(files_only=True),
                  default=os.path.join(REPO, 'configs', 'smoke.py'),
                  help='experiment config (its model sets the WAN payload; one process '
                  'per DC); a relative path is the caller\'s')
  args = ap.parse_args()
  config = os.path.abspath(args.config)
  num_dcs = common.config_value([f'--config={config}'], 'mesh.num_dcs', 2)
  root = tempfile.mkdtemp(prefix='hfl_wan_')
  try:
    bench(args, config, root, num_dcs)
  finally:
    if not args.keep:
      shutil.rmtree(root, ignore_errors=True)


def bench(args, config, root, num_dcs):
  """Runs every (payload, K, latency) and prints the table (see the module docstring)."""
  rows = []
  lats = args.latencies_ms
  for wan in args.wans:
    for k in args.ks:
      common_args = [f'--config={config}', f'--config.sync.k={k}',
                     f'--config.train.num_steps={args.rounds * k}',
                     '--config.train.eval_every=100000', '--config.train.checkpoint_every=0',
                     '--config.train.log_every=100000', f'--config.compression.wan.name={wan}',
                     f'--config.network.wan_bandwidth_mbps={args.wan_mbps}']
      hops = round_latencies(config, wan, num_dcs)
      # (paired excess, round median) of each run, seconds.
      loop_s, wan_s, bits, info = [], {lat: [] for lat in lats}, None, {}
      for rep in range(args.repeats):  # interleaved, so load drift hits all alike
        loop = os.path.join(root, f'loop_{wan}_k{k}_{rep}')
        s_loop = run([sys.executable, os.path.join(REPO, 'launch', 'local_multiprocess.py'),
                      f'--num_processes={num_dcs}', '--', *common_args, f'--workdir={loop}'],
                     loop)
        loop_s.append(_times(s_loop, k))
        for lat in lats:
          shaped = os.path.join(root, f'wan_{wan}_k{k}_{lat:g}ms_{rep}')
          s_wan = run([sys.executable, os.path.join(REPO, 'launch', 'emulated_wan.py'),
                       f'--wan_mbps={args.wan_mbps}', f'--wan_latency_ms={lat}', '--',
                       *common_args, f'--config.network.wan_latency_s={lat / 1000}',
                       f'--workdir={shaped}'], shaped)
          with open(os.path.join(shaped, 'wan_info.json')) as f:
            info[lat] = json.load(f)
          if lat and not info[lat]['one_way_delay_ms']:
            raise RuntimeError(f'no delay could be added ({info}); cannot measure latencies.')
          wan_s[lat].append(_times(s_wan, k))
          # Bits of each DC's payload per round (inter_dc counts each DC's payload
          # once per receiving DC, hfl.network.link_bytes).
          bits = (s_wan['bytes']['inter_dc'] * 8 / s_wan['inter_dc_rounds']
                  / (num_dcs * (num_dcs - 1)))
          n = s_wan['step_wall_s']['round_n']
        fmt = lambda v: f'{v[0] * 1e3:.1f} (round median {v[1] * 1e3:.1f})'
        print(f'{wan} K={k} rep {rep}, over {n} rounds, ms: paired excess (round median): '
              f'loopback {fmt(loop_s[-1])}, WAN ' + ', '.join(
                  f'{lat:g} ms: {fmt(wan_s[lat][-1])}' for lat in lats), flush=True)
      for lat in lats:
        paired, med = (float(np.median([v[i] for v in wan_s[lat]])
                             - np.median([v[i] for v in loop_s])) for i in (0, 1))
        rows.append((wan, k, lat, bits / 8, paired, med, model(args, num_dcs, bits, lat, 2),
                     hops, model(args, num_dcs, bits, lat, hops)))
  print(f'\nmeasured C: medians over the {args.repeats} repetitions, WAN run - loopback run, of '
        'the paired excess (per round: the round iteration - the median of its own local '
        'iterations; median over rounds) and, for reference, of the median round iteration '
        '(exposed to the load drifting between runs).\n')
  print('| WAN payload | K | one-way latency | bytes per DC per round | model, H=2 (ms) '
        '| measured / model | H (gloo) | model, gloo H (ms) | measured C, paired (ms) '
        '| measured / model | measured C, round medians (ms) | measured / model |')
  print('|---|---|---|---|---|---|---|---|---|---|---|---|')
  for wan, k, lat, b, paired, med, m2, hops, mh in rows:
    print(f'| {wan} | {k} | {lat:g} ms | {b / 1e6:.3f} MB | {m2 * 1e3:.1f} | {paired / m2:.2f} '
          f'| {hops} | {mh * 1e3:.1f} | {paired * 1e3:.1f} | {paired / mh:.2f} '
          f'| {med * 1e3:.1f} | {med / mh:.2f} |')


def _times(summary, k):
  """(paired excess, round median) of one run, seconds; K=1 has no local iterations."""
  wall = summary['step_wall_s']
  if k < 2 or wall['excess_median'] is None:
    raise ValueError('the paired estimate needs local iterations: use K >= 2 (--ks)')
  return wall['excess_median'], wall['round_median']


def model(args, num_dcs, bits, latency_ms, hops):
  """The model's C (seconds) for a round of ``bits`` per DC at ``latency_ms`` and H = hops."""
  net = network.NetworkModel(
      compute_s=np.zeros(num_dcs), lan_bps=1e12, lan_latency_s=0.0,
      wan_bps=args.wan_mbps * 1e6, wan_latency_s=latency_ms / 1000,
      wan_latencies_per_round=hops)
  return float(np.max(network.round_comm_time(net, np.full(num_dcs, bits))))


if __name__ == '__main__':
  main()
