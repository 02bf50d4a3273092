"""Where the wall time of a training run goes: the loop profiled end to end.

Runs ``hfl.train.train_and_evaluate`` on a config (in this process, allocator as
``hfl.runtime`` sets it) with timers around the functions the loop calls, and
splits the run's wall time into

  setup            config checks, data loading and partitioning (hfl.setup.setup)
  init/restore     state initialisation or checkpoint restore, the step's tracing
  step compile     first call of each step program (trace + XLA compile + run)
  step compute     the other step calls, until their results are ready
  batch indices    hfl.data.batch_indices (the per-worker sampler)
  batch transfer   hfl.distributed.put_rows (read + normalise rows, host->device)
  small transfers  hfl.distributed.put_global (active mask, weights)
  metrics fetch    hfl.distributed.to_host / to_host_stacked (device->host)
  evaluation       evaluate(params) calls (the first one compiles)
  checkpointing    hfl.checkpoint.save (orbax, waits until written)
  other            the rest: the Python loop itself, accounting, logging, summary

With ``--collectives`` it also times, in the same process, programs doing only
the step's collectives (the gradient all-reduce over 'worker' and the
pseudo-gradient all-gather over 'dc' of parameter-shaped trees), and prints the
compiled step's XLA cost analysis (FLOPs, bytes accessed). With ``--trace DIR``
it writes a ``jax.profiler`` trace of the steady-state steps (TensorBoard/XProf)
and sums the XLA:CPU op time per op category from it.

  python3 bench/profile_loop.py [--config=configs/default.py] [--steps=200] \
      [--collectives] [--trace=/tmp/hfl_trace] [-- --config.sync.k=4 ...]
"""

import argparse
import ast
import collections
import cProfile
import functools
import os
import pstats
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hfl import runtime  # noqa: E402

runtime.use_fast_allocator()

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
import jax  # noqa: E402
import numpy as np  # noqa: E402
from absl import logging  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from arg_types import int_at_least  # noqa: E402

TIMES = collections.defaultdict(float)
CALLS = collections.Counter()
LAST = []  # the last step's (output state, batch, active, weights)


_DEPTH = [0]  # calls inside a timed call count only in the outer one


def _timed(name, fn, block=False):
  @functools.wraps(fn)
  def wrapper(*a, **k):
    if _DEPTH[0]:
      return fn(*a, **k)
    _DEPTH[0] += 1
    t0 = time.perf_counter()
    try:
      out = fn(*a, **k)
      if block:
        jax.block_until_ready(out)
    finally:
      _DEPTH[0] -= 1
    TIMES[name] += time.perf_counter() - t0
    CALLS[name] += 1
    return out
  return wrapper


def instrument():
  """Wraps the loop's callees with timers (module attributes hfl.train looks up)."""
  from hfl import checkpoint, data, distributed, step, train  # pylint: disable=g-import-not-at-top
  from hfl import setup as setup_lib  # pylint: disable=g-import-not-at-top
  setup_lib.setup = _timed('setup', setup_lib.setup)
  data.batch_indices = _timed('batch indices', data.batch_indices)
  distributed.put_rows = _timed('batch transfer', distributed.put_rows, block=True)
  distributed.put_global = _timed('small transfers', distributed.put_global, block=True)
  distributed.to_host = _timed('metrics fetch', distributed.to_host)
  distributed.to_host_stacked = _timed('metrics fetch', distributed.to_host_stacked)
  checkpoint.save = _timed('checkpointing', checkpoint.save)
  seen = set()
  made = []

  def make_step(*a, **k):
    fn = step.__dict__['_orig_make_step'](*a, **k)
    made.append(fn)

    def stepped(state, batch, active, weights, do_round):
      key = (id(fn), bool(do_round))
      name = 'step compute' if key in seen else 'step compile'
      seen.add(key)
      t0 = time.perf_counter()
      out = jax.block_until_ready(fn(state, batch, active, weights, do_round))
      TIMES[name] += time.perf_counter() - t0
      CALLS[name] += 1
      LAST[:] = [(out[0], batch, active, weights)]  # the input state was donated
      return out
    stepped.jitted = fn.jitted
    stepped.info = fn.info
    return stepped
  step.__dict__.setdefault('_orig_make_step', step.make_step)
  step.make_step = make_step
  orig_eval = train.make_eval

  def make_eval(*a, **k):
    return _timed('evaluation', _timed('evaluation setup (test set transfer)', orig_eval)(*a, **k))
  train.make_eval = make_eval
  return made


