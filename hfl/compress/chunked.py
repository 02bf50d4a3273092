"""Chunked top-k with 2-bit values: SparseLoCo's pseudo-gradient compressor.

SparseLoCo (Sarfi, Thérien, Lidin & Belilovsky, "Communication Efficient LLM
Pre-training with SparseLoCo", arXiv:2508.15706, 2025, Algorithm 1) is DiLoCo whose
pseudo-gradient Δ_r is accumulated into a decaying error-feedback buffer and sent
sparse and quantised::

    e_r <- β e_r + Δ_r;   Δ̂_r = Q(TopK_chunk(e_r));   e_r <- e_r - Δ̂_r
    θ <- θ - α mean_r(Δ̂_r)                  (no outer momentum: e_r takes its place)

In hfl this is this compressor on the ``'dc'`` link (``compression.wan``) with its
``beta`` as the error-feedback memory weight (``p = x + β e``, :mod:`hfl.compress.ef`,
carried in the state's ``ef_gamma`` as CO3 does), and ``sync.outer.name = 'sgd'``
with ``momentum = 0`` and the outer lr α (``configs/sparseloco.py``).

The flattened leaf of ``size`` entries is cut into ``n = ceil(size / chunk_size)``
chunks of ``chunk_size`` (the last one padded with entries that are never sent);
each chunk keeps its ``k = num_kept(chunk_size, density)`` entries of largest
magnitude (ties: the lower index, as ``lax.top_k``; a chunk with fewer than k real
entries keeps them all). With ``value_bits = 2`` each kept value is sent as its sign
and one bit saying whether its magnitude exceeds the mean magnitude of its chunk's
kept values; the chunk's two magnitudes (the means of the kept magnitudes at or
below, and above, that mean; 0 for an empty class) are sent as bfloat16, so a
decoded value is ``±scale[class]``. The means are computed overflow-safe
(:func:`hfl.compress.base.mean_abs`) and saturate to bfloat16's max (3.39e38), so
every finite input gives finite scales (the excess stays in the error-feedback
residual). An all-zero chunk decodes to zeros, and within a chunk the decoded
magnitudes of each class sum to the kept ones (up to the bfloat16 rounding of the
scales); error feedback carries the rest.

Payload (static shapes; ``wire_bits`` = their sizes x widths, exact)::

  {'indices': idx[n, k]            within-chunk offsets (uint8 for chunk_size <= 256,
                                   uint16 for <= 65536, else int32; not sent at
                                   density 1, where every entry is kept in order),
   'signs':   uint8[ceil(n k / 8)] (value_bits = 2) 1 = negative,
   'large':   uint8[ceil(n k / 8)] (value_bits = 2) 1 = magnitude above the mean,
   'scales':  bfloat16[n, 2]       (value_bits = 2) small- and large-class magnitude,
   'values':  float32[n, k]        (value_bits = 32 instead of the three above)}

so ``n k (index bits + 2) + 32 n`` bits for 2-bit values (``2 n k + 32 n`` at
density 1: a plain 2-bit quantiser with two scales per chunk).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from hfl.compress import base
from hfl.compress.base import Compressor
from hfl.compress.quantize import pack_bits, unpack_bits
from hfl.compress.registry import register
from hfl.compress.sparse import num_kept

VALUE_BITS = (2, 32)


class ChunkedState(NamedTuple):
  """``ef_gamma``: float32[], β, the error-feedback memory weight (hfl.compress.ef)."""
  ef_gamma: jax.Array


def chunk_index_dtype(chunk_size: int):
  """The narrowest unsigned dtype holding an offset in a chunk of ``chunk_size``."""
  return jnp.uint8 if chunk_size <= 2**8 else jnp.uint16 if chunk_size <= 2**16 else jnp.int32


def _check_hyper(density, chunk_size, gamma, value_bits) -> None:
  """Raises ValueError for hyper-parameters :func:`chunked_topk` refuses (its Raises)."""
  if not 0.0 < float(density) <= 1.0:
    raise ValueError(f'density must be in (0, 1], got {density!r}')
  if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
    raise ValueError(f'chunk_size must be an integer >= 1, got {chunk_size!r}')
  if isinstance(gamma, bool) or not 0.0 <= float(gamma) <= 1.0:
    raise ValueError(f'gamma must be in [0, 1], got {gamma!r}')
  if value_bits not in VALUE_BITS:
    raise ValueError(f'value_bits must be one of {VALUE_BITS}, got {value_bits!r}')


def _two_bit_encode(vals, real) -> dict:
  """The 2-bit payload of each chunk's kept values f32[n, k] (``real``: not padding):
  ``signs`` and ``large`` (packed bits) and per chunk the bfloat16 ``scales`` [n, 2],
  the mean magnitude of its small and of its large values."""
  mag = jnp.abs(vals)
  # Means of magnitudes, overflow-safe (base.mean_abs: the plain sum / count where
  # that sum is a normal float, else pre-scaled): finite for every finite x, and
  # saturated to bfloat16's max before the cast (3.4e38 would round to inf).
  large = real & (mag > base.mean_abs(mag, axis=1, where=real)[:, None])
  small = real & ~large
  mean = lambda m: base.saturate(base.mean_abs(mag, axis=1, where=m), jnp.bfloat16)
  return dict(signs=pack_bits((vals < 0).reshape(-1)), large=pack_bits(large.reshape(-1)),
              scales=jnp.stack([mean(small), mean(large)], axis=1).astype(jnp.bfloat16))


def _two_bit_decode(payload, n: int, k: int):
  """The values f32[n, k] of :func:`_two_bit_encode`'s payload."""
  neg = unpack_bits(payload['signs'], n * k).reshape(n, k)
  large = unpack_bits(payload['large'], n * k).reshape(n, k)
  scales = payload['scales'].astype(jnp.float32)
  mag = jnp.where(large, scales[:, 1:2], scales[:, 0:1])
  return jnp.where(neg, -mag, mag)


