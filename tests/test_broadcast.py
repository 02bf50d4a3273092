"""The round's update reaching the workers through the downlink (issue 48).

After an inter-DC round each DC's PS sends its workers the correction
c = (x_global' - x_global) + Δ_d through the downlink compressor with its own error
feedback (hfl.step.broadcast_correction); the workers add what the PS's residual
assumes it sent, and the model they then hold is the reference point of the next
round's pseudo-gradient. Lossless downlinks keep the re-gathered global model.
"""

import copy
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from configs import default as default_config
from hfl import accounting, mesh as mesh_lib, step as step_lib, train
from hfl import setup as setup_lib
from hfl.compress import base, dgc, policy, registry, sparse
from hfl import workdir as workdir_lib
from tests.helpers import put as _put

U = 2.0**-24
SHAPE = (12, 10)
NAMES = sorted(policy.REGISTRY)


def compressor(name, shape=SHAPE):
  """The registry's ``name`` for a leaf of ``shape``, built from its registered example
  spec (hfl.compress.registry.example_spec); a name that does not build fails the test."""
  return policy.build(registry.example_spec(name), jax.ShapeDtypeStruct(shape, jnp.float32),
                      0, 'float32')[0]


# --------------------------------------------------------------------------------
# Error feedback on the post-round link, every compressor of the registry.
# --------------------------------------------------------------------------------

@pytest.mark.parametrize('name', NAMES)
def test_round_correction_error_feedback_is_exact(name):
  """T = 4 rounds of broadcast_correction on one DC of 2 workers, with the workers'
  model, x_global and x_global' at 0, so that the correction is c_t = Δ_t (given)
  and the workers' new model is exactly D_t, what they received. With
  e_t = c_t + γ e_{t-1} - D_t (γ: CO3's decaying memory, else 1) telescoping:

      Σ_t c_t = Σ_t D_t + e_T + (1 - γ) Σ_{t<T} e_t.

  Tolerance, from the float32 operations (u = 2^-24): per round p = c + γ e (a
  product and a sum: u |γ e| + u |p|, |p| <= |c| + |γ e|) and e' = p - D (u |e'|),
  the decode being the same on sender and receiver (one device): at most
  3u (|c_t| + |γ e_{t-1}| + |D_t| + |e_t|) per round; checked at 9u (as
  tests/test_links.py with W = 1). Every worker holds the same model, residual and
  reference point, and the charged bits are the payload's ``wire_bits``. A lossless
  compressor takes no part: its leaf is re-gathered, the state holds no link."""
  c = compressor(name)
  comps = step_lib.Compressors([c], [c], [c])
  params = {'w': np.zeros(SHAPE, np.float32)}
  state = step_lib.init_state(params, optax.sgd(0.1), optax.sgd(1.0), comps, 1, 2,
                              jax.random.PRNGKey(0))
  if c.lossless:
    assert state.bcast == () and state.ref == ()
    assert step_lib.broadcast_leaves([c]) == [False]
    return
  mesh = mesh_lib.make_mesh(1, 2, jax.devices()[:2])
  setup = step_lib.Setup(None, optax.sgd(0.1), optax.sgd(1.0), comps, 1, 2, False,
                         dgc.Options(), bcast=(True,))
  specs = step_lib.state_specs(state)
  state = jax.device_put(state, step_lib.state_shardings(mesh, state))
  bits = []

  def f(s, delta, key):
    local = step_lib.to_local(s, specs)
    # x_global = x_global' = 0 (the state's, never changed) and the workers' model 0.
    zero = jax.tree.map(jnp.zeros_like, local.params)
    new, charge = step_lib.broadcast_correction(setup, local._replace(params=zero), zero,
                                                local.global_params, {'w': delta[0]}, key)
    bits.append(charge)
    return step_lib.from_local(new, specs), charge.dynamic[0][None, None]

  g = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(specs, P('dc'), P()),
                            out_specs=(specs, P('dc', 'worker'))))
  gamma = 1.0 if c.lossless else float(getattr(c.init(), 'ef_gamma', 1.0))
  rng = np.random.default_rng(0)
  e_prev = np.zeros(SHAPE)
  sum_c = sum_d = lost = tol = 0.0
  for t in range(4):
    delta = (rng.normal(size=SHAPE) * 10.0 ** (t - 1)).astype(np.float32)
    delta.reshape(-1)[0] = 7e4  # beyond float16's range
    state, dyn = g(state, _put(mesh, delta[None], 'dc'), jax.random.PRNGKey(t))
    x = np.asarray(state.params['w'], np.float64)[0]
    ref = np.asarray(state.ref['w'], np.float64)[0]
    e = np.asarray(state.bcast.residual['w'], np.float64)[0]
    np.testing.assert_array_equal(ref, x)  # the next round's reference point
    for arr in (state.params['w'], state.bcast.residual['w']):
      shards = [np.asarray(s.data) for s in arr.addressable_shards]
      assert all(np.array_equal(shards[0], s) for s in shards[1:])  # same on both workers
    sum_c, sum_d = sum_c + delta.astype(np.float64), sum_d + x
    if t < 3:
      lost = lost + (1 - gamma) * e
    tol = tol + 9 * U * (np.abs(delta) + np.abs(gamma * e_prev) + np.abs(x) + np.abs(e))
    e_prev = e
  err = np.abs(sum_c - (sum_d + e + lost))
  assert np.all(err <= np.maximum(tol, np.finfo(np.float32).tiny)), float(np.max(err / tol))
  # One payload's bits: static, or (variable-length codes) counted on the device.
  static, dynamic = bits[-1].static, int(np.asarray(dyn)[0, 0])
  assert (static, dynamic) == (policy.static_bits(c), 0) if static else dynamic > 0


