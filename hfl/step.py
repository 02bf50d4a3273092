"""The shard_map'd intra-DC iteration and inter-DC round, as composed pure functions.

Sources: hierarchical local SGD with a parameter server per DC and FedAvg model
averaging between DCs (McMahan et al., AISTATS 2017); the inter-DC step as an
outer optimizer on the pseudo-gradient (DiLoCo: Douillard et al. 2023,
arXiv:2311.08105); error feedback at both ends of a compressed link
(DoubleSqueeze: Tang et al., ICML 2019; Stich et al., NeurIPS 2018); DGC
momentum correction and local clipping (Lin et al., ICLR 2018); FedNova weights
(Wang et al., NeurIPS 2020); ZeRO-1 optimizer-state sharding (Rajbhandari et
al., SC 2020).

One compiled program per ``do_round`` value. The round wraps an unchanged
iteration (as MaxText's DiLoCo wraps its inner step)::

    state, charges = intra_dc_iteration(setup, state, images, labels, active, keys)
    if do_round:
      state, wan = inter_dc_round(setup, state, weights, keys.dc)

:func:`intra_dc_iteration`, on every worker (d, w) of the ('dc', 'worker') mesh:
  1. g = grad of the worker's loss at the DC model x_d (genuinely per worker: the
     parameters are cast to 'worker'-varying before differentiation). DGC
     options (hfl.compress.dgc): local gradient clipping g <- clip(g, c / sqrt(W))
     (Lin et al. Sec. 3.3); momentum correction u <- m u + g (eq. 7), and u (not
     g) is what the uplink sends.
  2. uplink with error feedback (:func:`hfl.links.exchange` over 'worker'): p = x + e_up;
     payload = C_up(p); e_up <- p - D(payload). With DGC momentum the residual is
     DGC's accumulated velocity v, and momentum factor masking zeroes u where a
     sparse payload sent coordinates (Lin et al. Sec. 3.2). Float32 identity
     payloads are all-reduced; every other payload, casts included, is
     all-gathered in its wire dtype, each one decoded, then averaged in float32.
  3. PS downlink with its own error feedback (:func:`hfl.links.downlink`): q = agg + e_ps;
     d = C_down(q); e_ps <- q - D(d). The PS runs replicated on every worker of the
     DC (SPMD), so every worker holds the same downlink gradient.
  4. every worker applies the same optax update (:func:`apply_inner`); DCs whose
     ``active`` flag is off (semi-synchronous masking) keep their state. With
     ``send='update'`` (:class:`WorkerOptState`) each worker instead runs the
     optimizer on its own gradient before step 2, with its own state, and sends
     that update; the PS averages the updates and every worker adds the downlink's
     decoded mean (:func:`worker_update`). With
     ZeRO-1 (:class:`ShardedOptState`) worker w updates only slice w of every
     leaf (flattened, zero-padded to a multiple of W) and an all-gather over
     'worker' rebuilds the parameters; an identity leaf's uplink is then a
     reduce-scatter (each worker receives its slice of the aggregate).

:func:`inter_dc_round`:
  5. pseudo-gradient Δ_d = x_global - x_d, compressed for the WAN with a per-DC
     residual and exchanged over 'dc' (each of the DC's W workers sends 1/W of the
     DC's payload and the received slices are re-gathered over 'worker'; every
     leaf's WAN payload crosses in one fused collective per kind and dtype,
     hfl.collectives.run_fused), decoded and combined with the per-DC weights in
     float32 (FedAvg n_d/n over present DCs, or FedNova's rescaled weights).
  6. the outer optimizer (hfl.sync.outer.apply_outer) applies Σ_d s_d Δ̂_d to
     x_global; every DC restarts from the new x_global' — as it is (the re-gather
     of step 5) at a leaf whose downlink compressor is lossless, and through the
     downlink at a lossy one (:func:`broadcast_correction`; ``broadcast='gather'``
     in :func:`init_state` re-gathers every leaf): the DC's PS sends the workers
     the correction c = (x_global' - x_global) + Δ_d with its own error feedback
     (p = c + e, payload = C_down(p), e <- p - D(payload)); the workers add
     D(payload), and the model they then hold is the next round's reference point
     x_ref, against which Δ_d is taken (x_ref = x_global at re-gathered leaves).
  7. with SCAFFOLD (hfl.sync.scaffold; Karimireddy et al., ICML 2020) step 1's
     gradient is corrected by c - c_d, and the round updates the control variates
     and sends their deltas over 'dc' as a second, float32 payload
     (:func:`scaffold_round`).

Bits on every link are those of the payloads handed to the collectives
(``Compressor.wire_bits``): Python ints fixed when the program is traced
(:class:`ProgramInfo`), plus int32 per leaf for variable-length codes, summed on
the host in int64 (:func:`host_metrics`); no collective is spent on metrics.
Every collective of both programs is a link's: the uplink over 'worker', the
ZeRO-1 parameter all-gather over 'worker' (each worker pushes its slice to the PS,
intra_up, which forwards it to the other W - 1 workers, intra_down), the WAN
exchange over 'dc' (inter_dc) and the round's re-gather over 'worker' (charged to
intra_down as ``round_down_bits`` at the leaves the round reaches as the gathered
global model; at the leaves whose update goes through the downlink the re-gather
only assembles x_global' on the replicated PS, and ``round_down_bits`` charges
W x the correction's payload instead, which, like the PS downlink, crosses no
collective of the simulation). A dense (linear) downlink reaches each worker
as its slice only with ZeRO-1 (hfl.accounting.static_bits). Non-finite
gradients, payloads and residuals are flagged per link and leaf: every link
returns its leaves' checks (:class:`hfl.links.Check`), and the program reduces all of them
at once, a few operations per 32 flag bits (:func:`hfl.links.fused_flags`), instead of
several per leaf and link; the host unpacks the bits into the per-leaf flags of
:func:`hfl.links.finiteness_flags` (:func:`host_metrics`), so a non-finite value is named by
its leaf, link, DC and worker as before.
"""

from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from hfl import collectives
from hfl import links as link_lib
from hfl import mesh as mesh_lib
from hfl.collectives import chunk_bits, reduce_scatters, reduces
from hfl.compress import base
from hfl.compress import dgc
from hfl.sync import outer as outer_lib
from hfl.sync import scaffold as scaffold_lib
from hfl.sync import streaming

DC, WORKER = mesh_lib.DC, mesh_lib.WORKER
WAN_KEY_OFFSET = 1000  # WAN leaf i draws from fold_in(dc key, 1000 + i).


class TrainState(NamedTuple):
  """Training state. D = num DCs, W = workers per DC; ``...`` = the leaf's shape."""
  params: Any         # per-DC model x_d, leaves f32[D, ...], sharded P('dc')
  # inner optax state on the workers, leaves [D, ...], P('dc'); or a
  # ShardedOptState (ZeRO-1), leaves [D, W, ...slice], P('dc', 'worker').
  opt_state: Any
  global_params: Any  # x_global after the last round, leaves f32[...], replicated
  outer_state: Any    # outer optax state, replicated
  up: link_lib.LinkState       # worker uplink EF, leaves [D, W, ...], P('dc', 'worker')
  down: link_lib.LinkState     # PS downlink EF, leaves [D, ...], P('dc')
  wan: link_lib.LinkState      # pseudo-gradient EF on the WAN, leaves [D, ...], P('dc')
  local_steps: jax.Array  # int32[D], local steps since the last round
  step: jax.Array     # int32[], iterations done
  key: jax.Array      # uint32[2], PRNG key for stochastic compressors
  # DGC momentum-corrected velocity u, leaves f32[D, W, ...], P('dc', 'worker');
  # () when DGC momentum is off (no leaves: other runs' checkpoints do not grow).
  dgc_velocity: Any = ()
  # Streaming DiLoCo's eager stand-in x~_d (hfl.sync.streaming), leaves f32[D, ...],
  # P('dc'); () unless sync.eager.
  eager: Any = ()
  # The round's update through the downlink (:func:`broadcast_leaves`): the PS's
  # error-feedback state of the post-round correction, a LinkState whose leaves are
  # [D, ...], P('dc') (residual None at a lossless leaf), and the reference point
  # x_ref: the model the DC's workers hold at the round's start, leaves f32[D, ...],
  # P('dc'), None at every leaf the round reaches as the gathered global model. Both
  # () when no leaf goes through the downlink (lossless downlink, or
  # init_state(..., broadcast='gather')): such runs' checkpoints do not grow.
  bcast: Any = ()
  ref: Any = ()
  # SCAFFOLD (hfl.sync.scaffold, sync.control_variates='scaffold'): the per-DC
  # control variates c_d and learning-rate sums, a scaffold.DCState whose leaves are
  # [D, ...] and [D], P('dc'); and the global control variate c, leaves f32[...],
  # replicated. Both () when off (other runs' checkpoints do not grow).
  scaffold: Any = ()
  scaffold_c: Any = ()


class Compressors(NamedTuple):
  """Per-leaf compressors (lists aligned with ``jax.tree.leaves(params)``).

  ``bcast``: the compressors of the round's correction through the downlink
  (:func:`broadcast_correction`); None: the downlink's (``down``). See :meth:`correction`.
  """
  up: Sequence[base.Compressor]
  down: Sequence[base.Compressor]
  wan: Sequence[base.Compressor]
  bcast: Sequence[base.Compressor] | None = None

  def correction(self) -> Sequence[base.Compressor]:
    """The per-leaf compressors of the round's correction: ``bcast``, else ``down``."""
    return self.down if self.bcast is None else self.bcast


