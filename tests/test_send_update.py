"""compression.send='update' (hfl.step.worker_update): each worker runs Adam on its own
gradient and sends the update through top-k links with error feedback at both ends,
against a float64 numpy loop; its config checks; and SGD's closed form."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from configs import default
from hfl import config as config_lib
from hfl import mesh as mesh_lib, models, step as step_lib
from hfl import workdir as workdir_lib
from hfl.compress import base, sparse
from tests import helpers

D, W, B = 2, 4, 4
LR = 0.01
DENSITY = 0.05
STEPS = 3
# Adam's first steps are ±LR wherever |g| >> eps, which would make top-k a tie-break;
# an eps of the gradients' size spreads the update magnitudes.
EPS = 1e-3


def _put(mesh, x, *spec):
  return jax.device_put(x, NamedSharding(mesh, P(*spec)))


def _run(optimizer, kernel_comp, send, xs, ys):
  """STEPS iterations (no round) of the MLP on D x W workers; kernels through
  ``kernel_comp`` on the uplink and the PS downlink, biases dense float32."""
  mesh = mesh_lib.make_mesh(D, W)
  net = models.get_model('mlp', 10)
  params = jax.tree.map(np.array,
                        net.init(jax.random.PRNGKey(0), jnp.zeros((1, 8, 8, 1)))['params'])
  links = [kernel_comp(l.shape) if l.ndim == 2 else base.identity(l.shape)
           for l in jax.tree.leaves(params)]
  ident = [base.identity(l.shape) for l in jax.tree.leaves(params)]
  comps = step_lib.Compressors(links, links, ident)
  outer = optax.sgd(1.0)
  state = step_lib.init_state(params, optimizer, outer, comps, D, W, jax.random.PRNGKey(1),
                              send=send)
  state = jax.device_put(state, step_lib.state_shardings(mesh, state))
  apply_fn = lambda p, x: net.apply({'params': p}, x)
  fn = step_lib.make_step(apply_fn, optimizer, outer, comps, mesh, state)
  for t in range(STEPS):
    state, _ = fn(state, (_put(mesh, xs[t], 'dc', 'worker'), _put(mesh, ys[t], 'dc', 'worker')),
                  _put(mesh, np.ones(D, bool), 'dc'), _put(mesh, np.full(D, 0.5, np.float32)),
                  False)
  return params, apply_fn, state


def _batches(seed=7):
  rng = np.random.default_rng(seed)
  xs = rng.normal(size=(STEPS, D, W, B, 8, 8, 1)).astype(np.float32)
  ys = rng.integers(0, 10, size=(STEPS, D, W, B)).astype(np.int32)
  return xs, ys


def _topk(v):
  """Exact top-k by magnitude of a float64 array (numpy), hfl.compress.sparse's k."""
  flat = v.reshape(-1)
  idx = np.argsort(-np.abs(flat), kind='stable')[:sparse.num_kept(flat.size, DENSITY)]
  out = np.zeros_like(flat)
  out[idx] = flat[idx]
  return out.reshape(v.shape)


def _numpy_reference(params, apply_fn, xs, ys, b1=0.9, b2=0.999, eps=EPS):
  """Per DC: each worker's Adam (Kingma & Ba 2015, Algorithm 1, its own moments) on its
  gradient; uplink p = u + e_w, sent = top-k(p), e_w = p - sent; the PS averages the
  sent updates; downlink q = mean + e_ps, d = top-k(q), e_ps = q - d; x <- x + d.
  Biases: dense (sent whole, no residual)."""
  leaves0, treedef = jax.tree.flatten(params)
  out = []
  for d in range(D):
    x = [np.array(l, np.float64) for l in leaves0]
    zeros = lambda: [np.zeros_like(l) for l in x]
    m, v, e = ([zeros() for _ in range(W)] for _ in range(3))
    e_ps = zeros()
    for t in range(STEPS):
      total = zeros()
      for w in range(W):
        g = helpers.float64_grad(apply_fn, treedef, x, xs[t, d, w], ys[t, d, w])
        for i, a in enumerate(g):
          m[w][i] = b1 * m[w][i] + (1 - b1) * a
          v[w][i] = b2 * v[w][i] + (1 - b2) * a * a
          mhat, vhat = m[w][i] / (1 - b1**(t + 1)), v[w][i] / (1 - b2**(t + 1))
          p = -LR * mhat / (np.sqrt(vhat) + eps) + e[w][i]
          sent = _topk(p) if a.ndim == 2 else p
          e[w][i] = p - sent
          total[i] += sent
      for i in range(len(x)):
        q = total[i] / W + e_ps[i]
        dn = _topk(q) if x[i].ndim == 2 else q
        e_ps[i] = q - dn
        x[i] = x[i] + dn
    out.append((x, m, v, e, e_ps))
  return treedef, out


