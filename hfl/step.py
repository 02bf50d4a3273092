"""The shard_map'd intra-DC iteration and inter-DC round (DESIGN 4.1, 4.2, 4.3).

One compiled program per (do_round) value; the training loop's indicator decides,
per iteration, whether the iteration ends with an inter-DC round.

Intra-DC iteration, on every worker (d, w) of the ('dc', 'worker') mesh:
  1. g = grad of the worker's loss at the DC model x_d (genuinely per worker: the
     parameters are cast to 'worker'-varying before differentiation).
     DGC options (Lin et al., ICLR 2018; hfl.compress.dgc): local gradient
     clipping g <- clip(g, c / sqrt(W)) (Sec. 3.3); momentum correction
     u <- m u + g (eq. 7), and u (not g) is what the uplink sends.
  2. uplink with error feedback: p = x + e_up (x = g, or u with DGC momentum);
     payload = C_up(p); e_up <- p - D(payload). With DGC momentum the residual e_up
     is DGC's accumulated velocity v, and momentum factor masking zeroes u where a
     sparse payload sent coordinates (Sec. 3.2).
  3. PS aggregation over 'worker': float32 identity payloads are all-reduced
     (exact transport, float32 sum); every other payload, casts included, is
     all-gathered in its wire dtype, each one decoded, then averaged in float32 —
     never an average of encoded values. The PS thus adds exactly what each
     worker's residual assumes it sent (:func:`exchange`).
  4. PS downlink with its own error feedback: q = agg + e_ps; d = C_down(q);
     e_ps <- q - D(d). The PS runs replicated on every worker of the DC (SPMD), so
     every worker holds the same downlink gradient.
  5. every worker applies the same optax update with the downlink gradient; DCs
     whose ``active`` flag is off (semi-synchronous masking) keep their state.
     With the optimizer state sharded across the DC's workers (ZeRO-1,
     :class:`ShardedOptState`), worker w holds slice w of every state leaf and
     updates only slice w of the parameters (every leaf flattened, zero-padded to
     a multiple of W); an all-gather over 'worker' rebuilds the parameters. A leaf
     with an identity uplink and downlink is then reduce-scattered instead of
     all-reduced (each worker receives only its slice of the aggregate); any other
     leaf's downlink is decoded whole and sliced.

Inter-DC round (after the iteration, when ``do_round``):
  6. pseudo-gradient Δ_d = x_global - x_d, compressed for the WAN with a per-DC
     residual, exchanged over 'dc' like step 3 (each of the DC's W workers sends
     1/W of the DC's payload over 'dc' and the received slices are re-gathered
     over 'worker'), decoded, combined with per-DC weights in float32 (FedAvg
     n_d/n over present DCs, or FedNova's rescaled weights).
  7. the outer optimizer (optax) applies Σ_d s_d Δ̂_d to x_global; every DC restarts
     from the new x_global.

Bits on every link are those of the payloads handed to the collectives
(``Compressor.wire_bits``): Python ints fixed when the program is traced
(:class:`ProgramInfo`), plus int32 per leaf for variable-length codes, summed on
the host in int64 (:func:`host_metrics`); no collective is spent on metrics.
Every collective of the iteration and round programs is a link's: the uplink
(all-reduce, all-gather, or ZeRO-1 reduce-scatter over 'worker'), the ZeRO-1
parameter all-gather over 'worker' (each worker pushes its updated slice to the
PS, intra_up, which forwards it to the other W - 1 workers, intra_down), the WAN
exchange over 'dc' (inter_dc) and the round's re-gather over 'worker' (the
round's result reaching the workers, charged to intra_down as
``round_down_bits``). A dense (linear) downlink reaches each worker as its slice
only with ZeRO-1; see :func:`static_bits`. Non-finite gradients, payloads and
residuals are flagged per link and leaf (:func:`finiteness_flags`).
"""

from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from hfl import collectives
from hfl import mesh as mesh_lib
from hfl.compress import base
from hfl.compress import dgc
from hfl.compress import ef
from hfl.compress import policy

DC, WORKER = mesh_lib.DC, mesh_lib.WORKER


class TrainState(NamedTuple):
  """Training state. D = num DCs, W = workers per DC; ``...`` = the leaf's shape."""
  params: Any         # per-DC model x_d, leaves f32[D, ...], sharded P('dc')
  # inner optax state on the workers, leaves [D, ...], P('dc'); or a
  # ShardedOptState (ZeRO-1), leaves [D, W, ...slice], P('dc', 'worker').
  opt_state: Any
  global_params: Any  # x_global after the last round, leaves f32[...], replicated
  outer_state: Any    # outer optax state, replicated
  up_residual: Any    # worker error feedback e_up, leaves f32[D, W, ...], P('dc', 'worker')
  up_state: Any       # uplink compressor states, list per leaf, leading [D, W]
  down_residual: Any  # PS error feedback e_ps, leaves f32[D, ...], P('dc')
  down_state: Any     # downlink compressor states, list per leaf, leading [D]
  wan_residual: Any   # pseudo-gradient error feedback, leaves f32[D, ...], P('dc')
  wan_state: Any      # WAN compressor states, list per leaf, leading [D]
  local_steps: jax.Array  # int32[D], local steps since the last round
  step: jax.Array     # int32[], iterations done
  key: jax.Array      # uint32[2], PRNG key for stochastic compressors
  # DGC momentum-corrected velocity u, leaves f32[D, W, ...], P('dc', 'worker');
  # () when DGC momentum is off (no leaves: other runs' checkpoints do not grow).
  dgc_velocity: Any = ()