class WorkerOptState(NamedTuple):
  """Each worker's own inner optimizer state (``send='update'``, :func:`worker_update`).

  ``inner`` is what ``optimizer.init`` returns for the parameters, stacked over DCs
  and workers: leaves [D, W, ...] (scalars such as step counts [D, W]), sharded
  P('dc', 'worker'). Every worker starts from the same state; they then differ,
  each fed by its own gradients.
  """
  inner: Any


# What the workers send up (``send`` of :func:`init_state`): their gradient, which the
# PS aggregates and every worker feeds to the same optimizer (the thesis's design), or
# their own optimizer's update of it (:func:`worker_update`).
SENDS = ('gradient', 'update')


class ShardedOptState(NamedTuple):
  """Inner optimizer state sharded across a DC's workers (ZeRO-1; Rajbhandari et
  al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", SC 2020).

  ``inner`` is what ``optimizer.init`` returns for one worker's slices of the
  parameters (hfl.collectives.split_tree: every leaf flattened, zero-padded to a
  multiple of W, cut into W equal chunks), stacked over DCs and workers: leaves
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


def sends_update(state_like: TrainState) -> bool:
  """Whether ``state_like`` holds each worker's own optimizer state (``send='update'``)."""
  return isinstance(state_like.opt_state, WorkerOptState)


def state_specs(state_like: TrainState) -> TrainState:
  """PartitionSpecs of every TrainState field (a prefix tree of the state)."""
  per_worker = is_sharded(state_like) or sends_update(state_like)
  return TrainState(
      params=P(DC), opt_state=P(DC, WORKER) if per_worker else P(DC),
      global_params=P(), outer_state=P(), up=P(DC, WORKER), down=P(DC), wan=P(DC),
      local_steps=P(DC), step=P(), key=P(), dgc_velocity=P(DC, WORKER), eager=P(DC),
      bcast=P(DC), ref=P(DC), scaffold=P(DC), scaffold_c=P())


def state_shardings(mesh: Mesh, state_like: TrainState) -> TrainState:
  """NamedShardings of every leaf of a TrainState (or of its eval_shape), per state_specs."""
  return jax.tree.map(
      lambda spec, sub: jax.tree.map(lambda _: NamedSharding(mesh, spec), sub),
      state_specs(state_like), state_like, is_leaf=lambda x: isinstance(x, P))


# How the round's new global model reaches a DC's workers (``compression.broadcast``).
BROADCASTS = ('downlink', 'gather')
# The round's correction of its j-th leaf draws fold_in(fold_in(dc key, 2000), j).
BROADCAST_KEY_OFFSET = 2000


def broadcast_leaves(down: Sequence[base.Compressor], broadcast: str = 'downlink') -> list:
  """Per parameter leaf, whether the round's update reaches the DC's workers through
  the downlink compressor (True) or as the re-gathered global model (False).

  'downlink' (the thesis's design): after the inter-DC exchange the DC's PS sends its
  workers the correction through the leaf's downlink compressor with its own error
  feedback (:func:`broadcast_correction`), wherever that compressor is lossy; a leaf
  with a lossless downlink (identity) gets the re-gathered global model exactly as
  with 'gather', so lossless configurations are bitwise unchanged. 'gather': every
  leaf is re-gathered (the global model in full, whatever the downlink compressor).

  Raises:
    ValueError: ``broadcast`` not one of :data:`BROADCASTS`.
  """
  if broadcast not in BROADCASTS:
    raise ValueError(f'broadcast={broadcast!r} must be one of {BROADCASTS}')
  return [broadcast == 'downlink' and not c.lossless for c in down]


def _state_broadcast(comps: Compressors, state_like) -> tuple:
  """Per leaf, whether ``state_like`` (built by :func:`init_state`) sends the round's
  update through the downlink: its lossy downlink leaves when it holds a broadcast
  link state, else none."""
  if isinstance(state_like.bcast, tuple) and state_like.bcast == ():
    return tuple(False for _ in comps.down)
  return tuple(broadcast_leaves(comps.correction(), 'downlink'))


def check_links(comps: Compressors, state_like) -> None:
  """Raises ValueError when a link's compressors are not one per parameter leaf, or a
  lossy compressor's leaf has no residual in the state (a state built by
  :func:`init_state` for other compressors), or the round's correction (``bcast``,
  :func:`broadcast_leaves`) has a lossy downlink leaf without its residual and
  reference point. Leaves are named by their path."""
  paths, treedef = jax.tree_util.tree_flatten_with_path(state_like.params)
  sent = _state_broadcast(comps, state_like) if len(comps.down) == len(paths) else ()
  links = ('up', 'down', 'wan') + (('bcast',) if any(sent) else ())
  for link in links:
    link_comps = comps.correction() if link == 'bcast' else getattr(comps, link)
    if len(link_comps) != len(paths):
      raise ValueError(f'make_step: {len(link_comps)} {link} compressors for '
                       f'{len(paths)} parameter leaves')
    residual = treedef.flatten_up_to(getattr(state_like, link).residual)
    for i, (c, r, (path, _)) in enumerate(zip(link_comps, residual, paths)):
      if r is None and not c.lossless:
        raise ValueError(
            f'make_step: the {link} link\'s leaf {i} ({jax.tree_util.keystr(path)}) has '
            f'compressor {c.name!r}, which needs an error-feedback residual, but the state '
            'holds none (it was built for a lossless compressor there); build the state '
            'with init_state(...) for the same compressors')
  if any(sent):
    ref = treedef.flatten_up_to(state_like.ref)
    for i, (b, r, (path, _)) in enumerate(zip(sent, ref, paths)):
      if b and r is None:
        raise ValueError(
            f'make_step: the round\'s correction of leaf {i} ({jax.tree_util.keystr(path)}) '
            'goes through its lossy downlink compressor but the state holds no reference '
            'point there; build the state with init_state(...) for the same compressors')


def _init_opt_state(params, optimizer: optax.GradientTransformation, d: int, w: int,
                    shard_state: bool, send: str, dgc_momentum: bool):
  """:func:`init_state`'s inner optimizer state: per DC ([D, ...]), ZeRO-1 sliced
  (:class:`ShardedOptState`) or per worker (:class:`WorkerOptState`); its Raises."""
  if send not in SENDS:
    raise ValueError(f'init_state: send={send!r} must be one of {SENDS}')
  if send == 'update' and (shard_state or dgc_momentum):
    raise ValueError("init_state: send='update' keeps a whole optimizer state on each "
                     'worker, which cannot be combined with shard_state (ZeRO-1) or '
                     "dgc_momentum (DGC's velocity would be a second momentum)")
  if shard_state:
    per_worker = jax.vmap(lambda i: optimizer.init(
        collectives.split_tree(params, w, i)))(jnp.arange(w))
    return ShardedOptState(link_lib.with_lead(per_worker, (d,)))
  if send == 'update':
    return WorkerOptState(link_lib.with_lead(optimizer.init(params), (d, w)))
  return link_lib.with_lead(optimizer.init(params), (d,))


def init_state(params, optimizer: optax.GradientTransformation,
               outer: optax.GradientTransformation, comps: Compressors,
               num_dcs: int, workers_per_dc: int, key,
               dgc_momentum: bool = False, shard_state: bool = False,
               stream: streaming.Spec | None = None,
               broadcast: str = 'downlink', scaffold: bool = False,
               send: str = 'gradient') -> TrainState:
  """Builds the initial state from one set of global parameters (all DCs start equal).

  Pure; call under ``jax.jit(..., out_shardings=...)`` to allocate it sharded.

  Args:
    params: pytree of float32 arrays, the global model (x_global, one copy).
    optimizer: the inner optax optimizer (its state is stacked per DC: [D, ...]).
    outer: the outer optax optimizer (one state, on the global model).
    comps: per-leaf compressors; their link states are stacked per DC and worker
      (uplink: [D, W, ...]) or per DC (PS downlink, WAN: [D, ...]).
    num_dcs: D; workers_per_dc: W.
    key: uint32[2] PRNG key of the run (stochastic compressors fold in the step).
    dgc_momentum: allocate the per-worker DGC velocity (zeros, leaves
      f32[D, W, ...]); otherwise ``dgc_velocity`` is ().
    shard_state: shard the inner optimizer state across each DC's workers
      (:class:`ShardedOptState`, ZeRO-1); ``optimizer`` must be elementwise.
    stream: Streaming DiLoCo (hfl.sync.streaming.Spec): ``outer_state`` is then a
      tuple of per-fragment outer states, and with ``eager`` ``eager`` holds the
      per-DC stand-ins (leaves f32[D, ...]).
    broadcast: how the round's update reaches the workers (:func:`broadcast_leaves`,
      :data:`BROADCASTS`). Where a leaf goes through its lossy downlink compressor,
      ``bcast`` holds the correction's link state (zero residual, fresh compressor
      state, leaves [D, ...]) and ``ref`` the workers' model (x_global at the start);
      both are () when no leaf does.
    scaffold: allocate SCAFFOLD's control variates (hfl.sync.scaffold.init: zeros,
      ``scaffold`` leaves f32[D, ...] and lr_sum f32[D], ``scaffold_c`` f32[...]);
      otherwise both are ().
    send: what the workers send up (:data:`SENDS`): 'gradient', or 'update', each
      worker's own optimizer update (``opt_state`` is then a :class:`WorkerOptState`,
      leaves [D, W, ...]; :func:`worker_update`).

  Raises:
    ValueError: an unknown ``broadcast`` or ``send``; Streaming DiLoCo (``stream``)
      with a lossy downlink leaf and broadcast='downlink' (a fragment's merge adopts
      the global fragment as it is: use broadcast='gather'); send='update' with
      ``shard_state`` or ``dgc_momentum`` (each worker's whole state is its own; DGC's
      velocity would be a second momentum).
  """
  d, w = num_dcs, workers_per_dc
  sent = broadcast_leaves(comps.correction(), broadcast)
  if any(sent) and stream is not None:
    raise ValueError(
        "init_state: broadcast='downlink' with a lossy downlink compressor cannot be "
        "combined with Streaming DiLoCo (fragments merge the global model as it is); "
        "use broadcast='gather'")
  opt_state = _init_opt_state(params, optimizer, d, w, shard_state, send, dgc_momentum)
  state = TrainState(
      params=link_lib.with_lead(params, (d,)), opt_state=opt_state, global_params=params,
      outer_state=outer.init(params), up=link_lib.init_link(comps.up, params, (d, w)),
      down=link_lib.init_link(comps.down, params, (d,)), wan=link_lib.init_link(comps.wan, params, (d,)),
      local_steps=jnp.zeros((d,), jnp.int32), step=jnp.zeros((), jnp.int32), key=key,
      dgc_velocity=link_lib.with_lead(jax.tree.map(jnp.zeros_like, params), (d, w)) if dgc_momentum
      else (),
      eager=link_lib.with_lead(params, (d,)) if stream is not None and stream.eager else ())
  if any(sent):
    leaves, treedef = jax.tree.flatten(params)
    state = state._replace(
        bcast=link_lib.init_link(comps.correction(), params, (d,)),
        ref=link_lib.with_lead(treedef.unflatten([x if b else None for b, x in zip(sent, leaves)]), (d,)))
  if stream is not None:
    state = state._replace(outer_state=streaming.init_outer(outer, params, stream.fragments))
  if scaffold:
    per_dc, c = scaffold_lib.init(params, d)
    state = state._replace(scaffold=per_dc, scaffold_c=c)
  return state


