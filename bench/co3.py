"""CO3 benchmarks: coder throughput, and bits per entry on real gradients.

Usage::

    python bench/co3.py                 # throughput table (1M-symbol streams)
    python bench/co3.py --bits          # bits/entry on Fashion-MNIST CNN gradients
    python bench/co3.py --bits --fmt fp8 --steps 50

Throughput: Huffman and ANS (constriction) encode/decode of 1M fp4 symbols drawn
from the CO3 conversion of GenNorm(beta=1) data, in MB/s of symbols (1 byte each)
and of the float32 input they stand for (4 bytes each), plus the in-jit convert
(GenNorm fit + scale + round, ``co3(...).encode``) and in-jit accounting
(``wire_bits``: Huffman from the symbol histogram, ANS by replaying the coder)
throughput on the default JAX backend.

Bits: a small Flax CNN is trained for ``--steps`` SGD steps on real Fashion-MNIST
(IDX files under /usr/share/datasets/fashion-mnist); the gradients of the next
``--batches`` batches are CO3-converted layer by layer and coded. Columns, in bits
per gradient entry: the empirical-entropy bound (magnitude entropy + one sign bit
per non-zero, no side information), the GenNorm-designed Huffman code (real
bitstream incl. the 40-bit header; the in-jit count is checked equal), and ANS
(real constriction stream incl. header; the in-jit count is checked equal).
"""

import argparse
import gzip
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hfl import runtime  # noqa: E402

runtime.use_fast_allocator()  # re-exec once with tcmalloc (docs/benchmarks.md)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from scipy import stats  # noqa: E402

from hfl.compress import co3 as co3_lib  # noqa: E402
from hfl.compress import coding  # noqa: E402
from hfl.compress import floatgrid  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from arg_types import int_at_least  # noqa: E402

FMNIST_DIR = '/usr/share/datasets/fashion-mnist'


def _best(fn, reps=3):
  best = float('inf')
  out = None
  for _ in range(reps):
    t = time.perf_counter()
    out = fn()
    best = min(best, time.perf_counter() - t)
  return best, out


def throughput(n=1_000_000, fmt='fp4', beta=1.0):
  """Markdown table of coder and convert throughput on an n-entry stream."""
  x = stats.gennorm.rvs(beta, scale=0.01, size=n, random_state=0).astype(np.float32)
  rows = []
  for coder in co3_lib.CODERS:
    c = co3_lib.co3((n,), fmt=fmt, coder=coder)
    codec = co3_lib.make_codec(co3_lib.parse_fmt(fmt), coder)
    payload, _ = jax.jit(c.encode)(jnp.asarray(x), c.init(), jax.random.key(0))
    payload = jax.device_get(payload)
    t_enc, msg = _best(lambda: co3_lib.encode_message(payload, codec))
    t_dec, back = _best(lambda: co3_lib.decode_message(msg, (n,), codec))
    assert np.array_equal(back['symbols'], payload['symbols'])
    bpe = 8 * len(msg) / n
    for what, t in (('encode', t_enc), ('decode', t_dec)):
      rows.append((f'{coder} {what} (host)', t, n / t / 1e6, 4 * n / t / 1e6, bpe))
  c = co3_lib.co3((n,), fmt=fmt)
  enc = jax.jit(c.encode)
  xs, st, key = jnp.asarray(x), c.init(), jax.random.key(0)
  jax.block_until_ready(enc(xs, st, key))
  t, payload = _best(lambda: jax.block_until_ready(enc(xs, st, key)), reps=5)
  rows.append(('convert, in-jit (fit+scale+round)', t, n / t / 1e6, 4 * n / t / 1e6,
               float('nan')))
  for coder, how in (('huffman', 'histogram'), ('ans', 'coder replay')):
    bits = jax.jit(co3_lib.co3((n,), fmt=fmt, coder=coder).wire_bits)
    jax.block_until_ready(bits(payload[0]))
    t, _ = _best(lambda: jax.block_until_ready(bits(payload[0])), reps=5)
    rows.append((f'wire_bits {coder}, in-jit ({how})', t, n / t / 1e6, 4 * n / t / 1e6,
                 float('nan')))
  lines = [f'CO3 throughput, {n} entries, fmt={fmt}, GenNorm(beta={beta}) data, '
           f'backend={jax.default_backend()}, best of 3-5',
           '',
           '| stage | time (ms) | symbols MB/s | float32 input MB/s | bits/entry |',
           '|---|---:|---:|---:|---:|']
  for name, t, mbs, mbf, bpe in rows:
    b = '' if np.isnan(bpe) else f'{bpe:.3f}'
    lines.append(f'| {name} | {1e3 * t:.1f} | {mbs:.1f} | {mbf:.1f} | {b} |')
  return '\n'.join(lines)


