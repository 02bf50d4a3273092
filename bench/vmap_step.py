"""Steps/s of the default config's step in both simulation modes (issue 52).

'devices': one simulated CPU device per (DC, worker) under shard_map (hfl's default
on CPU); 'vmap': the whole hierarchy on one device under nested jax.vmap
(``mesh.simulate='vmap'``). Both steps are built by hfl.setup.setup from the same
config (default: configs/default.py, 2 DCs x 4 workers, CNN, batch 32 per worker,
a round every sync.k iterations), run on the same pre-placed batches of the
training set, warmed up (both programs compiled), then timed in alternating blocks
of --steps iterations in one process; the medians and the median of the per-block
ratios are printed (quote the ratio: the machine is shared).

  python3 bench/vmap_step.py [--steps=30] [--blocks=3] [--config.FIELD=VALUE ...]
"""

import argparse
import copy
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hfl import runtime  # noqa: E402

runtime.use_fast_allocator()  # re-exec once with tcmalloc (docs/benchmarks.md)

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from configs import default  # noqa: E402
from hfl import mesh as mesh_lib  # noqa: E402


def build(config, mode: str):
  """(step, state, batches, active, weights, k) of the config in ``mode``."""
  from hfl import step as step_lib, train  # pylint: disable=g-import-not-at-top
  from hfl import setup as setup_lib  # pylint: disable=g-import-not-at-top
  c = copy.deepcopy(config)
  c.mesh.simulate = mode
  s = setup_lib.setup(c)
  init_fn = train._init_fn(s)  # pylint: disable=protected-access
  shape = jax.eval_shape(init_fn)
  state = jax.jit(init_fn, out_shardings=step_lib.state_shardings(s.place.mesh, shape))()
  apply_fn = lambda p, x: s.model.apply({'params': p}, x)
  step = step_lib.make_step(apply_fn, s.optim.optimizer, s.optim.outer, s.compress.comps,
                            s.place.mesh, shape, s.compress.dgc, prox_mu=s.loop.prox_mu,
                            stream=s.sync.stream, mode=s.place.mode,
                            shape=(s.place.num_dcs, s.place.workers_per_dc))
  d, w, b = s.place.num_dcs, s.place.workers_per_dc, s.loop.batch_size
  rng = np.random.default_rng(0)
  sh = NamedSharding(s.place.mesh, P(mesh_lib.DC, mesh_lib.WORKER))
  n = len(s.data.dataset.train_labels)
  batches = []
  for _ in range(4):
    idx = rng.integers(0, n, size=(d, w, b))
    x = np.asarray(s.data.dataset.train_images[idx.reshape(-1)])
    x = x.reshape(idx.shape + x.shape[1:])
    y = np.asarray(s.data.dataset.train_labels)[idx]
    batches.append((jax.device_put(x, sh), jax.device_put(y, sh)))
  active = jax.device_put(np.ones(d, bool), NamedSharding(s.place.mesh, P(mesh_lib.DC)))
  weights = jax.device_put(np.full(d, 1 / d, np.float32), NamedSharding(s.place.mesh, P()))
  return s, step, state, batches, active, weights, int(c.sync.k)


def run(built, state, steps: int):
  """(state, seconds) of ``steps`` iterations, a round every k-th."""
  s, step, _, batches, active, weights, k = built
  t0 = time.perf_counter()
  for t in range(steps):
    state, m = step(state, batches[t % len(batches)], active, weights, (t + 1) % k == 0)
  jax.block_until_ready((state, m))
  return state, time.perf_counter() - t0


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--steps', type=int, default=30)
  parser.add_argument('--blocks', type=int, default=3)
  args, rest = parser.parse_known_args()
  config = default.get_config()
  for o in rest:  # --config.FIELD=VALUE
    key, _, value = o[len('--config.'):].partition('=')
    obj = config
    *parents, leaf = key.split('.')
    for p in parents:
      obj = obj[p]
    obj[leaf] = type(obj[leaf])(value)
  d, w = config.mesh.num_dcs, config.mesh.workers_per_dc
  mesh_lib.configure_cpu_devices(d * w)
  modes = ('devices', 'vmap')
  built = {m: build(config, m) for m in modes}
  states = {m: built[m][2] for m in modes}
  for m in modes:  # warm-up: both programs compiled, a few iterations run
    states[m], secs = run(built[m], states[m], 2 * built[m][6])
    print(f'warm-up {m}: {secs:.1f} s', flush=True)
  times = {m: [] for m in modes}
  for _ in range(args.blocks):
    for m in modes:
      states[m], secs = run(built[m], states[m], args.steps)
      times[m].append(secs)
      print(f'{m}: {args.steps / secs:.2f} steps/s', flush=True)
  rate = {m: [args.steps / t for t in times[m]] for m in modes}
  ratios = [v / dv for v, dv in zip(rate['vmap'], rate['devices'])]
  print(f'{d} DCs x {w} workers, {config.model.name}, batch {config.train.batch_size}/worker, '
        f'K={config.sync.k}, jax {jax.__version__}, {jax.device_count()} CPU devices')
  for m in modes:
    print(f'{m:8s} median {statistics.median(rate[m]):.2f} steps/s '
          f'(blocks: {", ".join(f"{r:.2f}" for r in rate[m])})')
  print(f'vmap / devices: median {statistics.median(ratios):.2f} '
        f'(blocks: {", ".join(f"{r:.2f}" for r in ratios)})')


if __name__ == '__main__':
  main()
