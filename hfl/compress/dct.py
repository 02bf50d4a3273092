"""Chunked DCT-II + top-k per chunk: DeMo's extraction of a momentum's fast components.

Source: Peng, Quesnelle & Kingma, "DeMo: Decoupled Momentum Optimization",
arXiv:2411.19870 (2024), Algorithm 1 and Sec. 3; reference code
github.com/bloc97/DeMo (``TransformDCT``, ``CompressDCT``). Each DeMo worker keeps a
momentum ``m <- β m + g``, sends ``q = TopK_chunk(DCT(m))``, keeps ``m <- m - IDCT(q)``;
the workers' ``q`` are gathered, decoded and averaged, and the parameters take a
signum step. In hfl that is this compressor on the uplink with its ``gamma`` as the
error-feedback memory weight β (``p = g + β e``, :mod:`hfl.compress.ef`, read from the
state's ``ef_gamma`` as CO3 and chunked_topk do: the residual e IS DeMo's momentum)
and ``optimizer.name = 'signum'`` on the aggregate (``docs/demo.md``,
``configs/demo.py``).

Chunks. The leaf is viewed as a matrix of R x C entries (C = the last dimension, R =
the product of the others; a 1-D leaf is 1 x n, a scalar 1 x 1), as DeMo views its 2-D
weights. Along each side the chunk edge is the largest divisor of that side that is
at most ``chunk_size`` (DeMo's ``_get_smaller_split``; a prime side longer than
``chunk_size`` gets edge 1), so a x b chunks tile the matrix exactly, with no padding:
``n = (R / a) (C / b)`` chunks of ``m = a b`` entries. Each chunk is transformed by the
orthonormal 2-D DCT-II ``Y = D_a X D_b^T`` (``D_N[k, j] = sqrt(2 / N) c_k cos(π (2 j +
1) k / (2 N))``, ``c_0 = 1 / sqrt 2``, else 1: scipy's ``dct(..., norm='ortho')``
along both axes), whose inverse is its transpose ``X = D_a^T Y D_b``. The chunk keeps
its ``k = num_kept(m, density)`` coefficients of largest magnitude (row-major offsets
``u b + v`` in the a x b coefficient block; ties: the lower offset, as ``lax.top_k``;
an all-zero chunk keeps offsets 0..k-1 with value 0). DeMo keeps a fixed k per chunk
(32 of 64 x 64 = ``density`` 0.0078125); here k follows the chunk's size.

Payload (static shapes; ``wire_bits`` = their sizes x widths, the default
:func:`hfl.compress.base.payload_bits`, exact)::

  {'indices': idx[n, k]      offsets in the chunk's coefficient block, in the dtype of
                             :func:`hfl.compress.chunked.chunk_index_dtype` (uint8 for
                             m <= 256, uint16 for <= 65536, else int32); not sent at
                             density 1, where every coefficient is sent in order,
   'values':  float32[n, k]  the kept coefficients}

so ``n k (32 + index bits)`` bits (``32 n m`` at density 1: the DCT alone, lossless up
to rounding).

Numerics. The transforms run in float32 with ``Precision.HIGHEST`` (a TPU or GPU
default of bf16 or TF32 passes would put their rounding into the error-feedback
residual). Each chunk is pre-scaled by a power of two of its max-abs
(:func:`hfl.compress.base.pow2_scale`; exact, so ordinary values give the plain
transform's results), so no intermediate overflows. A projection can exceed its input
entrywise (the DCT of a chunk of +-3e38 holds coefficients up to sqrt(m) 3e38, and a
decode entry is bounded only by the norm of the kept coefficients), so for a chunk
with ``max|p| + ||kept||_2 > (1 - 2^-8) FLOAT32_MAX`` the kept coefficients are scaled
down by the factor that makes it equal (0 when ``max|p|`` alone reaches it): then
every decoded entry (at most ``||kept||_2``, the DCT being orthonormal) and every
residual entry ``p - decode`` (at most ``max|p| + ||kept||_2``) is finite; the
caller's residual keeps what was not sent. Ordinary chunks are untouched (factor
exactly 1). A non-finite entry makes its chunk's coefficients, hence the decode and
the residual, non-finite.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from hfl.compress import base
from hfl.compress.base import Compressor
from hfl.compress.chunked import chunk_index_dtype
from hfl.compress.registry import register
from hfl.compress.sparse import num_kept

# Headroom below float32's max for a chunk's max|p| + ||kept||_2 (module docstring).
_HEADROOM = 1.0 - 2.0**-8
_HIGHEST = lax.Precision.HIGHEST


class DCTState(NamedTuple):
  """``ef_gamma``: float32[], β, the error-feedback memory weight (hfl.compress.ef):
  DeMo's momentum decay, the residual being its momentum."""
  ef_gamma: jax.Array