# --------------------------------------------------------------------------------
# The step: lossless runs unchanged; a lossy broadcast against a numpy loop.
# --------------------------------------------------------------------------------

D, W, B, HW, CLASSES = 2, 2, 4, 3, 5
LR = 0.2


def _linear(p, x):
  return x.reshape(x.shape[0], -1) @ p['w'] + p['b']


def _linear_setup(down, up=None, wan=None, broadcast='downlink', seed=0, bcast=None):
  """2 DCs x 2 workers, a linear softmax classifier on 3x3 inputs (w f32[9, 5],
  b f32[5]), SGD, outer SGD lr 1 (FedAvg); ``bcast``: the round's correction's own
  compressors (None: the downlink's)."""
  mesh = mesh_lib.make_mesh(D, W, jax.devices()[:D * W])
  rng = np.random.default_rng(seed)
  params = {'b': (0.1 * rng.normal(size=CLASSES)).astype(np.float32),
            'w': (0.5 * rng.normal(size=(HW * HW, CLASSES))).astype(np.float32)}
  shapes = [l.shape for l in jax.tree.leaves(params)]
  make = lambda f: [f(s) for s in shapes] if callable(f) else f
  comps = step_lib.Compressors(make(up or base.identity), make(down),
                               make(wan or base.identity), bcast and make(bcast))
  opt, outer = optax.sgd(LR), optax.sgd(1.0)
  state = step_lib.init_state(params, opt, outer, comps, D, W, jax.random.PRNGKey(1),
                              broadcast=broadcast)
  state = jax.device_put(state, step_lib.state_shardings(mesh, state))
  fn = step_lib.make_step(_linear, opt, outer, comps, mesh, state)
  return mesh, params, state, fn


def _batches(n, seed=5):
  rng = np.random.default_rng(seed)
  return (rng.normal(size=(n, D, W, B, HW, HW, 1)).astype(np.float32),
          rng.integers(0, CLASSES, size=(n, D, W, B)).astype(np.int32))


