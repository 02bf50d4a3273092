"""ZeRO-1 optimizer state sharding (``optimizer.shard_state``).

Sharded and unsharded training must give the same model (the optimizers are
elementwise, so updating slices is the same computation), each device must hold
1/W of its DC's optimizer state, a sharded run must resume from its checkpoints,
and bad configs must fail with a clear error.
"""

import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import default
from hfl import config as config_lib
from hfl import mesh as mesh_lib, models, step as step_lib, train
from hfl.compress import base, dgc, sparse
from hfl import workdir as workdir_lib
from tests.helpers import B, D, W, step_batches as _batches, run_steps as _run
from tests import helpers
from tests.helpers import crash_then_resume, final_state, mlp_identity, smoke_config

assert D == 2 and W == 4 and B


def _topk(shape):
  return sparse.topk(shape, 0.05)


def _topk_large_bf16_small(shape):
  """Mixed precision: top-k for kernels, bf16 (a lossy linear cast) for biases."""
  return _topk(shape) if len(shape) == 2 else base.cast(shape, jnp.bfloat16)


def _build(optimizer, up, down, shard, model='mlp'):
  mesh = mesh_lib.make_mesh(D, W)
  net = models.get_model(model, 10)
  params = net.init(jax.random.PRNGKey(0), jnp.zeros((1, 8, 8, 1)))['params']
  params = jax.tree.map(np.array, params)
  leaves = jax.tree.leaves(params)
  comps = step_lib.Compressors([up(l.shape) for l in leaves], [down(l.shape) for l in leaves],
                               [base.identity(l.shape) for l in leaves])
  outer = optax.sgd(1.0)
  state = step_lib.init_state(params, optimizer, outer, comps, D, W, jax.random.PRNGKey(1),
                              shard_state=shard)
  state = jax.device_put(state, step_lib.state_shardings(mesh, state))
  fn = step_lib.make_step(lambda p, x: net.apply({'params': p}, x), optimizer, outer, comps,
                          mesh, state)
  return mesh, params, state, fn


def _unshard_opt(sharded, like):
  """Rebuilds [D, ...] optimizer-state leaves from their [D, W, chunk] slices."""
  def leaf(s, u):
    s, u = np.asarray(s), np.asarray(u)
    if s.ndim == 2:  # a scalar (step count): the same on every worker
      assert (s == s[:, :1]).all()
      return s[:, 0]
    return s.reshape(D, -1)[:, :u[0].size].reshape(u.shape)
  return jax.tree.map(leaf, sharded.inner, like)


# name: (optimizer, uplink, downlink, steps, K (a round every K steps), DC 1 active)
CASES = {
    'momentum_identity_k3': (lambda: optax.sgd(0.1, momentum=0.9), base.identity,
                             base.identity, 6, 3, None),
    'adam_identity_k2': (lambda: optax.adam(1e-2), base.identity, base.identity, 6, 2, None),
    'sgd_sync_k1': (lambda: optax.sgd(0.1), base.identity, base.identity, 3, 1, None),
    # Weight decay reads the parameters: the slices must line up with the state's.
    'adamw_topk_both_k2': (lambda: optax.adamw(1e-2, weight_decay=0.1), _topk, _topk, 6, 2,
                           None),
    'nesterov_l2_topk_bf16_up_k3': (
        lambda: optax.chain(optax.add_decayed_weights(1e-2),
                            optax.sgd(0.1, momentum=0.9, nesterov=True)),
        _topk_large_bf16_small, base.identity, 6, 3, None),
    # Semi-synchronous masking: DC 1 runs 2 of every 3 iterations.
    'adam_semi_sync_masked_k3': (lambda: optax.adam(1e-2), base.identity, base.identity, 6, 3,
                                 [True, True, False]),
}


@pytest.mark.parametrize('name', sorted(CASES))
def test_sharded_training_equals_unsharded(name):
  make_opt, up, down, steps, k, dc1 = CASES[name]
  xs, ys = _batches(steps, seed=13)
  rounds = [(t + 1) % k == 0 for t in range(steps)]
  active = [[True, True if dc1 is None else dc1[t % k]] for t in range(steps)]
  weights = np.array([0.4, 0.6], np.float32)
  out = {}
  for shard in (False, True):
    mesh, params, state, fn = _build(make_opt(), up, down, shard)
    out[shard] = _run(mesh, fn, state, xs, ys, active, weights, rounds)
  (ref, m_ref), (got, m_got) = out[False], out[True]
  assert step_lib.is_sharded(got) and not step_lib.is_sharded(ref)
  tol = dict(atol=1e-6, rtol=1e-5)
  chex.assert_trees_all_close(got.params, ref.params, **tol)
  chex.assert_trees_all_close(got.global_params, ref.global_params, **tol)
  chex.assert_trees_all_close(got.up.residual, ref.up.residual, **tol)
  chex.assert_trees_all_close(got.down.residual, ref.down.residual, **tol)
  chex.assert_trees_all_close(_unshard_opt(got.opt_state, ref.opt_state),
                              jax.tree.map(np.asarray, ref.opt_state), **tol)
  np.testing.assert_allclose(m_got['loss'], m_ref['loss'], rtol=1e-6)
  np.testing.assert_array_equal(got.local_steps, ref.local_steps)
  # Not trivially equal: the model moved.
  assert not np.allclose(got.global_params['Dense_0']['kernel'], params['Dense_0']['kernel'])


def _device_bytes(tree, device):
  return sum(s.data.nbytes for a in jax.tree.leaves(tree) for s in a.addressable_shards
             if s.device == device)