def _read_idx(path):
  with gzip.open(path, 'rb') as f:
    data = f.read()
  ndim = data[3]
  dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], 'big') for i in range(ndim)]
  return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_fashion_mnist(directory=FMNIST_DIR):
  """(train images f32[N,28,28,1] normalised, labels int32[N])."""
  try:
    from hfl import data as hfl_data  # pylint: disable=g-import-not-at-top
    ds = hfl_data.load('fashion_mnist', directory)
    return np.asarray(ds.train_images, np.float32), np.asarray(ds.train_labels, np.int32)
  except (ImportError, AttributeError):
    images = _read_idx(os.path.join(directory, 'train-images-idx3-ubyte.gz'))
    labels = _read_idx(os.path.join(directory, 'train-labels-idx1-ubyte.gz'))
    images = images.astype(np.float32)[..., None] / 255.0
    return (images - images.mean()) / images.std(), labels.astype(np.int32)


def _cnn():
  import flax.linen as nn  # pylint: disable=g-import-not-at-top

  class CNN(nn.Module):
    """conv32-pool-conv64-pool-dense128-dense10 (~420k parameters)."""

    @nn.compact
    def __call__(self, x):
      x = nn.relu(nn.Conv(32, (3, 3), name='conv1')(x))
      x = nn.max_pool(x, (2, 2), (2, 2))
      x = nn.relu(nn.Conv(64, (3, 3), name='conv2')(x))
      x = nn.max_pool(x, (2, 2), (2, 2))
      x = nn.relu(nn.Dense(128, name='dense1')(x.reshape(x.shape[0], -1)))
      return nn.Dense(10, name='dense2')(x)

  return CNN()


def real_gradients(steps=30, batches=3, batch_size=64, lr=0.05, seed=0):
  """Trains the CNN ``steps`` SGD steps; returns the next ``batches`` gradients."""
  images, labels = load_fashion_mnist()
  model = _cnn()
  params = model.init(jax.random.key(seed), jnp.zeros((1, 28, 28, 1)))['params']

  def loss_fn(p, x, y):
    logits = model.apply({'params': p}, x)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))

  grad_fn = jax.jit(jax.value_and_grad(loss_fn))
  rng = np.random.default_rng(seed)
  grads, loss = [], None
  for t in range(steps + batches):
    idx = rng.choice(len(labels), batch_size, replace=False)
    loss, g = grad_fn(params, jnp.asarray(images[idx]), jnp.asarray(labels[idx]))
    if t < steps:
      params = jax.tree.map(lambda p, g: p - lr * g, params, g)
    else:
      grads.append(jax.device_get(g))
  return grads, float(loss)