def test_workers_adam_then_topk_both_ways_matches_numpy():
  xs, ys = _batches()
  params, apply_fn, state = _run(optax.adam(LR, eps=EPS), lambda s: sparse.topk(s, DENSITY),
                                 'update',
                                 xs, ys)
  assert isinstance(state.opt_state, step_lib.WorkerOptState)
  treedef, ref = _numpy_reference(params, apply_fn, xs, ys)
  adam = state.opt_state.inner[0]  # optax.ScaleByAdamState: count, mu, nu ([D, W, ...])
  assert np.asarray(adam.count).shape == (D, W)
  np.testing.assert_array_equal(np.asarray(adam.count), STEPS)
  up_res = treedef.flatten_up_to(state.up.residual)
  down_res = treedef.flatten_up_to(state.down.residual)
  for d, (x, m, v, e, e_ps) in enumerate(ref):
    for i, (got, want) in enumerate(zip(jax.tree.leaves(state.params), x)):
      # Adam's steps are O(LR) per coordinate whatever the gradient: float32 rounding of
      # three of them and of the parameters (|x| < 1) stays far below 1e-6.
      np.testing.assert_allclose(np.asarray(got[d]), want, atol=2e-6, rtol=0)
      for w in range(W):
        np.testing.assert_allclose(np.asarray(jax.tree.leaves(adam.mu)[i][d, w]), m[w][i],
                                   rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(np.asarray(jax.tree.leaves(adam.nu)[i][d, w]), v[w][i],
                                   rtol=1e-4, atol=1e-10)
        if up_res[i] is not None:
          np.testing.assert_allclose(np.asarray(up_res[i][d, w]), e[w][i], atol=2e-6, rtol=0)
      if down_res[i] is not None:
        np.testing.assert_allclose(np.asarray(down_res[i][d]), e_ps[i], atol=2e-6, rtol=0)
  # The workers' states really differ (each fed its own gradient), and top-k kept most
  # of every kernel's update in the residual.
  mu = np.asarray(jax.tree.leaves(adam.mu)[1])
  assert not np.allclose(mu[0, 0], mu[0, 1])
  assert np.mean(np.asarray(up_res[1]) != 0) > 0.5


def test_sgd_update_is_the_gradient_pipeline_up_to_rounding():
  """Plain SGD is linear: each worker sending −lr g_w, averaged, equals every worker
  applying −lr to the averaged gradient (lossless links)."""
  xs, ys = _batches(3)
  ident = lambda s: base.identity(s)
  _, _, a = _run(optax.sgd(0.1), ident, 'update', xs, ys)
  _, _, b = _run(optax.sgd(0.1), ident, 'gradient', xs, ys)
  for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-6, rtol=0)


def test_state_checks():
  params = {'w': np.zeros((4, 3), np.float32)}
  comps = step_lib.Compressors(*([[base.identity((4, 3))]] * 3))
  with pytest.raises(ValueError, match="send='weights'"):
    step_lib.init_state(params, optax.adam(LR), optax.sgd(1.0), comps, D, W,
                        jax.random.PRNGKey(0), send='weights')
  for extra in (dict(shard_state=True), dict(dgc_momentum=True)):
    with pytest.raises(ValueError, match='shard_state.*dgc_momentum'):
      step_lib.init_state(params, optax.adam(LR), optax.sgd(1.0), comps, D, W,
                          jax.random.PRNGKey(0), send='update', **extra)


def test_config_validation_names_the_field_before_compiling():
  c = default.get_config()
  c.compression.send = 'update'
  config_lib.validate(c)
  c.compression.send = 'updates'
  with pytest.raises(ValueError, match=r"compression\.send='updates' is unknown; allowed: "
                                       r'gradient, update'):
    config_lib.validate(c)
  c.compression.send = 'update'
  c.optimizer.shard_state = True
  with pytest.raises(ValueError, match=r'compression\.send.*optimizer\.shard_state'):
    config_lib.validate(c)
  c = default.get_config()
  c.compression.send = 'update'
  c.optimizer.name = 'sgd'
  c.compression.uplink.name = 'topk'
  c.compression.dgc.momentum = 0.9
  with pytest.raises(ValueError, match=r'compression\.send.*compression\.dgc\.momentum'):
    config_lib.validate(c)


def test_run_started_before_the_field_still_resumes(tmp_path):
  c = default.get_config()
  workdir = helpers.pinned_workdir_without(tmp_path, c, 'compression', 'send')
  workdir_lib.check_workdir_config(workdir, c)  # absent = 'gradient': accepted
  c.compression.send = 'update'
  with pytest.raises(ValueError, match=r'compression\.send'):
    workdir_lib.check_workdir_config(workdir, c)
