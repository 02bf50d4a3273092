"""The one-device simulation (make_step(..., mode='vmap')) against the device mesh.

The same per-member step body runs under nested ``jax.vmap`` (axis names 'dc' and
'worker') on one device and under ``jax.shard_map`` on the (D=2, W=4) mesh of
simulated CPU devices; after a few iterations with rounds the states, the host
metrics (bits, flags, loss) and the ProgramInfo must agree.

Tolerance (where not bitwise, BITWISE below). Every collective adds at most D * W = 8 float32 terms per element, and
the two programs may sum them in another order (XLA:CPU's all-reduce vs. a reduce
over the vmapped axis) and fuse elementwise arithmetic differently; the model is
a small MLP trained for a handful of iterations, so each state entry is a short
chain of such sums. rtol 1e-5 (~ 80 ulps of float32) with atol 1e-6 covers that
chain with room, and is far below any real difference (a wrong sign, a missing
worker, a skipped round move entries by ~1e-2). Integer state (steps, compressor
states' counters), bits and flags must be equal exactly.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from hfl import mesh as mesh_lib, models, step as step_lib
from hfl.compress import base, co3, dgc, policy, registry, sparse
from hfl.sync import scaffold as scaffold_lib
from hfl.sync import streaming
from hfl import workdir as workdir_lib
from tests.helpers import B, D, W, step_batches, put

LR = 0.1
RTOL, ATOL = 1e-5, 1e-6
# BITWISE: with a sparse (all-gathered) uplink every float sum of a collective is either
# done after the all-gather in ef.aggregate's explicit order (the same program on both
# paths) or a psum over 'dc' of D = 2 terms (a + b is exact to reorder); those runs are
# bitwise equal (jax 0.10.2, XLA:CPU). An identity uplink's psum over W = 4 workers is
# XLA's all-reduce on the mesh and a reduction over the vmapped axis here, in another
# order: float32 tolerance.


def _registered(name):
  spec = registry.example_spec(name)
  name, hyper = policy.check_spec(spec, 'compression.uplink')
  factory = registry.lookup(name).factory
  return lambda shape: factory(shape, **hyper)


def _pair(comp_up=None, comp_wan=None, comp_down=None, optimizer=None, outer=None,
          shard_state=False, dgc_momentum=0.0, broadcast='downlink', stream=None,
          prox_mu=0.0, adoption=False, control=None, send='gradient'):
  """(mesh step, its mesh, its state; vmap step, its 1 x 1 mesh, its state): the same
  initial state placed for each path."""
  net = models.get_model('mlp', 10)
  params = jax.tree.map(np.array, net.init(jax.random.PRNGKey(0),
                                           jnp.zeros((1, 8, 8, 1)))['params'])
  leaves = jax.tree.leaves(params)
  make = lambda f: [(f or base.identity)(l.shape) for l in leaves]
  comps = step_lib.Compressors(make(comp_up), make(comp_down), make(comp_wan))
  optimizer = optimizer or optax.sgd(LR)
  outer = outer or optax.sgd(1.0)
  state = step_lib.init_state(params, optimizer, outer, comps, D, W, jax.random.PRNGKey(1),
                              shard_state=shard_state, dgc_momentum=dgc_momentum > 0,
                              broadcast=broadcast, stream=stream, scaffold=control is not None,
                              send=send)
  state = jax.tree.map(np.asarray, state)
  apply_fn = lambda p, x: net.apply({'params': p}, x)
  out = []
  for mode, mesh in (('mesh', mesh_lib.make_mesh(D, W)),
                     ('vmap', mesh_lib.make_mesh(1, 1, jax.devices()[:1]))):
    placed = jax.device_put(state, step_lib.state_shardings(mesh, state))
    fn = step_lib.make_step(apply_fn, optimizer, outer, comps, mesh, placed,
                            dgc.Options(momentum=dgc_momentum), prox_mu=prox_mu,
                            stream=stream, mode=mode, shape=(D, W), adoption=adoption,
                            scaffold=control)
    out.append((fn, mesh, placed))
  return out


def _run(fn, mesh, state, xs, ys, actives, weights, rounds):
  """Runs the iterations; returns the state and every iteration's host metrics."""
  ms = []
  for t in range(len(xs)):
    w = np.asarray(weights[t] if np.ndim(weights) >= 2 and len(weights) == len(xs)
                   else weights, np.float32)
    state, m = fn(state, (put(mesh, xs[t], 'dc', 'worker'), put(mesh, ys[t], 'dc', 'worker')),
                  put(mesh, np.asarray(actives[t]), 'dc'), put(mesh, w), rounds[t])
    key = step_lib.program_key(rounds[t])
    agg, adopt = (w[0], w[1]) if w.ndim == 2 else (w, None)
    ms.append(step_lib.host_metrics(fn.info[key], np.asarray(m),
                                    np.asarray(actives[t]) > 0, agg, adopt))
  return state, ms


