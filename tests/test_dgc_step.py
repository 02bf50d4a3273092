"""DGC options in the training step (Lin et al., ICLR 2018) against a numpy loop."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from configs import default
from hfl import config as config_lib
from hfl import mesh as mesh_lib, models, step as step_lib, train
from hfl import setup as setup_lib
from hfl.compress import base, dgc, policy, sparse
from hfl import workdir as workdir_lib
from tests import helpers
from tests.helpers import smoke_config

D, W, B = 2, 4, 4
LR = 0.1
DENSITY = 0.05


def _put(mesh, x, *spec):
  return jax.device_put(x, NamedSharding(mesh, P(*spec)))


def _dgc_setup(momentum, clip_norm):
  mesh = mesh_lib.make_mesh(D, W)
  net = models.get_model('mlp', 10)
  params = net.init(jax.random.PRNGKey(0), jnp.zeros((1, 8, 8, 1)))['params']
  params = jax.tree.map(np.array, params)
  # Kernels: exact top-k; biases: dense float32 (lossless).
  up = [sparse.topk(l.shape, DENSITY) if l.ndim == 2 else base.identity(l.shape)
        for l in jax.tree.leaves(params)]
  ident = [base.identity(l.shape) for l in jax.tree.leaves(params)]
  comps = step_lib.Compressors(up, ident, ident)
  opt, outer = optax.sgd(LR), optax.sgd(1.0)
  state = step_lib.init_state(params, opt, outer, comps, D, W, jax.random.PRNGKey(1),
                              dgc_momentum=momentum > 0)
  state = jax.device_put(state, step_lib.state_shardings(mesh, state))
  apply_fn = lambda p, x: net.apply({'params': p}, x)
  fn = step_lib.make_step(apply_fn, opt, outer, comps, mesh, state,
                          dgc.Options(momentum=momentum, clip_norm=clip_norm))
  return mesh, params, apply_fn, state, fn


def _numpy_dgc(params, apply_fn, xs, ys, momentum, clip_norm):
  """Per DC: W workers with DGC momentum correction, clipping, top-k + masking; SGD."""
  leaves0, treedef = jax.tree.flatten(params)
  out = []
  for d in range(D):
    x = [np.array(l, np.float64) for l in leaves0]
    u = [[np.zeros_like(l) for l in x] for _ in range(W)]
    v = [[np.zeros_like(l) for l in x] for _ in range(W)]
    for t in range(len(xs)):
      sent_sum = [np.zeros_like(l) for l in x]
      for w in range(W):
        g = helpers.float64_grad(apply_fn, treedef, x, xs[t, d, w], ys[t, d, w])
        if clip_norm > 0:
          norm = np.sqrt(sum(np.sum(a * a) for a in g))
          g = [a * min(1.0, clip_norm / np.sqrt(W) / norm) for a in g]
        for i, a in enumerate(g):
          u[w][i] = momentum * u[w][i] + a
          v[w][i] = v[w][i] + u[w][i]
          if a.ndim == 2:  # top-k of |v|, then momentum factor masking of u and v
            flat = v[w][i].reshape(-1)
            k = sparse.num_kept(flat.size, DENSITY)
            idx = np.argsort(-np.abs(flat), kind='stable')[:k]
            sent = np.zeros_like(flat)
            sent[idx] = flat[idx]
            sent = sent.reshape(a.shape)
            uf = u[w][i].reshape(-1).copy()
            uf[idx] = 0
            u[w][i] = uf.reshape(a.shape)
          else:  # dense, lossless: everything sent, u keeps its momentum
            sent = v[w][i]
          v[w][i] = v[w][i] - sent
          sent_sum[i] += sent
      x = [xi - LR * s / W for xi, s in zip(x, sent_sum)]
    out.append((x, u, v))
  return treedef, out


@pytest.mark.parametrize('momentum,clip_norm', [(0.9, 0.0), (0.9, 0.5)])
def test_dgc_momentum_correction_matches_numpy(momentum, clip_norm):
  mesh, params, apply_fn, state, fn = _dgc_setup(momentum, clip_norm)
  rng = np.random.default_rng(11)
  steps = 3
  xs = rng.normal(size=(steps, D, W, B, 8, 8, 1)).astype(np.float32)
  ys = rng.integers(0, 10, size=(steps, D, W, B)).astype(np.int32)
  for t in range(steps):
    state, m = fn(state, (_put(mesh, xs[t], 'dc', 'worker'), _put(mesh, ys[t], 'dc', 'worker')),
                  _put(mesh, np.ones(D, bool), 'dc'),
                  _put(mesh, np.full(D, 0.5, np.float32)), False)
  treedef, ref = _numpy_dgc(params, apply_fn, xs, ys, momentum, clip_norm)
  for d, (x, u, v) in enumerate(ref):
    got = [np.asarray(l[d]) for l in jax.tree.leaves(state.params)]
    for a, b in zip(got, x):
      np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4)
    got_u = [np.asarray(l[d]) for l in jax.tree.leaves(state.dgc_velocity)]
    # A lossless leaf keeps no residual (None): numpy's v must be zero there.
    got_v = [np.zeros((W,) + np.shape(p)) if r is None else np.asarray(r)[d]
             for p, r in zip(jax.tree.leaves(params),
                             jax.tree.structure(params).flatten_up_to(state.up.residual))]
    for i in range(len(x)):
      for w in range(W):
        np.testing.assert_allclose(got_u[i][w], u[w][i], atol=2e-5, rtol=1e-4)
        np.testing.assert_allclose(got_v[i][w], v[w][i], atol=2e-5, rtol=1e-4)
  # The masking really happened (sent coordinates zeroed) and momentum is non-trivial.
  kern = np.asarray(jax.tree.leaves(state.dgc_velocity)[1][0, 0])
  assert 0 < np.mean(kern == 0) < 0.5
  leaves = jax.tree.leaves(params)
  k_bits = sum(sparse.num_kept(l.size, DENSITY)
               * (32 + 8 * jnp.dtype(sparse.index_dtype(l.size)).itemsize)
               if l.ndim == 2 else l.size * 32 for l in leaves)
  m = step_lib.host_metrics(fn.info[False], np.asarray(m), np.ones(D, bool))
  assert m['up_bits'][0] == W * k_bits


def test_dgc_off_keeps_state_small_and_momentum_without_velocity_fails():
  mesh, params, apply_fn, state, fn = _dgc_setup(0.0, 0.0)
  assert state.dgc_velocity == () and not jax.tree.leaves(state.dgc_velocity)
  with pytest.raises(ValueError, match='init_state'):
    step_lib.make_step(apply_fn, optax.sgd(LR), optax.sgd(1.0),
                       step_lib.Compressors(*([[base.identity(l.shape)
                                                for l in jax.tree.leaves(params)]] * 3)),
                       mesh, state, dgc.Options(momentum=0.9))


def _config(**dgc_fields):
  c = default.get_config()
  c.optimizer.name = 'sgd'
  c.compression.uplink.name = 'topk'
  c.compression.dgc.update(dgc_fields)
  return c


def test_dgc_config_validation():
  config_lib.validate(_config(momentum=0.9, clip_norm=1.0, warmup_steps=100))
  c = _config(momentum=0.9)
  c.optimizer.name = 'momentum'
  with pytest.raises(ValueError, match=r"optimizer\.name.*|compression\.dgc\.momentum") as e:
    config_lib.validate(c)
  assert 'optimizer.name' in str(e.value) and 'compression.dgc.momentum' in str(e.value)
  with pytest.raises(ValueError, match=r'compression\.dgc\.momentum=1\.0'):
    config_lib.validate(_config(momentum=1.0))
  with pytest.raises(ValueError, match=r'compression\.dgc\.clip_norm'):
    config_lib.validate(_config(clip_norm=-1.0))
  with pytest.raises(ValueError, match=r'compression\.dgc\.num_stages'):
    config_lib.validate(_config(warmup_steps=10, num_stages=0))
  with pytest.raises(ValueError, match=r'compression\.dgc\.initial_density'):
    config_lib.validate(_config(warmup_steps=10, initial_density=0.0))
  c = _config(warmup_steps=10)
  c.compression.uplink.name = 'qsgd'
  with pytest.raises(ValueError, match=r'compression\.dgc\.warmup_steps=10.*uplink'):
    config_lib.validate(c)
  # A config without the section (older runs) is DGC-off.
  c = default.get_config()
  del c.compression['dgc']
  config_lib.validate(c)
  assert setup_lib.dgc_options(c) == dgc.Options()


@pytest.mark.slow
def test_warmup_switches_stages_and_wire_bits_follow_schedule(fake_data, tmp_path):
  steps, warm, stages = 10, 8, 4
  cfg = smoke_config(fake_data, **{
      'train.num_steps': steps, 'train.checkpoint_every': 0, 'sync.k': 1,
      'compression.uplink.name': 'topk', 'compression.uplink.density': 0.01,
      'compression.small_threshold': 1000,
      'compression.dgc.momentum': 0.9, 'compression.dgc.clip_norm': 5.0,
      'compression.dgc.warmup_steps': warm, 'compression.dgc.num_stages': stages,
      'compression.dgc.initial_density': 0.25})
  train.train_and_evaluate(cfg, str(tmp_path / 'run'))
  recs = [json.loads(l) for l in open(os.path.join(tmp_path / 'run', 'metrics.jsonl'))]
  assert [r['step'] for r in recs] == list(range(1, steps + 1))
  up = np.diff([0.0] + [r['bytes']['intra_up'] for r in recs])
  s = setup_lib.setup(cfg)
  expect = []
  for t in range(steps):
    comps = setup_lib.build_compressors(cfg, s.params_shape, t)
    expect.append(D * W * sum(policy.static_bits(c) for c in comps.up) / 8)
  np.testing.assert_array_equal(up, expect)
  # k follows 0.25 -> 0.01 exponentially over 4 stages of 2 steps, then stays at 0.01.
  big = [l for l in jax.tree.leaves(s.params_shape) if l.size >= 1000 and len(l.shape) >= 2]
  for t in range(steps):
    stage = min(stages, t * stages // warm)
    density = 0.25 * (0.01 / 0.25)**(stage / stages)
    comps = setup_lib.build_compressors(cfg, s.params_shape, t)
    ks = [c.name for c in comps.up if c.name.startswith('topk')]
    assert ks == [f'topk({dgc.warmup_density(t, 0.01, warm, 0.25, stages):g})'] * len(big)
    assert np.isclose(dgc.warmup_density(t, 0.01, warm, 0.25, stages), density)
  assert len(set(up.tolist())) == stages + 1
  assert all(a > b for a, b in zip(up[0:warm:2], up[2:warm + 1:2]))


def test_run_started_before_the_dgc_section_still_resumes(tmp_path):
  c = default.get_config()
  workdir = helpers.pinned_workdir_without(tmp_path, c, 'compression', 'dgc')
  workdir_lib.check_workdir_config(workdir, c)  # same config, DGC off: accepted
  c.compression.dgc.momentum = 0.9
  with pytest.raises(ValueError, match=r'compression\.dgc\.momentum'):
    workdir_lib.check_workdir_config(workdir, c)
