"""Steps/s of the hierarchical step (k=1, no compression) vs plain data parallelism.

Both programs train the same model on the same per-worker batch over the same
('dc', 'worker') mesh with SGD:
  * hierarchical: hfl.step with do_round=True every iteration (intra-DC all-reduce
    over 'worker', optimizer on the workers, inter-DC all-gather of the
    pseudo-gradient over 'dc', outer averaging) — the synchronous HPS baseline;
  * data parallel: one shard_map'd step, gradient pmean over ('dc', 'worker'),
    optax update.
They are timed in alternating blocks in one process; the ratio is what to quote.

  python bench/step_throughput.py [--model=cnn] [--steps=60] [--batch=32]
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
from hfl.compress import base  # noqa: E402


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument('--model', default='cnn')
  ap.add_argument('--steps', type=int, default=60)
  ap.add_argument('--blocks', type=int, default=4)
  ap.add_argument('--batch', type=int, default=32)
  args = ap.parse_args()
  d, w = 2, 4
  mesh = mesh_lib.make_mesh(d, w)
  net = models.get_model(args.model, 10)
  params = net.init(jax.random.PRNGKey(0), jnp.zeros((1, 28, 28, 1)))['params']
  apply_fn = lambda p, x: net.apply({'params': p}, x)
  opt = optax.sgd(0.05)

  def loss_fn(p, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(apply_fn(p, x), y).mean()

  # ---- Hierarchical step.
  leaves = jax.tree.leaves(params)
  ident = [base.identity(l.shape) for l in leaves]
  comps = step_lib.Compressors(ident, ident, ident)
  outer = optax.sgd(1.0)
  state = step_lib.init_state(params, opt, outer, comps, d, w, jax.random.PRNGKey(1))
  state = jax.device_put(state, step_lib.state_shardings(mesh, state))
  hstep = step_lib.make_step(apply_fn, opt, outer, comps, mesh, state)

  # ---- Data-parallel step.
  def dp_body(p, o, x, y):
    p_var = jax.lax.pcast(p, ('dc', 'worker'), to='varying')
    g = jax.grad(loss_fn)(p_var, x[0, 0], y[0, 0])
    g = jax.lax.pmean(g, ('dc', 'worker'))
    u, o = opt.update(g, o, p)
    return optax.apply_updates(p, u), o
  dp = jax.jit(jax.shard_map(dp_body, mesh=mesh,
                             in_specs=(P(), P(), P('dc', 'worker'), P('dc', 'worker')),
                             out_specs=(P(), P())), donate_argnums=(0, 1))
  rep = NamedSharding(mesh, P())
  dp_p = jax.device_put(jax.tree.map(jnp.array, params), rep)
  dp_o = jax.device_put(opt.init(params), rep)

  rng = np.random.default_rng(0)
  bsh = NamedSharding(mesh, P('dc', 'worker'))
  x = jax.device_put(rng.normal(size=(d, w, args.batch, 28, 28, 1)).astype(np.float32), bsh)
  y = jax.device_put(rng.integers(0, 10, size=(d, w, args.batch)).astype(np.int32), bsh)
  active = jax.device_put(np.ones(d, bool), NamedSharding(mesh, P('dc')))
  weights = jax.device_put(np.full(d, 1 / d, np.float32), rep)

  def run_h(n):
    nonlocal state
    for _ in range(n):
      state, m = hstep(state, (x, y), active, weights, True)
      jax.block_until_ready(m)

  def run_dp(n):
    nonlocal dp_p, dp_o
    for _ in range(n):
      dp_p, dp_o = dp(dp_p, dp_o, x, y)
      jax.block_until_ready(dp_p)

  run_h(3)
  run_dp(3)
  t_h, t_dp = [], []
  for _ in range(args.blocks):
    t0 = time.perf_counter()
    run_h(args.steps)
    t_h.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    run_dp(args.steps)
    t_dp.append(time.perf_counter() - t0)
  sh = args.steps / np.median(t_h)
  sdp = args.steps / np.median(t_dp)
  print(f'| model | batch/worker | mesh | hierarchical k=1 steps/s | data-parallel steps/s | ratio |')
  print(f'|---|---|---|---|---|---|')
  print(f'| {args.model} | {args.batch} | {d}x{w} | {sh:.2f} | {sdp:.2f} | {sh / sdp:.3f} |')


if __name__ == '__main__':
  main()