class Compressors(NamedTuple):
  """Per-leaf compressors (lists aligned with ``jax.tree.leaves(params)``)."""
  up: Sequence[base.Compressor]
  down: Sequence[base.Compressor]
  wan: Sequence[base.Compressor]


class ShardedOptState(NamedTuple):
  """Inner optimizer state sharded across a DC's workers (ZeRO-1, DESIGN 2).

  ``inner`` is what ``optimizer.init`` returns for one worker's slices of the
  parameters (:func:`split_tree`: every leaf flattened, zero-padded to a multiple
  of W, cut into W equal chunks), stacked over DCs and workers: leaves
  [D, W, ceil(size / W)] for parameter-shaped state, [D, W] for scalars (step
  counts, equal on every worker), sharded P('dc', 'worker'). Each device thus holds
  1/W of its DC's optimizer state (plus < W padding entries per leaf). Only
  elementwise optimizers can be sliced this way (an entry's update depends only on
  that entry's gradient, parameter and state, and on step counts): every name in
  hfl.optim.OPTIMIZERS is one.
  """
  inner: Any


def is_sharded(state_like: TrainState) -> bool:
  """Whether ``state_like`` holds ZeRO-1 sharded optimizer state."""
  return isinstance(state_like.opt_state, ShardedOptState)


def state_specs(state_like: TrainState) -> TrainState:
  """PartitionSpecs of every TrainState field (a prefix tree of the state)."""
  return TrainState(
      params=P(DC), opt_state=P(DC, WORKER) if is_sharded(state_like) else P(DC),
      global_params=P(), outer_state=P(),
      up_residual=P(DC, WORKER), up_state=P(DC, WORKER), down_residual=P(DC),
      down_state=P(DC), wan_residual=P(DC), wan_state=P(DC), local_steps=P(DC),
      step=P(), key=P(), dgc_velocity=P(DC, WORKER))


def state_shardings(mesh: Mesh, state_like: TrainState) -> TrainState:
  """NamedShardings of every leaf of a TrainState (or of its eval_shape), per state_specs."""
  return jax.tree.map(
      lambda spec, sub: jax.tree.map(lambda _: NamedSharding(mesh, spec), sub),
      state_specs(state_like), state_like, is_leaf=lambda x: isinstance(x, P))


def _stack(tree, lead):
  return jax.tree.map(lambda x: jnp.broadcast_to(x, tuple(lead) + x.shape), tree)


def init_state(params, optimizer: optax.GradientTransformation,
               outer: optax.GradientTransformation, comps: Compressors,
               num_dcs: int, workers_per_dc: int, key,
               dgc_momentum: bool = False, shard_state: bool = False) -> TrainState:
  """Builds the initial state from one set of global parameters (all DCs start equal).

  Pure; call under ``jax.jit(..., out_shardings=...)`` to allocate it sharded.

  Args:
    dgc_momentum: allocate the per-worker DGC velocity (zeros, leaves
      f32[D, W, ...]); otherwise ``dgc_velocity`` is ().
    shard_state: shard the inner optimizer state across each DC's workers
      (:class:`ShardedOptState`, ZeRO-1); ``optimizer`` must be elementwise.
  """
  d, w = num_dcs, workers_per_dc
  zeros = jax.tree.map(jnp.zeros_like, params)
  if shard_state:
    per_worker = jax.vmap(lambda i: optimizer.init(split_tree(params, w, i)))(jnp.arange(w))
    opt_state = ShardedOptState(_stack(per_worker, (d,)))
  else:
    opt_state = _stack(optimizer.init(params), (d,))
  return TrainState(
      params=_stack(params, (d,)),
      opt_state=opt_state,
      global_params=params,
      outer_state=outer.init(params),
      up_residual=_stack(zeros, (d, w)),
      up_state=_stack([c.init() for c in comps.up], (d, w)),
      down_residual=_stack(zeros, (d,)),
      down_state=_stack([c.init() for c in comps.down], (d,)),
      wan_residual=_stack(zeros, (d,)),
      wan_state=_stack([c.init() for c in comps.wan], (d,)),
      local_steps=jnp.zeros((d,), jnp.int32),
      step=jnp.zeros((), jnp.int32),
      key=key,
      dgc_velocity=_stack(zeros, (d, w)) if dgc_momentum else ())


# --------------------------------------------------------------------------------
# One leaf crossing one link: error feedback, encode, collective, decode.
# --------------------------------------------------------------------------------