@functools.lru_cache(maxsize=None)
def dct_matrix(n: int) -> np.ndarray:
  """The orthonormal DCT-II matrix of size ``n`` (host-side, cached).

  ``D[k, j] = sqrt(2 / n) c_k cos(π (2 j + 1) k / (2 n))`` with ``c_0 = 1 / sqrt 2``
  and ``c_k = 1`` otherwise, so ``D @ x`` is scipy's ``dct(x, type=2, norm='ortho')``
  and ``D^T`` is its inverse (``D D^T = I``).

  Args:
    n: the transform length, an int >= 1.

  Returns:
    float32[n, n] (computed in float64, rounded once).

  Raises:
    ValueError: n < 1.
  """
  if n < 1:
    raise ValueError(f'dct_matrix: n must be >= 1, got {n}')
  k = np.arange(n, dtype=np.float64)[:, None]
  j = np.arange(n, dtype=np.float64)[None, :]
  d = np.sqrt(2.0 / n) * np.cos(np.pi * (2.0 * j + 1.0) * k / (2.0 * n))
  d[0] /= np.sqrt(2.0)
  d = d.astype(np.float32)
  d.setflags(write=False)
  return d


def chunk_edge(side: int, chunk_size: int) -> int:
  """The largest divisor of ``side`` that is at most ``chunk_size`` (DeMo's chunk edge).

  Args:
    side: a matrix side, an int >= 1.
    chunk_size: the target edge, an int >= 1.

  Returns:
    int in [1, min(side, chunk_size)] dividing ``side``.
  """
  for d in range(min(side, chunk_size), 0, -1):
    if side % d == 0:
      return d
  return 1


def matrix_view(shape) -> tuple[int, int]:
  """(R, C): the leaf as a matrix, C its last dimension and R the product of the others
  (1 x n for a 1-D leaf, 1 x 1 for a scalar)."""
  shape = tuple(int(d) for d in shape)
  if not shape:
    return 1, 1
  return int(np.prod(shape[:-1], dtype=np.int64)), shape[-1]


def to_chunks(x: jax.Array, a: int, b: int) -> jax.Array:
  """f32[R, C] -> f32[R / a, C / b, a, b]: chunk (i, j) is ``x[i a:(i + 1) a, j b:(j + 1) b]``."""
  r, c = x.shape
  return x.reshape(r // a, a, c // b, b).transpose(0, 2, 1, 3)


def from_chunks(blocks: jax.Array) -> jax.Array:
  """Inverse of :func:`to_chunks`: f32[nr, nc, a, b] -> f32[nr a, nc b]."""
  nr, nc, a, b = blocks.shape
  return blocks.transpose(0, 2, 1, 3).reshape(nr * a, nc * b)


def dct2(blocks: jax.Array) -> jax.Array:
  """Orthonormal 2-D DCT-II of each a x b chunk: f32[..., a, b] -> f32[..., a, b]."""
  da, db = dct_matrix(blocks.shape[-2]), dct_matrix(blocks.shape[-1])
  return jnp.einsum('ku,...uv,lv->...kl', da, blocks, db, precision=_HIGHEST)


def idct2(coefs: jax.Array) -> jax.Array:
  """Inverse of :func:`dct2` (its transpose): f32[..., a, b] -> f32[..., a, b]."""
  da, db = dct_matrix(coefs.shape[-2]), dct_matrix(coefs.shape[-1])
  return jnp.einsum('ku,...kl,lv->...uv', da, coefs, db, precision=_HIGHEST)


def topk_per_chunk(coefs: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
  """The k entries of largest magnitude of each row of ``coefs`` f32[n, m].

  Ties: the lower offset first (``lax.top_k``), so an all-zero row gives 0..k-1.

  Returns:
    (offsets int32[n, k] by decreasing magnitude, values f32[n, k] signed).
  """
  _, off = lax.top_k(jnp.abs(coefs), k)
  return off, jnp.take_along_axis(coefs, off, axis=1)


def _check_hyper(density, chunk_size, gamma) -> None:
  """Raises ValueError for hyper-parameters :func:`dct_topk` refuses (its Raises)."""
  if isinstance(density, bool) or not 0.0 < float(density) <= 1.0:
    raise ValueError(f'density must be in (0, 1], got {density!r}')
  if (isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer))
      or chunk_size < 1):
    raise ValueError(f'chunk_size must be an integer >= 1, got {chunk_size!r}')
  if isinstance(gamma, bool) or not 0.0 <= float(gamma) <= 1.0:
    raise ValueError(f'gamma must be in [0, 1], got {gamma!r}')