# --------------------------------------------------------------------------------
# The step: an intra-DC iteration, optionally wrapped by an inter-DC round.
# --------------------------------------------------------------------------------

class Setup(NamedTuple):
  """What the step's pure functions need besides the state (static, trace time)."""
  loss_fn: Callable   # (params, images, labels) -> f32[] mean loss of one worker's batch
  optimizer: optax.GradientTransformation  # inner optimizer, on the workers
  outer: optax.GradientTransformation      # outer optimizer, on the pseudo-gradient
  comps: Compressors
  num_dcs: int        # D
  num_workers: int    # W
  shard: bool         # ZeRO-1 sharded optimizer state
  dgc: dgc.Options    # DGC momentum correction / local clipping
  prox_mu: float = 0.0  # FedProx proximal coefficient mu (0: off), local_gradient
  stream: Any = None  # hfl.sync.streaming.Spec (Streaming DiLoCo), or None
  # per leaf, the round's update goes through the downlink (broadcast_leaves); () none
  bcast: tuple = ()
  scaffold: Any = None  # hfl.sync.scaffold.Spec (SCAFFOLD control variates), or None
  # The round's weights argument is f32[2, D]: aggregation weights and each DC's
  # adoption of the new global model (partial strategies, :func:`adopt_global`).
  adoption: bool = False
  # send='update': each worker runs the optimizer and sends its update (worker_update)
  send_update: bool = False


class Keys(NamedTuple):
  """PRNG keys of one iteration on one device (uint32[2] each)."""
  dc: jax.Array      # fold_in(fold_in(key, step), dc): the PS downlink and the WAN
  worker: jax.Array  # fold_in(dc, D + worker): the worker's uplink


def step_keys(key, step, num_dcs: int) -> Keys:
  """This device's :class:`Keys` for iteration ``step`` (inside shard_map)."""
  dc_key = jax.random.fold_in(jax.random.fold_in(key, step), jax.lax.axis_index(DC))
  return Keys(dc_key, jax.random.fold_in(dc_key, num_dcs + jax.lax.axis_index(WORKER)))


def _keep(active, new, old):
  """``new`` where this DC is active, else ``old`` (semi-synchronous masking)."""
  return jax.tree.map(lambda a, b: jnp.where(active, a, b), new, old)


def _scatters(setup: Setup) -> list:
  """Per leaf, whether the uplink is a ZeRO-1 reduce-scatter."""
  return [setup.shard and reduce_scatters(cu, cd)
          for cu, cd in zip(setup.comps.up, setup.comps.down)]


def local_gradient(setup: Setup, params, images, labels, global_params=None,
                   correction=None):
  """(loss f32[], gradient pytree like params) of this worker, DGC-clipped if asked.

  ``params`` are the DC's (invariant over 'worker'); they are cast to
  'worker'-varying first, so that the gradient is this worker's alone.

  FedProx (Li et al., "Federated Optimization in Heterogeneous Networks", MLSys
  2020, eq. 2): with ``setup.prox_mu`` = mu > 0 each local objective gets the
  proximal term (mu / 2) ||x_d - x_global||^2, whose gradient mu (x_d - x_global)
  is added to the worker's gradient (after clipping; the reported loss is the data
  loss alone). ``global_params`` is the round's starting global model.

  SCAFFOLD (Karimireddy et al., ICML 2020, Algorithm 1's client update): ``correction``
  = c - c_d (hfl.sync.scaffold.correction, a pytree like the parameters, f32) is
  added last, g <- g - c_d + c; None: off.
  """
  p_var = collectives.pvary(params, WORKER)
  loss, grads = jax.value_and_grad(setup.loss_fn)(p_var, images, labels)
  if float(setup.dgc.clip_norm) > 0:
    grads = dgc.clip_local(grads, float(setup.dgc.clip_norm), setup.num_workers)
  if float(setup.prox_mu) > 0:
    mu = float(setup.prox_mu)
    grads = jax.tree.map(lambda g, x, x0: g + mu * (x - x0), grads, params, global_params)
  if correction is not None:
    grads = jax.tree.map(lambda g, c: g + c.astype(g.dtype), grads, correction)
  return loss, grads


def uplink(setup: Setup, grads, link: link_lib.LinkState, velocity, key):
  """The worker -> PS exchange over 'worker' (with DGC momentum correction).

  Returns:
    (:class:`hfl.links.Exchanged`, new DGC velocity: masked where a sparse payload sent
    coordinates, Lin et al. 2018 Sec. 3.2; () without DGC momentum).
  """
  momentum = float(setup.dgc.momentum)
  if momentum > 0:
    # u <- m u + g is sent through the EF (the residual is DGC's v).
    # The sent u depends on u and g alone, not on v (the link's residual, None at a
    # lossless leaf).
    grads = jax.tree.map(lambda u, g: dgc.accumulate(
        dgc.DGCState(u=u, v=jnp.zeros_like(u)), g, momentum).u, velocity, grads)
  up = link_lib.exchange(setup.comps.up, grads, link, key, WORKER, setup.num_workers,
                scatter=_scatters(setup))
  if momentum > 0:
    leaves, treedef = jax.tree.flatten(grads)
    velocity = treedef.unflatten([dgc.mask_velocity(c, p, u) for c, p, u in
                                  zip(setup.comps.up, up.payloads, leaves)])
  return up, velocity


def ps_downlink(setup: Setup, agg, link: link_lib.LinkState, key):
  """The PS's downlink of the uplink aggregate ``agg``; what this worker keeps of it.

  Returns:
    (:class:`hfl.links.Exchanged`, this worker's downlink gradient — a pytree like the
    parameters, or with ZeRO-1 of slices [ceil(size / W)] —, per-leaf bits charged).
    With ZeRO-1 a dense (linear) payload reaches each worker as its slice; any
    other payload whole, and each worker decodes it and keeps its slice.
  """
  w, wk = setup.num_workers, jax.lax.axis_index(WORKER)
  # A reduce-scattered leaf's aggregate is this worker's own slice: checked whole.
  down = link_lib.downlink(setup.comps.down, agg, link, key,
                  [None if sc else (wk, w) for sc in _scatters(setup)])
  grads, bits = [], []
  for c, g, b, p, scattered in zip(setup.comps.down, jax.tree.leaves(down.agg), down.bits,
                                   down.payloads, _scatters(setup)):
    if not setup.shard or scattered:  # scattered: the payload is this worker's slice
      grads.append(g)
      bits.append(b)
    else:
      grads.append(collectives.split(g, w, wk))
      bits.append(chunk_bits(p, w) if c.linear else b)
  return down, jax.tree.structure(agg).unflatten(grads), bits


def apply_inner(setup: Setup, params, opt_state, grads, lr_scale=None):
  """The inner optax update, the same on every worker of the DC.

  ``lr_scale`` (f32[], this DC's, None: 1) multiplies the optimizer's update, i.e.
  the DC's learning rate (per-DC learning-rate scaling, ``sync.lr_scaling``;
  multiplying by 1.0 changes nothing).

  With ZeRO-1 each worker updates its slice of the parameters with its slice of
  the state and an all-gather over 'worker' rebuilds them: each worker pushes its
  slice to the PS (intra_up) and receives the other W - 1 (intra_down).

  Returns:
    (new params, new opt_state, bits of one worker's parameter slice moved by the
    ZeRO-1 all-gather: Python int, 0 without ZeRO-1 or with W = 1).
  """
  scale = _lr_scale(lr_scale)
  if not setup.shard:
    updates, new_opt = setup.optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, scale(updates)), new_opt, 0
  w = setup.num_workers
  p_slices = collectives.split_tree(params, w, jax.lax.axis_index(WORKER))
  updates, new_opt = setup.optimizer.update(grads, opt_state.inner, p_slices)
  updates = scale(updates)
  new_params = collectives.all_gather_unsplit(optax.apply_updates(p_slices, updates),
                                              params, WORKER)
  return new_params, ShardedOptState(new_opt), chunk_bits(params, w) if w > 1 else 0