def bits_table(steps=30, batches=3, fmt='fp4'):
  """Markdown table of bits per entry per layer on real gradients."""
  grads, loss = real_gradients(steps, batches)
  fmt_t = co3_lib.parse_fmt(fmt)
  codecs = {c: co3_lib.make_codec(fmt_t, c) for c in co3_lib.CODERS}
  grid = codecs['huffman'].grid
  names = ['/'.join(str(getattr(k, 'key', k)) for k in path)
           for path, _ in jax.tree_util.tree_flatten_with_path(grads[0])[0]]
  acc = {}
  compiled = {}
  for g in grads:
    for name, leaf in zip(names, jax.tree.leaves(g)):
      leaf = np.asarray(leaf, np.float32)
      a = acc.setdefault(name, dict(n=0, ent=0.0, huf=0, huf_jit=0.0, ans=0,
                                    ans_jit=0.0, beta=[], sym_ent=0.0))
      if name not in compiled:
        cs = {c: co3_lib.co3(leaf.shape, fmt=fmt_t, coder=c) for c in co3_lib.CODERS}
        compiled[name] = (cs, jax.jit(cs['huffman'].encode),
                          {c: jax.jit(cs[c].wire_bits) for c in cs})
      cs, encode, wire_bits = compiled[name]
      # The payload does not depend on the coder; only the accounting does.
      payload, state = encode(jnp.asarray(leaf), cs['huffman'].init(),
                              jax.random.key(0))
      for coder in co3_lib.CODERS:
        real = 8 * len(co3_lib.encode_message(payload, codecs[coder]))
        key = 'huf' if coder == 'huffman' else 'ans'
        a[key] += real
        a[key + '_jit'] += float(wire_bits[coder](payload))
      e = coding.empirical_entropy(np.asarray(payload['symbols']), grid)
      a['n'] += leaf.size
      a['ent'] += e.bound_bits
      a['sym_ent'] += e.symbol_bits
      a['beta'].append(float(state.beta))
  lines = [f'CO3 bits per gradient entry, fmt={fmt} {fmt_t}, Fashion-MNIST CNN, '
           f'{batches} gradients after {steps} SGD steps (loss {loss:.3f}); '
           'Huffman/ANS = real bitstreams incl. 40-bit header; in-jit = charged in the step',
           '',
           '| layer | entries | beta | entropy bound | Huffman | Huffman in-jit | ANS | ANS in-jit |',
           '|---|---:|---:|---:|---:|---:|---:|---:|']
  tot = dict(n=0, ent=0.0, huf=0, huf_jit=0.0, ans=0, ans_jit=0.0)
  for name, a in acc.items():
    n = a['n']
    assert a['huf'] == a['huf_jit'], (name, a['huf'], a['huf_jit'])
    assert a['ans'] == a['ans_jit'], (name, a['ans'], a['ans_jit'])
    lines.append(f"| {name} | {n // batches} | {np.mean(a['beta']):.2f} | "
                 f"{a['ent'] / n:.3f} | {a['huf'] / n:.3f} | {a['huf_jit'] / n:.3f} | "
                 f"{a['ans'] / n:.3f} | {a['ans_jit'] / n:.3f} |")
    for k in tot:
      tot[k] += a[k]
  n = tot['n']
  lines.append(f"| **total** | {n // batches} | | {tot['ent'] / n:.3f} | "
               f"{tot['huf'] / n:.3f} | {tot['huf_jit'] / n:.3f} | {tot['ans'] / n:.3f} | "
               f"{tot['ans_jit'] / n:.3f} |")
  return '\n'.join(lines)


def float_format(text: str) -> str:
  """argparse type of --fmt: ``text`` when it is a CO3 float format, else ArgumentTypeError."""
  try:
    floatgrid.make_grid(co3_lib.parse_fmt(text))
  except ValueError as e:
    raise argparse.ArgumentTypeError(str(e)) from None
  return text


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--bits', action='store_true', help='bits/entry on real gradients')
  parser.add_argument('--fmt', type=float_format, default='fp4', help="'fp4', 'fp8' or 's,e,m'")
  parser.add_argument('--n', type=int_at_least(1), default=1_000_000,
                      help='throughput stream size')
  parser.add_argument('--steps', type=int_at_least(0), default=30,
                      help='SGD steps before measuring')
  parser.add_argument('--batches', type=int_at_least(1), default=3, help='gradients measured')
  args = parser.parse_args()
  if args.n > co3_lib.max_entries():
    parser.error(f'--n={args.n}: CO3 takes at most {co3_lib.max_entries()} entries')
  if args.bits and not os.path.isdir(FMNIST_DIR):
    parser.error(f'--bits needs Fashion-MNIST in {FMNIST_DIR} (IDX files); not found')
  cmd = 'python bench/co3.py ' + ' '.join(sys.argv[1:])
  if args.bits:
    print(bits_table(args.steps, args.batches, args.fmt))
  else:
    print(throughput(args.n, args.fmt))
  print(f'\ncommand: `{cmd.strip()}`')


if __name__ == '__main__':
  main()
