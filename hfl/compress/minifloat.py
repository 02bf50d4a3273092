"""Fixed-width low-bit float casts with a per-tensor scale (4-bit E3M0 and friends).

Source: Streaming DiLoCo (Douillard et al. 2025, "Streaming DiLoCo with
overlapping communication: Towards a Distributed Free Lunch", arXiv:2501.18512,
Sec. 2, its quantised-communication part) sends the outer gradients in a 4-bit float
with 1 sign bit, 3 exponent bits and no mantissa ("E3M0") and accumulates the
received values in float32. The paper names the format but not its bias, its
special values or a scale; the choices below are hfl's:

**The E3M0 grid** (``fmt = (1, 3, 0)``, built by :func:`hfl.compress.floatgrid.make_grid`,
the same IEEE-style grids CO3 uses, so a non-finite input is never turned into a
plausible number):

* 4 bits: sign s, exponent field E in 0..7, no mantissa; exponent bias 3
  (``2**(3-1) - 1``);
* E = 0 is zero (the subnormal range holds only 0 without mantissa bits); zero is
  unsigned (no -0 symbol);
* E = 1..6 are the normals ``2**(E - 3)``: magnitudes 0.25, 0.5, 1, 2, 4, 8;
* E = 7 is reserved (IEEE inf/NaN): the symbol ``0b0111`` decodes to NaN and is
  what a NaN or infinite input becomes;
* so 13 finite levels {0, +-0.25, +-0.5, +-1, +-2, +-4, +-8}, magnitude indices
  0..6; rounding to the nearest level in the linear domain, a tie to the even
  magnitude index (0.125 -> 0, 0.375 -> 0.5, 0.75 -> 0.5, 1.5 -> 2, 3 -> 2,
  6 -> 8); finite values beyond 8 saturate to +-8.

**Per-tensor scale** (absmax scaling, as the per-tensor scaling of FP8 training,
Micikevicius et al. 2022, "FP8 Formats for Deep Learning", arXiv:2209.05433): ``s = max_level / max|x|`` over the finite entries of the leaf
(float32; 1 when the leaf has no non-zero finite entry), so the largest entry
lands on the top level and nothing saturates; the value sent is ``Q(x s)`` and
the receiver decodes ``level / s`` in float32. The scale crosses the wire as one
float32 per leaf.

Payload: ``{'packed': uint8[ceil(n * b / 8)], 'scale': float32[]}`` with b = 4 bits
per entry (2 symbols per byte, the first in the high nibble), so
``wire_bits = 8 * ceil(n / 2) + 32`` for E3M0; a static Python int (fixed width,
no entropy coding; CO3, :mod:`hfl.compress.co3`, is the entropy-coded cast).
Not linear (each payload has its own scale): payloads are all-gathered in uint8
and each one decoded before the float32 sum (:mod:`hfl.compress.base`). Lossy:
the caller's error feedback (hfl.links.exchange) keeps what the grid drops.
"""

import jax
import jax.numpy as jnp
import numpy as np

from hfl.compress import base
from hfl.compress import floatgrid
from hfl.compress.base import Compressor, EmptyState
from hfl.compress.registry import register

E3M0 = (1, 3, 0)
FORMATS = {'e3m0': E3M0, 'e2m1': (1, 2, 1), 'e5m2': (1, 5, 2)}


def pack_symbols(sym: jax.Array, bits: int) -> jax.Array:
  """Packs b-bit symbols (b in {1, 2, 4, 8}) into bytes, the first symbol in the high bits.

  Args:
    sym: uint8[n] symbols below ``2**bits``.
    bits: b.

  Returns:
    uint8[ceil(n * b / 8)]; the last byte is zero-padded.
  """
  per = 8 // bits
  n = sym.shape[0]
  s = jnp.pad(sym.astype(jnp.uint8), (0, (-n) % per)).reshape(-1, per)
  shifts = jnp.asarray([bits * (per - 1 - i) for i in range(per)], jnp.uint8)
  return jnp.sum(s << shifts, axis=1, dtype=jnp.uint8)


def unpack_symbols(packed: jax.Array, bits: int, n: int) -> jax.Array:
  """Inverse of :func:`pack_symbols`: uint8[n] symbols."""
  per = 8 // bits
  shifts = jnp.asarray([bits * (per - 1 - i) for i in range(per)], jnp.uint8)
  mask = jnp.uint8((1 << bits) - 1)
  return ((packed[:, None] >> shifts) & mask).reshape(-1)[:n]


def absmax_scale(x: jax.Array, grid: floatgrid.FloatGrid) -> jax.Array:
  """float32[] ``grid.max / max|x|`` over the finite entries (1 if none is non-zero,
  or if the quotient overflows: entries of ~1e-38 and below), raised to at least
  :func:`hfl.compress.base.min_scale` of ``grid.max`` so that decode's
  ``level / scale`` is finite for every level: where ``max|x|`` is within a factor
  ``grid.max`` of float32's max (possible for e2m1, whose max is 3, and otherwise
  a float32 subnormal that the CPU flushes to 0), the largest entries saturate to
  the top level instead of decoding to NaN."""
  amax = jnp.max(jnp.where(jnp.isfinite(x), jnp.abs(x), 0.0), initial=0.0)
  scale = jnp.float32(grid.max) / jnp.where(amax > 0, amax, 1.0)
  return jnp.where((amax > 0) & jnp.isfinite(scale),
                   jnp.maximum(scale, base.min_scale(grid.max)), 1.0).astype(jnp.float32)


def float_cast(shape, fmt='e3m0') -> Compressor:
  """A fixed-width low-bit float cast of one leaf with a per-tensor absmax scale.

  Args:
    shape: the leaf's shape.
    fmt: 'e3m0' (default, Streaming DiLoCo's 4-bit float), 'e2m1' (= CO3's fp4
      [1,2,1]) or 'e5m2'; the grid must have 1, 2, 4 or 8 bits per entry.

  Returns:
    A :class:`hfl.compress.base.Compressor` named e.g. ``'e3m0'``: payload
    ``{'packed': uint8[ceil(n b / 8)], 'scale': f32[]}``, ``wire_bits`` =
    ``8 ceil(n b / 8) + 32`` (static), decode f32[shape] (module docstring).

  Raises:
    ValueError: an unknown ``fmt``.
  """
  if fmt not in FORMATS:
    raise ValueError(f'float cast: fmt={fmt!r} is unknown; allowed: {", ".join(FORMATS)}')
  grid = floatgrid.make_grid(FORMATS[fmt])
  shape = tuple(int(d) for d in shape)
  n = int(np.prod(shape, dtype=np.int64))

  def encode(x, state, key):
    del key  # Deterministic rounding.
    x = jnp.asarray(x, jnp.float32).reshape(-1)
    scale = absmax_scale(x, grid)
    sym = floatgrid.quantize(x * scale, grid)
    return {'packed': pack_symbols(sym, grid.bits), 'scale': scale}, state

  def decode(payload):
    sym = unpack_symbols(payload['packed'], grid.bits, n)
    vals = floatgrid.dequantize(sym, grid) / payload['scale'].astype(jnp.float32)
    return vals.reshape(shape)

  return Compressor(fmt, shape, EmptyState, encode, decode, linear=False)


def e3m0(shape, **unused) -> Compressor:
  """:func:`float_cast` with the E3M0 grid (the ``compression.*.name='e3m0'`` factory)."""
  return float_cast(shape, 'e3m0')


register('e3m0', e3m0)