def worker_update(setup: Setup, params, opt_state: WorkerOptState, grads, lr_scale=None):
  """``send='update'``: this worker's optimizer update of its own gradient, what its
  uplink then sends instead of the gradient.

  Each worker keeps its own inner optimizer state (:class:`WorkerOptState`) and
  feeds it only its own gradients, so an adaptive optimizer's moments see every
  iteration's dense gradient; the links' error feedback then acts on the update
  u_w = optimizer(g_w), the PS averages the decoded updates, and every worker adds
  the downlink's decoded mean to the DC model (:func:`_inner_step`). For plain SGD
  this is the thesis's pipeline up to where the learning rate multiplies; for Adam
  it moves the compression after the optimizer, the remedy that error feedback
  with a per-coordinate normaliser needs (1-bit Adam compresses after its momentum
  for the same reason: Tang et al., ICML 2021, sec. 3; DGC's momentum correction,
  Lin et al., ICLR 2018, sec. 3.2, does it for SGD with momentum).

  Args:
    params: the DC's parameters (invariant over 'worker'), for weight decay.
    opt_state: this worker's :class:`WorkerOptState` (leading axes removed).
    grads: this worker's gradient, a pytree like ``params`` (f32).
    lr_scale: f32[], this DC's learning-rate multiplier (None: 1).

  Returns:
    (the update, a pytree like ``params``, f32; the new :class:`WorkerOptState`).
  """
  updates, new = setup.optimizer.update(grads, opt_state.inner, params)
  return _lr_scale(lr_scale)(updates), WorkerOptState(new)


def _lr_scale(lr_scale) -> Callable:
  """updates -> updates x ``lr_scale`` (f32[]; None: unchanged)."""
  if lr_scale is None:
    return lambda u: u
  return lambda u: jax.tree.map(lambda x: x * lr_scale.astype(x.dtype), u)


def _inner_step(setup: Setup, state: TrainState, grads, active, lr_scale, lead_params,
                worker_opt=None):
  """:func:`apply_inner` with the semi-synchronous mask: (params, opt_state, gather
  bits), params and opt_state those of ``state`` where this DC is not ``active``.

  ``worker_opt``: with ``send='update'``, this worker's new :class:`WorkerOptState`
  (:func:`worker_update`); ``grads`` is then the downlink's mean update, added as it is.

  ``lead_params``: None, or this DC's parameters as the program received them, with
  their leading mesh axis ([1, ...]); then (without ZeRO-1) the masked update
  x <- where(active, x + u, x) is written in that shape and the local view taken
  after it, which lets XLA update the donated parameter buffers in place instead of
  copying every updated leaf into them. The same values either way.
  """
  keep = lambda new, old: _keep(active, new, old)
  if worker_opt is not None:
    updates, opt_state = grads, worker_opt
    if lead_params is None:
      return (keep(optax.apply_updates(state.params, updates), state.params),
              keep(opt_state, state.opt_state), 0)
  elif lead_params is None or setup.shard:
    params, opt_state, gather = apply_inner(setup, state.params, state.opt_state, grads,
                                            lr_scale)
    return keep(params, state.params), keep(opt_state, state.opt_state), gather
  else:
    updates, opt_state = setup.optimizer.update(grads, state.opt_state, state.params)
    updates = _lr_scale(lr_scale)(updates)
  params = jax.tree.map(lambda x, u: jnp.where(active, optax.apply_updates(x, u[None]), x)[0],
                        lead_params, updates)
  return params, keep(opt_state, state.opt_state), 0


class IterationCharge(NamedTuple):
  """Accounting of one intra-DC iteration on one device."""
  up: link_lib.LinkCharge
  down: link_lib.LinkCharge


def intra_dc_iteration(setup: Setup, state: TrainState, images, labels, active, keys: Keys,
                       lr_scale=None, lead_params=None):
  """One intra-DC iteration on one device (inside shard_map; per-device view).

  gradient -> uplink over 'worker' -> PS downlink -> inner optimizer (with
  ``send='update'``: gradient -> the worker's optimizer -> uplink -> PS downlink -> add).

  Args:
    setup: :class:`Setup`.
    state: this device's TrainState with the leading mesh axes removed
      (:func:`make_step`'s ``to_local``).
    images: f32[B, ...], this worker's batch; labels: int32[B] (or [B, T]).
    active: bool[], whether this DC runs this iteration; an inactive DC keeps
      its parameters, optimizer state, link states and velocity.
    keys: :func:`step_keys`.
    lr_scale: f32[], this DC's learning-rate multiplier (None: 1).
    lead_params: None, or ``state.params`` with the leading mesh axis the program
      received them with, leaves [1, ...] (:func:`_inner_step`: updated in place).

  Returns:
    (new state — step + 1, local_steps + active —, loss f32[], IterationCharge).
    With SCAFFOLD (``setup.scaffold``) the gradient is corrected by c - c_d and an
    active DC's ``scaffold.lr_sum`` grows by this update's η (hfl.sync.scaffold).
  """
  # FedProx's anchor is the model the workers started the round from (x_ref).
  anchor = round_reference(setup, state) if float(setup.prox_mu) > 0 else state.global_params
  sc = setup.scaffold
  corr = None if sc is None else scaffold_lib.correction(state.scaffold.c, state.scaffold_c)
  loss, grads = local_gradient(setup, state.params, images, labels, anchor, corr)
  worker_opt = None
  if setup.send_update:  # the worker's own optimizer update goes up, not its gradient
    grads, worker_opt = worker_update(setup, state.params, state.opt_state, grads, lr_scale)
  up, velocity = uplink(setup, grads, state.up, state.dgc_velocity, keys.worker)
  down, down_grads, down_bits = ps_downlink(setup, up.agg, state.down, keys.dc)
  params, opt_state, gather = _inner_step(setup, state, down_grads, active, lr_scale,
                                          lead_params, worker_opt)
  keep = lambda new, old: _keep(active, new, old)
  new = state._replace(
      params=params, opt_state=opt_state,
      up=keep(up.link, state.up), down=keep(down.link, state.down),
      dgc_velocity=keep(velocity, state.dgc_velocity),
      local_steps=state.local_steps + active.astype(jnp.int32), step=state.step + 1)
  if sc is not None:  # Σ_k η_{d,k} of this DC's local steps (hfl.sync.scaffold)
    cv = state.scaffold
    eta = scaffold_lib.step_lr(sc.learning_rate, cv.count, lr_scale, sc.gain)
    new = new._replace(scaffold=keep(cv._replace(lr_sum=cv.lr_sum + eta,
                                                 count=cv.count + 1), cv))
  charge = IterationCharge(link_lib.link_charge(up.bits, up.checks, gather),
                           link_lib.link_charge(down_bits, down.checks, (setup.num_workers - 1) * gather))
  return new, loss, charge


class RoundCharge(NamedTuple):
  """Accounting of one inter-DC round on one device."""
  wan: link_lib.LinkCharge  # static: all WAN bits of the DC's payload (wan_sum + wan_gather)
  wan_sum: int     # static bits of the all-reduced WAN leaves
  wan_gather: int  # static bits of the all-gathered WAN leaves
  # f32[2], this worker's share (hfl.collectives.share) of this DC's
  # ||x_d - x_ref||_2^2 before the round (the pseudo-gradient's squared norm; x_ref =
  # x_global unless the update goes through the downlink) and ||x_d - x_global'||_2^2
  # after it (x_global' the new global model); the host sums the W shares
  # (host_metrics).
  drift: Any = None
  # The round's update reaching the DC's workers (:func:`broadcast_leaves`): the
  # correction's payload through the downlink (static: one payload's bits, which
  # each of the W workers receives; dynamic and flags per leaf, 0 at a re-gathered
  # leaf), and the re-gathered leaves' WAN payload bits, all-reduced / all-gathered
  # (static; the dynamic ones are the WAN's at the leaves of ``regathered``).
  bcast: link_lib.LinkCharge | None = None
  regather_sum: int = 0
  regather_gather: int = 0
  regathered: tuple = ()  # per leaf, re-gathered (True) or through the downlink


def inter_dc_round(setup: Setup, state: TrainState, weights, key):
  """One inter-DC round on one device, after an iteration (inside shard_map).

  pseudo-gradient Δ_d = x_global - x_d -> WAN exchange over 'dc' (fused over the
  leaves, split over 'worker') -> outer optimizer (hfl.sync.outer.apply_outer).

  Args:
    setup: :class:`Setup`.
    state: this device's TrainState (per-device view) after the iteration.
    weights: f32[D], per-DC aggregation weights (FedAvg / FedNova scale; 0 for an
      absent DC, whose WAN link state is then kept).
    key: this device's ``Keys.dc``; WAN leaf i uses fold_in(key, 1000 + i).

  Returns:
    (new state: params = global_params = the new global model, local_steps 0;
    RoundCharge). With SCAFFOLD (``setup.scaffold``, :func:`scaffold_round`) the
    control variates are updated and their deltas' float32 bits are added to the
    WAN charge (static, all-reduced) and to the re-gather over 'worker'; their
    finiteness flags are OR'ed into the WAN's.
  """
  weights, adopt = split_weights(setup, weights)
  present = weights[jax.lax.axis_index(DC)] > 0
  start = round_reference(setup, state)
  pseudo = jax.tree.map(lambda x0, x: x0 - x, start, state.params)
  wan = link_lib.exchange(setup.comps.wan, pseudo, state.wan, key, DC, setup.num_dcs, weights=weights,
                 split_axis=WORKER, split_size=setup.num_workers,
                 key_offset=WAN_KEY_OFFSET, fuse=True)
  global_params, outer_state = outer_lib.apply_outer(setup.outer, state.global_params,
                                                     wan.agg, state.outer_state)
  part = (jax.lax.axis_index(WORKER), setup.num_workers)
  drift = jnp.stack([squared_distance(state.params, start, part),
                     squared_distance(state.params, global_params, part)])
  new = state._replace(params=global_params, global_params=global_params,
                       outer_state=outer_state, wan=_keep(present, wan.link, state.wan),
                       local_steps=jnp.zeros_like(state.local_steps))
  new, bcast = broadcast_correction(setup, new, state.params, state.global_params, pseudo, key)
  if adopt is not None:
    new = adopt_global(new, state, adopt[jax.lax.axis_index(DC)])
  sent = setup.bcast or (False,) * len(setup.comps.wan)
  static = [(int(b), reduces(c)) for c, b in zip(setup.comps.wan, wan.bits) if link_lib.is_static(b)]
  again = [(int(b), reduces(c)) for c, b, s in zip(setup.comps.wan, wan.bits, sent)
           if link_lib.is_static(b) and not s]
  checks, extra = wan.checks, 0  # SCAFFOLD's c_d deltas: a second, float32 WAN payload
  if setup.scaffold is not None:  # a leaf's two checks: its flag is their OR
    new, extra, cv_checks = scaffold_round(setup, new, state, pseudo, present, key)
    checks = [(c, g) for c, g in zip(checks, cv_checks)]
  return new, RoundCharge(link_lib.link_charge(wan.bits, checks, extra),
                          sum(b for b, r in static if r) + extra,
                          sum(b for b, r in static if not r), drift, bcast,
                          sum(b for b, r in again if r) + extra,
                          sum(b for b, r in again if not r), tuple(not s for s in sent))


