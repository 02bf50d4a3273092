"""The compressor type: a per-leaf pair of pure functions, in the style of optax.

A :class:`Compressor` is built for ONE pytree leaf of a known shape (the per-leaf
policy in :mod:`hfl.compress.policy` builds one per leaf). Everything is a pure,
jit-compatible function on arrays of static shape, so a compressor can run inside
``jax.shard_map`` and its payload can be handed to a collective.

Protocol (error feedback is NOT inside the compressor; the caller applies it,
Stich et al. 2018: ``p = g + e; payload = encode(p); e <- p - decode(payload)``)::

    state = c.init()                          # NamedTuple, may be EmptyState()
    payload, state = c.encode(x, state, key)  # x: float32[shape]; payload: dict of arrays
    x_hat = c.decode(payload)                 # float32[shape]
    bits = c.wire_bits(payload)               # int, bits on the wire (see below)

``payload`` is what crosses the link: a dict of arrays with static shapes and
dtypes (values, indices, codes, scales). ``wire_bits`` defaults to the payload's
array sizes times their dtype widths, a Python int known when the program is
traced (exact at any size); a variable-length code (entropy coding) overrides it
with the code length computed from the symbols, an int32 scalar (exact up to
2^31 - 1 bits per payload; such a compressor must refuse larger leaves when it is
built). Bits are never float: float32 counts are inexact above 2^24.

Non-finite values are never turned into finite ones: a non-finite entry of ``x``
must make ``decode(payload)`` non-finite (or the residual ``x - decode(payload)``
non-finite), so that the step's finiteness checks (hfl.step) stop the run.
Conversely every finite ``x`` (up to float32's max) gives a finite payload, a
finite ``decode(payload)`` and a finite residual: norms and means are computed with
the overflow-safe helpers below (:func:`l2_norm`, :func:`mean_abs`,
:func:`pow2_scale`; bitwise the plain expressions wherever those do not overflow
or underflow), a scale that is divided out on decode is at least
:func:`min_scale`, and finite values beyond a format's range saturate to its
largest one (:func:`saturate`; the excess stays in the error-feedback residual).
tests/test_numerics.py checks this for every registry compressor.

``linear`` is True when ``decode`` is linear in the payload arrays AND the payload
is a dense array of the leaf's shape (identity, casts). A ``linear`` and
``lossless`` compressor (identity) must send float32 elementwise: hfl.step sums
such payloads with a float32 all-reduce (or reduce-scatter, with ZeRO-1 sharded
optimizer state), which moves exactly what is sent and adds it as a float32
parameter server would. Every other compressor, casts included, is aggregated by
all-gathering the payloads in their wire dtype and decoding each one before the
float32 (weighted) sum: the receiver then adds exactly the value each sender's
error feedback assumed it sent (never a sum or an average of encoded values).
"""

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

Payload = dict  # dict[str, jax.Array]


class EmptyState(NamedTuple):
  """State of a stateless compressor."""


def payload_bits(payload: Payload) -> int:
  """Bits of a payload dict from its array shapes and dtypes (static).

  Args:
    payload: dict of arrays (or ShapeDtypeStructs, or tracers: only shapes and
      dtypes are read).

  Returns:
    Python int: sum over arrays of size * itemsize * 8 (exact at any size).
  """
  total = 0
  for leaf in jax.tree.leaves(payload):
    total += int(np.prod(leaf.shape, dtype=np.int64)) * jnp.dtype(leaf.dtype).itemsize * 8
  return int(total)


class Compressor(NamedTuple):
  """A compressor for one leaf of shape ``shape``.

  Attributes:
    name: short name used in logs, e.g. ``'topk(0.01)'``.
    shape: the leaf's shape (tuple of ints).
    init: ``() -> state``.
    encode: ``(x: f32[shape], state, key: PRNGKey) -> (payload, state)``.
    decode: ``(payload) -> f32[shape]``.
    wire_bits: ``(payload) -> int | int32[]``, bits this payload costs on the
      wire: a Python int when it follows from the payload's shapes (the
      default, :func:`payload_bits`), an int32 scalar for variable-length codes.
    linear: payloads may be summed before decoding (see module doc).
    lossless: decode(encode(x)) == x exactly, so error feedback is a no-op and
      callers may skip it (identity).
    decode_sum: optional ``(gathered) -> f32[shape]``, the sum over the leading
      axis of ``decode`` of W payloads, computed without materialising W dense
      tensors (sparse payloads: one scatter-add of all W*k values). Equal to
      ``sum_w decode(payload_w)`` up to float summation order; None: vmap decode.
  """
  name: str
  shape: tuple
  init: Callable[[], Any]
  encode: Callable[..., tuple]
  decode: Callable[[Payload], jax.Array]
  wire_bits: Callable[[Payload], Any] = payload_bits
  linear: bool = False
  lossless: bool = False
  decode_sum: Callable[[Payload], jax.Array] | None = None


