"""Memory and time of sharded optimizer state (ZeRO-1) vs replicated, one process.

The default CNN on a 2x4 ('dc', 'worker') mesh, identity links (the default
config), local iterations (no inter-DC round), the inner optimizer chosen by
--optimizer (default adam). For both layouts of the optimizer state it reports:
  * optimizer-state bytes per device (from the arrays' addressable shards);
  * the compiled local step's memory per device (``memory_analysis()`` of the
    XLA executable: arguments, outputs, aliased, temporaries; arguments include
    the donated state, so the state saving shows there, and the outputs alias
    them);
  * intra-DC bytes per iteration per DC, as the step counts them;
  * the step time, in alternating blocks (medians), as a ratio.

  python bench/zero_memory.py [--optimizer=adam] [--steps=20] [--blocks=4] [--batch=32]
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
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from configs import default  # noqa: E402
from hfl import mesh as mesh_lib, models, optim, step as step_lib  # noqa: E402
from hfl import setup as setup_lib  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from arg_types import int_at_least  # noqa: E402


def device_bytes(tree, device) -> int:
  """Bytes of ``tree``'s arrays held by ``device``."""
  return sum(s.data.nbytes for a in jax.tree.leaves(tree) for s in a.addressable_shards
             if s.device == device)


def build(config: ml_collections.ConfigDict, shard: bool):
  """(mesh, state, step function, comps) for ``config`` with ``shard_state=shard``."""
  d, w = config.mesh.num_dcs, config.mesh.workers_per_dc
  mesh = mesh_lib.make_mesh(d, w)
  net = models.get_model(config.model.name, 10)
  params = net.init(jax.random.PRNGKey(0), jnp.zeros((1, 28, 28, 1)))['params']
  comps = setup_lib.build_compressors(config, params)
  opt = optim.make_optimizer(config.optimizer)
  outer = optax.sgd(1.0)
  init = lambda: step_lib.init_state(params, opt, outer, comps, d, w, jax.random.PRNGKey(1),
                                     shard_state=shard)
  shardings = step_lib.state_shardings(mesh, jax.eval_shape(init))
  state = jax.jit(init, out_shardings=shardings)()
  fn = step_lib.make_step(lambda p, x: net.apply({'params': p}, x), opt, outer, comps, mesh,
                          state)
  return mesh, state, fn


def main():
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--optimizer', default='adam', choices=optim.OPTIMIZERS)
  ap.add_argument('--steps', type=int_at_least(1), default=20)
  ap.add_argument('--blocks', type=int_at_least(1), default=4)
  ap.add_argument('--batch', type=int_at_least(1), default=32)
  args = ap.parse_args()
  config = default.get_config()
  config.optimizer.name = args.optimizer
  d, w = config.mesh.num_dcs, config.mesh.workers_per_dc

  rng = np.random.default_rng(0)
  runs = {}
  for shard in (False, True):
    mesh, state, fn = build(config, shard)
    bsh = NamedSharding(mesh, P('dc', 'worker'))
    x = jax.device_put(rng.normal(size=(d, w, args.batch, 28, 28, 1)).astype(np.float32), bsh)
    y = jax.device_put(rng.integers(0, 10, size=(d, w, args.batch)).astype(np.int32), bsh)
    active = jax.device_put(np.ones(d, bool), NamedSharding(mesh, P('dc')))
    weights = jax.device_put(np.full(d, 1 / d, np.float32), NamedSharding(mesh, P()))
    dev = mesh.devices.flat[0]
    opt_bytes = device_bytes(state.opt_state, dev)
    param_bytes = device_bytes(state.params, dev)
    compiled = fn.jitted[False].lower(state, x, y, active, weights).compile()
    mem = compiled.memory_analysis()
    runs[shard] = dict(fn=fn, state=state, args=(x, y, active, weights), opt=opt_bytes,
                       params=param_bytes, mem=mem)

  def run(shard, n):
    r = runs[shard]
    for _ in range(n):
      r['state'], m = r['fn'](r['state'], r['args'][:2], *r['args'][2:], False)
      jax.block_until_ready(m)
    r['metrics'] = step_lib.host_metrics(r['fn'].info[False], np.asarray(m), np.ones(d, bool))

  for shard in (False, True):
    run(shard, 2)
  times = {False: [], True: []}
  for _ in range(args.blocks):
    for shard in (False, True):
      t0 = time.perf_counter()
      run(shard, args.steps)
      times[shard].append((time.perf_counter() - t0) / args.steps)

  def mem_row(name, key):
    vals = [getattr(runs[s]['mem'], key, None) for s in (False, True)]
    if None in vals:
      return f'| {name} | n/a | n/a | |'
    return f'| {name} | {vals[0]:,} | {vals[1]:,} | {vals[1] / vals[0]:.3f} |'

  print(f'optimizer {args.optimizer}, model {config.model.name}, mesh {d}x{w}, '
        f'batch {args.batch}/worker, jax {jax.__version__}, {jax.devices()[0].platform}')
  print('| per device | replicated (shard_state=False) | sharded (True) | sharded / replicated |')
  print('|---|---:|---:|---:|')
  for name, key in (('optimizer state (bytes)', 'opt'), ('parameters (bytes)', 'params')):
    a, b = runs[False][key], runs[True][key]
    print(f'| {name} | {a:,} | {b:,} | {b / a:.3f} |')
  print(mem_row('compiled step: arguments (bytes)', 'argument_size_in_bytes'))
  print(mem_row('compiled step: outputs (bytes)', 'output_size_in_bytes'))
  print(mem_row('compiled step: aliased (donated) (bytes)', 'alias_size_in_bytes'))
  print(mem_row('compiled step: temporaries (bytes)', 'temp_size_in_bytes'))
  total = {s: (lambda m: m.argument_size_in_bytes + m.output_size_in_bytes
               - m.alias_size_in_bytes + m.temp_size_in_bytes)(runs[s]['mem'])
           for s in (False, True)}
  print(f'| compiled step: arguments + outputs − aliased + temporaries (bytes) | '
        f'{total[False]:,} | {total[True]:,} | {total[True] / total[False]:.3f} |')
  for link in ('up_bits', 'down_bits'):
    a, b = (int(runs[s]['metrics'][link][0]) / 8 for s in (False, True))
    print(f'| intra-DC {link[:-5]} per iteration per DC (bytes) | {a:,.0f} | {b:,.0f} | '
          f'{b / a:.3f} |')
  ta, tb = (float(np.median(times[s])) for s in (False, True))
  print(f'| step time, median of {args.blocks} blocks of {args.steps} (ms) | {1e3 * ta:.1f} | '
        f'{1e3 * tb:.1f} | {tb / ta:.3f} |')


if __name__ == '__main__':
  main()