SCAFFOLD_KEY_OFFSET = 3000  # the c_d deltas' leaf i draws fold_in(dc key, 3000 + i)


def split_weights(setup: Setup, weights):
  """(f32[D] aggregation weights, f32[D] adoption or None) of a round's ``weights``
  argument: f32[2, D] with ``setup.adoption``, else the weights alone."""
  if setup.adoption:
    return weights[0], weights[1]
  return weights, None


def adopt_global(new: TrainState, state: TrainState, a) -> TrainState:
  """A DC's model after a round in which it adopts the fraction ``a`` (f32[], in
  [0, 1]) of the new global model (hfl.sync.strategies: ``RoundPlan.adopt``):
  x_d <- a x_global' + (1 - a) x_d, x_global' itself at a = 1 and the DC's own model
  at a = 0. A DC that adopts nothing keeps counting its local steps.

  Args:
    new: the state after the outer step (``params`` = x_global').
    state: the state before the round (``params`` = x_d).
    a: this DC's adoption.
  """
  mix = lambda g, x: jnp.where(a == 1, g, a * g + (1 - a) * x)
  return new._replace(params=jax.tree.map(mix, new.params, state.params),
                      local_steps=jnp.where(a == 1, new.local_steps, state.local_steps))


def scaffold_round(setup: Setup, new: TrainState, state: TrainState, pseudo, present, key):
  """SCAFFOLD's end of a round on one device (hfl.sync.scaffold; Karimireddy et al.,
  ICML 2020, Algorithm 1: option II, the communication and the server update).

  c_d+ = c_d - c + Δ_d / Σ_k η_{d,k} (c_d kept by an absent DC); the deltas
  c_d+ - c_d cross the WAN as an uncompressed float32 payload (identity
  compressors: an all-reduce over 'dc' of 1/W slices per worker, weighted by the
  data weights p_d, then re-gathered over 'worker', as an identity WAN leaf of
  :func:`inter_dc_round`); c <- c + Σ_d p_d (c_d+ - c_d); every lr_sum restarts at 0.

  Args:
    setup: :class:`Setup` with ``scaffold`` set; new: the state after the outer step
      (its scaffold fields are replaced); state: the state before the round (c_d, c,
      lr_sum); pseudo: Δ_d = x_ref - x_d (pytree like the parameters, f32);
    present: bool[], this DC takes part; key: ``Keys.dc``.

  Returns:
    (state, static bits of one DC's deltas (Python int: 32 per parameter), per-leaf
    finiteness checks of the deltas).
  """
  cv, c = state.scaffold, state.scaffold_c
  c_plus = _keep(present, scaffold_lib.update(cv.c, c, pseudo, cv.lr_sum), cv.c)
  delta = jax.tree.map(lambda a, b: a - b, c_plus, cv.c)
  leaves, treedef = jax.tree.flatten(delta)
  comps = [base.identity(x.shape) for x in leaves]
  link = link_lib.LinkState(treedef.unflatten([None] * len(leaves)), [k.init() for k in comps])
  ex = link_lib.exchange(comps, delta, link, key, DC, setup.num_dcs,
                weights=jnp.asarray(setup.scaffold.weights, jnp.float32),
                split_axis=WORKER, split_size=setup.num_workers,
                key_offset=SCAFFOLD_KEY_OFFSET, fuse=True)
  new = new._replace(scaffold=cv._replace(c=c_plus, lr_sum=jnp.zeros_like(cv.lr_sum)),
                     scaffold_c=jax.tree.map(lambda a, b: a + b, c, ex.agg))
  return new, sum(int(b) for b in ex.bits), ex.checks


def round_reference(setup: Setup, state: TrainState):
  """x_ref, the model the DC's workers started the round from (per-device view): the
  state's reference point at the leaves whose round update goes through the
  downlink (:func:`broadcast_leaves`), x_global at the others. The round's
  pseudo-gradient is Δ_d = x_ref - x_d, the DC's own progress: what the workers
  have not yet received of x_global (still in the PS's residual) is neither lost
  nor counted as the DC's."""
  if not any(setup.bcast):
    return state.global_params
  g, treedef = jax.tree.flatten(state.global_params)
  ref = treedef.flatten_up_to(state.ref)
  return treedef.unflatten([r if b else x for b, r, x in zip(setup.bcast, ref, g)])


def broadcast_correction(setup: Setup, state: TrainState, params, global_params, pseudo,
                         key):
  """The round's update reaching the DC's workers through the downlink (per device).

  At a leaf of :func:`broadcast_leaves` the DC's PS sends the correction

      c = (x_global' - x_global) + Δ_d = x_global' - (x_global - Δ_d),

  what the workers must add to the model they hold (x_ref - Δ_d) to reach
  x_global' had they started the round from x_global, through the leaf's downlink
  compressor with its own error feedback (:func:`hfl.links.downlink`, hfl.compress.ef):
  p = c + γ e, payload = C_down(p), e <- p - D(payload); every worker adds
  x_d <- x_d + D(payload), which becomes the next round's reference point x_ref.
  With γ = 1 the workers' model is then x_global' - e exactly up to float32
  rounding (e: what the residual still holds), and Σ_rounds c = Σ D(payload) + e.
  The PS runs replicated on the DC's workers (SPMD), so no collective carries the
  payload; each worker decodes the same one, and checks its share of the
  finiteness flags. An absent DC (weight 0) gets its correction too: its own
  progress Δ_d, which the round discarded, is undone by it. Every other leaf takes
  x_global' as it is (the re-gather over 'worker' of :func:`inter_dc_round`).

  Args:
    setup: :class:`Setup`; state: the TrainState after the outer step, whose
      ``params`` and ``global_params`` are x_global'; params: x_d before the round;
      global_params: x_global before it; pseudo: Δ_d (pytree like the parameters,
      f32); key: ``Keys.dc`` (the correction's j-th leaf draws
      fold_in(fold_in(key, BROADCAST_KEY_OFFSET), j)).

  Returns:
    (state with ``params``, ``ref`` and ``bcast`` of the correction's leaves set,
    LinkCharge of one payload: static bits, dynamic bits and flags per leaf, 0 at the
    re-gathered leaves).
  """
  n = len(setup.comps.down)
  if not any(setup.bcast):
    return state, link_lib.no_charge(n)
  idx = [i for i, b in enumerate(setup.bcast) if b]
  leaves = lambda tree: jax.tree.leaves(tree)
  new_g, treedef = jax.tree.flatten(state.global_params)
  old_g, x, delta = leaves(global_params), leaves(params), leaves(pseudo)
  res = treedef.flatten_up_to(state.bcast.residual)
  cstates = list(state.bcast.compressor_state)
  corr = [(new_g[i] - old_g[i]) + delta[i] for i in idx]
  wk = jax.lax.axis_index(WORKER)
  out = link_lib.downlink([setup.comps.correction()[i] for i in idx], corr,
                 link_lib.LinkState([res[i] for i in idx], [cstates[i] for i in idx]),
                 jax.random.fold_in(key, BROADCAST_KEY_OFFSET),
                 [(wk, setup.num_workers)] * len(idx))
  new_x, new_ref = list(new_g), treedef.flatten_up_to(state.ref)
  bits, checks = [0] * n, [None] * n
  for j, i in enumerate(idx):
    new_x[i] = x[i] + out.agg[j]
    new_ref[i] = new_x[i]
    res[i], cstates[i] = out.link.residual[j], out.link.compressor_state[j]
    bits[i], checks[i] = out.bits[j], out.checks[j]
  state = state._replace(params=treedef.unflatten(new_x), ref=treedef.unflatten(new_ref),
                         bcast=link_lib.LinkState(treedef.unflatten(res), cstates))
  return state, link_lib.link_charge(bits, checks)


def squared_distance(a, b, part=None) -> jax.Array:
  """f32[]: ||a - b||_2^2 over every leaf of two like pytrees (summed in float32).
  Local to the device: no collective.

  ``part`` = (index int32[], parts): only this member's share of every leaf
  (hfl.collectives.share); the shares of the ``parts`` members add up to the whole.
  """
  flat = []
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    d = x.astype(jnp.float32) - y.astype(jnp.float32)
    if part is not None:
      d, ok = collectives.share(d, part[1], part[0])
      d = jnp.where(ok, d, 0)
    flat.append(d.reshape(-1))
  if not flat:
    return jnp.float32(0)
  d = link_lib.fused_concat(flat)
  # A dot, not jnp.sum(d * d): jaxlib 0.10's XLA:CPU sends such reductions to
  # YNNPACK, where this one (independent of the rest of the step) stalled the CO3
  # round step for ~0.9 s (docs/benchmarks.md, "YNNPACK reduce fusions").
  return jnp.dot(d, d)


