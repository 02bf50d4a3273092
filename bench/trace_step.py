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


WINDOW = 'trace_step: timed steps'  # the annotation around the traced steps


def _busy_ns(intervals) -> int:
  """Length of the union of (start, end) intervals: nested events counted once."""
  total, end = 0, None
  for s, e in sorted(intervals):
    if end is None or s > end:
      total += e - s
      end = e
    elif e > end:
      total += e - end
      end = e
  return total


def planes_summary(trace_dir: str, steps: int, top: int = 12) -> dict:
  """{plane name: ({line name: (events per step, busy ms per step)}, the ``top``
  events by time per step of the device's "XLA Ops" line and of the Python thread:
  [(name, us per step, calls per step)])} of the device and host planes.

  Host events count only inside the :data:`WINDOW` annotation (the profiler's own
  start and stop are left out); an event nested in one of the same name (jit's
  ``PjitFunction`` appears twice per call) counts once; a line's busy time is the
  union of its events' intervals, so nested events are not added up.
  """
  files = [os.path.join(r, f) for r, _, fs in os.walk(trace_dir) for f in fs
           if f.endswith('.xplane.pb')]
  if not files:
    return {}
  prof = ProfileData.from_file(files[0])
  planes = [p for p in prof.planes if p.name.startswith(('/device:', '/host:CPU'))]
  window = None
  for plane in planes:
    for line in plane.lines:
      for ev in line.events:
        if ev.name == WINDOW:
          window = (ev.start_ns, ev.start_ns + ev.duration_ns)
  out = {}
  for plane in planes:
    lines, ops, counts = {}, collections.Counter(), collections.Counter()
    for line in plane.lines:
      evs = sorted(((ev.start_ns, ev.start_ns + ev.duration_ns, ev.name) for ev in line.events
                    if ev.name != WINDOW), key=lambda e: (e[0], -e[1]))
      if plane.name.startswith('/host') and window is not None:
        evs = [e for e in evs if window[0] <= e[0] and e[1] <= window[1]]
      if not evs:
        continue
      lines[line.name] = (len(evs) / steps, _busy_ns([e[:2] for e in evs]) / steps / 1e6)
      if line.name in ('XLA Ops', 'python3', 'python'):
        open_until = {}  # name -> end of its outermost event so far
        for start, end, name in evs:
          if start < open_until.get(name, -1):
            continue  # nested in an event of the same name
          open_until[name] = end
          ops[name] += end - start
          counts[name] += 1
    out[plane.name] = (lines, [(k, v / steps / 1e3, counts[k] / steps)
                               for k, v in ops.most_common(top)])
  return out


def main():
  ap = argparse.ArgumentParser(
      description="Profiles the hierarchical step and data parallelism: the device's "
                  "kernels and the host's dispatch per step (bench/trace_step.py's docstring).")
  ap.add_argument('--model', default='transformer,cnn',
                  help=f'comma-separated models ({", ".join(models.MODELS)})')
  ap.add_argument('--mesh', default='1,1', help='D,W (default 1,1: one GPU)')
  ap.add_argument('--batch', type=int_at_least(1), default=256,
                  help='examples per worker (default 256)')
  ap.add_argument('--steps', type=int_at_least(1), default=10,
                  help='steps per timed block, and steps traced (default 10)')
  ap.add_argument('--blocks', type=int_at_least(1), default=3,
                  help='alternating untraced blocks for the steps/s medians (default 3)')
  ap.add_argument('--top', type=int_at_least(1), default=12,
                  help='events listed per line (default 12)')
  ap.add_argument('--out', default='/tmp/hfl_trace_step',
                  help='directory for the traces (default /tmp/hfl_trace_step)')
  args = ap.parse_args()
  try:
    d, w = mesh_lib.parse_shape(args.mesh)
  except ValueError as e:
    ap.error(str(e))
  if os.path.exists(args.out) and not os.path.isdir(args.out):
    ap.error(f'--out={args.out!r} exists and is not a directory')
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
    progs = {k: v for k, v in progs.items() if k not in ('one device', 'two-level floor')}
    rates, _ = step_throughput.measure(progs, args.steps, args.blocks)
    print(f'\n## {name} ({desc})', flush=True)
    for k, (run, _) in progs.items():
      tdir = os.path.join(args.out, f'{name}_{k.replace(" ", "_").replace("=", "")}')
      shutil.rmtree(tdir, ignore_errors=True)
      run(2)
      with jax.profiler.trace(tdir):
        with jax.profiler.TraceAnnotation(WINDOW):
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
