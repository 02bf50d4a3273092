"""Tiny floating-point grids and a round-to-nearest quantiser onto them (CO3 "convert").

A format ``fmt = (s, e, m)`` gives the bit counts of sign, exponent and mantissa
of an IEEE-754-style binary float (the CO3 paper's [1,2,1] fp4):

* exponent bias ``b = 2**(e-1) - 1``;
* exponent field ``E = 0``: subnormals ``2**(1-b) * (f / 2**m)`` (``f`` the mantissa
  field; ``f = 0`` is zero);
* ``1 <= E <= 2**e - 2``: normals ``2**(E-b) * (1 + f / 2**m)``;
* ``E = 2**e - 1`` is RESERVED (IEEE inf/NaN) and holds no finite level.

So ``(1, 2, 1)`` has exactly the 11 levels {0, +-0.5, +-1, +-1.5, +-2, +-3} and
``(1, 5, 2)`` the 247 finite values of fp8 E5M2 (``ml_dtypes.float8_e5m2``,
max 57344).

Symbols. An entry is quantised to a ``uint8`` symbol that is the IEEE bit pattern of
the format: ``symbol = sign << (e + m) | mag`` where ``mag = E << m | f`` is the
magnitude index (0 .. M-1 for the M finite magnitudes, in increasing order). For
``(1, 5, 2)`` the symbol is therefore bit-identical to the ``float8_e5m2`` encoding.

Conventions (decided here, tested in tests/test_co3.py):

* Tie-breaking: round half to even, IEEE ``roundTiesToEven``: a value exactly
  half-way between two adjacent magnitudes goes to the one with the even magnitude
  index (= even mantissa LSB), e.g. 1.25 -> 1.0, 1.75 -> 2.0, 2.5 -> 2.0 on fp4.
* Saturation: finite values beyond the largest level map to +-max (never to inf).
* Non-finite values (NaN, +-inf) are NEVER mapped to a valid level: they get the
  reserved symbol ``nan_mag = 2**(e+m) - 1`` (exponent and mantissa all ones, an
  IEEE NaN pattern whenever ``m >= 1``), sign 0, and :func:`dequantize` returns
  NaN for it, so a non-finite input decodes to a non-finite value (the grid has
  no inf symbol; saturating inf to +-max would turn it into a plausible number
  that error feedback keeps sending).
* Zero is unsigned: a value that rounds to magnitude 0 gets sign 0 (no -0 symbol).
* With ``s = 0`` the grid is non-negative and negative inputs saturate to 0.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class FloatGrid(NamedTuple):
  """A tiny float format and its finite levels (host-side, static).

  Attributes:
    fmt: ``(s, e, m)`` bit counts.
    mags: float64[M] the finite non-negative magnitudes, increasing, ``mags[0] = 0``.
    levels: float64[L] all finite levels (signed), increasing; ``L = 2M - 1`` when
      ``s = 1`` (zero counted once), else ``M``.
    mids: float64[M-1] mid-points between consecutive magnitudes.
    nan_mag: int, the reserved magnitude index used for NaN.
    bits: int, ``s + e + m`` bits per fixed-width symbol.
  """
  fmt: tuple
  mags: np.ndarray
  levels: np.ndarray
  mids: np.ndarray
  nan_mag: int
  bits: int

  # A grid is fully determined by its format: hash/compare by it, so a grid can be
  # a static argument of jax.jit.
  def __hash__(self):
    return hash(('FloatGrid', self.fmt))

  def __eq__(self, other):
    return isinstance(other, FloatGrid) and self.fmt == other.fmt

  def __ne__(self, other):
    return not self == other

  @property
  def num_mags(self) -> int:
    """M, the number of finite magnitudes (including 0)."""
    return int(self.mags.shape[0])

  @property
  def max(self) -> float:
    """Largest finite level."""
    return float(self.mags[-1])


def make_grid(fmt=(1, 2, 1)) -> FloatGrid:
  """Builds the finite levels of an IEEE-style ``[sign, exponent, mantissa]`` float.

  Args:
    fmt: ``(s, e, m)`` with ``s`` in {0, 1}, ``e >= 2`` (one exponent code is
      reserved, IEEE-style), ``m >= 0`` and ``s + e + m <= 8`` (symbols are uint8).

  Returns:
    A :class:`FloatGrid`.

  Raises:
    ValueError: on an invalid format.
  """
  try:
    s, e, m = (int(v) for v in fmt)
  except (TypeError, ValueError) as err:
    raise ValueError(f'fmt must be (sign, exponent, mantissa) ints, got {fmt!r}') from err
  if s not in (0, 1):
    raise ValueError(f'fmt sign bits must be 0 or 1, got {s}')
  if e < 2:
    raise ValueError(f'fmt exponent bits must be >= 2 (all-ones is reserved), got {e}')
  if m < 0:
    raise ValueError(f'fmt mantissa bits must be >= 0, got {m}')
  if s + e + m > 8:
    raise ValueError(f'fmt {fmt} needs {s + e + m} bits; at most 8 (uint8 symbols)')
  bias = 2**(e - 1) - 1
  mags = []
  for big_e in range(0, 2**e - 1):  # E = 2**e - 1 reserved.
    for f in range(2**m):
      if big_e == 0:
        mags.append(2.0**(1 - bias) * f / 2**m)
      else:
        mags.append(2.0**(big_e - bias) * (1 + f / 2**m))
  mags = np.asarray(mags, np.float64)
  assert np.all(np.diff(mags) > 0)
  levels = np.concatenate([-mags[:0:-1], mags]) if s else mags.copy()
  mids = 0.5 * (mags[1:] + mags[:-1])
  return FloatGrid((s, e, m), mags, levels, mids, 2**(e + m) - 1, s + e + m)


def quantize_mag(a: jax.Array, grid: FloatGrid) -> jax.Array:
  """Round-to-nearest magnitude index (ties to even), saturating, inf/NaN -> ``nan_mag``.

  Args:
    a: float32[...] non-negative magnitudes (already scaled), may hold inf/NaN.
    grid: the target grid.

  Returns:
    int32[...] magnitude indices in ``[0, M)``, or ``grid.nan_mag`` where ``a`` is
    not finite.
  """
  a = jnp.asarray(a, jnp.float32)
  if grid.num_mags == 1:
    idx = jnp.zeros(a.shape, jnp.int32)
  else:
    # Mid-points are dyadic with few bits, hence exact in float32: ties are exact.
    mids = jnp.asarray(grid.mids, jnp.float32)
    # Few mid-points (fp4: 10): counting comparisons is one fused pass, much
    # faster than a per-element binary search; same result.
    method = 'compare_all' if len(grid.mids) <= 32 else 'scan'
    lo = jnp.searchsorted(mids, a, side='left', method=method).astype(jnp.int32)
    hi = jnp.searchsorted(mids, a, side='right', method=method).astype(jnp.int32)
    # lo == hi: no tie, index lo. lo < hi: a == mids[lo], pick the even of lo, lo+1.
    idx = jnp.where(lo == hi, lo, jnp.where(lo % 2 == 0, lo, lo + 1))
    idx = jnp.minimum(idx, grid.num_mags - 1)
  return jnp.where(jnp.isfinite(a), idx, jnp.int32(grid.nan_mag))


def quantize(x: jax.Array, grid: FloatGrid) -> jax.Array:
  """Rounds ``x`` onto the grid and returns the uint8 symbols (jit-compatible).

  Round half to even, saturation of finite values to +-max, inf and NaN -> the
  reserved NaN symbol; see the module docstring.

  Args:
    x: float[...] values already multiplied by the scale.
    grid: the target grid.

  Returns:
    uint8[...] symbols ``sign << (e+m) | mag``.
  """
  x = jnp.asarray(x, jnp.float32)
  if grid.fmt[0] == 0:
    x = jnp.where(x < 0, jnp.float32(0), x)  # Unsigned grid: negatives -> 0.
  mag = quantize_mag(jnp.abs(x), grid)
  neg = (x < 0) & (mag > 0) & (mag != grid.nan_mag)
  shift = grid.fmt[1] + grid.fmt[2]
  sym = jnp.where(neg, (1 << shift) | mag, mag)
  return sym.astype(jnp.uint8)


def split_symbols(sym: jax.Array, grid: FloatGrid):
  """Splits symbols into (magnitude index int32, sign bool), jit-compatible."""
  sym = jnp.asarray(sym).astype(jnp.int32)
  shift = grid.fmt[1] + grid.fmt[2]
  return sym & ((1 << shift) - 1), (sym >> shift) & 1 == 1


def dequantize(sym: jax.Array, grid: FloatGrid) -> jax.Array:
  """Maps uint8 symbols back to float32 levels; the NaN symbol decodes to NaN.

  Args:
    sym: uint8[...] symbols from :func:`quantize`.
    grid: the grid.

  Returns:
    float32[...] levels (unscaled).
  """
  mag, neg = split_symbols(sym, grid)
  table = jnp.asarray(grid.mags, jnp.float32)
  val = table[jnp.clip(mag, 0, grid.num_mags - 1)]
  val = jnp.where(neg, -val, val)
  return jnp.where(mag >= grid.num_mags, jnp.float32(jnp.nan), val)


def quantize_reference(x: np.ndarray, grid: FloatGrid) -> np.ndarray:
  """Numpy reference of :func:`quantize` (searchsorted on the levels; for tests).

  Args:
    x: float array of scaled values.
    grid: the grid.

  Returns:
    uint8 symbols, same conventions as :func:`quantize`.
  """
  x = np.asarray(x, np.float64)
  if grid.fmt[0] == 0:
    x = np.where(x < 0, 0.0, x)
  a = np.abs(x)
  mags = grid.mags
  j = np.clip(np.searchsorted(mags, np.where(np.isnan(a), 0, a)), 1, len(mags) - 1) \
      if len(mags) > 1 else np.zeros(a.shape, np.int64)
  if len(mags) > 1:
    d_lo = a - mags[j - 1]
    d_hi = mags[j] - a
    idx = np.where(d_lo < d_hi, j - 1, j)
    idx = np.where(d_lo == d_hi, np.where((j - 1) % 2 == 0, j - 1, j), idx)
    idx = np.where(a >= mags[-1], len(mags) - 1, idx)
  else:
    idx = j
  idx = np.where(np.isfinite(a), idx, grid.nan_mag)
  neg = (x < 0) & (idx > 0) & (idx != grid.nan_mag)
  return np.where(neg, (1 << (grid.fmt[1] + grid.fmt[2])) | idx, idx).astype(np.uint8)
