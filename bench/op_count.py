"""Top-level operations of the compiled step programs: hfl's hierarchical step (its
iteration program and its round program) against a plain data-parallel step.

Why. On an accelerator a step of a small model costs mostly the launching of its
operations, not their work (docs/benchmarks.md, "On an accelerator"): each top-level
operation of the compiled program is at least one kernel. The count does not depend on
the machine's speed, so it can be measured on this CPU and compared across commits.

What is counted: the instructions of the ENTRY computation of each program as XLA
compiled it (``jax.jit(...).lower(...).compile().as_text()``, after fusion: a fusion is
one operation), leaving out those that launch no work: ``parameter``, ``constant``,
``tuple``, ``get-tuple-element`` and ``bitcast`` (``bench/hlo_ops.py``). On a device
mesh the program is the SPMD program each device runs.

The programs (bench/step_throughput.py's, same model, batch and mesh; SGD on the
workers, identity compressors on every link, outer averaging):
  * iteration: hfl's step without an inter-DC round (gradient, uplink all-reduce over
    'worker', PS downlink, inner update, semi-synchronous masking, finiteness flags,
    metrics);
  * round: the same iteration followed by the inter-DC round (pseudo-gradient, WAN
    exchange over 'dc', outer optimizer, drift norms);
  * data parallel: one gradient pmean over ('dc', 'worker') and the SGD update.
The issue's targets (issue 52): iteration / DP <= 1.3, round / DP <= 1.6.

  python3 bench/op_count.py [--model=cnn,...|all|transformer_large] [--mesh=2,4] \
      [--batch=32] [--ops]

``--ops`` also prints, per program, the operations by opcode. Compiles only: runs no
step.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import step_throughput as st  # noqa: E402  (re-executes once with tcmalloc, as it does)
import arg_types  # noqa: E402
from arg_types import int_at_least  # noqa: E402
from hlo_ops import FREE, entry_opcodes, op_count  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from hfl import mesh as mesh_lib, models  # noqa: E402

MODEL_CHOICES = st.CHOICES  # hfl.models' and the benchmark-only sizes


def compiled_programs(name: str, batch: int, mesh) -> dict:
  """{'iteration', 'round', 'data parallel'}: the compiled programs of model ``name``
  (bench/step_throughput.py's setup) on ``mesh``."""
  d, w = mesh.shape['dc'], mesh.shape['worker']
  net, x_host, y_host, _ = st.build(name, batch, np.random.default_rng(0), d, w)
  params = net.init(jax.random.PRNGKey(0), jnp.asarray(x_host[0, 0, :1]))['params']
  apply_fn = lambda p, x: net.apply({'params': p}, x)
  opt = optax.sgd(0.05)
  loss_fn = lambda p, x, y: optax.softmax_cross_entropy_with_integer_labels(
      apply_fn(p, x), y).mean()
  hstep, state = st.hierarchical(apply_fn, params, opt, mesh)
  bsh = NamedSharding(mesh, P('dc', 'worker'))
  x, y = jax.device_put(x_host, bsh), jax.device_put(y_host, bsh)
  active = jax.device_put(np.ones(d, bool), NamedSharding(mesh, P('dc')))
  weights = jax.device_put(np.full(d, 1 / d, np.float32), NamedSharding(mesh, P()))
  out = {kind: hstep.jitted[r].lower(state, x, y, active, weights).compile()
         for kind, r in (('iteration', False), ('round', True))}
  rep = NamedSharding(mesh, P())
  dp_args = jax.device_put((params, opt.init(params)), rep)
  out['data parallel'] = st.data_parallel(loss_fn, opt, mesh).lower(*dp_args, x, y).compile()
  return out


def main():
  ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  ap.add_argument('--model', default='all',
                  help=f'comma-separated models, each once ({", ".join(MODEL_CHOICES)}), or '
                       f'all (those of hfl.models: {", ".join(models.MODELS)})')
  ap.add_argument('--mesh', default='2,4', help='D,W: DCs and workers per DC')
  ap.add_argument('--batch', type=int_at_least(1), default=32, help='examples per worker')
  ap.add_argument('--ops', action='store_true', help='also list each program\'s opcodes')
  args = ap.parse_args()
  names = arg_types.model_names(ap, args.model, MODEL_CHOICES, models.MODELS)
  try:
    d, w = mesh_lib.parse_shape(args.mesh)
  except ValueError as e:
    ap.error(str(e))
  if d * w > mesh_lib.MAX_CPU_DEVICES:
    ap.error(f'argument --mesh: {args.mesh} asks for D x W = {d * w} devices; at most '
             f'{mesh_lib.MAX_CPU_DEVICES} simulated devices are allowed in one process')
  mesh_lib.configure_cpu_devices(d * w)  # before anything starts the backend
  mesh = mesh_lib.make_mesh(d, w)
  print(f'{d}x{w} mesh of {jax.device_count()} {jax.default_backend()} devices, '
        f'{args.batch} examples per worker; jax {jax.__version__}')
  print('\n| model | iteration ops | round ops | data-parallel ops | iteration / DP | '
        'round / DP |')
  print('|---|---:|---:|---:|---:|---:|', flush=True)
  for name in names:
    progs = compiled_programs(name, args.batch, mesh)
    ops = {k: entry_opcodes(c.as_text()) for k, c in progs.items()}
    n = {k: op_count(v) for k, v in ops.items()}
    dp = n['data parallel']
    print(f'| {name} | {n["iteration"]} | {n["round"]} | {dp} | '
          f'{n["iteration"] / dp:.2f} | {n["round"] / dp:.2f} |', flush=True)
    if args.ops:
      for k, v in ops.items():
        print(f'    {name} {k}: ' + ', '.join(f'{op} {c}' for op, c in v.most_common()
                                              if op not in FREE), flush=True)


if __name__ == '__main__':
  main()