def _chunk(size: int, parts: int) -> int:
  """Entries of one member's slice of a ``size``-entry array split in ``parts``."""
  return -(-int(size) // parts)


def _pad_flat(a, parts: int):
  """``a`` flattened and zero-padded to a multiple of ``parts`` entries."""
  flat = a.reshape(-1)
  return jnp.pad(flat, (0, _chunk(flat.size, parts) * parts - flat.size))


def _split(a, parts: int, index):
  """This member's 1/parts slice of ``a`` flattened (zero-padded to a multiple)."""
  chunk = _chunk(a.size, parts)
  return jax.lax.dynamic_slice_in_dim(_pad_flat(a, parts), index * chunk, chunk)


def split_tree(tree, parts: int, index):
  """Slice ``index`` of every leaf of ``tree`` (:func:`_split`): leaves [ceil(size/parts)]."""
  return jax.tree.map(lambda a: _split(a, parts, index), tree)


def chunk_bits(payload, parts: int) -> int:
  """Bits of one member's 1/parts slice of every array of ``payload`` (static).

  Args:
    payload: pytree of arrays or ShapeDtypeStructs.
    parts: members the arrays are split across (each flattened, zero-padded to a
      multiple of ``parts``).

  Returns:
    int: sum over arrays of ceil(size / parts) * itemsize * 8.
  """
  return sum(_chunk(np.prod(a.shape, dtype=np.int64), parts) * jnp.dtype(a.dtype).itemsize * 8
             for a in jax.tree.leaves(payload))


def _unsplit(parts_gathered, shape):
  """Inverse of :func:`_split` after an all-gather of the slices on the last axis."""
  size = int(np.prod(shape, dtype=np.int64))
  lead = parts_gathered.shape[:-1]
  return parts_gathered[..., :size].reshape(lead + tuple(shape))


def all_gather_split(payload, axis: str, split_axis: str, split_size: int):
  """``all_gather(payload, axis)`` with each member of ``split_axis`` sending 1/split_size.

  Used for the inter-DC exchange: a DC's payload is identical on its W workers, so
  worker w sends only slice w over 'dc' and the slices are re-assembled inside the
  DC over 'worker'. The WAN then carries each DC's payload once (plus < W padding
  entries per payload array), not W times.

  Returns:
    payload pytree with a leading [axis_size] dimension, invariant over both axes.
  """
  idx = jax.lax.axis_index(split_axis)

  def leaf(a):
    mine = _split(a, split_size, idx)
    g = jax.lax.all_gather(mine, axis, to='invarying')                      # [n_axis, chunk]
    g = jax.lax.all_gather(g, split_axis, axis=1, tiled=True, to='invarying')  # [n_axis, W*chunk]
    return _unsplit(g, a.shape)
  return jax.tree.map(leaf, payload)


def psum_split(payload, axis: str, split_axis: str, split_size: int):
  """``psum(payload, axis)`` with each member of ``split_axis`` reducing 1/split_size."""
  idx = jax.lax.axis_index(split_axis)

  def leaf(a):
    s = jax.lax.psum(_split(a, split_size, idx), axis)
    s = jax.lax.all_gather(s, split_axis, tiled=True, to='invarying')
    return _unsplit(s, a.shape)
  return jax.tree.map(leaf, payload)


def psum_scatter_split(payload, axis: str, axis_size: int):
  """``_split(psum(payload, axis), axis_size, axis_index(axis))`` as one reduce-scatter.

  Returns:
    payload pytree, each leaf this member's slice [ceil(size / axis_size)] of the
    leaf flattened and zero-padded (varying over ``axis``).
  """
  return jax.tree.map(
      lambda a: jax.lax.psum_scatter(_pad_flat(a, axis_size), axis, scatter_dimension=0,
                                     tiled=True), payload)


def all_gather_unsplit(slices, shapes, axis: str):
  """Inverse of :func:`split_tree` across ``axis``: all-gathers every member's slice.

  Args:
    slices: pytree, leaves [chunk] (member i holds slice i).
    shapes: pytree of the same structure whose leaves have the full shapes.
    axis: the mesh axis the slices are split over.

  Returns:
    pytree of full leaves, invariant over ``axis``.
  """
  return jax.tree.map(
      lambda s, like: _unsplit(jax.lax.all_gather(s, axis, tiled=True, to='invarying'),
                               like.shape), slices, shapes)


def reduces(c: base.Compressor) -> bool:
  """Whether a leaf's payloads are summed by an all-reduce instead of all-gathered.

  Only for a lossless linear compressor (identity: float32 values): a float32
  all-reduce then moves exactly what each member sends and adds it in float32,
  as a parameter server does. Every lossy payload (casts included) is
  all-gathered in its wire dtype and each one decoded before the float32 sum, so
  the receiver adds exactly what the sender's error feedback assumes it sent.
  """
  return c.linear and c.lossless


def reduce_scatters(cu: base.Compressor, cd: base.Compressor) -> bool:
  """Whether a leaf's uplink is a reduce-scatter under sharded optimizer state.

  Only for an uncompressed leaf: a lossless linear uplink and downlink (identity;
  both are then elementwise casts, valid on slices), so that no worker needs more
  than its slice of the aggregate and the PS keeps no downlink residual.
  """
  return reduces(cu) and reduces(cd)


# Bit flags of one leaf's finiteness check on one link (hfl.train names them).
BAD_INPUT, BAD_PAYLOAD, BAD_RESIDUAL = 1, 2, 4
FLAG_NAMES = {BAD_INPUT: 'input', BAD_PAYLOAD: 'payload', BAD_RESIDUAL: 'residual'}


def _all_finite(*trees) -> jax.Array:
  """bool[]: every inexact (float) array in ``trees`` is finite."""
  arrays = [a for t in trees for a in jax.tree.leaves(t)
            if jnp.issubdtype(jnp.result_type(a), jnp.inexact)]
  if not arrays:
    return jnp.bool_(True)
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(a)) for a in arrays]))


