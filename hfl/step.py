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
  3. PS aggregation over 'worker': linear payloads (identity, casts) are scaled by
     1/W and all-reduced; every other payload is all-gathered, each decoded, then
     averaged — never an average of encoded values.
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
     residual, all-gathered over 'dc', decoded, combined with per-DC weights
     (FedAvg n_d/n over present DCs, or FedNova's rescaled weights).
  7. the outer optimizer (optax) applies Σ_d s_d Δ̂_d to x_global; every DC restarts
     from the new x_global.

Bits on every link are computed inside the step from the payloads handed to the
collectives (``Compressor.wire_bits``) and returned per DC. With sharded optimizer
state the intra-DC links also carry the parameter all-gather (each worker pushes
its updated slice to the PS, which forwards it to the other W - 1 workers), and a
dense (linear) downlink reaches each worker as its slice only; see
:func:`static_bits`.
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


def reduce_scatters(cu: base.Compressor, cd: base.Compressor) -> bool:
  """Whether a leaf's uplink is a reduce-scatter under sharded optimizer state.

  Only for an uncompressed leaf: a lossless linear uplink and downlink (identity;
  both are then elementwise casts, valid on slices), so that no worker needs more
  than its slice of the aggregate and the PS keeps no downlink residual.
  """
  return cu.linear and cu.lossless and cd.linear and cd.lossless


def exchange(*args, **kwargs):
  """Error-feedback-compresses ``x``, sends it over mesh axis ``axis``, aggregates.

  ``exchange_steps(...)`` (same arguments) run with its collective applied
  directly; see there.
  """
  return collectives.run(exchange_steps(*args, **kwargs))


def exchange_steps(c: base.Compressor, x, residual, state, key, axis: str, axis_size: int,
                   weights=None, gamma=None, split_axis: str | None = None,
                   split_size: int = 1, with_payload: bool = False, scatter: bool = False):
  """Error-feedback-compresses ``x``, sends it over mesh axis ``axis``, aggregates.

  A generator: it yields its one collective (a ``hfl.collectives.Call``) and
  receives the result, so that several leaves' exchanges can share one
  collective (``collectives.run_fused``); :func:`exchange` runs one alone.

  Error feedback (hfl.compress.ef): p = x + γ e; payload = C(p); e <- p - D(payload)
  (skipped for lossless compressors, whose residual stays 0).

  Aggregation: linear payloads (identity, casts) are re-encoded from p scaled by
  the member's weight in f32 (fp16 bounded, hfl.compress.ef.encode_for_sum) and
  all-reduced — the sum of payloads is then decoded; every other payload is
  all-gathered and each one decoded before the weighted sum (never an average of
  encoded values, DESIGN 7).

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
      send 1/split_size of the payload (:func:`all_gather_split`).
    split_size: members on ``split_axis``.
    with_payload: also return this member's payload (e.g. for DGC's momentum
      factor masking).
    scatter: reduce-scatter instead of all-reduce (ZeRO-1; a lossless linear
      compressor, see :func:`reduce_scatters`): the aggregate is then this
      member's slice f32[ceil(size / axis_size)] of it flattened and zero-padded
      (:func:`psum_scatter_split`), and the bits are those of the padded payload
      handed to the reduce-scatter.

  Returns:
    (aggregate f32[shape] identical on every member — or this member's slice
     with ``scatter`` —, new residual, new state, wire bits f32[] of this member's
     payload), plus the payload (dict of arrays) when ``with_payload``.

  Raises:
    ValueError: ``scatter`` with a compressor that is not lossless and linear, or
      with ``split_axis``/``weights``.
  """
  if scatter and not (c.linear and c.lossless and split_axis is None and weights is None):
    raise ValueError(f'exchange: scatter needs a lossless linear compressor (got {c.name}) '
                     'and no split_axis/weights')
  if gamma is None:
    gamma = getattr(state, 'ef_gamma', 1.0)
  if c.lossless:
    p, new_res = x.astype(jnp.float32), residual
    payload, new_state = c.encode(p, state, key)
  else:
    p = x.astype(jnp.float32) + jnp.float32(gamma) * residual
    payload, new_res, new_state = ef.ef_step(c, x, residual, state, key, gamma)
  bits = c.wire_bits(payload)
  if c.linear:
    # encode_for_sum divides by axis_size: the psum is then the (weighted) mean.
    scale = (jnp.float32(1) if weights is None
             else weights[jax.lax.axis_index(axis)] * axis_size)
    wire, _ = ef.encode_for_sum(c, p * scale, state, key, axis_size)
    if scatter:
      bits = jnp.float32(axis_size * chunk_bits(wire, axis_size))
      agg = c.decode(psum_scatter_split(wire, axis, axis_size))
    elif split_axis is None:
      agg = c.decode((yield collectives.Call(
          lambda a: jax.lax.psum(a, axis), wire, ('psum', axis))))
    else:
      agg = c.decode((yield collectives.Call(
          lambda a: psum_split(a, axis, split_axis, split_size), wire,
          ('psum_split', axis, split_axis, split_size))))
  else:
    if split_axis is None:
      gathered = yield collectives.Call(
          lambda a: jax.lax.all_gather(a, axis, to='invarying'), payload,
          ('all_gather', axis), pack_bytes=True)
    else:
      gathered = yield collectives.Call(
          lambda a: all_gather_split(a, axis, split_axis, split_size), payload,
          ('all_gather_split', axis, split_axis, split_size), pack_bytes=True)
    if weights is None:
      agg = ef.aggregate(c, gathered, axis_size)
    else:
      agg = jnp.tensordot(weights, jax.vmap(c.decode)(gathered), axes=1)
  if with_payload:
    return agg, new_res, new_state, bits, payload
  return agg, new_res, new_state, bits


def static_bits(comps: Compressors, params_shape, num_w: int,
                shard_state: bool = False) -> tuple[float, float, float]:
  """Bits per iteration of one worker's uplink, of what one worker receives on the
  downlink, and of one DC's WAN payload, from payload shapes (nothing runs).

  The same counting as the step (which counts the payloads it sends): exact where
  ``wire_bits`` is the default, an upper bound for variable-length codes. Used to
  plan (semi-synchronous K_d) before anything is compiled.

  Args:
    comps: per-leaf compressors.
    params_shape: pytree of the parameters (arrays or ShapeDtypeStructs).
    num_w: W, workers per DC.
    shard_state: ZeRO-1 sharded optimizer state (reduce-scatter of identity
      leaves, sliced dense downlinks, the parameter all-gather).

  Returns:
    (up, down, wan) bits, Python floats.
  """
  up = down = 0.0
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
  return float(up), float(down), float(sum(policy.static_bits(c) for c in comps.wan))


# --------------------------------------------------------------------------------
# The step.
# --------------------------------------------------------------------------------

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
  and returns the new state and float32[D] metrics: ``loss`` (DC-mean train loss),
  ``up_bits`` (all the DC's workers' uplink payloads), ``down_bits`` (PS downlink
  to all workers), ``wan_bits`` (the DC's pseudo-gradient payload, 0 without a round).
  """
  num_w = mesh.shape[WORKER]
  num_d = mesh.shape[DC]
  treedef = jax.tree.structure(state_like.params)
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
    up_bits = jnp.float32(0)
    down_bits = jnp.float32(0)
    for i, g in enumerate(g_leaves):
      cu, cd = comps.up[i], comps.down[i]
      # ZeRO-1 with identity links: a reduce-scatter; agg is then this worker's slice.
      scatter = shard and reduce_scatters(cu, cd)
      if use_velocity:
        # Momentum correction: u <- m u + g is sent through the EF (e_up = DGC's v).
        u = dgc.accumulate(dgc.DGCState(u=vel[i], v=up_res[i]), g, momentum).u
        agg, e, st, bits, payload = exchange(
            cu, u, up_res[i], up_st[i], jax.random.fold_in(wk_key, i), WORKER, num_w,
            with_payload=True)
        new_vel.append(dgc.mask_velocity(cu, payload, u))
      else:
        agg, e, st, bits = exchange(cu, g, up_res[i], up_st[i],
                                    jax.random.fold_in(wk_key, i), WORKER, num_w,
                                    scatter=scatter)
      up_bits += bits
      # The PS (replicated on the DC's workers) re-compresses the aggregate.
      if cd.lossless:
        dpay, de, dst = cd.encode(agg, down_st[i], None)[0], down_res[i], down_st[i]
      else:
        dpay, de, dst = ef.ef_step(cd, agg, down_res[i], down_st[i],
                                   jax.random.fold_in(dc_key, i),
                                   getattr(down_st[i], 'ef_gamma', 1.0))
      if not shard or scatter:  # with scatter, dpay holds only this worker's slice
        down_bits += cd.wire_bits(dpay)
        down_g.append(cd.decode(dpay))
      else:
        # A dense (linear) payload reaches each worker as its slice; any other
        # payload whole, and each worker decodes it and keeps its slice.
        down_bits += chunk_bits(dpay, num_w) if cd.linear else cd.wire_bits(dpay)
        down_g.append(_split(cd.decode(dpay), num_w, wk))
      new_up_res.append(e)
      new_up_st.append(st)
      new_down_res.append(de)
      new_down_st.append(dst)
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
      up_bits += gather_bits
      down_bits += (num_w - 1) * gather_bits
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

    up_bits_dc = jax.lax.psum(up_bits, WORKER) * is_active
    down_bits_dc = down_bits * num_w * is_active
    loss_dc = jax.lax.pmean(loss, WORKER)

    global_params, outer_state = state.global_params, state.outer_state
    wan_residual, wan_state = sq1(state.wan_residual), sq1(state.wan_state)
    wan_bits = jnp.float32(0)
    if do_round:
      # 6. Pseudo-gradient, WAN compression with EF, all-gather over 'dc'.
      present = weights[dc] > 0
      x_leaves = treedef.flatten_up_to(new_params)
      x0_leaves = treedef.flatten_up_to(global_params)
      r_leaves = treedef.flatten_up_to(wan_residual)
      new_r, new_st, delta = [], [], []
      # All leaves' WAN payloads cross in one collective per kind and dtype
      # (hfl.collectives): a multi-process transport pays its latencies once.
      exchanged = collectives.run_fused([
          exchange_steps(comps.wan[i], x0 - x, r_leaves[i], wan_state[i],
                         jax.random.fold_in(dc_key, 1000 + i), DC, num_d, weights,
                         split_axis=WORKER, split_size=num_w)
          for i, (x, x0) in enumerate(zip(x_leaves, x0_leaves))])
      for i, (agg, e, st, bits) in enumerate(exchanged):
        wan_bits += bits
        delta.append(agg)
        new_r.append(jnp.where(present, e, r_leaves[i]))
        new_st.append(jax.tree.map(lambda a, b: jnp.where(present, a, b), st, wan_state[i]))
      wan_bits = wan_bits * present
      wan_residual, wan_state = treedef.unflatten(new_r), new_st
      # 7. Outer optimizer on the aggregated pseudo-gradient.
      delta = treedef.unflatten(delta)
      outer_updates, outer_state = outer.update(delta, outer_state, global_params)
      global_params = optax.apply_updates(global_params, outer_updates)
      new_params = global_params
      local_steps = jnp.zeros_like(local_steps)

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
    metrics = dict(loss=loss_dc[None], up_bits=up_bits_dc[None],
                   down_bits=down_bits_dc[None], wan_bits=wan_bits[None])
    return new_state, metrics

  specs = state_specs(state_like)
  metric_specs = dict(loss=P(DC), up_bits=P(DC), down_bits=P(DC), wan_bits=P(DC))

  def build(do_round):
    f = jax.shard_map(
        lambda s, x, y, a, w: body(s, x, y, a, w, do_round), mesh=mesh,
        in_specs=(specs, P(DC, WORKER), P(DC, WORKER), P(DC), P()),
        out_specs=(specs, metric_specs))
    return jax.jit(f, donate_argnums=(0,))

  compiled = {False: build(False), True: build(True)}

  def step(state, batch, active, weights, do_round: bool):
    images, labels = batch
    return compiled[bool(do_round)](state, images, labels, active, weights)

  step.jitted = compiled
  return step