def _compare(pair, steps, actives=None, weights=(0.5, 0.5), rounds=None, seed=0,
             bitwise=False, atol=ATOL):
  """Runs both paths on the same batches; asserts they agree; returns (a, b) states."""
  (fa, ma, sa), (fb, mb, sb) = pair
  xs, ys = step_batches(steps, seed=seed)
  actives = actives or [[True, True]] * steps
  rounds = rounds or [(t + 1) % 2 == 0 for t in range(steps)]
  start = np.asarray(jax.tree.leaves(sa.params)[0])  # the steps donate their state
  a, metrics_a = _run(fa, ma, sa, xs, ys, actives, weights, rounds)
  b, metrics_b = _run(fb, mb, sb, xs, ys, actives, weights, rounds)
  # The state: same structure and shapes as the mesh path's, values to float32 rounding.
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b)):
    x, y = np.asarray(x), np.asarray(y)
    where = jax.tree_util.keystr(path)
    assert x.shape == y.shape and x.dtype == y.dtype, (where, x.shape, y.shape)
    if bitwise or not np.issubdtype(x.dtype, np.floating):
      np.testing.assert_array_equal(x, y, err_msg=where)
    else:
      np.testing.assert_allclose(x, y, rtol=RTOL, atol=atol, err_msg=where)
  # Metrics: bits and flags exactly, loss and drift to rounding.
  for t, (p, q) in enumerate(zip(metrics_a, metrics_b)):
    for k in p:
      if np.issubdtype(np.asarray(p[k]).dtype, np.integer):
        np.testing.assert_array_equal(p[k], q[k], err_msg=f'iteration {t}: {k}')
      else:
        np.testing.assert_allclose(p[k], q[k], rtol=RTOL, atol=ATOL,
                                   err_msg=f'iteration {t}: {k}')
  assert fa.info == fb.info
  # Not vacuous: the parameters moved away from the start.
  assert not np.allclose(np.asarray(jax.tree.leaves(a.params)[0]), start)
  return a, b


def test_identity_links_equal_the_mesh_path():
  a, _ = _compare(_pair(), 4)
  assert int(a.step) == 4


TOPK = lambda s: sparse.topk(s, 0.05)


@pytest.mark.slow  # ~30 s each (compilation of 4 programs) on the shared 2-core CPU
@pytest.mark.parametrize('wan', ['co3', 'qsgd'])
def test_topk_uplink_with_co3_or_qsgd_wan(wan):
  # QSGD: bitwise (see BITWISE); CO3's encoder reduces over each leaf in its own order
  # under vmap (measured: 1.5e-8 apart after 4 iterations).
  _compare(_pair(comp_up=TOPK, comp_wan=_registered(wan)), 4, weights=(0.3, 0.7),
           bitwise=wan == 'qsgd')


def test_zero1_sharded_adam():
  """ZeRO-1 (reduce-scattered identity uplink, sharded Adam state, parameter
  all-gather). Adam divides by sqrt(v) + eps: where a gradient entry is near 0 its
  rounding difference is magnified (up to lr / eps times), so atol 1e-5 (measured:
  8e-7 after 4 iterations)."""
  pair = _pair(optimizer=optax.adam(1e-2), shard_state=True,
               outer=optax.sgd(0.7, momentum=0.9, nesterov=True))
  a, _ = _compare(pair, 4, atol=1e-5)
  assert isinstance(a.opt_state, step_lib.ShardedOptState)


def test_workers_send_their_adam_update_through_top_k():
  """compression.send='update': per-worker Adam state (leaves [D, W, ...]) under vmap
  as on the mesh; Adam's rounding magnification as in test_zero1_sharded_adam. Adam's
  first steps are ±lr wherever |g| >> eps, so top-k would choose among ties by rounding:
  eps of the gradients' size spreads the magnitudes."""
  pair = _pair(comp_up=TOPK, comp_down=TOPK, optimizer=optax.adam(1e-2, eps=1e-3),
               send='update')
  a, _ = _compare(pair, 4, atol=1e-5)
  assert isinstance(a.opt_state, step_lib.WorkerOptState)


def test_dgc_momentum_with_clipping():
  pair = _pair(comp_up=TOPK, dgc_momentum=0.9)
  _compare(pair, 4, bitwise=True)  # BITWISE


@pytest.mark.slow  # ~25 s
def test_semi_sync_masks_with_fednova_weights_and_prox():
  actives = [[True, False], [True, True], [False, True], [True, True]]
  weights = [[0.5, 0.5], [0.7, 0.3], [0.5, 0.5], [0.25, 0.75]]  # FedNova-style, rescaled
  _compare(_pair(comp_up=TOPK, prox_mu=0.01), 4, actives=actives, weights=weights,
           bitwise=True)  # BITWISE