def finiteness_flags(x, payload, decoded, residual) -> jax.Array:
  """int32[] bit flags of one leaf on one link: BAD_INPUT where ``x`` (the gradient,
  aggregate or pseudo-gradient sent) has a non-finite entry, BAD_PAYLOAD where the
  payload or its decoded value does, BAD_RESIDUAL where the new residual does."""
  return (jnp.where(_all_finite(x), 0, BAD_INPUT)
          | jnp.where(_all_finite(payload, decoded), 0, BAD_PAYLOAD)
          | jnp.where(_all_finite(residual), 0, BAD_RESIDUAL)).astype(jnp.int32)


class Sent(NamedTuple):
  """One member's side of one leaf crossing one link (:func:`exchange`)."""
  agg: jax.Array       # f32[shape] aggregate, identical on every member (a slice with scatter)
  residual: jax.Array  # f32[shape] the member's new error-feedback residual
  state: Any           # the member's new compressor state
  bits: Any            # wire bits of the member's payload: int (static) or int32[]
  flags: jax.Array     # int32[] finiteness flags (BAD_INPUT | BAD_PAYLOAD | BAD_RESIDUAL)
  payload: Any         # the member's payload (dict of arrays)


def exchange(*args, **kwargs) -> Sent:
  """Error-feedback-compresses ``x``, sends it over mesh axis ``axis``, aggregates.

  :func:`exchange_steps` (same arguments) run with its collective applied
  directly; see there.
  """
  return collectives.run(exchange_steps(*args, **kwargs))


def exchange_steps(c: base.Compressor, x, residual, state, key, axis: str, axis_size: int,
                   weights=None, gamma=None, split_axis: str | None = None,
                   split_size: int = 1, scatter: bool = False):
  """Error-feedback-compresses ``x``, sends it over mesh axis ``axis``, aggregates.

  A generator: it yields its one collective (a ``hfl.collectives.Call``) and
  receives the result, so that several leaves' exchanges can share one
  collective (``collectives.run_fused``); :func:`exchange` runs one alone. It
  returns a :class:`Sent`.

  Every member sends the encoding of its own unscaled p = x + γ e (error feedback,
  hfl.compress.ef; no residual for lossless compressors), keeps the residual
  e <- p - D(payload), and the receiver adds exactly D(payload) of each member in
  float32, with the member's weight applied in float32: for every compressor,
  link, W and weights, Σ_m w_m (received_m + e_m) = Σ_m w_m p_m up to float32
  rounding. What a link cannot represent (fp16 saturation, a quantiser's
  rounding) stays in the residual. Identity payloads (float32) are summed by an
  all-reduce; every other payload is all-gathered in its wire dtype and each one
  decoded before the sum (:func:`reduces`; never a sum of encoded values;
  Stich et al. 2018, error feedback).

  Args:
    c: the leaf's compressor.
    x: f32[shape], this member's value.
    residual: f32[shape], this member's error-feedback memory.
    state: the compressor's state.
    key: PRNG key.
    axis: mesh axis name.
    axis_size: members on the axis.
    weights: f32[axis_size] aggregation weights; None for the plain mean.
    gamma: error-feedback memory decay γ (default: the compressor state's
      ``ef_gamma`` when it has one — CO3's decaying memory — else 1).
    split_axis: a mesh axis over which ``x`` is identical; its members then each
      send 1/split_size of the payload and re-gather the rest over
      ``split_axis`` (:func:`all_gather_split`, :func:`psum_split`).
    split_size: members on ``split_axis``.
    scatter: reduce-scatter instead of all-reduce (ZeRO-1; identity, see
      :func:`reduce_scatters`): the aggregate is then this member's slice
      f32[ceil(size / axis_size)] of it flattened and zero-padded
      (:func:`psum_scatter_split`), and the bits are those of the padded payload
      handed to the reduce-scatter.

  Returns:
    :class:`Sent`.

  Raises:
    ValueError: ``scatter`` with a compressor that is not lossless and linear, or
      with ``split_axis``/``weights``.
  """
  if scatter and not (reduces(c) and split_axis is None and weights is None):
    raise ValueError(f'exchange: scatter needs a lossless linear compressor (got {c.name}) '
                     'and no split_axis/weights')
  if gamma is None:
    gamma = getattr(state, 'ef_gamma', 1.0)
  x = x.astype(jnp.float32)
  p = x if c.lossless else x + jnp.float32(gamma) * residual
  payload, new_state = c.encode(p, state, key)
  sent = c.decode(payload)  # what every receiver gets from this member
  new_res = residual if c.lossless else p - sent
  bits = c.wire_bits(payload)
  flags = finiteness_flags(x, payload, sent, new_res)
  if reduces(c):
    mine = sent / axis_size if weights is None else sent * weights[jax.lax.axis_index(axis)]
    if scatter:
      bits = axis_size * chunk_bits(payload, axis_size)
      agg = psum_scatter_split(mine, axis, axis_size)
    elif split_axis is None:
      agg = yield collectives.Call(lambda a: jax.lax.psum(a, axis), mine, ('psum', axis))
    else:
      agg = yield collectives.Call(
          lambda a: psum_split(a, axis, split_axis, split_size), mine,
          ('psum_split', axis, split_axis, split_size))
  else:
    if split_axis is None:
      gathered = yield collectives.Call(
          lambda a: jax.lax.all_gather(a, axis, to='invarying'), payload,
          ('all_gather', axis), pack_bytes=True)
    else:
      gathered = yield collectives.Call(
          lambda a: all_gather_split(a, axis, split_axis, split_size), payload,
          ('all_gather_split', axis, split_axis, split_size), pack_bytes=True)
    agg = ef.aggregate(c, gathered, axis_size, weights)
  return Sent(agg, new_res, new_state, bits, flags, payload)