def _fragment_exchange(setup: Setup, state: TrainState, weights, key, frag):
  """Fragment ``frag``'s pseudo-gradient Δ = x_global - x_d over the WAN, as the
  whole model's in :func:`inter_dc_round` (leaf j of the fragment draws
  fold_in(key, 1000 + j)). Returns (x_global leaves, Δ leaves, Exchanged)."""
  x0 = streaming.select(state.global_params, frag)
  pseudo = [a - b for a, b in zip(x0, streaming.select(state.params, frag))]
  link = link_lib.LinkState(streaming.select(state.wan.residual, frag),
                   [state.wan.compressor_state[i] for i in frag])
  wan = link_lib.exchange([setup.comps.wan[i] for i in frag], pseudo, link, key, DC, setup.num_dcs,
                 weights=weights, split_axis=WORKER, split_size=setup.num_workers,
                 key_offset=WAN_KEY_OFFSET, fuse=True)
  return x0, pseudo, wan


def merge_fragment(spec: streaming.Spec, state: TrainState, frag) -> Any:
  """The DC models after fragment ``frag``'s merge (hfl.sync.streaming):
  x <- α x + (1 - α) x_global (α = 0: x_global itself), or with ``eager``
  x <- x + (x_global - x~) (the stand-in replaced by the global update)."""
  x = streaming.select(state.params, frag)
  g = streaming.select(state.global_params, frag)
  if spec.eager:
    new = [xi + (gi - ei) for xi, gi, ei in zip(x, g, streaming.select(state.eager, frag))]
  elif spec.alpha == 0:
    new = g
  else:
    a = jnp.float32(spec.alpha)
    new = [a * xi + (1 - a) * gi for xi, gi in zip(x, g)]
  return streaming.replace(state.params, frag, new)


def stream_event(setup: Setup, state: TrainState, weights, key, event: streaming.Event):
  """Streaming DiLoCo's end of an iteration on one device (inside shard_map).

  Sync (``event.sync`` = p >= 0): fragment p's pseudo-gradient crosses the WAN
  (its own residuals and compressor states), fragment p's outer optimizer state
  steps its global copy; the DC models keep training on their own fragment
  (with ``eager``: from the stand-in x~ = outer(x_global, Δ_d), kept in
  ``state.eager``). Merge (``event.merge`` = q >= 0, after the sync when both):
  :func:`merge_fragment`. Douillard et al. 2025, arXiv:2501.18512, Sec. 2;
  eager: Kale et al. 2025, arXiv:2502.12996.

  Args:
    setup: :class:`Setup` with ``stream`` set; state: per-device TrainState whose
      ``outer_state`` is a tuple of per-fragment states
      (hfl.sync.streaming.init_outer); weights: f32[D]; key: ``Keys.dc``.

  Returns:
    (new state, RoundCharge of the fragment's WAN payload; no bits without a sync).
  """
  spec, n = setup.stream, len(setup.comps.wan)
  bits, checks = [0] * n, [None] * n
  if event.sync >= 0:
    p, frag = event.sync, spec.fragments[event.sync]
    x0, pseudo, wan = _fragment_exchange(setup, state, weights, key, frag)
    outer_old = state.outer_state[p]
    g_new, outer_p = outer_lib.apply_outer(setup.outer, x0, wan.agg, outer_old)
    cstates = list(state.wan.compressor_state)
    for j, i in enumerate(frag):
      cstates[i], bits[i], checks[i] = wan.link.compressor_state[j], wan.bits[j], wan.checks[j]
    link = link_lib.LinkState(streaming.replace(state.wan.residual, frag, wan.link.residual), cstates)
    present = weights[jax.lax.axis_index(DC)] > 0
    state = state._replace(
        global_params=streaming.replace(state.global_params, frag, g_new),
        outer_state=tuple(outer_p if q == p else o for q, o in enumerate(state.outer_state)),
        wan=_keep(present, link, state.wan), local_steps=jnp.zeros_like(state.local_steps))
    if spec.eager:
      stand_in, _ = outer_lib.apply_outer(setup.outer, x0, pseudo, outer_old)
      state = state._replace(params=streaming.replace(state.params, frag, stand_in),
                             eager=streaming.replace(state.eager, frag, stand_in))
  if event.merge >= 0:
    state = state._replace(params=merge_fragment(spec, state, spec.fragments[event.merge]))
  static = [(int(b), reduces(c)) for c, b in zip(setup.comps.wan, bits) if link_lib.is_static(b)]
  wan_sum, wan_gather = sum(b for b, r in static if r), sum(b for b, r in static if not r)
  # Every fragment leaf is re-gathered (Streaming DiLoCo refuses the downlink path).
  return state, RoundCharge(link_lib.link_charge(bits, checks), wan_sum, wan_gather, None,
                            link_lib.no_charge(n), wan_sum, wan_gather, (True,) * n)


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
  # The round's update reaching a DC's workers (RoundCharge): static bits of the
  # correction's payload through the downlink (one worker receives it), and of the
  # re-gathered leaves' WAN payloads (all-reduced / all-gathered); per leaf, whether
  # it is re-gathered (() without a round: every leaf).
  bcast: int = 0
  regather_sum: int = 0
  regather_gather: int = 0
  regathered: tuple = ()
  # :func:`hfl.links.flag_layout` of the program's checks: ((link, leaf, mask), ...) per bit of
  # the metrics' flag words.
  flag_bits: tuple = ()


def metrics_size(num_leaves: int) -> int:
  """Entries of one device's packed metrics vector (see :func:`make_step`)."""
  return 1 + link_lib.NUM_LINKS * num_leaves + link_lib.flag_words(num_leaves) + NUM_DRIFT


NUM_DRIFT = 2  # RoundCharge.drift entries


def pack_metrics(loss, links: Sequence[link_lib.LinkCharge], drift=None) -> jax.Array:
  """int32[metrics_size(L)]: [loss (float32 bits), dynamic bits per leaf of each
  link in order, the :func:`hfl.links.fused_flags` words of every link's checks (uint32 bits,
  :func:`hfl.links.flag_layout`), the round's :attr:`RoundCharge.drift` (float32 bits; zeros
  without a round)]."""
  drift = jnp.zeros((NUM_DRIFT,), jnp.float32) if drift is None else drift
  as_int = lambda x: jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.int32)
  words = jax.lax.bitcast_convert_type(
      link_lib.fused_flags(links, link_lib.flag_words(len(links[0].dynamic))), jnp.int32)
  return jnp.concatenate([jnp.stack([as_int(loss)] + [b for link in links for b in link.dynamic]),
                          words, jax.lax.bitcast_convert_type(drift, jnp.int32)])


def _lead_map(fn, state, specs):
  """``fn(leaf, len(spec))`` on every leaf, with the leaf's field PartitionSpec."""
  return jax.tree.map(lambda spec, sub: jax.tree.map(lambda x: fn(x, len(spec)), sub),
                      specs, state, is_leaf=lambda x: isinstance(x, P))


def to_local(state: TrainState, specs: TrainState) -> TrainState:
  """Inside shard_map: drops each field's leading mesh axes (one entry each)."""
  return _lead_map(lambda x, n: x[(0,) * n], state, specs)


def from_local(state: TrainState, specs: TrainState) -> TrainState:
  """Inverse of :func:`to_local`."""
  return _lead_map(lambda x, n: x[(None,) * n], state, specs)


def _check_options(state_like: TrainState, opts: dgc.Options) -> None:
  """Raises ValueError when DGC momentum and the state's layout disagree."""
  momentum = float(opts.momentum)
  use_velocity = momentum > 0
  has_velocity = bool(jax.tree.leaves(state_like.dgc_velocity))
  if use_velocity != has_velocity:
    raise ValueError(
        f'make_step: dgc momentum={momentum} but the state '
        f'{"holds" if has_velocity else "has no"} DGC velocity; build it with '
        f'init_state(..., dgc_momentum={use_velocity})')
  if is_sharded(state_like) and use_velocity:
    raise ValueError(
        f'make_step: dgc momentum={momentum} keeps the momentum in per-worker velocities '
        'that cannot be sharded; build the state with init_state(..., shard_state=False)')
  if sends_update(state_like) and use_velocity:
    raise ValueError(
        f"make_step: dgc momentum={momentum} with a state whose workers send their "
        "optimizer's update (init_state(..., send='update')): the velocity would be a "
        "second momentum; build the state with send='gradient' or without DGC momentum")


# How the step maps the hierarchy onto the backend (make_step's ``mode``): 'mesh', one
# device per (DC, worker) under shard_map; 'vmap', the whole hierarchy on one device
# under nested jax.vmap over the same axis names.
MODES = ('mesh', 'vmap')


def _axes(specs: TrainState, axis: str) -> TrainState:
  """vmap ``in_axes`` of the state over ``axis``: 0 for fields sharded over it."""
  return TrainState(*[0 if axis in spec else None for spec in specs])


def _unbatch(state: TrainState, specs: TrainState) -> TrainState:
  """The vmapped step's [D, W]-stacked outputs cut to the mesh path's shapes: index 0
  of the worker (and DC) axis of fields not sharded over it (every member holds the
  same value there; shard_map's out_specs check it on the mesh path)."""
  def cut(spec, sub):
    index = (slice(None) if DC in spec else 0, slice(None) if WORKER in spec else 0)
    return jax.tree.map(lambda x: x[index], sub)
  return TrainState(*[cut(spec, sub) for spec, sub in zip(specs, state)])