def test_lr_scaled_dcs_and_an_absent_dc():
  actives = [np.array([1.0, 0.5], np.float32), np.array([1.0, 0.0], np.float32)] * 2
  weights = [[0.5, 0.5], [1.0, 0.0]] * 2
  _compare(_pair(), 4, actives=actives, weights=weights)


def test_partial_participation_adoption():
  """A partial strategy's rounds (hfl.sync.strategies): DC 1 sits out and keeps its own
  model in the first round, DC 0 in the second."""
  weights = [np.zeros((2, 2)), [[1.0, 0.0], [1.0, 0.0]],
             np.zeros((2, 2)), [[0.0, 1.0], [0.0, 1.0]]]
  _compare(_pair(broadcast='gather', adoption=True), 4, weights=weights)


def test_scaffold_control_variates_with_semi_sync_masks():
  actives = [[True, False], [True, True], [True, False], [True, True]]
  _compare(_pair(control=scaffold_lib.spec((0.3, 0.7), LR)), 4, actives=actives,
           weights=(0.3, 0.7))


def test_lossy_downlink_broadcast_correction():
  _compare(_pair(comp_down=_registered('e3m0'), comp_wan=_registered('bf16')), 4)


def test_streaming_diloco_events():
  net = models.get_model('mlp', 10)
  params = net.init(jax.random.PRNGKey(0), jnp.zeros((1, 8, 8, 1)))['params']
  spec = streaming.Spec(streaming.partition(params, 2), 0.5, True)
  pair = _pair(outer=optax.sgd(0.7, momentum=0.9, nesterov=True), stream=spec,
               comp_wan=_registered('e3m0'))
  events = [streaming.event_at(t + 1, 2, 2, 1) for t in range(6)]
  assert any(e.sync >= 0 for e in events) and any(e.merge >= 0 for e in events)
  _compare(pair, 6, rounds=events)


# Every registered compressor on the uplink and the WAN (the same spec on both); each
# compiles 4 programs (5-50 s here), so all but identity are slow.
@pytest.mark.parametrize('name', [
    n if n == 'identity' else pytest.param(n, marks=pytest.mark.slow)
    for n in registry.distinct_names()])
def test_every_registered_compressor(name):
  make = _registered(name)
  _compare(_pair(comp_up=make, comp_wan=make), 2)


# ------------------------------------------------------------------ selection and runs


def test_auto_picks_vmap_only_without_enough_devices():
  assert mesh_lib.step_mode('auto', 2, 4, device_count=8) == 'mesh'
  assert mesh_lib.step_mode('auto', 2, 4, device_count=1) == 'vmap'
  assert mesh_lib.step_mode('auto', 4, 4, device_count=8) == 'vmap'
  assert mesh_lib.step_mode('devices', 2, 4, device_count=1) == 'mesh'
  assert mesh_lib.step_mode('vmap', 2, 4, device_count=8) == 'vmap'
  with pytest.raises(ValueError, match='mesh.simulate'):
    mesh_lib.step_mode('gpu', 2, 4)


def test_bad_simulate_names_the_field():
  from configs import default  # pylint: disable=g-import-not-at-top
  from hfl import config as config_lib  # pylint: disable=g-import-not-at-top
  c = default.get_config()
  c.mesh.simulate = 'one_device'
  with pytest.raises(ValueError, match="mesh.simulate='one_device' is unknown"):
    config_lib.validate(c, paths=False)


def test_an_older_config_resumes_with_auto():
  """A config.json from before mesh.simulate: 'auto', which picks the device mesh
  wherever the run could start before (and the default config's value: no diff)."""
  assert workdir_lib.upgrade_config({'mesh': {'num_dcs': 2, 'workers_per_dc': 4}})['mesh'][
      'simulate'] == 'auto'


@pytest.mark.slow
def test_smoke_run_vmap_equals_devices(fake_data, tmp_path):
  """train_and_evaluate end to end (rounds, evaluation, checkpoints) in both modes:
  the same bytes, rounds, iterations and simulated clock exactly; accuracy and loss
  to float32 rounding of the trained model."""
  from hfl import train  # pylint: disable=g-import-not-at-top
  from tests.helpers import smoke_config  # pylint: disable=g-import-not-at-top
  runs = {mode: train.train_and_evaluate(
      smoke_config(fake_data, **{'mesh.simulate': mode}), str(tmp_path / mode))
          for mode in ('devices', 'vmap')}
  a, b = runs['devices'], runs['vmap']
  for key in ('bytes', 'sim_time_s', 'inter_dc_rounds', 'intra_dc_iterations'):
    assert a[key] == b[key], key
  for key in ('final_test_accuracy', 'best_test_accuracy'):
    assert abs(a[key] - b[key]) <= 1 / 160 + 1e-9, key  # at most one of 160 test images
  np.testing.assert_allclose(a['final_test_loss'], b['final_test_loss'], rtol=1e-4)
