"""Throughput of compressor encode+decode, relative to this machine's copy bandwidth.

Run:
  python bench/compressors.py                 # 1M and 10M float32 entries
  python bench/compressors.py --sizes=1000000 --runs=5

For each size, a jitted copy (``x + 0``, same size, same run) is the reference;
every compressor's jitted ``decode(encode(x))`` is timed (warm-up call first,
then the median of ``--runs`` calls, each ``block_until_ready``). Throughput is
GB/s of float32 input processed (size * 4 bytes / time) and the fraction of the
copy's throughput. Leaves are 2-D, (size / 1000, 1000), so PowerSGD sees a matrix.
Prints a markdown table that can be pasted into docs/benchmarks.md.
"""

import argparse
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hfl import runtime  # noqa: E402

runtime.use_fast_allocator()  # re-exec once with tcmalloc (docs/benchmarks.md)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from hfl import compress as C  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from arg_types import int_at_least, int_list  # noqa: E402

COMPRESSORS = {
    'identity (f32)': lambda s: C.identity(s),
    'bf16': lambda s: C.cast(s, jnp.bfloat16),
    'fp16': lambda s: C.cast(s, jnp.float16),
    'topk exact (1%)': lambda s: C.topk(s, 0.01),
    'topk threshold (1%)': lambda s: C.topk(s, 0.01, threshold_variant=True),
    'topk threshold (0.1%)': lambda s: C.topk(s, 0.001, threshold_variant=True),
    'randk (1%)': lambda s: C.randk(s, 0.01),
    'qsgd (s=16)': lambda s: C.qsgd(s, 16),
    'sign': lambda s: C.sign(s),
    'powersgd (r=2)': lambda s: C.powersgd(s, 2),
}


def _time(fn, *args, runs):
  """Median wall time (s) of ``fn(*args)`` after one warm-up call."""
  jax.block_until_ready(fn(*args))
  ts = []
  for _ in range(runs):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    ts.append(time.perf_counter() - t0)
  return float(np.median(ts))


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument('--sizes', type=int_list(lo=1000, multiple_of=1000),
                  default='1000000,10000000',
                  help='comma-separated entry counts, multiples of 1000 (leaves are '
                  '(size / 1000, 1000))')
  ap.add_argument('--runs', type=int_at_least(1), default=7)
  ap.add_argument('--only', default='',
                  help='comma-separated parts of names (e.g. topk,bf16) selecting compressors')
  args = ap.parse_args()
  sizes = args.sizes
  only = [o.strip() for o in args.only.split(',') if o.strip()]
  unmatched = [o for o in only if not any(o in n for n in COMPRESSORS)]
  if unmatched:
    ap.error(f'--only={args.only!r}: {", ".join(map(repr, unmatched))} matches no compressor; '
             f'names: {", ".join(COMPRESSORS)}')
  names = [n for n in COMPRESSORS if not only or any(o in n for o in only)]

  rows = []
  for size in sizes:
    shape = (size // 1000, 1000)
    x = jax.random.normal(jax.random.PRNGKey(0), shape, jnp.float32)
    key = jax.random.PRNGKey(1)
    gb = size * 4 / 1e9
    t_copy = _time(jax.jit(lambda v: v + 0), x, runs=args.runs)
    rows.append(('copy (x + 0)', size, t_copy, gb / t_copy, 1.0, 32.0))
    for name in names:
      c = COMPRESSORS[name](shape)
      state = c.init()
      fn = jax.jit(lambda v, k, c=c, state=state: c.decode(c.encode(v, state, k)[0]))
      t = _time(fn, x, key, runs=args.runs)
      bits = C.static_bits(c) / size
      rows.append((name, size, t, gb / t, t_copy / t, bits))
      print(f'  {name:24s} {size:>9d}  {t * 1e3:9.2f} ms', file=sys.stderr)

  print(f'\nCommand: `python bench/compressors.py --sizes={",".join(map(str, sizes))} '
        f'--runs={args.runs}`')
  print(f'Machine: {platform.processor() or platform.machine()}, '
        f'{os.cpu_count()} CPUs, jax {jax.__version__}, '
        f'backend {jax.default_backend()}\n')
  print('| compressor | entries | bits/entry | encode+decode (ms) | GB/s of input '
        '| fraction of copy |')
  print('|---|---:|---:|---:|---:|---:|')
  for name, size, t, gbs, frac, bits in rows:
    print(f'| {name} | {size:,} | {bits:.3f} | {t * 1e3:.2f} | {gbs:.2f} '
          f'| {frac * 100:.1f}% |')


if __name__ == '__main__':
  main()