def make_step(apply_fn: Callable, optimizer: optax.GradientTransformation,
              outer: optax.GradientTransformation, comps: Compressors, mesh: Mesh,
              state_like: TrainState, dgc_options: dgc.Options | None = None,
              prox_mu: float = 0.0, stream: streaming.Spec | None = None,
              mode: str = 'mesh', shape: tuple[int, int] | None = None,
              scaffold: scaffold_lib.Spec | None = None, loss_fn=None,
              adoption: bool = False) -> Callable:
  """Builds ``step(state, batch, active, weights, do_round) -> (state, metrics)``.

  Args:
    apply_fn: ``apply_fn(params, images) -> logits`` for ONE model.
    optimizer: the inner optax optimizer, applied on the workers.
    outer: the outer optax optimizer, applied to the pseudo-gradient.
    comps: per-leaf compressors.
    mesh: the ('dc', 'worker') mesh.
    state_like: a TrainState (or its eval_shape) to read the tree structure. Its
      optimizer state is sharded across each DC's workers (ZeRO-1) when it is a
      :class:`ShardedOptState`; ``optimizer`` must then be elementwise. When it is a
      :class:`WorkerOptState` each worker runs ``optimizer`` on its own gradient and
      sends the update (:func:`worker_update`).
    dgc_options: DGC momentum correction / local clipping (default: off). With
      ``momentum > 0`` the state must hold a velocity (``init_state(...,
      dgc_momentum=True)``) and ``optimizer`` should be plain SGD.
    prox_mu: FedProx's mu (:func:`local_gradient`; 0: off).
    stream: Streaming DiLoCo (hfl.sync.streaming.Spec), for a state from
      ``init_state(..., stream=stream)``; ``do_round`` may then be an Event.
    mode: 'mesh': each (DC, worker) member on its own device of ``mesh``
      (``shard_map``); 'vmap': the same member program under nested ``jax.vmap``
      over 'dc' and 'worker', the whole hierarchy on ``mesh``'s (usually one)
      device. Same layout, metrics and bits; results equal to float32 rounding.
    shape: (D, W) simulated in 'vmap' mode (default and in 'mesh' mode: ``mesh``'s).
    scaffold: SCAFFOLD (hfl.sync.scaffold.Spec; None: off; init_state(..., scaffold=True)).
    loss_fn: ``(params, inputs, labels) -> f32[]`` of one worker (None: :func:`cross_entropy`).
    adoption: ``weights`` is f32[2, D], the aggregation weights and each DC's adoption
      of the new global model (:func:`adopt_global`; hfl.sync.strategies' ``partial``).

  The returned function takes
    state: TrainState sharded by :func:`state_specs` (donated).
    batch: (inputs, labels), sharded P('dc', 'worker'): images f32[D, W, B, H, W', C]
      with labels int32[D, W, B], or (language model) tokens int32[D, W, B, T] with
      next-token labels int32[D, W, B, T]; ``apply_fn`` maps one worker's inputs to
      logits [B, classes] or [B, T, vocab].
    active: bool[D], DCs that run this iteration (semi-sync masking); or f32[D],
      each DC's learning-rate multiplier (:func:`apply_inner`), 0 = inactive.
    weights: f32[D], per-DC aggregation weights for this round's pseudo-gradients
      (0 for an absent DC); ignored unless ``do_round``. With ``adoption``: f32[2, D].
    do_round: static bool, end the iteration with an inter-DC round (or an
      Event: :func:`stream_event`; one program per event).
  and returns the new state and the metrics: int32[D, W, metrics_size(L)] (L
  leaves, :func:`pack_metrics` of the uplink, downlink, WAN and the round's
  correction through the downlink), sharded P('dc', 'worker'); no collective is
  spent on them. Read them with :func:`host_metrics` and ``step.info[do_round]`` (a
  :class:`ProgramInfo`, set when the program is traced).

  Raises:
    ValueError: DGC momentum without a velocity in the state (or the reverse), or
      with ZeRO-1 or a :class:`WorkerOptState`; a lossy compressor at a leaf where the state holds no residual
      (:func:`check_links`); ``scaffold`` and the state disagree (:func:`_check_scaffold`);
      ``adoption`` with a lossy downlink broadcast, ``stream`` or ``scaffold``.
  """
  opts = dgc_options or dgc.Options()
  sent = _check_make_step(comps, state_like, opts, stream, scaffold, adoption)
  shape = _step_shape(mode, mesh, shape)
  setup = Setup(loss_fn or cross_entropy(apply_fn), optimizer, outer, comps, shape[0],
                shape[1], is_sharded(state_like), opts, prox_mu=float(prox_mu),
                stream=stream, bcast=sent if any(sent) else (), scaffold=scaffold,
                adoption=bool(adoption), send_update=sends_update(state_like))
  specs, info = state_specs(state_like), {}
  body = _member_body(setup, specs, jax.tree.structure(state_like.params).num_leaves, info)
  step = _programs(body, mesh, specs, mode, shape, state_like)
  step.info, step.num_workers, step.mode = info, setup.num_workers, mode
  return step


def _member_body(setup: Setup, specs, num_leaves: int, info: dict) -> Callable:
  """One (DC, worker) member's iteration, ``body(state, images, labels, active,
  weights, do_round) -> (state, packed metrics)``, recording each program's
  :class:`ProgramInfo` in ``info`` when traced."""
  def body(state, images, labels, active, weights, do_round):
    keys = step_keys(state.key, state.step, setup.num_dcs)
    act, lr_scale = split_active(active[0])
    local, loss, it = intra_dc_iteration(setup, to_local(state, specs), images[0, 0],
                                         labels[0, 0], act, keys, lr_scale, state.params)
    local, rnd = _end_iteration(setup, local, weights, keys.dc, do_round, num_leaves)
    links = (it.up, it.down, rnd.wan, rnd.bcast)
    info[do_round] = ProgramInfo(
        syncs(do_round), it.up.static, it.down.static, rnd.wan_sum, rnd.wan_gather,
        num_leaves, rnd.bcast.static, rnd.regather_sum, rnd.regather_gather,
        rnd.regathered or (True,) * num_leaves, link_lib.flag_layout(links))
    packed = pack_metrics(loss, links, rnd.drift)
    return from_local(local, specs), packed[None, None]
  return body


def cross_entropy(apply_fn: Callable) -> Callable:
  """``(params, inputs, labels) -> f32[]``: the mean softmax cross-entropy of
  ``apply_fn(params, inputs)``'s logits against the integer ``labels``."""
  return lambda params, images, labels: optax.softmax_cross_entropy_with_integer_labels(
      apply_fn(params, images), labels).mean()


def _step_shape(mode: str, mesh: Mesh, shape) -> tuple:
  """(D, W) of :func:`make_step`; raises ValueError for an unknown ``mode`` or, in
  'mesh' mode, a ``shape`` other than the mesh's."""
  if mode not in MODES:
    raise ValueError(f'make_step: mode={mode!r} must be one of {MODES}')
  mesh_shape = (mesh.shape[DC], mesh.shape[WORKER])
  shape = mesh_shape if shape is None else tuple(int(v) for v in shape)
  if mode == 'mesh' and shape != mesh_shape:
    raise ValueError(f'make_step: shape={shape} differs from the mesh\'s {mesh_shape} '
                     "(only mode='vmap' simulates a hierarchy of another shape)")
  return shape


def _check_make_step(comps: Compressors, state_like: TrainState, opts: dgc.Options,
                     stream: streaming.Spec | None, scaffold=None, adoption=False) -> tuple:
  """:func:`make_step`'s checks (its Raises); returns ``_state_broadcast``: per leaf,
  whether the state sends the round's update through the downlink."""
  _check_options(state_like, opts)
  _check_scaffold(state_like, scaffold, stream)
  check_links(comps, state_like)
  sent = _state_broadcast(comps, state_like)
  if adoption and (any(sent) or stream is not None or scaffold is not None):
    raise ValueError('make_step: adoption (a partial sync strategy) cannot be combined with '
                     'a lossy downlink broadcast, Streaming DiLoCo or SCAFFOLD, which '
                     'assume every DC adopts the new global model')
  if any(sent) and stream is not None:
    raise ValueError('make_step: the state sends the round\'s update through a lossy '
                     'downlink (init_state(..., broadcast=\'downlink\')), which Streaming '
                     'DiLoCo cannot; build it with broadcast=\'gather\'')
  return sent


def _check_scaffold(state_like: TrainState, scaffold, stream) -> None:
  """Raises ValueError when SCAFFOLD (``scaffold``, a hfl.sync.scaffold.Spec) and the
  state's control variates disagree, or SCAFFOLD is asked with Streaming DiLoCo."""
  has = bool(jax.tree.leaves(state_like.scaffold_c))
  if (scaffold is not None) != has:
    raise ValueError(
        f'make_step: scaffold={"on" if scaffold is not None else "off"} but the state '
        f'{"holds" if has else "has no"} control variates; build it with '
        f'init_state(..., scaffold={scaffold is not None})')
  if scaffold is not None and stream is not None:
    raise ValueError('make_step: SCAFFOLD control variates cannot be combined with '
                     'Streaming DiLoCo (fragments sync on their own schedule)')


# TrainState fields a round program (any truthy ``do_round``) does not donate. It writes
# the new global model into both; donated, XLA:CPU copies every leaf of both at the
# program's start to keep the old values readable (16 extra copies in the default CNN's
# round program, docs/benchmarks.md "Top-level operations of the step programs"). Not
# donated, the round holds two more copies of the model at its peak; the iteration
# program donates everything.
ROUND_HELD = ('params', 'global_params')