def dct_topk(shape, density: float = 0.0078125, chunk_size: int = 64,
             gamma: float = 0.999) -> Compressor:
  """Chunked DCT-II, top-k per chunk (module docstring); biased, use with error feedback.

  Args:
    shape: the leaf's shape.
    density: fraction of each chunk's coefficients kept, in (0, 1]; k =
      :func:`hfl.compress.sparse.num_kept` of the chunk's entries (DeMo's default 32 of
      64 x 64 is 0.0078125).
    chunk_size: target chunk edge s along each side of the leaf's matrix view, an
      integer >= 1 (DeMo's ``compression_chunk``, default 64); the edge used is the
      largest divisor of the side that is at most s.
    gamma: β, the error-feedback memory weight in [0, 1] (``p = x + β e``): DeMo's
      momentum decay (``compression_decay``, default 0.999).

  Returns:
    Compressor with the module docstring's payload and a :class:`DCTState`.

  Raises:
    ValueError: density outside (0, 1], chunk_size not an integer >= 1, or gamma
      outside [0, 1].
  """
  _check_hyper(density, chunk_size, gamma)
  shape = tuple(int(d) for d in shape)
  rows, cols = matrix_view(shape)
  a, b = chunk_edge(rows, int(chunk_size)), chunk_edge(cols, int(chunk_size))
  nr, nc = rows // a, cols // b
  n, m = nr * nc, a * b
  k = num_kept(m, float(density))
  idt = chunk_index_dtype(m)
  beta = float(gamma)
  big = np.float32(base.FLOAT32_MAX)

  def init():
    return DCTState(jnp.float32(beta))

  def encode(x, state, key):
    del key
    blocks = to_chunks(x.astype(jnp.float32).reshape(rows, cols), a, b)
    amax = base.max_abs(blocks, axis=(2, 3), keepdims=True)  # f32[nr, nc, 1, 1]
    down, up = base.pow2_scale(amax)
    coefs = dct2(blocks * down).reshape(n, m)
    if k == m:
      off, vals = None, coefs
    else:
      off, vals = topk_per_chunk(coefs, k)
    down, up, p_max = down.reshape(n, 1), up.reshape(n, 1), (amax * down).reshape(n, 1)
    # Headroom (module docstring), in the pre-scaled units: FLOAT32_MAX * down is exact
    # (inf for chunks scaled up, which need none).
    limit = big * down * np.float32(_HEADROOM)
    kept = jnp.sqrt(jnp.sum(vals * vals, axis=1, keepdims=True))
    total = p_max + kept
    shrink = jnp.maximum(limit - p_max, 0.0) / jnp.where(kept > 0, kept, 1.0)
    factor = jnp.where((total <= limit) | ~jnp.isfinite(total), 1.0, shrink)
    values = vals * factor * up
    payload = {'values': values}
    if off is not None:
      payload['indices'] = off.astype(idt)
    return payload, state

  def decode(payload):
    vals = payload['values'].astype(jnp.float32)
    down, up = base.pow2_scale(base.max_abs(vals, axis=1, keepdims=True))
    scaled = vals * down
    if k == m:
      coefs = scaled
    else:
      off = payload['indices'].astype(jnp.int32)
      coefs = jnp.zeros((n, m), jnp.float32).at[
          jnp.arange(n, dtype=jnp.int32)[:, None], off].set(scaled, unique_indices=True)
    blocks = idct2(coefs.reshape(nr, nc, a, b)) * up.reshape(nr, nc, 1, 1)
    return base.saturate(from_chunks(blocks)).reshape(shape)

  name = f'dct_topk({density:g}, chunk {a}x{b}, k={k}, gamma={beta:g})'
  return Compressor(name, shape, init, encode, decode)


register('dct_topk', dct_topk, ('density', 'chunk_size', 'gamma'),
         example={'density': 0.05, 'chunk_size': 8, 'gamma': 0.9})
