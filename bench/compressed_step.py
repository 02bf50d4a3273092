"""Training-step time with compression over without (issue 3 target: <= 1.3x).

Three local intra-DC steps (hfl.step, do_round=False: gradient, uplink with error
feedback, PS aggregation, downlink with error feedback, SGD) on the same model,
batch and ('dc', 'worker') mesh, built from the same per-leaf policy as the
training loop (hfl.compress.policy):
  * none:     identity everywhere (float32 all-reduce);
  * topk_thr: bidirectional top-k, threshold-estimate variant, at ``--density``
              on leaves >= ``--small_threshold`` entries, bf16 for the others;
  * co3_fp4:  CO3 fp4 (Huffman-charged) up and down on the same large leaves,
              bf16 for the others.
They are timed in alternating blocks in one process (medians over blocks). With
``--profile`` the encode + decode of each large leaf's compressor is also timed
alone on one device, to see where the extra time goes.

  python bench/compressed_step.py [--model=cnn] [--steps=30] [--blocks=5] [--profile]
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hfl import runtime  # noqa: E402

runtime.use_fast_allocator()  # re-exec once with tcmalloc (docs/benchmarks.md)

import jax  # noqa: E402

jax.config.update('jax_num_cpu_devices', 8)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from hfl import mesh as mesh_lib, models, step as step_lib  # noqa: E402
from hfl.compress import policy  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from arg_types import int_at_least, number_in  # noqa: E402


def variants(density: float):
  """name -> (uplink spec, downlink spec) for policy.build."""
  topk = dict(name='topk', density=density, threshold_variant=True)
  co3 = dict(name='co3', fmt='fp4', gamma=0.9, coder='huffman', refit_every=1)
  return {'none': ('identity', 'identity'), 'topk_thr': (topk, topk), 'co3_fp4': (co3, co3)}


def main():
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--model', default='cnn', choices=models.IMAGE_MODELS)
  ap.add_argument('--steps', type=int_at_least(1), default=30)
  ap.add_argument('--blocks', type=int_at_least(1), default=5)
  ap.add_argument('--batch', type=int_at_least(1), default=32)
  ap.add_argument('--density', type=number_in(0, 1, lo_open=True), default=0.02,
                  help='top-k fraction kept, in (0, 1]')
  ap.add_argument('--small_threshold', type=int_at_least(0), default=16384)
  ap.add_argument('--profile', action='store_true')
  args = ap.parse_args()
  d, w = 2, 4
  mesh = mesh_lib.make_mesh(d, w)
  net = models.get_model(args.model, 10)
  params = net.init(jax.random.PRNGKey(0), jnp.zeros((1, 28, 28, 1)))['params']
  params = jax.tree.map(np.array, params)  # host copy: the steps donate their states
  apply_fn = lambda p, x: net.apply({'params': p}, x)
  opt, outer = optax.sgd(0.05), optax.sgd(1.0)

  rng = np.random.default_rng(0)
  bsh = NamedSharding(mesh, P('dc', 'worker'))
  x = jax.device_put(rng.normal(size=(d, w, args.batch, 28, 28, 1)).astype(np.float32), bsh)
  y = jax.device_put(rng.integers(0, 10, size=(d, w, args.batch)).astype(np.int32), bsh)
  active = jax.device_put(np.ones(d, bool), NamedSharding(mesh, P('dc')))
  weights = jax.device_put(np.full(d, 1 / d, np.float32), NamedSharding(mesh, P()))

  runs, comps_of = {}, {}
  for name, (up_spec, down_spec) in variants(args.density).items():
    small = 'float32' if name == 'none' else 'bfloat16'
    up = policy.build(up_spec, params, args.small_threshold, small)
    down = policy.build(down_spec, params, args.small_threshold, small)
    wan = policy.build('identity', params, 0, 'float32')
    comps = step_lib.Compressors(up, down, wan)
    comps_of[name] = comps
    state = step_lib.init_state(params, opt, outer, comps, d, w, jax.random.PRNGKey(1))
    state = jax.device_put(state, step_lib.state_shardings(mesh, state))
    fn = step_lib.make_step(apply_fn, opt, outer, comps, mesh, state)
    runs[name] = [fn, state]

  def run(name, n):
    fn, state = runs[name]
    for _ in range(n):
      state, m = fn(state, (x, y), active, weights, False)
      jax.block_until_ready(m)
    runs[name][1] = state

  for name in runs:
    run(name, 3)  # compile + warm up
  times = {name: [] for name in runs}
  for _ in range(args.blocks):
    for name in runs:
      t0 = time.perf_counter()
      run(name, args.steps)
      times[name].append((time.perf_counter() - t0) / args.steps)
  med = {name: float(np.median(t)) for name, t in times.items()}

  print(f'model {args.model}, mesh {d}x{w}, batch/worker {args.batch}, '
        f'{args.blocks} alternating blocks x {args.steps} steps, devices: '
        f'{jax.devices()[0].platform} x {len(jax.devices())}')
  print('| variant | uplink bytes/worker | ms/step (median) | min..max over blocks | '
        'x uncompressed |')
  print('|---|---|---|---|---|')
  for name in runs:
    bits = sum(policy.static_bits(c) for c in comps_of[name].up)
    approx = '<=' if name == 'co3_fp4' else ''
    t = np.asarray(times[name]) * 1e3
    print(f'| {name} | {approx}{bits / 8:.0f} | {med[name] * 1e3:.2f} | '
          f'{t.min():.2f}..{t.max():.2f} | {med[name] / med["none"]:.3f} |')

  if args.profile:
    print('\n| compressor | leaf shape | encode+decode ms (1 device) |')
    print('|---|---|---|')
    dev = jax.devices()[0]
    for name in ('topk_thr', 'co3_fp4'):
      for c, leaf in zip(comps_of[name].up, jax.tree.leaves(params)):
        if c.name in ('bfloat16',):
          continue
        f = jax.jit(lambda a, s, k, c=c: c.decode(c.encode(a, s, k)[0]))
        a = jax.device_put(jnp.asarray(rng.normal(size=leaf.shape), jnp.float32), dev)
        s, k = c.init(), jax.random.PRNGKey(0)
        jax.block_until_ready(f(a, s, k))
        reps = 20
        t0 = time.perf_counter()
        for _ in range(reps):
          out = f(a, s, k)
        jax.block_until_ready(out)
        print(f'| {c.name} | {tuple(leaf.shape)} | '
              f'{(time.perf_counter() - t0) / reps * 1e3:.3f} |')


if __name__ == '__main__':
  main()