def _run(mesh, fn, state, xs, ys, k):
  """len(xs) iterations, a round every k; returns (state, host metrics of each)."""
  ms = []
  weights = np.full(D, 0.5, np.float32)
  for t in range(len(xs)):
    rnd = (t + 1) % k == 0
    state, m = fn(state, (_put(mesh, xs[t], 'dc', 'worker'), _put(mesh, ys[t], 'dc', 'worker')),
                  _put(mesh, np.ones(D, bool), 'dc'), _put(mesh, weights), rnd)
    ms.append(step_lib.host_metrics(fn.info[rnd], np.asarray(m), np.ones(D, bool), weights))
  return state, ms


def test_lossless_downlink_is_bitwise_the_gathered_global_model():
  """Identity downlink (with a lossy uplink and WAN): broadcast='downlink' holds no
  broadcast state and gives bitwise the params, global model, residuals and bits of
  broadcast='gather' (the behaviour before issue 48), over 3 rounds of K = 2."""
  topk = lambda s: sparse.topk(s, 0.3)
  xs, ys = _batches(6)
  out = {}
  for mode in ('gather', 'downlink'):
    mesh, _, state, fn = _linear_setup(base.identity, up=topk, wan=topk, broadcast=mode)
    assert state.bcast == () and state.ref == ()
    out[mode] = _run(mesh, fn, state, xs, ys, 2)
  (sg, mg), (sd, md) = out['gather'], out['downlink']
  for a, b in zip(jax.tree.leaves(sg), jax.tree.leaves(sd)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  for a, b in zip(mg, md):
    for key in ('up_bits', 'down_bits', 'wan_bits', 'round_down_bits'):
      np.testing.assert_array_equal(a[key], b[key])


def _np_topk(p, k):
  """Top-k by magnitude of a float32 array (ties: the lower index, as lax.top_k)."""
  flat = p.reshape(-1)
  keep = np.argsort(-np.abs(flat), kind='stable')[:k]
  out = np.zeros_like(flat)
  out[keep] = flat[keep]
  return out.reshape(p.shape)


def _np_grad(p, x, y):
  """Gradient of the mean softmax cross-entropy of the linear model (float64)."""
  xf = x.reshape(x.shape[0], -1).astype(np.float64)
  z = xf @ p['w'] + p['b']
  z = z - z.max(axis=1, keepdims=True)
  s = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
  s[np.arange(len(y)), y] -= 1.0
  s /= len(y)
  return {'w': xf.T @ s, 'b': s.sum(axis=0)}


@pytest.mark.parametrize('bcast_density,down_lossy', [(None, True), (0.5, True), (0.5, False)])
def test_lossy_broadcast_matches_a_numpy_loop(bcast_density, down_lossy):
  """2 DCs x 2 workers, top-k downlink (density 0.2) on w, identity on b (re-gathered),
  2 rounds of K = 2, FedAvg: the step's models match a plain numpy loop in which
  every iteration's PS downlink is top-k with error feedback and every round
  sends each DC the correction c = (x_global' - x_global) + Δ_d through top-k
  (at the downlink's density, or at ``bcast_density``: compression.broadcast_density)
  with its own residual, Δ_d = x_ref - x_d against the model the workers started
  from (x_ref = x_global for b). The re-gathered path ('gather') does not. With
  ``down_lossy`` False the downlink is identity and only the correction is lossy
  (compression.correction): the round still sends it through its own compressor."""
  density = 0.2 if down_lossy else 1.0
  k = sparse.num_kept(HW * HW * CLASSES, density)
  k_b = k if bcast_density is None else sparse.num_kept(HW * HW * CLASSES, bcast_density)
  down = lambda s: (sparse.topk(s, density) if len(s) == 2 and down_lossy
                    else base.identity(s))
  bcast = None if bcast_density is None else (
      lambda s: sparse.topk(s, bcast_density) if len(s) == 2 else base.identity(s))
  xs, ys = _batches(4)
  mesh, params, state, fn = _linear_setup(down, bcast=bcast)
  state, _ = _run(mesh, fn, state, xs, ys, 2)

  g = {n: params[n].astype(np.float64) for n in params}
  x = [{n: g[n].copy() for n in g} for _ in range(D)]
  ref = [g['w'].copy() for _ in range(D)]
  e_down = [np.zeros_like(g['w']) for _ in range(D)]
  e_b = [np.zeros_like(g['w']) for _ in range(D)]
  for t in range(4):
    for d in range(D):
      grads = [_np_grad(x[d], xs[t, d, w], ys[t, d, w]) for w in range(W)]
      agg = {n: sum(gr[n] for gr in grads) / W for n in g}
      q = agg['w'] + e_down[d]
      sent = _np_topk(q, k)
      e_down[d] = q - sent
      x[d] = {'w': x[d]['w'] - LR * sent, 'b': x[d]['b'] - LR * agg['b']}
    if (t + 1) % 2 == 0:
      delta = [{'w': ref[d] - x[d]['w'], 'b': g['b'] - x[d]['b']} for d in range(D)]
      new_g = {n: g[n] - sum(0.5 * delta[d][n] for d in range(D)) for n in g}
      for d in range(D):
        p = (new_g['w'] - g['w']) + delta[d]['w'] + e_b[d]
        sent = _np_topk(p, k_b)
        e_b[d] = p - sent
        x[d] = {'w': x[d]['w'] + sent, 'b': new_g['b'].copy()}
        ref[d] = x[d]['w'].copy()
      g = new_g
  tol = dict(rtol=2e-5, atol=2e-6)
  for n in g:
    np.testing.assert_allclose(np.asarray(state.global_params[n]), g[n], **tol)
    for d in range(D):
      np.testing.assert_allclose(np.asarray(state.params[n])[d], x[d][n], **tol)
  for d in range(D):
    np.testing.assert_allclose(np.asarray(state.ref['w'])[d], ref[d], **tol)
    np.testing.assert_allclose(np.asarray(state.bcast.residual['w'])[d], e_b[d], **tol)
  assert state.ref['b'] is None and state.bcast.residual['b'] is None
  # The workers hold x_global' minus what the residual still owes them.
  for d in range(D):
    np.testing.assert_allclose(np.asarray(state.params['w'])[d],
                               g['w'] - e_b[d], **tol)
  mesh, _, gathered, fn = _linear_setup(down, broadcast='gather')
  gathered, _ = _run(mesh, fn, gathered, xs, ys, 2)
  assert np.max(np.abs(np.asarray(gathered.params['w'])[0] - x[0]['w'])) > 1e-3


def test_round_charges_the_correction_payload_and_refuses_streaming():
  """The round's intra_down charge at a lossy downlink leaf is W x its downlink
  payload's bits (each worker receives the PS's correction), at a lossless one
  the re-gathered WAN payload, as hfl.accounting.round_down_bits plans it; an
  unknown mode and Streaming DiLoCo with a lossy broadcast are refused."""
  density = 0.2
  down = lambda s: sparse.topk(s, density) if len(s) == 2 else base.identity(s)
  mesh, params, state, fn = _linear_setup(down)
  xs, ys = _batches(2)
  _, ms = _run(mesh, fn, state, xs, ys, 2)
  shapes = [l.shape for l in jax.tree.leaves(params)]
  c = step_lib.Compressors([base.identity(s) for s in shapes], [down(s) for s in shapes],
                           [base.identity(s) for s in shapes])
  want = W * (32 * CLASSES + policy.static_bits(c.down[1]))
  assert ms[1]['round_down_bits'].tolist() == [want] * D
  assert accounting.round_down_bits(c, W, D, 'downlink') == want
  assert accounting.round_down_bits(c, W, D, 'gather') == W * 32 * (CLASSES + HW * HW * CLASSES)
  assert ms[0]['round_down_bits'].tolist() == [0] * D
  # The correction at its own density (compression.broadcast_density) is charged as such.
  bcast = lambda s: sparse.topk(s, 0.6) if len(s) == 2 else base.identity(s)
  mesh, _, state, fn = _linear_setup(down, bcast=bcast)
  _, ms = _run(mesh, fn, state, xs, ys, 2)
  cb = c._replace(bcast=[bcast(s) for s in shapes])
  want_b = W * (32 * CLASSES + policy.static_bits(cb.bcast[1]))
  assert want_b > want and ms[1]['round_down_bits'].tolist() == [want_b] * D
  assert accounting.round_down_bits(cb, W, D, 'downlink') == want_b
  with pytest.raises(ValueError, match='broadcast'):
    step_lib.broadcast_leaves(c.down, 'scatter')
  from hfl.sync import streaming  # pylint: disable=g-import-not-at-top
  spec = streaming.Spec(streaming.partition(params, 1), 0.0, False)
  with pytest.raises(ValueError, match="broadcast='gather'"):
    step_lib.init_state(params, optax.sgd(0.1), optax.sgd(1.0), c, D, W,
                        jax.random.PRNGKey(0), stream=spec)


# --------------------------------------------------------------------------------
# The compression sweep's intra-DC bytes, from static payload sizes.
# --------------------------------------------------------------------------------

def _intra_bytes_per_round(cfg, k, input_shape=(28, 28, 1)):
  """Planned intra-DC (up + down) bits of one DC and round of K iterations (10 classes,
  images of ``input_shape``)."""
  from hfl import models  # pylint: disable=g-import-not-at-top
  net = models.from_config(cfg.model, 10)
  shapes = jax.eval_shape(lambda: net.init(jax.random.PRNGKey(0),
                                           jnp.zeros((1,) + input_shape))['params'])
  comps = setup_lib.build_compressors(cfg, shapes)
  w, d = cfg.mesh.workers_per_dc, cfg.mesh.num_dcs
  up, down, _ = accounting.static_bits(comps, shapes, w)
  return k * w * (up + down) + accounting.round_down_bits(comps, w, d, setup_lib.broadcast(cfg))


def test_default_config_top_k_2_percent_is_20x_fewer_intra_dc_bytes():
  """configs/default.py (K = 4) with top-k 2% on the uplink and the downlink moves
  >= 20x fewer intra-DC bytes per round than uncompressed (issue 48): the round's
  update goes through the downlink. Re-gathered ('gather') it could not reach 10x."""
  cfg = default_config.get_config()
  k = int(cfg.sync.k)
  dense = _intra_bytes_per_round(cfg, k)
  for link in ('uplink', 'downlink'):
    cfg.compression[link].name = 'topk'
    cfg.compression[link].density = 0.02
  sparse_bits = _intra_bytes_per_round(cfg, k)
  assert dense / sparse_bits >= 20, dense / sparse_bits
  cfg.compression.broadcast = 'gather'
  assert dense / _intra_bytes_per_round(cfg, k) < 10


# --------------------------------------------------------------------------------
# Config, older runs, checkpoints.
# --------------------------------------------------------------------------------

def test_config_refuses_an_unknown_broadcast_and_lossy_broadcast_with_streaming():
  """compression.broadcast is 'downlink' or 'gather'; Streaming DiLoCo with a lossy
  downlink needs 'gather' (the error names the fields), a lossless one is fine."""
  from hfl import config as config_lib  # pylint: disable=g-import-not-at-top
  assert config_lib.BROADCASTS == step_lib.BROADCASTS
  cfg = default_config.get_config()
  assert cfg.compression.broadcast == 'downlink'
  cfg.compression.broadcast = 'scatter'
  with pytest.raises(ValueError, match="compression.broadcast='scatter' is unknown"):
    config_lib.validate(cfg, paths=False)
  cfg.compression.broadcast = 'downlink'
  cfg.sync.fragments, cfg.train.num_steps = 2, 800
  config_lib.validate(cfg, paths=False)  # identity downlink: nothing to refuse
  cfg.compression.downlink.name = 'topk'
  with pytest.raises(ValueError, match=r"compression.broadcast='downlink'.*"
                     r"compression.downlink.name='topk'.*sync.fragments=2.*"
                     r"Set compression.broadcast='gather'"):
    config_lib.validate(cfg, paths=False)
  cfg.compression.broadcast = 'gather'
  config_lib.validate(cfg, paths=False)


def test_low_bit_correction_is_charged_as_sent():
  """An E3M0 correction (compression.correction.name='e3m0') after top-k iterations:
  the round's intra_down charge is W x (the identity bias re-gathered + the packed
  4-bit payload and its float32 scale), as round_down_bits plans it, under a quarter
  of the gathered float32 model; the workers then hold x_global' minus the correction's
  residual (error feedback at the PS)."""
  from hfl.compress import minifloat  # pylint: disable=g-import-not-at-top
  down = lambda s: sparse.topk(s, 0.2) if len(s) == 2 else base.identity(s)
  bcast = lambda s: minifloat.e3m0(s) if len(s) == 2 else base.identity(s)
  mesh, params, state, fn = _linear_setup(down, bcast=bcast)
  xs, ys = _batches(2)
  state, ms = _run(mesh, fn, state, xs, ys, 2)
  shapes = [l.shape for l in jax.tree.leaves(params)]
  c = step_lib.Compressors([base.identity(s) for s in shapes], [down(s) for s in shapes],
                           [base.identity(s) for s in shapes], [bcast(s) for s in shapes])
  n = HW * HW * CLASSES
  want = W * (32 * CLASSES + 8 * -(-n // 2) + 32)  # 4 bits per entry, one f32 scale
  assert ms[1]['round_down_bits'].tolist() == [want] * D
  assert accounting.round_down_bits(c, W, D, 'downlink') == want
  assert 4 * want < accounting.round_down_bits(c, W, D, 'gather')  # 4 of 32 bits, + bias
  for d in range(D):
    np.testing.assert_allclose(np.asarray(state.params['w'])[d],
                               np.asarray(state.global_params['w'])
                               - np.asarray(state.bcast.residual['w'])[d],
                               rtol=0, atol=2e-6)


def test_correction_compressor_is_built_and_checked_before_compiling():
  """compression.correction.name='e3m0' gives the round's correction E3M0 at the
  large leaves and the small-leaf cast at the others, planned as such (more
  intra-DC bytes than top-k's 2% of 64 bits per entry: 4 bits per entry); '' leaves it
  None; an unknown name,
  'gather', a broadcast_density set as well, and Streaming DiLoCo are refused
  naming the fields. A config older than the field upgrades to the default spec."""
  from hfl import config as config_lib, models  # pylint: disable=g-import-not-at-top
  cfg = default_config.get_config()
  cfg.compression.uplink.name = cfg.compression.downlink.name = 'topk'
  cfg.compression.uplink.density = cfg.compression.downlink.density = 0.02
  cfg.compression.small, cfg.compression.small_threshold = 'bfloat16', 16384
  net = models.from_config(cfg.model, 10)
  shapes = jax.eval_shape(lambda: net.init(jax.random.PRNGKey(0),
                                           jnp.zeros((1, 28, 28, 1)))['params'])
  assert setup_lib.build_compressors(cfg, shapes).bcast is None
  topk_bits = _intra_bytes_per_round(cfg, 4)
  cfg.compression.correction.name = 'e3m0'
  config_lib.validate(cfg, paths=False)
  comps = setup_lib.build_compressors(cfg, shapes)
  big = [i for i, c in enumerate(comps.down) if c.name.startswith('topk')]
  assert big and all(comps.bcast[i].name == 'e3m0' for i in big)
  assert all(comps.bcast[i].name == comps.down[i].name
             for i in range(len(comps.down)) if i not in big)
  assert _intra_bytes_per_round(cfg, 4) > topk_bits  # 4 bits x n > 64 bits x 2% of n
  for field, value, match in (
      ('name', 'e4m3', r"compression.correction.name='e4m3': unknown compressor"),
      ('broadcast', 'gather', r"correction.name='e3m0'.*compression.broadcast='gather'"),
      ('broadcast_density', 0.06, r'both set the round.s correction')):
    bad = copy.deepcopy(cfg)
    if field == 'name':
      bad.compression.correction.name = value
    else:
      bad.compression[field] = value
    with pytest.raises(ValueError, match=match):
      config_lib.validate(bad, paths=False)
  streaming = copy.deepcopy(cfg)
  streaming.compression.downlink.name = streaming.compression.uplink.name = 'identity'
  streaming.compression.small = 'float32'
  streaming.sync.fragments = 2
  with pytest.raises(ValueError, match=r"compression.correction.name='e3m0'"):
    config_lib.validate(streaming, paths=False)
  old = default_config.get_config().to_dict()
  del old['compression']['correction']
  assert (workdir_lib.upgrade_config(old)['compression']['correction']
          == default_config.get_config().compression.correction.to_dict())


def test_broadcast_density_builds_the_correction_and_is_checked_before_compiling():
  """compression.broadcast_density > 0 gives the round's correction the downlink's
  compressor at that density (Compressors.bcast), planned as such; 0 leaves it None
  (the downlink's); a value outside [0, 1], a non-sparsifier downlink or 'gather' are
  refused naming the fields."""
  from hfl import config as config_lib, models  # pylint: disable=g-import-not-at-top
  cfg = default_config.get_config()
  cfg.compression.uplink.name = cfg.compression.downlink.name = 'topk'
  cfg.compression.uplink.density = cfg.compression.downlink.density = 0.02
  config_lib.validate(cfg, paths=False)
  net = models.from_config(cfg.model, 10)
  shapes = jax.eval_shape(lambda: net.init(jax.random.PRNGKey(0),
                                           jnp.zeros((1, 28, 28, 1)))['params'])
  assert setup_lib.build_compressors(cfg, shapes).bcast is None
  base_bits = _intra_bytes_per_round(cfg, 4)
  cfg.compression.broadcast_density = 0.08
  config_lib.validate(cfg, paths=False)
  comps = setup_lib.build_compressors(cfg, shapes)
  big = [i for i, c in enumerate(comps.down) if c.name.startswith('topk')]
  assert big and all(comps.bcast[i].name == 'topk(0.08)' for i in big)
  assert all(comps.bcast[i].name == comps.down[i].name
             for i in range(len(comps.down)) if i not in big)
  assert _intra_bytes_per_round(cfg, 4) > base_bits
  for value, match in ((1.5, r'compression.broadcast_density=1.5 must be in \[0, 1\]'),
                       (-0.1, r'compression.broadcast_density=-0.1 must be in \[0, 1\]')):
    cfg.compression.broadcast_density = value
    with pytest.raises(ValueError, match=match):
      config_lib.validate(cfg, paths=False)
  cfg.compression.broadcast_density = 0.08
  cfg.compression.broadcast = 'gather'
  with pytest.raises(ValueError, match=r"broadcast_density=0.08.*compression.broadcast='gather'"):
    config_lib.validate(cfg, paths=False)
  cfg.compression.broadcast, cfg.compression.downlink.name = 'downlink', 'qsgd'
  with pytest.raises(ValueError, match=r"compression.downlink.name='qsgd'"):
    config_lib.validate(cfg, paths=False)


def test_an_older_runs_config_ran_with_the_gathered_model():
  """A config.json from before the field (issue 48) upgrades to 'gather', how it ran,
  where its downlink is lossy; to the default 'downlink' where it is lossless (both
  train bitwise the same run: test_lossless_downlink_is_bitwise_the_gathered_global_model),
  so that an older lossless run resumes under today's default."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  old = default_config.get_config().to_dict()
  del old['compression']['broadcast']
  assert workdir_lib.upgrade_config(old)['compression']['broadcast'] == 'downlink'
  for name, small in (('topk', 'float32'), ('identity', 'bfloat16')):
    lossy = copy.deepcopy(old)
    lossy['compression']['downlink']['name'] = name
    lossy['compression']['small'] = small
    assert workdir_lib.upgrade_config(lossy)['compression']['broadcast'] == 'gather'
    assert setup_lib.broadcast(ml_collections.ConfigDict(lossy)) == 'gather'


@pytest.mark.slow
def test_lossy_broadcast_run_resumes_bitwise(fake_data, tmp_path, monkeypatch):
  """The smoke config with top-k 20% up and down (the round's update through the
  downlink, K = 3): a run crashed in its third round resumes to the same final
  state (broadcast residual and reference point included) and byte counts."""
  from tests.helpers import crash_then_resume, final_state, smoke_config  # pylint: disable=g-import-not-at-top
  cfg = {'sync.k': 3, 'train.num_steps': 12, 'compression.uplink.name': 'topk',
         'compression.uplink.density': 0.2, 'compression.downlink.name': 'topk',
         'compression.downlink.density': 0.2}
  ref_dir, cut_dir = str(tmp_path / 'ref'), str(tmp_path / 'cut')
  ref = train.train_and_evaluate(smoke_config(fake_data, **cfg), ref_dir)
  summary = crash_then_resume(lambda: smoke_config(fake_data, **cfg), cut_dir, monkeypatch, 8)
  (step_a, a), (step_b, b) = final_state(ref_dir), final_state(cut_dir)
  assert step_a == step_b == 12
  assert jax.tree.leaves(a['bcast']) and jax.tree.leaves(a['ref'])
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  for key in ('final_test_accuracy', 'bytes', 'sim_time_s', 'inter_dc_rounds'):
    assert summary[key] == ref[key], key


def test_broadcast_md_planned_bytes_table():
  """docs/broadcast.md's planned table ("Sparse iterations, a low-bit correction"):
  intra-DC up + down bytes saved per round of K iterations against uncompressed, for
  the default (Fashion-MNIST) and CIFAR-10 CNNs, recomputed from the payload shapes
  (hfl.accounting, checked against the compiled programs by tests/test_step.py);
  each printed percentage within half its last digit."""
  import os  # pylint: disable=g-import-not-at-top
  from configs import cifar10 as cifar_config  # pylint: disable=g-import-not-at-top
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  with open(os.path.join(repo, 'docs', 'broadcast.md'), encoding='utf-8') as f:
    text = f.read()
  lines = text[text.index('| iterations (up = down) | correction |'):].splitlines()
  rows = [[c.strip() for c in l.strip().strip('|').split('|')] for l in lines[2:]
          if l.startswith('|')]
  rows = rows[:next((i for i, r in enumerate(rows) if not r), len(rows))]
  assert len(rows) == 4

  planned = lambda cfg, shape: _intra_bytes_per_round(cfg, int(cfg.sync.k), shape)

  for it, corr, fmnist, cifar in rows:
    rho = float(it.removeprefix('top-k ').rstrip('%')) / 100
    for module, shape, printed in ((default_config, (28, 28, 1), fmnist),
                                   (cifar_config, (32, 32, 3), cifar)):
      cfg = module.get_config()
      base_bits = planned(cfg, shape)
      for link in ('uplink', 'downlink'):
        cfg.compression[link].name, cfg.compression[link].density = 'topk', rho
      cfg.compression.small, cfg.compression.small_threshold = 'bfloat16', 16384
      cfg.compression.broadcast = 'downlink'
      if corr == 'E3M0':
        cfg.compression.correction.name = 'e3m0'
      else:
        assert corr == it, (it, corr)
      saved = 100 * (1 - planned(cfg, shape) / base_bits)
      assert abs(float(printed.rstrip('%')) - saved) <= 0.005 + 1e-9, (it, corr, printed, saved)