def ps_downlink(c: base.Compressor, q, residual, state, key) -> Sent:
  """The PS's downlink of one leaf: error-feedback-compresses the aggregate ``q``.

  p = q + γ e; payload = C(p); e <- p - D(payload) (no residual for lossless
  compressors); every worker of the DC receives D(payload). The PS is replicated
  on the DC's workers (SPMD), so nothing crosses a collective here: each worker
  decodes the same payload.

  Args:
    c: the leaf's downlink compressor.
    q: f32[shape] (or a slice, for an elementwise lossless compressor), the
      aggregate.
    residual: f32 like ``q``, the PS's error-feedback memory.
    state: the compressor's state.
    key: PRNG key.

  Returns:
    :class:`Sent` whose ``agg`` is D(payload), what every worker receives.
  """
  gamma = getattr(state, 'ef_gamma', 1.0)
  p = q if c.lossless else q + jnp.float32(gamma) * residual
  payload, new_state = c.encode(p, state, key)
  received = c.decode(payload)
  new_res = residual if c.lossless else p - received
  return Sent(received, new_res, new_state, c.wire_bits(payload),
              finiteness_flags(q, payload, received, new_res), payload)


def static_bits(comps: Compressors, params_shape, num_w: int,
                shard_state: bool = False) -> tuple[int, int, int]:
  """Bits per iteration of one worker's uplink, of what one worker receives on the
  downlink, and of one DC's WAN payload, from payload shapes (nothing runs).

  The same counting as the step (which counts the payloads it sends): exact where
  ``wire_bits`` is static, the moved bits for variable-length codes. Used to
  plan (semi-synchronous K_d) before anything is compiled.

  Args:
    comps: per-leaf compressors.
    params_shape: pytree of the parameters (arrays or ShapeDtypeStructs).
    num_w: W, workers per DC.
    shard_state: ZeRO-1 sharded optimizer state (reduce-scatter of identity
      leaves, sliced dense downlinks, the parameter all-gather).

  Returns:
    (up, down, wan) bits, Python ints.
  """
  up = down = 0
  for cu, cd in zip(comps.up, comps.down):
    if shard_state and reduce_scatters(cu, cd):
      up += num_w * chunk_bits(policy.payload_shape(cu), num_w)
      down += chunk_bits(policy.payload_shape(cd), num_w)
    else:
      up += policy.static_bits(cu)
      down += (chunk_bits(policy.payload_shape(cd), num_w) if shard_state and cd.linear
               else policy.static_bits(cd))
  if shard_state and num_w > 1:
    gather = chunk_bits(params_shape, num_w)
    up += gather
    down += (num_w - 1) * gather
  return int(up), int(down), int(sum(policy.static_bits(c) for c in comps.wan))


def round_down_bits(comps: Compressors, num_w: int, num_present: int) -> int:
  """Planning estimate of :func:`host_metrics`' ``round_down_bits`` (one DC, one
  round, ``num_present`` DCs present), from payload shapes (nothing runs)."""
  summed = sum(policy.static_bits(c) for c in comps.wan if reduces(c))
  gathered = sum(policy.static_bits(c) for c in comps.wan if not reduces(c))
  return int(num_w * (summed + num_present * gathered))


# --------------------------------------------------------------------------------
# The step.
# --------------------------------------------------------------------------------

class ProgramInfo(NamedTuple):
  """Static (trace-time) facts of one compiled step program, for :func:`host_metrics`.

  Bits are Python ints, per device and iteration: every static payload size is
  known when the program is traced; only variable-length codes are counted on
  the device (int32 per leaf, in the metrics).
  """
  do_round: bool
  up: int         # static bits of one worker's uplink (+ its ZeRO-1 parameter slice)
  down: int       # static bits one worker receives on the downlink (+ ZeRO-1 slices)
  wan_sum: int    # static bits of one DC's WAN payload leaves that are all-reduced
  wan_gather: int  # static bits of one DC's WAN payload leaves that are all-gathered
  num_leaves: int


def metrics_size(num_leaves: int) -> int:
  """Entries of one device's packed metrics vector (see :func:`make_step`)."""
  return 1 + 6 * num_leaves


