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
  big = float(jnp.finfo(dtype).max)

  def encode(x, state, key):
    del key
    x = x.astype(jnp.float32)
    x = jnp.where(jnp.isfinite(x), jnp.clip(x, -big, big), x)
    return {'values': x.astype(dtype)}, state

  def decode(payload):
    return payload['values'].astype(jnp.float32)

  return Compressor(dtype.name, shape, EmptyState, encode, decode, linear=True)