def chunked_topk(shape, density: float = 0.02, chunk_size: int = 4096, gamma: float = 1.0,
                 value_bits: int = 2) -> Compressor:
  """Chunked top-k, values in 2 bits (module docstring); biased, use with error feedback.

  Args:
    shape: the leaf's shape.
    density: fraction of each chunk kept, in (0, 1] (SparseLoCo: 1-3%).
    chunk_size: entries per chunk, an integer >= 1 (SparseLoCo: 64 x 64 = 4096).
    gamma: β, the error-feedback memory weight in [0, 1] (``p = x + β e``; 1 =
      classic error feedback); the spec field ``gamma``, which CO3 uses for the same
      memory weight.
    value_bits: 2 (sign and magnitude class, bfloat16 scales per chunk) or 32
      (float32 values: chunked top-k alone).

  Returns:
    Compressor with the module docstring's payload and a :class:`ChunkedState`.

  Raises:
    ValueError: density outside (0, 1], chunk_size not an integer >= 1, gamma outside
      [0, 1] or value_bits not in :data:`VALUE_BITS`.
  """
  _check_hyper(density, chunk_size, gamma, value_bits)
  shape = tuple(int(d) for d in shape)
  size = int(np.prod(shape, dtype=np.int64))
  chunk = int(min(chunk_size, size))
  n = -(-size // chunk)
  k = num_kept(chunk, float(density))
  idt = chunk_index_dtype(chunk)
  beta = float(gamma)

  def init():
    return ChunkedState(jnp.float32(beta))

  def select(x):
    """(offsets int32[n, k], values f32[n, k], real bool[n, k]) of each chunk's top-k."""
    flat = jnp.pad(x.reshape(-1).astype(jnp.float32), (0, n * chunk - size))
    rows = flat.reshape(n, chunk)
    pos = jnp.arange(n * chunk, dtype=jnp.int32).reshape(n, chunk)
    if k == chunk:  # density 1: every entry, in order (no offsets are sent)
      off = jnp.broadcast_to(jnp.arange(chunk, dtype=jnp.int32), (n, chunk))
    else:
      mag = jnp.where(pos < size, jnp.abs(rows), -1.0)  # padding: never above a real entry
      _, off = lax.top_k(mag, k)
    real = jnp.take_along_axis(pos, off, axis=1) < size
    vals = jnp.where(real, jnp.take_along_axis(rows, off, axis=1), 0.0)
    return off, vals, real

  def encode(x, state, key):
    del key
    off, vals, real = select(x)
    payload = {} if k == chunk else {'indices': off.astype(idt)}
    if value_bits == 32:
      payload['values'] = vals
      return payload, state
    payload.update(_two_bit_encode(vals, real))
    return payload, state

  def values(payload):
    if value_bits == 32:
      return payload['values'].astype(jnp.float32)
    return _two_bit_decode(payload, n, k)

  def decode(payload):
    if k == chunk:
      return values(payload).reshape(-1)[:size].reshape(shape)
    at = (payload['indices'].astype(jnp.int32)
          + jnp.arange(n, dtype=jnp.int32)[:, None] * chunk).reshape(-1)
    flat = jnp.zeros((n * chunk,), jnp.float32).at[at].set(
        values(payload).reshape(-1), unique_indices=True)
    return flat[:size].reshape(shape)

  name = (f'chunked_topk({density:g}, chunk {chunk}, '
          f'{"2-bit" if value_bits == 2 else "f32"} values, gamma={beta:g})')
  return Compressor(name, shape, init, encode, decode)


register('chunked_topk', chunked_topk, ('density', 'chunk_size', 'gamma', 'value_bits'),
         example={'density': 0.05, 'chunk_size': 64})