def make_step(apply_fn: Callable, optimizer: optax.GradientTransformation,
              outer: optax.GradientTransformation, comps: Compressors, mesh: Mesh,
              state_like: TrainState, dgc_options: dgc.Options | None = None) -> Callable:
  """Builds ``step(state, batch, active, weights, do_round) -> (state, metrics)``.

  Args:
    apply_fn: ``apply_fn(params, images) -> logits`` for ONE model.
    optimizer: the inner optax optimizer, applied on the workers.
    outer: the outer optax optimizer, applied to the pseudo-gradient.
    comps: per-leaf compressors.
    mesh: the ('dc', 'worker') mesh.
    state_like: a TrainState (or its eval_shape) to read the tree structure.
    dgc_options: DGC momentum correction / local clipping (default: off). With
      ``momentum > 0`` the state must hold a velocity (``init_state(...,
      dgc_momentum=True)``) and ``optimizer`` should be plain SGD (the momentum
      is in the velocity; hfl.config checks it for configs).

  The optimizer state is sharded across each DC's workers (ZeRO-1) when
  ``state_like.opt_state`` is a :class:`ShardedOptState` (``init_state(...,
  shard_state=True)``); ``optimizer`` must then be elementwise.

  The returned function takes
    state: TrainState sharded by :func:`state_specs`.
    batch: (images f32[D, W, B, H, W', C], labels int32[D, W, B]), sharded P('dc', 'worker').
    active: bool[D], DCs that run this iteration (semi-sync masking).
    weights: f32[D], per-DC aggregation weights for this round's pseudo-gradients
      (0 for an absent DC); ignored unless ``do_round``.
    do_round: static bool, end the iteration with an inter-DC round.
  and returns the new state and the metrics: int32[D, W, metrics_size(L)] (L
  leaves), per device, sharded P('dc', 'worker') — no collective is spent on
  them: [loss (float32 bits), variable-length bits per leaf of the uplink,
  downlink and WAN (0 for static leaves), finiteness flags per leaf of the
  uplink, downlink and WAN (BAD_*)]. Read them with :func:`host_metrics` and
  ``step.info[do_round]`` (a :class:`ProgramInfo`, set when the program is
  traced). Every collective of both programs is counted on a link (README).
  """
  num_w = mesh.shape[WORKER]
  num_d = mesh.shape[DC]
  treedef = jax.tree.structure(state_like.params)
  num_leaves = treedef.num_leaves
  opts = dgc_options or dgc.Options()
  momentum = float(opts.momentum)
  clip_norm = float(opts.clip_norm)
  use_velocity = momentum > 0
  has_velocity = bool(jax.tree.leaves(state_like.dgc_velocity))
  if use_velocity != has_velocity:
    raise ValueError(
        f'make_step: dgc momentum={momentum} but the state '
        f'{"holds" if has_velocity else "has no"} DGC velocity; build it with '
        f'init_state(..., dgc_momentum={use_velocity})')
  shard = is_sharded(state_like)
  if shard and use_velocity:
    raise ValueError(
        f'make_step: dgc momentum={momentum} keeps the momentum in per-worker velocities '
        'that cannot be sharded; build the state with init_state(..., shard_state=False)')
  info = {}

  def loss_fn(params, images, labels):
    logits = apply_fn(params, images)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

  def body(state: TrainState, images, labels, active, weights, do_round):
    sq1 = lambda t: jax.tree.map(lambda x: x[0], t)
    sq2 = lambda t: jax.tree.map(lambda x: x[0, 0], t)
    params = sq1(state.params)
    opt_state = sq2(state.opt_state.inner) if shard else sq1(state.opt_state)
    dc = jax.lax.axis_index(DC)
    wk = jax.lax.axis_index(WORKER)
    is_active = active[0]
    step_key = jax.random.fold_in(state.key, state.step)
    dc_key = jax.random.fold_in(step_key, dc)
    wk_key = jax.random.fold_in(dc_key, num_d + wk)
    # Bits: static Python ints per device (ProgramInfo), variable-length ones per
    # leaf on the device; finiteness flags per leaf. Index 0/1/2: up/down/WAN.
    static = dict(up=0, down=0, wan_sum=0, wan_gather=0)
    dyn = [[jnp.int32(0)] * num_leaves for _ in range(3)]
    flags = [[jnp.int32(0)] * num_leaves for _ in range(3)]

    def charge(link, field, i, bits):
      if isinstance(bits, (int, np.integer)):
        static[field] += int(bits)
      else:
        dyn[link][i] = dyn[link][i] + bits.astype(jnp.int32)

    # 1. Per-worker gradient.
    p_var = jax.lax.pcast(params, WORKER, to='varying')
    loss, grads = jax.value_and_grad(loss_fn)(p_var, images[0, 0], labels[0, 0])
    if clip_norm > 0:
      grads = dgc.clip_local(grads, clip_norm, num_w)

    # 2-4. Uplink with EF, PS aggregation, PS downlink with EF, leaf by leaf.
    g_leaves = treedef.flatten_up_to(grads)
    up_res = treedef.flatten_up_to(sq2(state.up_residual))
    down_res = treedef.flatten_up_to(sq1(state.down_residual))
    up_st, down_st = sq2(state.up_state), sq1(state.down_state)
    vel = treedef.flatten_up_to(sq2(state.dgc_velocity)) if use_velocity else None
    new_up_res, new_up_st, new_down_res, new_down_st, down_g = [], [], [], [], []
    new_vel = []
    for i, g in enumerate(g_leaves):
      cu, cd = comps.up[i], comps.down[i]
      # ZeRO-1 with identity links: a reduce-scatter; agg is then this worker's slice.
      scatter = shard and reduce_scatters(cu, cd)
      if use_velocity:
        # Momentum correction: u <- m u + g is sent through the EF (e_up = DGC's v).
        g = dgc.accumulate(dgc.DGCState(u=vel[i], v=up_res[i]), g, momentum).u
      up = exchange(cu, g, up_res[i], up_st[i], jax.random.fold_in(wk_key, i), WORKER, num_w,
                    scatter=scatter)
      if use_velocity:
        new_vel.append(dgc.mask_velocity(cu, up.payload, g))
      charge(0, 'up', i, up.bits)
      flags[0][i] = up.flags
      # The PS (replicated on the DC's workers) re-compresses the aggregate.
      down = ps_downlink(cd, up.agg, down_res[i], down_st[i], jax.random.fold_in(dc_key, i))
      flags[1][i] = down.flags
      if not shard or scatter:  # with scatter, the payload holds only this worker's slice
        charge(1, 'down', i, down.bits)
        down_g.append(down.agg)
      else:
        # A dense (linear) payload reaches each worker as its slice; any other
        # payload whole, and each worker decodes it and keeps its slice.
        charge(1, 'down', i, chunk_bits(down.payload, num_w) if cd.linear else down.bits)
        down_g.append(_split(down.agg, num_w, wk))
      new_up_res.append(up.residual)
      new_up_st.append(up.state)
      new_down_res.append(down.residual)
      new_down_st.append(down.state)
    down_g = treedef.unflatten(down_g)

    # 5. The same optimizer update on every worker of the DC.
    if shard:
      # ZeRO-1: each worker updates its slice of the parameters with its slice of
      # the state; the all-gather rebuilds the parameters. Each worker pushes its
      # slice to the PS (up) and receives the other W - 1 slices (down); with
      # W = 1 nothing needs to move.
      p_slices = split_tree(params, num_w, wk)
      updates, new_opt = optimizer.update(down_g, opt_state, p_slices)
      new_params = all_gather_unsplit(optax.apply_updates(p_slices, updates), params, WORKER)
      gather_bits = chunk_bits(params, num_w) if num_w > 1 else 0
      static['up'] += gather_bits
      static['down'] += (num_w - 1) * gather_bits
    else:
      updates, new_opt = optimizer.update(down_g, opt_state, params)
      new_params = optax.apply_updates(params, updates)

    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(is_active, a, b), new, old)
    new_params = keep(new_params, params)
    new_opt = keep(new_opt, opt_state)
    up_residual = keep(treedef.unflatten(new_up_res), treedef.unflatten(up_res))
    up_state = keep(new_up_st, up_st)
    down_residual = keep(treedef.unflatten(new_down_res), treedef.unflatten(down_res))
    down_state = keep(new_down_st, down_st)
    if use_velocity:
      velocity = keep(treedef.unflatten(new_vel), treedef.unflatten(vel))
    else:
      velocity = ()
    local_steps = state.local_steps + is_active.astype(jnp.int32)

    global_params, outer_state = state.global_params, state.outer_state
    wan_residual, wan_state = sq1(state.wan_residual), sq1(state.wan_state)
    if do_round:
      # 6. Pseudo-gradient, WAN compression with EF, all-gather over 'dc'; the
      # received slices are re-gathered over 'worker' (the round's result reaching
      # the DC's workers; host_metrics' round_down_bits).
      present = weights[dc] > 0
      x_leaves = treedef.flatten_up_to(new_params)
      x0_leaves = treedef.flatten_up_to(global_params)
      r_leaves = treedef.flatten_up_to(wan_residual)
      new_r, new_st, delta = [], [], []
      # All leaves' WAN payloads cross in one collective per kind and dtype
      # (hfl.collectives): a multi-process transport pays its latencies once.
      sent = collectives.run_fused([
          exchange_steps(comps.wan[i], x0 - x, r_leaves[i], wan_state[i],
                         jax.random.fold_in(dc_key, 1000 + i), DC, num_d, weights,
                         split_axis=WORKER, split_size=num_w)
          for i, (x, x0) in enumerate(zip(x_leaves, x0_leaves))])
      for i, wan in enumerate(sent):
        charge(2, 'wan_sum' if reduces(comps.wan[i]) else 'wan_gather', i, wan.bits)
        flags[2][i] = wan.flags
        delta.append(wan.agg)
        new_r.append(jnp.where(present, wan.residual, r_leaves[i]))
        new_st.append(jax.tree.map(lambda a, b: jnp.where(present, a, b), wan.state,
                                   wan_state[i]))
      wan_residual, wan_state = treedef.unflatten(new_r), new_st
      # 7. Outer optimizer on the aggregated pseudo-gradient.
      delta = treedef.unflatten(delta)
      outer_updates, outer_state = outer.update(delta, outer_state, global_params)
      global_params = optax.apply_updates(global_params, outer_updates)
      new_params = global_params
      local_steps = jnp.zeros_like(local_steps)
    info[do_round] = ProgramInfo(do_round, static['up'], static['down'], static['wan_sum'],
                                 static['wan_gather'], num_leaves)

    ex1 = lambda t: jax.tree.map(lambda x: x[None], t)
    ex2 = lambda t: jax.tree.map(lambda x: x[None, None], t)
    new_state = TrainState(
        params=ex1(new_params),
        opt_state=ShardedOptState(ex2(new_opt)) if shard else ex1(new_opt),
        global_params=global_params,
        outer_state=outer_state, up_residual=ex2(up_residual), up_state=ex2(up_state),
        down_residual=ex1(down_residual), down_state=ex1(down_state),
        wan_residual=ex1(wan_residual), wan_state=ex1(wan_state),
        local_steps=local_steps, step=state.step + 1, key=state.key,
        dgc_velocity=ex2(velocity))
    metrics = jnp.stack([jax.lax.bitcast_convert_type(loss.astype(jnp.float32), jnp.int32)]
                        + [b for link in dyn for b in link] + [f for link in flags for f in link])
    return new_state, metrics[None, None]

  specs = state_specs(state_like)

  def build(do_round):
    f = jax.shard_map(
        lambda s, x, y, a, w: body(s, x, y, a, w, do_round), mesh=mesh,
        in_specs=(specs, P(DC, WORKER), P(DC, WORKER), P(DC), P()),
        out_specs=(specs, P(DC, WORKER)))
    return jax.jit(f, donate_argnums=(0,))

  compiled = {False: build(False), True: build(True)}

  def step(state, batch, active, weights, do_round: bool):
    images, labels = batch
    return compiled[bool(do_round)](state, images, labels, active, weights)

  step.jitted = compiled
  step.info = info
  step.num_workers = num_w
  return step