class _HeldJit(NamedTuple):
  """A jitted ``f(state, *rest)`` that donates the state except the fields ``held``:
  called and lowered with the whole state, as ``jax.jit(f, donate_argnums=(0,))``."""
  jitted: Any  # jax.jit of (state without ``held``, tuple of held fields, *rest)
  held: tuple

  def _split(self, state, rest):
    return (state._replace(**{n: None for n in self.held}),
            tuple(getattr(state, n) for n in self.held), *rest)

  def __call__(self, state, *rest):
    return self.jitted(*self._split(state, rest))

  def lower(self, state, *rest):
    return self.jitted.lower(*self._split(state, rest))


def _donating_jit(f: Callable, do_round, **kw):
  """``jax.jit(f, donate_argnums=(0,))`` for an iteration program; for a round program
  the state is donated except :data:`ROUND_HELD`."""
  if not do_round:
    return jax.jit(f, donate_argnums=(0,), **kw)
  def g(donated, kept, *rest):
    return f(donated._replace(**dict(zip(ROUND_HELD, kept))), *rest)
  return _HeldJit(jax.jit(g, donate_argnums=(0,), **kw), ROUND_HELD)


def _programs(body: Callable, mesh: Mesh, specs, mode: str, shape: tuple,
              state_like: TrainState) -> Callable:
  """``step(state, batch, active, weights, do_round)``: the jitted ``body`` of each
  ``do_round`` (:func:`program_key`; False and True built now, an Event's on first
  use, all in ``step.jitted``), ``shard_map``'d over ``mesh`` or (``mode='vmap'``)
  under nested vmaps of ``shape`` = (D, W) members; the state donated (a round
  program's except :data:`ROUND_HELD`)."""
  def build(do_round):
    if mode == 'vmap':
      return build_vmap(do_round)
    f = jax.shard_map(
        lambda s, x, y, a, w: body(s, x, y, a, w, do_round), mesh=mesh,
        in_specs=(specs, P(DC, WORKER), P(DC, WORKER), P(DC), P()),
        out_specs=(specs, P(DC, WORKER)))
    return _donating_jit(f, do_round)

  def build_vmap(do_round):
    def member(s, x, y, a, w):
      # One member sees what shard_map would hand it: each field with its leading
      # mesh axes of length 1 (body's to_local drops them again).
      new, packed = body(from_local(s, specs), x[None, None], y[None, None], a[None], w,
                         do_round)
      return to_local(new, specs), packed[0, 0]
    inner = jax.vmap(member, in_axes=(_axes(specs, WORKER), 0, 0, None, None),
                     axis_name=WORKER, axis_size=shape[1])
    outer_fn = jax.vmap(inner, in_axes=(_axes(specs, DC), 0, 0, 0, None), axis_name=DC,
                        axis_size=shape[0])

    def f(s, x, y, a, w):
      new, packed = outer_fn(s, x, y, a, w)
      return _unbatch(new, specs), packed
    placed = {}
    if mesh.size == 1:  # outputs stay on the state's (1 x 1 mesh) shardings
      placed['out_shardings'] = (
          state_shardings(mesh, state_like), NamedSharding(mesh, P(DC, WORKER)))
    return _donating_jit(f, do_round, **placed)

  compiled = {False: build(False), True: build(True)}

  def step(state, batch, active, weights, do_round):
    key = program_key(do_round)
    if key not in compiled:
      compiled[key] = build(key)
    return compiled[key](state, *batch, active, weights)

  step.jitted = compiled
  return step


def split_active(active):
  """(bool[] this DC runs the iteration, f32[] its learning-rate multiplier or None):
  a bool ``active`` is the mask alone; a float one is the multiplier, 0 = inactive."""
  if active.dtype == jnp.bool_:
    return active, None
  return active > 0, active.astype(jnp.float32)


def _end_iteration(setup: Setup, state: TrainState, weights, key, do_round, num_leaves: int):
  """The inter-DC end of an iteration: a round (``do_round`` True), a streaming
  event (:func:`stream_event`) or nothing. Returns (state, RoundCharge)."""
  if isinstance(do_round, streaming.Event):
    return stream_event(setup, state, weights, key, do_round)
  if do_round:
    return inter_dc_round(setup, state, weights, key)
  return state, RoundCharge(link_lib.no_charge(num_leaves), 0, 0, None, link_lib.no_charge(num_leaves))


def program_key(do_round):
  """The static key of a step program: a bool, or a streaming Event that does something."""
  if isinstance(do_round, streaming.Event):
    return do_round if do_round != streaming.Event() else False
  return bool(do_round)


def syncs(do_round) -> bool:
  """Whether the program ``do_round`` exchanges over the WAN."""
  return do_round.sync >= 0 if isinstance(do_round, streaming.Event) else bool(do_round)


def host_metrics(info: ProgramInfo, metrics, active, weights=None, adopt=None) -> dict:
  """Per-DC metrics of one iteration, on the host, with exact integer bit counts.

  Args:
    info: the program's :class:`ProgramInfo` (``step.info[do_round]``).
    metrics: the step's metrics, fetched: int32[D, W, metrics_size(L)].
    active: bool[D], the DCs that ran the iteration (others count no bits).
    weights: f32[D], the round's aggregation weights (0 = absent DC); needed when
      ``info.do_round``.
    adopt: f32[D], each DC's adoption of the new global model (None: 1 for all); a
      DC adopting nothing receives nothing over its LAN (``round_down_bits`` 0).

  Returns:
    dict of numpy arrays [D]: ``loss`` (float64, mean over the DC's workers),
    ``up_bits`` (int64, all the DC's workers' uplink payloads), ``down_bits``
    (int64, the PS downlink to all W workers), ``wan_bits`` (int64, the DC's
    pseudo-gradient payload; 0 without a round or for an absent DC) and
    ``round_down_bits`` (int64, the round's result reaching the DC's W workers
    over the LAN, 0 without a round: W x, at the leaves whose update goes through
    the downlink (:func:`broadcast_leaves`), the DC's correction payload, and at the
    others the all-reduced WAN leaves' payload + every present DC's all-gathered
    WAN payload, the bits each worker holds after the re-gather over 'worker');
    ``flags`` int32[D, W, NUM_LINKS, L] (finiteness flags of the uplink, downlink,
    WAN and the round's correction per leaf); ``update_l2`` and
    ``drift_l2`` (float64 [D], :attr:`RoundCharge.drift`: ||x_d - x_ref||_2
    before the round and ||x_d - x_global'||_2 after it: the W workers' float32
    sums of squares over their slices, added in float64; 0 without a round).
    Downlink, WAN and correction flags are each worker's share of its DC's values
    (:func:`hfl.links.finiteness_flags` ``part``): OR them over the workers for the DC's.
  """
  m = np.asarray(metrics)
  d, w, _ = m.shape
  n, k = info.num_leaves, link_lib.NUM_LINKS
  loss = np.ascontiguousarray(m[..., 0]).view(np.float32).astype(np.float64).mean(axis=1)
  dyn_leaf = m[..., 1:1 + k * n].astype(np.int64).reshape(d, w, k, n)
  words = m[..., 1 + k * n:1 + k * n + link_lib.flag_words(n)]
  dyn = dyn_leaf.sum(axis=-1)
  active = np.asarray(active, bool)
  zero = np.zeros(d, np.int64)
  up = np.where(active, w * info.up + dyn[:, :, 0].sum(axis=1), zero)
  down = np.where(active, w * info.down + dyn[:, :, 1].sum(axis=1), zero)
  wan = round_down = zero
  if info.do_round:
    present = np.asarray(weights) > 0
    gathered = np.where(present, info.wan_gather + dyn[:, 0, 2], zero)  # same on every worker
    wan = np.where(present, info.wan_sum + gathered, zero)
    again = np.asarray(info.regathered or (True,) * n, bool)
    regathered = np.where(present, info.regather_gather + dyn_leaf[:, 0, 2, again].sum(-1),
                          zero)
    # Every worker decodes the same correction payload (the replicated PS's).
    round_down = (w * (info.regather_sum + int(regathered.sum())) + w * info.bcast
                  + dyn[:, :, 3].sum(axis=1))
    if adopt is not None:
      round_down = np.where(np.asarray(adopt) > 0, round_down, 0)
  shares = np.ascontiguousarray(m[..., 1 + k * n + link_lib.flag_words(n):]).view(
      np.float32).astype(np.float64)
  drift = np.sqrt(shares.sum(axis=1))  # [D, 2]: the W workers' shares summed
  return dict(loss=loss, up_bits=up, down_bits=down, wan_bits=wan,
              round_down_bits=np.asarray(round_down, np.int64),
              flags=link_lib.unpack_flags(words, info.flag_bits, n),
              update_l2=drift[:, 0], drift_l2=drift[:, 1])


# Per-DC state of a round that an absent DC's work changes (hfl.sync.faults).
ROUND_FIELDS = ('opt_state', 'up', 'down', 'wan', 'dgc_velocity', 'scaffold')


def round_start(state: TrainState) -> dict:
  """A copy of the per-DC state a round may have to discard (:data:`ROUND_FIELDS`)."""
  return {f: jax.tree.map(jnp.copy, getattr(state, f)) for f in ROUND_FIELDS}


def discard_absent(state: TrainState, start: dict, present) -> TrainState:
  """Rolls absent DCs' per-DC state back to its start-of-round values.

  An absent DC's work in a round is discarded (hfl.sync.faults): its inner
  optimizer state, uplink/downlink/WAN link states (residuals and compressor
  states), DGC velocity and SCAFFOLD state (c_d, learning-rate sum, update count) are
  those of the round's start; its parameters are the new global
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