def test_each_device_holds_one_wth_of_the_optimizer_state():
  _, params, ref, _ = _build(optax.adam(1e-3), base.identity, base.identity, False)
  mesh, _, got, _ = _build(optax.adam(1e-3), base.identity, base.identity, True)
  sizes = {l.size for l in jax.tree.leaves(params)}
  for a in jax.tree.leaves(got.opt_state):
    assert a.sharding.spec == jax.sharding.PartitionSpec('dc', 'worker')
    shard_shapes = {s.data.shape for s in a.addressable_shards}
    assert len(shard_shapes) == 1
    (shape,) = shard_shapes
    if a.ndim == 2:   # adam's step count
      assert shape == (1, 1)
    else:
      assert shape[:2] == (1, 1) and any(shape[2] == -(-n // W) for n in sizes)
  # mu and nu of every leaf: per device, 1/W of the unsharded (replicated) state,
  # plus < W padding entries per leaf and the per-worker step counts.
  dev = jax.devices()[0]
  full, part = _device_bytes(ref.opt_state, dev), _device_bytes(got.opt_state, dev)
  n_leaves = len(jax.tree.leaves(params))
  n = sum(l.size for l in jax.tree.leaves(params))
  assert full == 2 * 4 * n + 4
  assert full / W <= part < full / W + 2 * 4 * W * n_leaves + 4
  # The device at mesh position (d, w) holds DC d's slice w, whole (no replication).
  mu = got.opt_state.inner[0].mu['Dense_0']['kernel']
  assert len(mu.addressable_shards) == D * W
  for s in mu.addressable_shards:
    (d, w), = np.argwhere(mesh.devices == s.device)
    assert s.index == (slice(d, d + 1), slice(w, w + 1), slice(None))


def test_make_step_refuses_dgc_momentum_with_sharded_state():
  mesh = mesh_lib.make_mesh(D, W)
  net, params, comps = mlp_identity(8)
  opt = optax.sgd(0.1)
  state = jax.eval_shape(lambda: step_lib.init_state(
      params, opt, opt, comps, D, W, jax.random.PRNGKey(1), dgc_momentum=True,
      shard_state=True))
  with pytest.raises(ValueError, match='shard_state=False'):
    step_lib.make_step(lambda p, x: net.apply({'params': p}, x), opt, opt, comps, mesh, state,
                       dgc.Options(momentum=0.9))


# ---------------------------------------------------------------------------
# Config and the training loop.
# ---------------------------------------------------------------------------

def test_config_errors_name_the_field():
  c = default.get_config()
  assert c.optimizer.shard_state is False
  config_lib.validate(c)
  c.optimizer.shard_state = True
  config_lib.validate(c)
  bad = default.get_config()
  del bad.optimizer['shard_state']
  config_lib.validate(bad)   # absent: off (configs written before the field)
  bad.optimizer.shard_state = 'yes'
  with pytest.raises(ValueError, match=r"optimizer.shard_state='yes' must be True or False"):
    config_lib.validate(bad)
  c.optimizer.name = 'sgd'
  c.compression.dgc.momentum = 0.9
  with pytest.raises(ValueError, match=r'optimizer.shard_state=True cannot be combined with '
                                       r'compression.dgc.momentum=0.9'):
    config_lib.validate(c)


def test_older_run_without_the_field_resumes(tmp_path):
  """A workdir whose config.json predates optimizer.shard_state counts it as False."""
  c = default.get_config()
  workdir = helpers.pinned_workdir_without(tmp_path, c, 'optimizer', 'shard_state')
  assert workdir_lib.check_workdir_config(workdir, c) == []
  c.optimizer.shard_state = True
  with pytest.raises(ValueError, match=r'optimizer.shard_state: False -> True'):
    workdir_lib.check_workdir_config(workdir, c)


@pytest.mark.slow
def test_sharded_run_matches_unsharded_and_resumes_bitwise(fake_data, tmp_path, monkeypatch):
  cfg = {'optimizer.name': 'adam', 'optimizer.learning_rate': 0.01, 'sync.k': 3,
         'train.num_steps': 9}
  plain, ref_dir, cut_dir = (str(tmp_path / n) for n in ('plain', 'ref', 'cut'))
  s_plain = train.train_and_evaluate(smoke_config(fake_data, **cfg), plain)
  cfg['optimizer.shard_state'] = True
  s_ref = train.train_and_evaluate(smoke_config(fake_data, **cfg), ref_dir)

  s_cut = crash_then_resume(lambda: smoke_config(fake_data, **cfg), cut_dir, monkeypatch, 5)

  _, a = final_state(ref_dir)
  _, b = final_state(cut_dir)
  chex.assert_trees_all_equal(a, b)
  for key in ('final_test_accuracy', 'bytes', 'sim_time_s', 'inter_dc_rounds'):
    assert s_cut[key] == s_ref[key], key
  # The checkpoint holds the sharded layout: [D, W, chunk] per parameter leaf.
  _, p = final_state(plain)
  n_w = {l.size for l in jax.tree.leaves(p['global_params'])}
  mu = jax.tree.leaves(b['opt_state'])
  assert {x.shape[:2] for x in mu} == {(D, W)}
  assert {x.shape[2] for x in mu if x.ndim == 3} == {-(-n // W) for n in n_w}
  # The same model as the unsharded run; more intra-DC bytes (the all-gather).
  chex.assert_trees_all_close(a['global_params'], p['global_params'], atol=1e-6, rtol=1e-5)
  assert s_ref['final_test_accuracy'] == pytest.approx(s_plain['final_test_accuracy'], abs=1e-3)
  n = sum(l.size for l in jax.tree.leaves(p['global_params']))
  assert s_plain['bytes']['intra_up'] == 9 * D * W * n * 4
  assert s_ref['bytes']['intra_up'] > s_plain['bytes']['intra_up'] * (1 + 1 / W) - 1
  assert s_ref['bytes']['inter_dc'] == s_plain['bytes']['inter_dc']