def host_metrics(info: ProgramInfo, metrics, active, weights=None) -> dict:
  """Per-DC metrics of one iteration, on the host, with exact integer bit counts.

  Args:
    info: the program's :class:`ProgramInfo` (``step.info[do_round]``).
    metrics: the step's metrics, fetched: int32[D, W, metrics_size(L)].
    active: bool[D], the DCs that ran the iteration (others count no bits).
    weights: f32[D], the round's aggregation weights (0 = absent DC); needed when
      ``info.do_round``.

  Returns:
    dict of numpy arrays [D]: ``loss`` (float64, mean over the DC's workers),
    ``up_bits`` (int64, all the DC's workers' uplink payloads), ``down_bits``
    (int64, the PS downlink to all W workers), ``wan_bits`` (int64, the DC's
    pseudo-gradient payload; 0 without a round or for an absent DC) and
    ``round_down_bits`` (int64, the round's result reaching the DC's W workers
    over the LAN: W x (the all-reduced WAN leaves' payload + every present DC's
    all-gathered WAN payload), the bits each worker holds after the re-gather over
    'worker'; 0 without a round); and ``flags`` int32[D, W, 3, L] (finiteness
    flags of the uplink, downlink and WAN per leaf).
  """
  m = np.asarray(metrics)
  d, w, _ = m.shape
  n = info.num_leaves
  loss = np.ascontiguousarray(m[..., 0]).view(np.float32).astype(np.float64).mean(axis=1)
  dyn = m[..., 1:1 + 3 * n].astype(np.int64).reshape(d, w, 3, n).sum(axis=-1)
  active = np.asarray(active, bool)
  zero = np.zeros(d, np.int64)
  up = np.where(active, w * info.up + dyn[:, :, 0].sum(axis=1), zero)
  down = np.where(active, w * info.down + dyn[:, :, 1].sum(axis=1), zero)
  wan = round_down = zero
  if info.do_round:
    present = np.asarray(weights) > 0
    gathered = np.where(present, info.wan_gather + dyn[:, 0, 2], zero)  # same on every worker
    wan = np.where(present, info.wan_sum + gathered, zero)
    round_down = np.full(d, w * (info.wan_sum + int(gathered.sum())), np.int64)
  return dict(loss=loss, up_bits=up, down_bits=down, wan_bits=wan, round_down_bits=round_down,
              flags=m[..., 1 + 3 * n:].reshape(d, w, 3, n))


