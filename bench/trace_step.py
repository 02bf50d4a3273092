"""Where a step's time goes: the hierarchical step against data parallelism, from a
``jax.profiler`` trace of each.

For each model, builds bench/step_throughput.py's programs (same model, same global
batch, SGD), times each untraced (median of alternating blocks), then traces
``--steps`` steps of each. From the trace it prints, per program and step, each
line of the device plane (GPU: the stream's kernels and memsets, their count and
time) and of the host plane (threads), and the ``--top`` events by time of the device's
"XLA Ops" line and of the Python thread (the jitted call ``PjitFunction``, and inside
it argument handling and the program's launch, e.g. ``ExecuteHelperOnSingleDevice``).
The step blocks on each result, so the wall time per step is host plus device time.

  python3 bench/trace_step.py [--model=transformer,cnn] [--mesh=1,1] [--batch=256] \
      [--steps=10] [--blocks=3] [--top=12] [--out=DIR]

Written for one GPU (``--mesh=1,1 --batch=256``, docs/benchmarks.md "On an
accelerator"); on CPU there is no device plane and XLA:CPU's ops run on the host's
threads, so the Python thread's events are what it tells apart.
"""

import argparse
import collections
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import step_throughput  # noqa: E402  (re-execs with the fast allocator on CPU)

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.profiler import ProfileData  # noqa: E402

from arg_types import int_at_least  # noqa: E402
from hfl import mesh as mesh_lib, models  # noqa: E402


def planes_summary(trace_dir: str, steps: int, top: int = 12) -> dict:
  """{plane name: ({line name: (events per step, ms per step)}, the ``top`` events
  by time per step of the "XLA Ops" line (device) and the Python thread (host):
  [(name, us per step, calls per step)])} of the device and host planes."""
  files = [os.path.join(r, f) for r, _, fs in os.walk(trace_dir) for f in fs
           if f.endswith('.xplane.pb')]
  out = {}
  if not files:
    return out
  prof = ProfileData.from_file(files[0])
  for plane in prof.planes:
    if not (plane.name.startswith('/device:') or plane.name.startswith('/host:CPU')):
      continue
    lines = {}
    ops = collections.Counter()
    counts = collections.Counter()
    for line in plane.lines:
      n, t = 0, 0
      for ev in line.events:
        n += 1
        t += ev.duration_ns
        if line.name in ('XLA Ops', 'python3', 'python'):
          ops[ev.name] += ev.duration_ns
          counts[ev.name] += 1
      if n:
        lines[line.name] = (n / steps, t / steps / 1e6)
    out[plane.name] = (lines, [(k, v / steps / 1e3, counts[k] / steps)
                               for k, v in ops.most_common(top)])
  return out


def main():
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--model', default='transformer,cnn',
                  help=f'comma-separated models ({", ".join(models.MODELS)})')
  ap.add_argument('--mesh', default='1,1')
  ap.add_argument('--batch', type=int_at_least(1), default=256)
  ap.add_argument('--steps', type=int_at_least(1), default=10)
  ap.add_argument('--blocks', type=int_at_least(1), default=3)
  ap.add_argument('--top', type=int_at_least(1), default=12, help='events listed per line')
  ap.add_argument('--out', default='/tmp/hfl_trace_step')
  args = ap.parse_args()
  try:
    d, w = mesh_lib.parse_shape(args.mesh)
  except ValueError as e:
    ap.error(str(e))
  for n in args.model.split(','):
    if n not in models.MODELS:
      ap.error(f'--model={n!r} is not one of {", ".join(models.MODELS)}')
  mesh_lib.configure_cpu_devices(d * w)  # before anything starts the backend
  mesh = mesh_lib.make_mesh(d, w)
  rng = np.random.default_rng(0)
  dev = jax.devices()[0]
  print(f'jax {jax.__version__}, {dev.platform} ({dev.device_kind}), mesh {d}x{w}, '
        f'{args.batch} examples per worker', flush=True)
  for name in args.model.split(','):
    net, xh, yh, desc = step_throughput.build(name, args.batch, rng, d, w)
    progs, _, _ = step_throughput.programs(net, xh, yh, mesh)
    progs = {k: v for k, v in progs.items() if k != 'one device'}
    rates, _ = step_throughput.measure(progs, args.steps, args.blocks)
    print(f'\n## {name} ({desc})', flush=True)
    for k, (run, _) in progs.items():
      tdir = os.path.join(args.out, f'{name}_{k.replace(" ", "_").replace("=", "")}')
      shutil.rmtree(tdir, ignore_errors=True)
      run(2)
      with jax.profiler.trace(tdir):
        t0 = time.perf_counter()
        run(args.steps)
        wall = (time.perf_counter() - t0) / args.steps * 1e3
      print(f'\n### {k}: {rates[k]:.1f} steps/s untraced ({1e3 / rates[k]:.3f} ms/step); '
            f'traced {wall:.3f} ms/step', flush=True)
      for plane, (lines, top) in planes_summary(tdir, args.steps, args.top).items():
        print(f'{plane}: ' + '; '.join(f'{ln}: {n:.1f} events, {ms:.3f} ms'
                                        for ln, (n, ms) in lines.items()))
        for op, us, n in top:
          print(f'    {us:9.1f} us/step  x{n:5.1f}  {op[:110]}')
    print(flush=True)


if __name__ == '__main__':
  main()
