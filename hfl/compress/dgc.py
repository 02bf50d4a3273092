"""Deep Gradient Compression options as pure functions.

Reference: Lin, Han, Mao, Wang & Dally, "Deep Gradient Compression: Reducing the
Communication Bandwidth for Distributed Training", ICLR 2018:
  * momentum correction (Sec. 3.2, eq. 6-7): accumulate the *velocity*,
        u <- m * u + g,   v <- v + u,   send sparse(v);
  * momentum factor masking (Sec. 3.2): after sending, zero the sent coordinates
    of BOTH u and v (v <- v * not(mask), u <- u * not(mask));
  * local gradient clipping (Sec. 3.3): clip each worker's gradient by global L2
    norm before accumulating, with the threshold scaled by N^(-1/2) (N workers);
  * warm-up training (Sec. 3.3): the density falls exponentially over the first
    epochs, 25% -> 6.25% -> 1.5625% -> 0.4% -> 0.1% in the paper (4 stages).

Integration contract (what a training step does, per worker, per leaf):

  state:  one :class:`DGCState` per large leaf (``u``, ``v`` f32[shape], zeros at
          start; per-worker, so leading (dc, worker) axes like EF residuals).
          Small leaves are not DGC'd (dense, reduced precision: hfl.compress.policy).
  step:   g = clip_local(grads, max_norm, num_workers)     # whole tree, optional
          for each large leaf:
            payload, dgc_state, cstate = dgc_step(comp, g_leaf, dgc_state,
                                                  cstate, key, momentum)
          all-gather payloads, ef.aggregate(...) -> mean update; the optimizer
          applied to it must be plain SGD (no momentum: momentum is already in
          the accumulated velocity, eq. 7). ``comp`` should be a sparsifier whose
          payload has 'indices' (topk/randk); other compressors use
          ``decode(payload) != 0`` as the sent mask.
  warm-up: k is static, so the density changes in stages: build the compressors
          for ``warmup_density(step, ...)`` and rebuild (recompile) only when
          :func:`warmup_stage` changes (num_stages + 1 compilations at most).

hfl.step implements this contract with the uplink's error-feedback residual as v:
the worker sends u through ``hfl.links.exchange`` (p = u + e; e <- p - decode), masks u
with :func:`mask_velocity` and keeps u in ``TrainState.dgc_velocity``; hfl.train
rebuilds the compressors per warm-up stage (``compression.dgc`` in the config).

``dgc_step`` keeps error feedback exact: v <- v - decode(payload), which equals
masking for exact float32 values and also absorbs value rounding for
reduced-precision values.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from hfl.compress import base
from hfl.compress.base import Compressor


class Options(NamedTuple):
  """DGC options of the training step (``compression.dgc`` in the config).

  Attributes:
    momentum: m of the momentum correction (0: off; the inner optimizer must then
      be plain SGD when > 0).
    clip_norm: local gradient clipping threshold (0: off), scaled by
      W^(-1/2) for the W workers of a DC (:func:`clip_local`).
  """
  momentum: float = 0.0
  clip_norm: float = 0.0


class DGCState(NamedTuple):
  """Per-leaf DGC accumulators.

  Attributes:
    u: f32[shape], momentum-corrected velocity.
    v: f32[shape], accumulated velocity not yet sent (the error memory).
  """
  u: jax.Array
  v: jax.Array


def init(shape) -> DGCState:
  """Zero accumulators for a leaf of ``shape``."""
  z = jnp.zeros(tuple(shape), jnp.float32)
  return DGCState(u=z, v=z)


def clip_local(grads, max_norm: float, num_workers: int):
  """Local gradient clipping: scale the tree so its global L2 norm <= max_norm / sqrt(N).

  Args:
    grads: pytree of f32 arrays (one worker's gradient).
    max_norm: the global clipping threshold (as for the aggregated gradient).
    num_workers: N, the number of workers whose gradients are summed.

  Returns:
    pytree like ``grads``. All-zero gradients stay zero (no NaN); a non-finite
    tree stays non-finite. A finite tree whose sum of squares overflows float32
    (entries beyond ~1e19) is clipped like any other: its norm is then computed
    from the values pre-scaled by a power of two of their max-abs
    (:func:`hfl.compress.base.pow2_scale`, as BLAS ``nrm2`` pre-scales), and the
    result has global norm ``max_norm / sqrt(N)`` up to float32 rounding. Where
    the plain sum of squares is finite the result is bitwise the plain
    ``x * min(1, thr / norm)``.
  """
  thr = jnp.float32(max_norm) / jnp.sqrt(jnp.float32(num_workers))
  leaves = jax.tree.leaves(grads)
  if not leaves:
    return grads
  sum_sq = sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in leaves)
  norm = jnp.sqrt(sum_sq)
  scale = jnp.minimum(1.0, thr / jnp.maximum(norm, 1e-30))
  # Where the sum of squares overflows but every entry is finite: the norm of the
  # tree times 2^-k (base.pow2_scale; exact), norm_s = norm 2^-k, which does not
  # overflow, and x thr / norm = (x 2^-k) (thr / norm_s).
  amax = jnp.max(jnp.stack([base.max_abs(x) for x in leaves]))
  rescue = ~jnp.isfinite(sum_sq) & jnp.isfinite(amax)
  down, _ = base.pow2_scale(amax)
  norm_s = jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32) * down)) for x in leaves))
  clip_s = norm_s > thr * down
  ratio = thr / jnp.where(clip_s, norm_s, 1.0)

  def clip(x):
    xs = x.astype(jnp.float32) * down
    rescued = jnp.where(clip_s, xs * ratio, x.astype(jnp.float32)).astype(x.dtype)
    return jnp.where(rescue, rescued, x * scale.astype(x.dtype))

  return jax.tree.map(clip, grads)


def accumulate(state: DGCState, g: jax.Array, momentum: float) -> DGCState:
  """Momentum correction (Lin et al. eq. 7): u <- m u + g; v <- v + u.

  With m = 0, u = g exactly, whatever the old u holds (no 0 * NaN: a velocity of
  weight 0 contributes nothing, as a residual of weight 0, hfl.compress.ef.feed_back).
  """
  m = jnp.asarray(momentum, jnp.float32)
  g = g.astype(jnp.float32)
  u = jnp.where(m == 0, g, m * state.u + g)
  return DGCState(u=u, v=state.v + u)


def sent_mask(compressor: Compressor, payload) -> jax.Array:
  """bool[shape]: coordinates carried by ``payload``.

  From ``payload['indices']`` when present (sparsifiers), else
  ``decode(payload) != 0``.
  """
  shape = compressor.shape
  if 'indices' in payload:
    size = 1
    for d in shape:
      size *= d
    idx = payload['indices'].astype(jnp.int32)
    return jnp.zeros((size,), bool).at[idx].set(True, mode='drop').reshape(shape)
  return compressor.decode(payload) != 0


def mask_velocity(compressor: Compressor, payload, u: jax.Array) -> jax.Array:
  """Momentum factor masking of the velocity (Lin et al. 2018, Sec. 3.2): u <- u * not(mask).

  Applied only to sparse payloads (those with ``'indices'``: top-k, random-k),
  whose unsent coordinates are delayed in the error memory; a dense payload
  (identity, casts, quantisers) sends every coordinate on every step, and masking
  it would zero the whole velocity, i.e. turn momentum off for that leaf. Dense
  leaves therefore keep their velocity (for a lossless link this is exactly
  momentum SGD, the mean of the workers' velocities being the velocity of the
  mean gradient).

  Args:
    compressor: the leaf's compressor.
    payload: the payload ``compressor.encode`` produced this step.
    u: f32[shape], the velocity after :func:`accumulate`.

  Returns:
    f32[shape].
  """
  if 'indices' not in payload:
    return u
  return jnp.where(sent_mask(compressor, payload), jnp.float32(0), u)


def dgc_step(compressor: Compressor, g: jax.Array, state: DGCState, cstate,
             key: jax.Array, momentum: float = 0.9):
  """Momentum correction + sparsification + momentum factor masking for one leaf.

  Args:
    compressor: the leaf's compressor (top-k in DGC).
    g: f32[shape], this worker's (clipped) gradient.
    state: the leaf's :class:`DGCState`.
    cstate: the compressor's own state.
    key: PRNG key.
    momentum: m.

  Returns:
    (payload, new DGCState, new compressor state).
  """
  acc = accumulate(state, g, momentum)
  payload, cstate = compressor.encode(acc.v, cstate, key)
  mask = sent_mask(compressor, payload)
  v = acc.v - compressor.decode(payload)
  u = jnp.where(mask, 0.0, acc.u)
  return payload, DGCState(u=u, v=v), cstate


def warmup_stage(step: int, warmup_steps: int, num_stages: int = 4) -> int:
  """Warm-up stage of ``step``: 0..num_stages (num_stages = warm-up finished).

  Args:
    step: optimizer step (int, host side).
    warmup_steps: length of the warm-up in steps (DGC: 4 epochs); <= 0 disables.
    num_stages: number of equal-length stages.
  """
  if warmup_steps <= 0:
    return num_stages
  return min(num_stages, int(step * num_stages // warmup_steps))


def warmup_density(step: int, final_density: float, warmup_steps: int,
                   initial_density: float = 0.25, num_stages: int = 4) -> float:
  """Exponential density warm-up (Lin et al. 2018, Sec. 3.3).

  density = initial * (final / initial) ** (stage / num_stages), constant within a
  stage; with the defaults and final 0.001: 0.25, 0.0629, 0.0158, 0.0040, 0.001
  (the paper's 25%, 6.25%, 1.5625%, 0.4%, 0.1%, up to its rounding).

  Args:
    step: optimizer step (host int).
    final_density: density after the warm-up, in (0, 1].
    warmup_steps: warm-up length in steps (<= 0: always final_density).
    initial_density: density of stage 0 (clipped to >= final_density).
    num_stages: number of warm-up stages.

  Returns:
    Python float in [final_density, max(initial_density, final_density)].

  Raises:
    ValueError: densities outside (0, 1].
  """
  for name, d in (('final_density', final_density),
                  ('initial_density', initial_density)):
    if not 0.0 < d <= 1.0:
      raise ValueError(f'{name} must be in (0, 1], got {d!r}')
  initial = max(initial_density, final_density)
  stage = warmup_stage(step, warmup_steps, num_stages)
  return float(initial * (final_density / initial)**(stage / num_stages))