def cost_analysis(fn, state, batch, active, weights):
  """FLOPs and bytes of the compiled local and round step programs."""
  out = {}
  for do_round in (False, True):
    compiled = fn.jitted[do_round].lower(state, *batch, active, weights).compile()
    ca = compiled.cost_analysis()
    ca = ca[0] if isinstance(ca, (list, tuple)) else ca
    out[do_round] = (float(ca.get('flops', 0.0)), float(ca.get('bytes accessed', 0.0)))
  return out


def time_collectives(state, reps=20):
  """Seconds per call of the step's collectives alone (all-reduce over 'worker' of a
  gradient-shaped tree, then the all-gather over 'dc' of a pseudo-gradient)."""
  from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from hfl import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from hfl import metrics as metrics_lib  # pylint: disable=g-import-not-at-top
  params = state.params  # [D, ...] sharded over 'dc'
  mesh = jax.tree.leaves(params)[0].sharding.mesh
  spec = jax.tree.map(lambda _: P(mesh_lib.DC), params)

  def intra(p):
    g = jax.lax.pcast(p, mesh_lib.WORKER, to='varying')
    return jax.lax.psum(g, mesh_lib.WORKER)

  def inter(p):
    return jax.tree.map(lambda x: jax.lax.all_gather(x, mesh_lib.DC, tiled=True).sum(0)[None],
                        p)

  res = {}
  for name, f in (('all-reduce over worker', intra), ('all-gather over dc', inter)):
    prog = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(spec,), out_specs=spec))
    jax.block_until_ready(prog(params))
    t0 = time.perf_counter()
    for _ in range(reps):
      jax.block_until_ready(prog(params))
    res[name] = (time.perf_counter() - t0) / reps
  return res


def trace_categories(trace_dir):
  """Total XLA:CPU op time (s) per op-name prefix from a jax.profiler trace."""
  from jax.profiler import ProfileData  # pylint: disable=g-import-not-at-top
  files = [os.path.join(r, f) for r, _, fs in os.walk(trace_dir) for f in fs
           if f.endswith('.xplane.pb')]
  if not files:
    return {}
  totals = collections.Counter()
  prof = ProfileData.from_file(files[0])
  for plane in prof.planes:
    if not plane.name.startswith('/host:CPU'):
      continue
    for line in plane.lines:
      for ev in line.events:
        name = ev.name
        if any(s in name for s in ('all-reduce', 'all-gather', 'collective', 'reduce-scatter')):
          cat = 'collectives'
        elif any(s in name for s in ('convolution', 'dot', 'fusion', 'reduce', 'copy',
                                     'select-and-scatter', 'reduce-window')):
          cat = 'XLA ops: ' + name.split('.')[0]
        else:
          continue
        totals[cat] += ev.duration_ns / 1e9
  return dict(totals.most_common(15))


