"""Error feedback and aggregation of payloads: the one implementation callers use.

Error feedback (DESIGN 4.2; Seide et al. 2014 "1-bit SGD"; Stich et al. 2018;
Karimireddy et al. 2019; decaying memory of CO3, DESIGN 4.4)::

    p = x + decay * e;  payload = encode(p);  e <- p - decode(payload)

so that, with decay = 1, sum_t decode(payload_t) + e_T = sum_t x_t exactly (up to
float rounding): nothing is ever lost, only delayed.

Aggregation over W workers (DESIGN 2/7): nonlinear payloads are all-gathered
and each one is DECODED before averaging (:func:`aggregate`); never average
encoded values. Linear payloads (identity, casts) may be summed by an
all-reduce; :func:`encode_for_sum` scales by 1/W in float32 BEFORE the cast, and
bounds float16 values so that a sum of W of them cannot overflow.
"""

import jax
import jax.numpy as jnp

from hfl.compress.base import Compressor

_FP16_MAX = 65504.0
_FP16_UNIT_ROUNDOFF = 2.0**-11


def ef_step(compressor: Compressor, x: jax.Array, residual: jax.Array, state,
            key: jax.Array, decay: float = 1.0):
  """One error-feedback step for one leaf.

  Args:
    compressor: the leaf's compressor.
    x: f32[shape], the new gradient (or pseudo-gradient).
    residual: f32[shape], the error memory e (zeros at the start).
    state: the compressor's state.
    key: PRNG key for stochastic compressors.
    decay: gamma in p = x + gamma * e (1.0: classic EF; CO3 uses 0.9).

  Returns:
    (payload, new_residual f32[shape], new_state).
  """
  p = x.astype(jnp.float32) + jnp.float32(decay) * residual.astype(jnp.float32)
  payload, state = compressor.encode(p, state, key)
  return payload, p - compressor.decode(payload), state


def aggregate(compressor: Compressor, gathered, num_workers: int) -> jax.Array:
  """Mean of W workers' payloads, decoding each one first.

  Args:
    compressor: the leaf's compressor (same for every worker).
    gathered: payload dict whose arrays have a leading worker axis W (as returned
      by ``jax.lax.all_gather``).
    num_workers: W (static), the divisor.

  Returns:
    f32[shape]: (1/W) * sum_w decode(payload_w), summed in float32.
  """
  if compressor.decode_sum is not None:
    return compressor.decode_sum(gathered) / jnp.float32(num_workers)
  decoded = jax.vmap(compressor.decode)(gathered)
  return jnp.sum(decoded.astype(jnp.float32), axis=0) / jnp.float32(num_workers)


def fp16_sum_bound(num_workers: int) -> float:
  """Largest |value| per summand so that a float16 sum of W of them stays finite.

  Recursive float16 summation satisfies |s_hat| <= sum|t_i| (1 + u)^(W - 1) with
  unit roundoff u = 2^-11 (Higham, "Accuracy and Stability of Numerical
  Algorithms", 2002, eq. 4.4 bound); so |t_i| <= 65504 / (W (1 + u)^(W - 1)) keeps
  every partial sum <= 65504, in any summation order. For W = 8 this gives up
  0.3% of the range.

  Args:
    num_workers: W >= 1.

  Returns:
    Python float.
  """
  w = int(num_workers)
  return _FP16_MAX / (w * (1.0 + _FP16_UNIT_ROUNDOFF)**(w - 1))


def encode_for_sum(compressor: Compressor, x: jax.Array, state, key,
                   num_workers: int):
  """Encodes x / W for a linear compressor so W payloads can be summed safely.

  The caller then sums the payloads in their own dtype (``lax.psum``) and
  decodes the sum, which is the mean. Scaling happens in float32 before the
  cast; for float16 payloads each scaled value is clipped to
  :func:`fp16_sum_bound` so the reduced-precision sum cannot overflow.

  Args:
    compressor: a compressor with ``linear=True``.
    x: f32[shape].
    state: the compressor's state.
    key: PRNG key (unused by casts).
    num_workers: W (static).

  Returns:
    (payload, state).

  Raises:
    ValueError: the compressor is not linear (use all-gather + :func:`aggregate`).
  """
  if not compressor.linear:
    raise ValueError(
        f'encode_for_sum: compressor {compressor.name!r} is not linear; '
        'all-gather its payloads and use aggregate() instead')
  y = x.astype(jnp.float32) / jnp.float32(num_workers)
  if compressor.name == 'float16':
    bound = fp16_sum_bound(num_workers)
    y = jnp.clip(y, -bound, bound)
  return compressor.encode(y, state, key)


def sum_payloads(gathered):
  """Sums W payloads of a linear compressor in their own dtype (what psum does).

  Sequential accumulation in the payload dtype, the worst case for overflow.

  Args:
    gathered: payload dict with a leading worker axis W.

  Returns:
    payload dict of the summed arrays (same dtypes).
  """
  def seq_sum(a):
    return jax.lax.fori_loop(1, a.shape[0], lambda i, s: s + a[i], a[0])
  return jax.tree.map(seq_sum, gathered)


def tree_ef_step(compressors, xs, residuals, states, key, decay: float = 1.0):
  """:func:`ef_step` on every leaf of a pytree (leaf order = ``jax.tree.leaves``).

  Args:
    compressors: list of Compressor, one per leaf of ``xs``.
    xs: pytree of f32 leaves.
    residuals: pytree like ``xs``.
    states: list of compressor states, one per leaf.
    key: PRNG key; leaf i uses ``jax.random.fold_in(key, i)``.
    decay: as in :func:`ef_step`.

  Returns:
    (list of payloads, residual pytree like ``xs``, list of states).
  """
  leaves, treedef = jax.tree.flatten(xs)
  res = treedef.flatten_up_to(residuals)
  if len(compressors) != len(leaves):
    raise ValueError(f'{len(compressors)} compressors for {len(leaves)} leaves')
  out_p, out_r, out_s = [], [], []
  for i, (c, x, e, s) in enumerate(zip(compressors, leaves, res, states)):
    p, e, s = ef_step(c, x, e, s, jax.random.fold_in(key, i), decay)
    out_p.append(p)
    out_r.append(e)
    out_s.append(s)
  return out_p, jax.tree.unflatten(treedef, out_r), out_s


def tree_bits(compressors, payloads) -> jax.Array:
  """Total wire bits (f32 scalar) of per-leaf payloads."""
  total = jnp.float32(0)
  for c, p in zip(compressors, payloads):
    total = total + c.wire_bits(p)
  return total