LINK_NAMES = ('uplink', 'downlink', 'WAN')


def first_nonfinite(flags, leaf_names: Sequence[str] | None = None) -> str | None:
  """Where the first non-finite value of one iteration was, in words, or None.

  Args:
    flags: int32[D, W, 3, L] from :func:`host_metrics`.
    leaf_names: the L leaves' pytree paths (default: their indices).

  Returns:
    e.g. ``"input of leaf ['Dense_0']['kernel'] on the uplink (DC 0, worker 2)"``
    (the input is the gradient on the uplink, the aggregate on the downlink, the
    pseudo-gradient on the WAN) — links in the order uplink, downlink, WAN; None
    when every value was finite.
  """
  flags = np.asarray(flags)
  for link in range(flags.shape[2]):
    bad = np.argwhere(flags[:, :, link, :] != 0)
    if len(bad):
      d, w, leaf = (int(v) for v in bad[0])
      what = [name for bit, name in FLAG_NAMES.items() if flags[d, w, link, leaf] & bit]
      name = leaf if leaf_names is None else leaf_names[leaf]
      return (f'{" and ".join(what)} of leaf {name} on the {LINK_NAMES[link]} '
              f'(DC {d}, worker {w})')
  return None


# Per-DC state of a round that an absent DC's work changes (hfl.sync.faults).
ROUND_FIELDS = ('opt_state', 'up_residual', 'up_state', 'down_residual', 'down_state',
                'wan_residual', 'wan_state', 'dgc_velocity')


def round_start(state: TrainState) -> dict:
  """A copy of the per-DC state a round may have to discard (:data:`ROUND_FIELDS`)."""
  return {f: jax.tree.map(jnp.copy, getattr(state, f)) for f in ROUND_FIELDS}


def discard_absent(state: TrainState, start: dict, present) -> TrainState:
  """Rolls absent DCs' per-DC state back to its start-of-round values.

  An absent DC's work in a round is discarded (hfl.sync.faults): its inner
  optimizer state, uplink/downlink/WAN residuals and compressor states and DGC
  velocity are those of the round's start; its parameters are the new global
  model, like every DC's after a round. Elementwise: no collective.

  Args:
    state: the TrainState after the round.
    start: :func:`round_start` of the state at the round's start.
    present: bool[D], the round's present DCs.

  Returns:
    The TrainState with absent DCs' :data:`ROUND_FIELDS` replaced.
  """
  present = jnp.asarray(present, bool)

  def pick(new, old):
    return jnp.where(present.reshape(present.shape + (1,) * (new.ndim - 1)), new, old)
  return state._replace(**{f: jax.tree.map(pick, getattr(state, f), start[f])
                           for f in ROUND_FIELDS})