def main():
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--config', default='configs/default.py')
  ap.add_argument('--steps', type=int_at_least(1), default=200)
  ap.add_argument('--workdir', default=None, help='default: a fresh temporary directory')
  ap.add_argument('--collectives', action='store_true')
  ap.add_argument('--trace', default=None, help='write a jax.profiler trace here')
  ap.add_argument('--cprofile', type=int_at_least(0), default=0,
                  help='also print the N functions with the most cumulative time (cProfile)')
  ap.add_argument('overrides', nargs='*', help='--config.FIELD=VALUE (after --)')
  args = ap.parse_args()

  from hfl import config as config_lib  # pylint: disable=g-import-not-at-top
  from hfl import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from hfl import metrics as metrics_lib  # pylint: disable=g-import-not-at-top
  try:  # every config problem now, before anything is compiled
    config = config_lib.load_file(args.config)
    for ov in args.overrides:
      key, _, value = ov.removeprefix('--config.').partition('=')
      try:
        value = ast.literal_eval(value)
      except (ValueError, SyntaxError):
        pass  # a string
      config_lib.apply_overrides(config, {key: value})
    config.train.num_steps = args.steps
    config_lib.validate(config)
  except (ValueError, FileNotFoundError) as e:
    ap.error(f'{" ".join([f"--config={args.config}"] + args.overrides)}: {e}')
  for flag in ('workdir', 'trace'):
    path = getattr(args, flag)
    problem = path and metrics_lib.dir_problem(path)
    if problem:
      ap.error(f'--{flag}={path} {problem}; pass a directory (created if missing)')
  mesh_lib.configure_cpu_devices(config.mesh.num_dcs * config.mesh.workers_per_dc)
  made = instrument()
  from hfl import train  # pylint: disable=g-import-not-at-top
  logging.set_verbosity(logging.WARNING)
  workdir = args.workdir or tempfile.mkdtemp(prefix='hfl_profile_')
  print(f'allocator: {runtime.active() or "glibc malloc (untuned)"}; config {args.config}, '
        f'{args.steps} steps, workdir {workdir}')
  prof = cProfile.Profile() if args.cprofile else None
  t0 = time.perf_counter()
  if prof:
    prof.enable()
  summary = train.train_and_evaluate(config, workdir)
  if prof:
    prof.disable()
  total = time.perf_counter() - t0
  if prof:
    pstats.Stats(prof).sort_stats('cumulative').print_stats(args.cprofile)
  accounted = sum(TIMES.values())
  print(f'\n| part | seconds | share of wall | calls |\n|---|---:|---:|---:|')
  for name, t in sorted(TIMES.items(), key=lambda kv: -kv[1]):
    print(f'| {name} | {t:.2f} | {t / total:.1%} | {CALLS[name] or 1} |')
  print(f'| other (Python loop, accounting, logging) | {total - accounted:.2f} | '
        f'{(total - accounted) / total:.1%} | |')
  print(f'| **total** | {total:.2f} | 100% | |')
  n = CALLS['step compute']
  if n:
    print(f'\nsteady-state step: {TIMES["step compute"] / n * 1e3:.1f} ms '
          f'({n} calls); final test accuracy {summary["final_test_accuracy"]:.4f}')

  if (args.collectives or args.trace) and LAST:
    state, batch, active, weights = LAST[-1]
    fn = made[-1]
    for do_round, (flops, nbytes) in cost_analysis(fn, state, batch, active, weights).items():
      print(f'compiled {"round" if do_round else "local"} step (XLA cost analysis, all '
            f'{jax.device_count()} devices): {flops / 1e9:.3f} GFLOP, {nbytes / 1e6:.1f} MB accessed')
  if args.collectives and LAST:
    for name, t in time_collectives(LAST[-1][0]).items():
      print(f'collective alone, {name}: {t * 1e3:.1f} ms per call')
  if args.trace and LAST:
    state, batch, active, weights = LAST[-1]
    fn = made[-1]
    t0 = time.perf_counter()
    with jax.profiler.trace(args.trace):
      for i in range(8):
        state, _ = jax.block_until_ready(fn(state, batch, active, weights, i % 4 == 3))
    wall = time.perf_counter() - t0
    print(f'\ntrace of 8 steps ({wall:.2f} s wall incl. tracing overhead) in {args.trace}; '
          'XLA:CPU op time summed over threads:')
    for cat, t in trace_categories(args.trace).items():
      print(f'  {cat}: {t:.3f} s')
  if not args.workdir:
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == '__main__':
  main()
