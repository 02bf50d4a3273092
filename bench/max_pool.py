"""2x2 max-pooling on one device: flax's pooling vs hfl.models.max_pool_2x2.

``flax.linen.max_pool`` lowers to XLA's reduce-window (forward) and select-and-scatter
(backward); ``hfl.models.max_pool_2x2`` computes the same values and gradient with
reshapes and elementwise selects. For each shape (the pooling layers of the small CNN
and the CIFAR CNN at a global batch of 256 by default) this times the forward pass
and the forward + backward pass (``jax.vjp``) of both, jitted, on device 0, in
alternating blocks (median ms per call), and checks that outputs and gradients are
bitwise equal.

  python3 bench/max_pool.py [--shapes=256x28x28x32,256x14x14x64,...] [--calls=20] \
      [--blocks=5]
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hfl import runtime  # noqa: E402

runtime.use_fast_allocator()  # re-exec once with tcmalloc (docs/benchmarks.md)

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from hfl import models  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from arg_types import int_at_least  # noqa: E402

# The inputs of the pooling layers of models 'cnn' (Fashion-MNIST) and 'cifar_cnn'
# (CIFAR-10) at a global batch of 256 (8 workers x 32).
DEFAULT_SHAPES = '256x28x28x32,256x14x14x64,256x32x32x32,256x16x16x64,256x8x8x128'


def shape_list(text: str) -> list[tuple[int, ...]]:
  """'BxHxWxC,...' -> [(B, H, W, C), ...]; argparse type."""
  out = []
  for item in text.split(','):
    if not item.strip():
      raise argparse.ArgumentTypeError(f'{text!r} holds an empty shape (a stray comma?)')
    try:
      dims = tuple(int(d) for d in item.lower().split('x'))
    except ValueError:
      dims = ()
    if len(dims) != 4 or min(dims) < 1 or min(dims[1:3]) < 2:
      raise argparse.ArgumentTypeError(
          f'{item!r} is not a shape BxHxWxC of four positive integers with H, W >= 2 '
          '(e.g. 256x28x28x32)')
    out.append(dims)
  return out


def flax_pool(x):
  return nn.max_pool(x, (2, 2), (2, 2))


def vjp_of(pool):
  """jit of x, g -> (pool(x), d/dx <g, pool(x)>)."""
  def f(x, g):
    y, back = jax.vjp(pool, x)
    return y, back(g)[0]
  return jax.jit(f)


def main():
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--shapes', type=shape_list, default=shape_list(DEFAULT_SHAPES),
                  help='comma-separated BxHxWxC input shapes')
  ap.add_argument('--calls', type=int_at_least(1), default=20, help='calls per timed block')
  ap.add_argument('--blocks', type=int_at_least(1), default=5)
  args = ap.parse_args()

  dev = jax.devices()[0]
  print(f'allocator: {runtime.active() or "glibc malloc"}; {dev.platform} device '
        f'({dev.device_kind}); float32; median ms per call over {args.blocks} alternating '
        f'blocks of {args.calls} calls\n')
  print('| input [B, H, W, C] | forward: flax / hfl ms | forward + backward: flax / hfl ms '
        '| speed-up (fwd + bwd) | bitwise equal |')
  print('|---|---:|---:|---:|---|')
  rng = np.random.default_rng(0)
  for shape in args.shapes:
    # Rounded to a coarse grid so that windows hold ties, whose rule both must share.
    x = jax.device_put(np.round(rng.normal(size=shape) * 4).astype(np.float32), dev)
    out = (shape[0], shape[1] // 2, shape[2] // 2, shape[3])
    g = jax.device_put(rng.normal(size=out).astype(np.float32), dev)
    fns = {'flax fwd': jax.jit(flax_pool), 'hfl fwd': jax.jit(models.max_pool_2x2),
           'flax vjp': vjp_of(flax_pool), 'hfl vjp': vjp_of(models.max_pool_2x2)}
    runs = {k: (lambda f=f, k=k: f(x, g) if k.endswith('vjp') else f(x)) for k, f in fns.items()}
    results = {k: jax.block_until_ready(r()) for k, r in runs.items()}  # compiles
    equal = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(
        (results['flax fwd'],) + tuple(results['flax vjp']),
        (results['hfl fwd'],) + tuple(results['hfl vjp'])))
    times = {k: [] for k in runs}
    for _ in range(args.blocks):
      for k, r in runs.items():
        t0 = time.perf_counter()
        for _ in range(args.calls):
          jax.block_until_ready(r())
        times[k].append((time.perf_counter() - t0) / args.calls * 1e3)
    ms = {k: float(np.median(v)) for k, v in times.items()}
    print(f'| {"x".join(map(str, shape))} | {ms["flax fwd"]:.2f} / {ms["hfl fwd"]:.2f} | '
          f'{ms["flax vjp"]:.2f} / {ms["hfl vjp"]:.2f} | '
          f'{ms["flax vjp"] / ms["hfl vjp"]:.1f}x | {"yes" if equal else "NO"} |')


if __name__ == '__main__':
  main()
