"""Quantising compressors: QSGD (stochastic, s levels) and scaled sign (EF-signSGD).

Codes are bit-packed into uint8 so the payload's size is the wire cost:
``wire_bits`` (the base default, sizes x dtype widths) counts exactly the packed
bytes plus the float32 scales.

References:
  * QSGD: Alistarh, Grubic, Li, Tomioka & Vojnovic, "QSGD: Communication-Efficient
    SGD via Gradient Quantization and Encoding", NeurIPS 2017, Sec. 3.1, eq. (4):
    Q_s(v_i) = ||v||_2 * sgn(v_i) * xi_i(v, s), where with l = floor(|v_i| s / ||v||_2)
    xi_i = (l + 1)/s with probability |v_i| s/||v||_2 - l, else l/s (unbiased).
    Bucketing (one norm per bucket of d entries) as in the paper's experiments.
  * Scaled sign with error feedback: Karimireddy, Rebjock, Stich & Jaggi, "Error
    Feedback Fixes SignSGD and other Gradient Compression Schemes", ICML 2019,
    Algorithm 1 (EF-SignSGD): C(p) = (||p||_1 / d) * sign(p).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

from hfl.compress import base
from hfl.compress.base import Compressor, EmptyState
from hfl.compress.registry import register

_BIT_WEIGHTS = (128, 64, 32, 16, 8, 4, 2, 1)  # MSB first, like np.packbits


def pack_bits(bits: jax.Array) -> jax.Array:
  """Packs booleans along the last axis into bytes, MSB first (as ``np.packbits``).

  Args:
    bits: bool[..., n].

  Returns:
    uint8[..., ceil(n / 8)]; the last byte is zero-padded.
  """
  n = bits.shape[-1]
  pad = (-n) % 8
  b = bits.astype(jnp.uint8)
  if pad:
    b = jnp.pad(b, [(0, 0)] * (b.ndim - 1) + [(0, pad)])
  b = b.reshape(b.shape[:-1] + (-1, 8))
  w = jnp.asarray(_BIT_WEIGHTS, jnp.uint8)
  return jnp.sum(b * w, axis=-1, dtype=jnp.uint8)


def unpack_bits(packed: jax.Array, n: int) -> jax.Array:
  """Inverse of :func:`pack_bits`.

  Args:
    packed: uint8[..., ceil(n / 8)].
    n: number of bits to return.

  Returns:
    bool[..., n].
  """
  w = jnp.asarray(_BIT_WEIGHTS, jnp.uint8)
  bits = (packed[..., None] & w) != 0
  return bits.reshape(packed.shape[:-1] + (-1,))[..., :n]


# The most QSGD levels s: the scaled magnitude s * |x| / ||x|| <= s is a float32
# (24 significand bits), and the stochastic rounding needs its fraction: with
# s <= 2**16 at least 8 fraction bits are left, so the rounding probability is
# resolved to 2**-8 or finer and the code stays unbiased to that resolution.
MAX_LEVELS = 2**16


def level_bits(levels: int) -> int:
  """Bits of a QSGD magnitude code in {0, ..., levels}: ceil(log2(levels + 1))."""
  return max(1, math.ceil(math.log2(levels + 1)))


def qsgd(shape, levels: int = 16, bucket_size: int | None = 512,
         **unused) -> Compressor:
  """QSGD stochastic quantisation to ``levels`` (s) levels per sign (needs ``key``).

  Each bucket of ``bucket_size`` entries (default 512, the paper's bucket size d;
  None: the whole leaf) sends its L2
  norm (float32) and, per entry, a sign bit and a level l in {0..s} on
  ``level_bits(s)`` bits, packed as bit planes. Unbiased: E[decode] = x.
  An all-zero bucket has norm 0 and decodes to zeros (no NaN). The norm is
  computed overflow-safe (:func:`hfl.compress.base.l2_norm`); a finite bucket whose
  norm exceeds float32's range sends ``FLOAT32_MAX`` instead, still >= every
  entry, so the code stays unbiased and the payload finite (the variance bound of
  the paper's Lemma 3.1 then holds with that value for ||v||_2).

  Wire cost: ``32 * num_buckets + 8 * (1 + level_bits(s)) * ceil(size / 8)`` bits,
  i.e. ~(1 + ceil(log2(s + 1))) bits per entry (6 for s = 16).

  Args:
    shape: the leaf's shape.
    levels: s in [1, MAX_LEVELS], number of non-zero magnitude levels.
    bucket_size: entries per norm (default 512); None for one norm per leaf —
      with s = 16 levels on a 10^5-entry leaf that variance diverges training.
    **unused: other spec hyper-parameters, ignored.

  Returns:
    Compressor with payload ``{'norm': f32[num_buckets],
    'codes': uint8[1 + level_bits(s), ceil(size / 8)]}`` (plane 0: sign bit,
    1 = negative; planes 1..: level bits, least significant first).

  Raises:
    ValueError: levels not in [1, MAX_LEVELS] or bucket_size < 1.
  """
  del unused
  if int(levels) != levels or not 1 <= levels <= MAX_LEVELS:
    raise ValueError(f'levels must be an integer in [1, {MAX_LEVELS}], got {levels!r}')
  levels = int(levels)
  shape = tuple(int(d) for d in shape)
  size = int(np.prod(shape, dtype=np.int64))
  bucket = size if bucket_size is None else int(bucket_size)
  if bucket < 1:
    raise ValueError(f'bucket_size must be >= 1, got {bucket_size!r}')
  bucket = min(bucket, size)
  nb = -(-size // bucket)
  padded = nb * bucket
  nbits = level_bits(levels)

  def encode(x, state, key):
    flat = x.reshape(-1).astype(jnp.float32)
    if padded != size:
      flat = jnp.pad(flat, (0, padded - size))
    v = flat.reshape(nb, bucket)
    norm = base.l2_norm(v, axis=1)
    # |v| / norm with both pre-scaled by the same power of two (exact): the divisor
    # is then in [1, 4), never near float32's max, where XLA:CPU's division (a
    # multiply by the flushed-to-zero reciprocal) would give 0.
    down = base.pow2_scale(norm)[0][:, None]
    safe = jnp.where(norm[:, None] > 0, norm[:, None] * down, 1.0)
    r = jnp.clip(jnp.abs(v) * down / safe * levels, 0.0, float(levels))
    low = jnp.floor(r)
    u = jax.random.uniform(key, r.shape)
    lvl = (low + (u < r - low)).astype(jnp.uint32).reshape(-1)[:size]
    neg = (v < 0).reshape(-1)[:size]
    planes = [neg] + [((lvl >> b) & 1).astype(bool) for b in range(nbits)]
    return {'norm': norm, 'codes': pack_bits(jnp.stack(planes))}, state

  def decode(payload):
    bits = unpack_bits(payload['codes'], size)
    lvl = jnp.zeros((size,), jnp.float32)
    for b in range(nbits):
      lvl = lvl + bits[1 + b].astype(jnp.float32) * float(1 << b)
    mag = lvl / levels
    if padded != size:
      mag = jnp.pad(mag, (0, padded - size))
    val = (mag.reshape(nb, bucket) * payload['norm'][:, None]).reshape(-1)[:size]
    return jnp.where(bits[0], -val, val).reshape(shape)

  name = f'qsgd(s={levels}' + (f',d={bucket}' if bucket_size else '') + ')'
  return Compressor(name, shape, EmptyState, encode, decode)


def sign(shape, **unused) -> Compressor:
  """Scaled sign, 1 bit per entry + one float32 scale (EF-signSGD).

  decode = mean(|x|) * s, with s_i = +1 if x_i >= 0 else -1: sign(0) is +1, so
  the code is strictly binary (never a third value). Biased; use with
  error feedback (Karimireddy et al. 2019). The mean is computed overflow-safe
  (:func:`hfl.compress.base.mean_abs`): finite for every finite ``x``.

  Wire cost: ``32 + 8 * ceil(size / 8)`` bits.

  Args:
    shape: the leaf's shape.
    **unused: other spec hyper-parameters, ignored.

  Returns:
    Compressor with payload ``{'scale': f32[], 'signs': uint8[ceil(size / 8)]}``
    (bit 1 = non-negative, MSB first).
  """
  del unused
  shape = tuple(int(d) for d in shape)
  size = int(np.prod(shape, dtype=np.int64))

  def encode(x, state, key):
    del key
    flat = x.reshape(-1).astype(jnp.float32)
    scale = base.mean_abs(flat)
    return {'scale': scale, 'signs': pack_bits(flat >= 0)}, state

  def decode(payload):
    pos = unpack_bits(payload['signs'], size)
    s = payload['scale'].astype(jnp.float32)
    return jnp.where(pos, s, -s).reshape(shape)

  return Compressor('sign', shape, EmptyState, encode, decode)


register('qsgd', qsgd, ('levels', 'bucket_size'), example={'levels': 16, 'bucket_size': 64})
register('sign', sign)
