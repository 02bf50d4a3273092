"""Error feedback and aggregation of payloads: the one implementation callers use.

Error feedback (Seide et al. 2014 "1-bit SGD"; Stich et al. 2018 "Sparsified SGD
with memory"; Karimireddy et al. 2019; the decaying memory of the CO3 paper)::

    p = x + decay * e;  payload = encode(p);  e <- p - decode(payload)

so that, with decay = 1, sum_t decode(payload_t) + e_T = sum_t x_t exactly (up to
float rounding): nothing is ever lost, only delayed. With decay = 0 there is no
memory: ``p = x`` exactly, whatever ``e`` holds (the product 0 * e is never
formed, so a non-finite residual is not fed back as 0 * inf = NaN).

Non-finite values. A non-finite entry of ``x`` makes the payload or the residual
non-finite; hfl.step flags it on its link and leaf (hfl.links.finiteness_flags)
and the run stops at the end of that round, naming the first flagged iteration
(hfl.train). With decay > 0 the non-finite residual is fed back, as classic error
feedback carries every error, so the iterations after it in the same round (which
run before the host reads the round's flags) are flagged too: the stop message
names the first. With decay = 0 the next step's payload is that of its own ``x``
alone, finite for a finite ``x``.

Aggregation over W members: payloads are all-gathered in their wire
dtype and each one is DECODED before the float32 (weighted) sum
(:func:`aggregate`); never sum or average encoded values. The receiver then adds
exactly ``decode(payload)`` of each member, which is what that member's residual
assumes was sent, so error feedback loses nothing on any link. (hfl.step sums
float32 identity payloads with an all-reduce instead: the same values, moved and
added in float32.)
"""

import jax
import jax.numpy as jnp

from hfl.compress.base import Compressor


def _decay_of(state, decay):
  """gamma: ``decay``, or when None the state's ``ef_gamma`` (CO3's decaying memory), else 1."""
  return getattr(state, 'ef_gamma', 1.0) if decay is None else decay


def ef_step(compressor: Compressor, x: jax.Array, residual: jax.Array, state,
            key: jax.Array, decay: float | None = None):
  """One error-feedback step for one leaf.

  A lossless compressor (identity) sends ``x`` itself and passes ``residual``
  through unchanged: it never leaves anything behind to feed back.

  Args:
    compressor: the leaf's compressor.
    x: f32[shape], the new gradient (or pseudo-gradient).
    residual: f32[shape], the error memory e (zeros at the start); a lossless
      compressor passes it through, so it may be None there (hfl.links.init_link).
    state: the compressor's state.
    key: PRNG key for stochastic compressors.
    decay: gamma in p = x + gamma * e (1.0: classic EF; CO3 uses 0.9; 0: no
      memory, ``p = x`` even where ``e`` is non-finite, :func:`feed_back`); None
      (default): the compressor state's ``ef_gamma`` when it has one, else 1.

  Returns:
    (payload, new_residual f32[shape], new_state).
  """
  if compressor.lossless:
    payload, state = compressor.encode(x.astype(jnp.float32), state, key)
    return payload, residual, state
  p = feed_back(x, residual, _decay_of(state, decay))
  payload, state = compressor.encode(p, state, key)
  return payload, p - compressor.decode(payload), state


def feed_back(x: jax.Array, residual: jax.Array, gamma) -> jax.Array:
  """``p = x + gamma * e`` in float32, and exactly ``x`` where ``gamma`` is 0.

  A residual whose weight is 0 contributes nothing, not even a non-finite value
  (``0 * inf`` and ``0 * NaN`` are NaN in IEEE arithmetic): ``jnp.where`` on the
  weight, which may be traced (a compressor state's ``ef_gamma``); for a nonzero
  weight the value is bitwise ``x + gamma * e``.

  Args:
    x: f32[shape] the new value.
    residual: f32[shape] the error memory e.
    gamma: the memory weight: a Python float or a float32[] (traced or not).

  Returns:
    f32[shape].
  """
  x = x.astype(jnp.float32)
  gamma = jnp.asarray(gamma, jnp.float32)
  return jnp.where(gamma == 0, x, x + gamma * residual.astype(jnp.float32))


def aggregate(compressor: Compressor, gathered, num_workers: int,
              weights: jax.Array | None = None) -> jax.Array:
  """Weighted sum of W members' payloads, decoding each one first, in float32.

  Args:
    compressor: the leaf's compressor (same for every member).
    gathered: payload dict whose arrays have a leading member axis W (as returned
      by ``jax.lax.all_gather``).
    num_workers: W (static), the divisor of the plain mean.
    weights: f32[W] per-member weights; None for the mean (1/W each).

  Returns:
    f32[shape]: sum_w weights_w * decode(payload_w), or (1/W) * sum_w
    decode(payload_w), summed in float32.
  """
  if weights is None:
    if compressor.decode_sum is not None:
      return compressor.decode_sum(gathered) / jnp.float32(num_workers)
    decoded = jax.vmap(compressor.decode)(gathered).astype(jnp.float32)
    # Added in member order with elementwise adds rather than jnp.sum(axis=0):
    # jaxlib 0.10's XLA:CPU sends that reduction to YNNPACK, where it stalled the CO3
    # step (docs/benchmarks.md, "YNNPACK reduce fusions").
    total = decoded[0]
    for w in range(1, decoded.shape[0]):
      total = total + decoded[w]
    return total / jnp.float32(num_workers)
  decoded = jax.vmap(compressor.decode)(gathered).astype(jnp.float32)
  return jnp.tensordot(jnp.asarray(weights, jnp.float32), decoded, axes=1)


def tree_ef_step(compressors, xs, residuals, states, key, decay: float | None = None,
                 key_offset: int = 0):
  """:func:`ef_step` on every leaf of a pytree (leaf order = ``jax.tree.leaves``).

  Args:
    compressors: list of Compressor, one per leaf of ``xs``.
    xs: pytree of f32 leaves.
    residuals: pytree like ``xs`` (None at a lossless compressor's leaf).
    states: list of compressor states, one per leaf.
    key: PRNG key; leaf i uses ``jax.random.fold_in(key, key_offset + i)``.
    decay: as in :func:`ef_step` (None: each state's ``ef_gamma``, else 1).
    key_offset: added to the leaf index before folding it into ``key``.

  Returns:
    (list of payloads, residual pytree like ``xs``, list of states).

  Raises:
    ValueError: the number of compressors is not the number of leaves.
  """
  leaves, treedef = jax.tree.flatten(xs)
  res = treedef.flatten_up_to(residuals)
  if len(compressors) != len(leaves):
    raise ValueError(f'{len(compressors)} compressors for {len(leaves)} leaves')
  out_p, out_r, out_s = [], [], []
  for i, (c, x, e, s) in enumerate(zip(compressors, leaves, res, states)):
    p, e, s = ef_step(c, x, e, s, jax.random.fold_in(key, key_offset + i), decay)
    out_p.append(p)
    out_r.append(e)
    out_s.append(s)
  return out_p, jax.tree.unflatten(treedef, out_r), out_s
