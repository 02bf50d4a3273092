"""Can a semi-synchronous step skip its idle DCs with ``lax.cond``? Its cost on this backend.

The lockstep semi-sync program runs every DC each iteration and masks the DCs
whose K_d is done (hfl.step's ``active``). Skipping their work instead means a
per-DC ``jax.lax.cond`` around (at least) the worker's forward and backward pass.
This measures, for one worker's batch, ``jit(value_and_grad(loss))`` against the
same function as the taken branch of a ``lax.cond`` (the idle branch computes
the forward loss only), timed in alternating blocks in one process, and whether
the two give bitwise the same loss and gradient.

On XLA:CPU a convolution inside a nested computation (a conditional or a loop
body) does not get the entry computation's kernel (jax-ml/jax#12868), so the
taken branch can be slower than the whole masked step it would save and round
differently; a cond is then no saving and no longer bitwise the masked run.

  python3 bench/skip_idle.py [--model=cnn,transformer] [--batch=32] [--blocks=5]
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from hfl import models  # noqa: E402

_MODELS = flags.DEFINE_list('model', ['cnn', 'transformer'], 'hfl.models names.')
_BATCH = flags.DEFINE_integer('batch', 32, "one worker's batch")
_BLOCKS = flags.DEFINE_integer('blocks', 5, 'alternating timing blocks of 5 calls each')


def _inputs(name: str, batch: int):
  rng = np.random.default_rng(0)
  if models.input_kind(name) == 'tokens':
    t = models.TRANSFORMER_FIELDS['seq_len']
    x = rng.integers(0, 65, size=(batch, t)).astype(np.int32)
    return models.get_model(name, 65), jnp.asarray(x), jnp.asarray(np.roll(x, -1, 1))
  x = rng.normal(size=(batch, 28, 28, 1)).astype(np.float32)
  return models.get_model(name, 10), jnp.asarray(x), jnp.zeros((batch,), jnp.int32)


def measure(name: str, batch: int, blocks: int) -> dict:
  """Median seconds per call of the plain and the cond'ed gradient, and bitwise equality."""
  net, x, y = _inputs(name, batch)
  params = net.init(jax.random.PRNGKey(0), x[:1])['params']
  loss = lambda p: optax.softmax_cross_entropy_with_integer_labels(
      net.apply({'params': p}, x), y).mean()
  grad = jax.value_and_grad(loss)
  idle = lambda p: (loss(p), jax.tree.map(jnp.zeros_like, p))
  plain = jax.jit(grad)
  cond = jax.jit(lambda p, run: jax.lax.cond(run, grad, idle, p))
  calls = {'plain': lambda: plain(params), 'cond': lambda: cond(params, True)}
  times = {k: [] for k in calls}
  for f in calls.values():
    jax.block_until_ready(f())
  for _ in range(blocks):
    for k, f in calls.items():
      t = time.perf_counter()
      for _ in range(5):
        jax.block_until_ready(f())
      times[k].append((time.perf_counter() - t) / 5)
  a, b = calls['plain'](), calls['cond']()
  same = all(np.array_equal(u, v) for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
  return dict(plain_s=float(np.median(times['plain'])), cond_s=float(np.median(times['cond'])),
              bitwise=same)


def main(argv):
  del argv
  print(f'backend {jax.default_backend()}, jax {jax.__version__}, batch {_BATCH.value}')
  print('model        plain ms   cond ms   cond/plain   bitwise')
  for name in _MODELS.value:
    r = measure(name, _BATCH.value, _BLOCKS.value)
    print(f'{name:12s} {1e3 * r["plain_s"]:8.2f} {1e3 * r["cond_s"]:9.2f} '
          f'{r["cond_s"] / r["plain_s"]:11.2f}   {r["bitwise"]}')


if __name__ == '__main__':
  app.run(main)