def identity(shape) -> Compressor:
  """No compression: float32 values (32 bits per entry)."""
  shape = tuple(shape)

  def encode(x, state, key):
    del key
    return {'values': x.astype(jnp.float32)}, state

  def decode(payload):
    return payload['values'].astype(jnp.float32)

  return Compressor('identity', shape, EmptyState, encode, decode, linear=True,
                    lossless=True)



# ------------------------------------------------------------- overflow-safe norms, scales

FLOAT32_MAX = float(np.finfo(np.float32).max)    # 3.4028235e38
FLOAT32_TINY = float(np.finfo(np.float32).tiny)  # 2**-126, the smallest normal float32


def saturate(x: jax.Array, dtype=jnp.float32) -> jax.Array:
  """Clips the finite entries of ``x`` to ``+-finfo(dtype).max``; inf and NaN unchanged.

  Used before a cast to a narrower float, so that a finite value never becomes
  inf (the excess stays in the caller's error-feedback residual).

  Args:
    x: float array.
    dtype: the float dtype whose largest finite value is the bound.

  Returns:
    array like ``x``.
  """
  big = float(jnp.finfo(dtype).max)
  return jnp.where(jnp.isfinite(x), jnp.clip(x, -big, big), x)


def pow2_scale(amax: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Power-of-two pre-scale of values whose largest magnitude is ``amax``.

  Returns ``(down, up) = (2**-k, 2**k)``, float32 normals, with k = floor(log2
  amax) clamped to [-126, 126]: ``amax * down`` is in [1, 2) for a normal
  ``amax`` in [2**-126, 2**127), in [2, 4) above, below 1 for a subnormal or
  zero ``amax``; inf and NaN give k = 126. Multiplying by a power of two is exact
  (barring subnormal results), and IEEE rounding commutes with it, so a sum of
  squares or of magnitudes of the pre-scaled values, times ``up`` (twice for
  squares), is the unscaled sum up to the order of summation whenever that neither
  overflows nor underflows, and stays finite (at most 16 n for n entries) when it
  would overflow. (Callers that must reproduce the unscaled value bitwise keep the
  plain reduction where it is a normal float, :func:`l2_norm`: XLA fuses the two
  programs differently.) This is the pre-scaling of the reference BLAS ``xNRM2`` (Anderson,
  "Algorithm 978: Safe Scaling in the Level 1 BLAS", ACM TOMS 44(1), 2017),
  restricted to powers of two.

  Args:
    amax: f32[...] largest magnitudes (>= 0, may be inf or NaN).

  Returns:
    (down f32[...], up f32[...]).
  """
  bits = jax.lax.bitcast_convert_type(jnp.asarray(amax, jnp.float32), jnp.int32)
  k = jnp.clip(((bits >> 23) & 0xFF) - 127, -126, 126)
  as_f32 = lambda e: jax.lax.bitcast_convert_type((e + 127) << 23, jnp.float32)
  return as_f32(-k), as_f32(k)


def max_abs(x: jax.Array, axis=None, keepdims: bool = False) -> jax.Array:
  """f32 ``max |x|`` over ``axis`` (0 for no entries); NaN if an entry is NaN."""
  return jnp.max(jnp.abs(jnp.asarray(x, jnp.float32)), axis=axis, keepdims=keepdims,
                 initial=0.0)


def l2_norm(x: jax.Array, axis=None) -> jax.Array:
  """Overflow- and underflow-safe Euclidean norm ``sqrt(sum x**2)`` in float32.

  The plain ``jnp.sqrt(jnp.sum(x * x, axis))`` where its sum of squares is a normal
  float32 (so ordinary norms are bitwise the plain expression: XLA may fuse a
  differently scaled sum of squares into fused multiply-adds, which round
  differently); elsewhere, when every entry is finite, the norm of the values
  pre-scaled by a power of two of their max-abs (:func:`pow2_scale`, as BLAS
  ``nrm2`` pre-scales), which neither overflows nor underflows, times that power;
  a norm beyond float32's range saturates to ``FLOAT32_MAX`` (>= every
  ``|x_i|``, so it still bounds each entry). Non-finite entries give inf or NaN,
  as the plain expression does. Relative error: at most n U / 2 + U (first order)
  for n entries (U = 2^-24; Higham 2002, eq. 4.4) on either path.

  Args:
    x: float[...] values.
    axis: reduction axis, an int or None (all).

  Returns:
    f32[...] the norms, the reduced axis removed.
  """
  x = jnp.asarray(x, jnp.float32)
  sum_sq = jnp.sum(x * x, axis=axis)
  plain = jnp.sqrt(sum_sq)
  amax = max_abs(x, axis, keepdims=True)
  down, up = pow2_scale(amax)
  xs = x * down
  scaled = jnp.sqrt(jnp.sum(xs * xs, axis=axis)) * jnp.squeeze(up, axis)
  return _plain_or_scaled(sum_sq, plain, scaled, jnp.squeeze(amax, axis))


def mean_abs(x: jax.Array, axis=None, where=None) -> jax.Array:
  """Overflow-safe ``mean |x|`` in float32 (the L1 norm over the count).

  The plain ``jnp.sum(|x|, axis) / n`` where that sum is a normal float32 (bitwise
  the plain expression, as :func:`l2_norm`); elsewhere, when every counted entry
  is finite, the sum of the magnitudes pre-scaled by a power of two of their max
  (:func:`pow2_scale`) over n, times that power, saturating to ``FLOAT32_MAX``:
  finite for every finite ``x`` (the plain sum overflows from n entries of
  ~3.4e38 / n on). Non-finite counted entries give inf or NaN.

  Args:
    x: float[...] values.
    axis: reduction axis, an int or None (all).
    where: optional bool like ``x``: only these entries count (n = their number,
      at least 1); the others may hold anything, inf and NaN included.

  Returns:
    f32[...] the means, the reduced axis removed; 0 where no entry counts.
  """
  a = jnp.abs(jnp.asarray(x, jnp.float32))
  if where is not None:
    a = jnp.where(where, a, 0.0)
    n = jnp.maximum(jnp.sum(where, axis=axis), 1).astype(jnp.float32)
  else:
    n = jnp.float32(a.size if axis is None else a.shape[axis])
  total = jnp.sum(a, axis=axis)
  amax = jnp.max(a, axis=axis, keepdims=True, initial=0.0)
  down, up = pow2_scale(amax)
  scaled = jnp.sum(a * down, axis=axis) / n * jnp.squeeze(up, axis)
  return _plain_or_scaled(total, total / n, scaled, jnp.squeeze(amax, axis))


def _plain_or_scaled(plain_sum, plain, scaled, amax):
  """``plain`` where ``plain_sum`` (the unscaled reduction it came from) is a normal
  float32, zero entries included, or where an input is non-finite (``amax``, the
  inputs' max-abs, is inf or NaN); else ``scaled`` saturated to FLOAT32_MAX."""
  use_plain = (((plain_sum >= FLOAT32_TINY) & (plain_sum <= FLOAT32_MAX)) | (amax == 0)
               | ~jnp.isfinite(amax))
  return jnp.where(use_plain, plain, jnp.minimum(scaled, FLOAT32_MAX))


def min_scale(grid_max: float) -> float:
  """The smallest normal float32 ``s`` with ``grid_max / s <= FLOAT32_MAX`` in float32.

  A compressor that sends ``x * s`` on a grid whose largest level is ``grid_max``
  and decodes ``level / s`` raises its scale ``s`` to at least this, so that every
  level decodes to a finite value (entries near float32's max then saturate to the
  top level; the residual keeps the rest). Host-side, for a static grid.

  Args:
    grid_max: the grid's largest level (> 0).

  Returns:
    float (a float32 value), at least ``FLOAT32_TINY``.
  """
  g = np.float32(grid_max)
  s = np.float32(max(float(g) / FLOAT32_MAX, FLOAT32_TINY))
  with np.errstate(over='ignore'):
    while not np.isfinite(g / s) or float(g / s) > FLOAT32_MAX:
      s = np.nextafter(s, np.float32(np.inf))
  return float(s)


def cast(shape, dtype) -> Compressor:
  """Round to a low-precision float (bf16 or fp16), 16 bits per entry.

  Finite values beyond the format's largest finite value saturate to +-max
  (fp16: 65504; bf16: 3.3895e38, below float32's max) instead of rounding to inf,
  so a payload is finite whenever the input is; the excess stays in the caller's
  error-feedback residual. inf and NaN stay inf and NaN.
  """
  shape = tuple(shape)
  dtype = jnp.dtype(dtype)
  if dtype not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
    raise ValueError(f'cast: dtype must be bfloat16 or float16, got {dtype}')

  def encode(x, state, key):
    del key
    return {'values': saturate(x.astype(jnp.float32), dtype).astype(dtype)}, state

  def decode(payload):
    return payload['values'].astype(jnp.float32)

  return Compressor(dtype.name, shape, EmptyState, encode, decode, linear=True)
