"""DeMo in hfl (issue 53): the dct_topk compressor (hfl/compress/dct.py), the signum
inner optimizer (hfl/optim.py) and configs/demo.py.

References are independent of hfl: scipy.fft's orthonormal DCT-II in float64, numpy's
stable argsort for top-k, and a plain numpy loop of DeMo's Algorithm 1 (Peng,
Quesnelle & Kingma, arXiv:2411.19870) for the worker update.
"""

import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
import scipy.fft

from configs import demo as demo_config
from hfl import config as config_lib
from hfl import models, optim
from hfl import setup as setup_lib
from hfl.compress import dct, ef, policy, registry

KEY = jax.random.PRNGKey(0)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ref_chunks(x, a, b):
  """float64 [R, C] -> list of ((row slice, col slice), a x b block), row-major."""
  r, c = x.shape
  return [((slice(i, i + a), slice(j, j + b)), x[i:i + a, j:j + b])
          for i in range(0, r, a) for j in range(0, c, b)]


def _ref_topk(x, a, b, k):
  """Per chunk: scipy's orthonormal 2-D DCT-II (float64), the k largest |coefficients|
  (stable: the lower row-major offset first among equals), and the reconstruction
  of the kept ones. Returns (offsets [n, k], values [n, k], decoded [R, C])."""
  offs, vals = [], []
  dec = np.zeros_like(x)
  for where, blk in _ref_chunks(x, a, b):
    y = scipy.fft.dctn(blk, type=2, norm='ortho').reshape(-1)
    o = np.argsort(-np.abs(y), kind='stable')[:k]
    offs.append(o)
    vals.append(y[o])
    kept = np.zeros_like(y)
    kept[o] = y[o]
    dec[where] = scipy.fft.idctn(kept.reshape(a, b), type=2, norm='ortho')
  return np.array(offs), np.array(vals), dec


def test_dct_matrix_is_scipys_orthonormal_dct_ii():
  for n in (1, 2, 5, 13, 64):
    d = dct.dct_matrix(n).astype(np.float64)
    ref = scipy.fft.dct(np.eye(n), type=2, norm='ortho', axis=0)
    np.testing.assert_allclose(d, ref, atol=1e-7)
    np.testing.assert_allclose(d @ d.T, np.eye(n), atol=1e-6)


@pytest.mark.parametrize('side,s,edge', [(128, 64, 64), (65, 64, 13), (512, 64, 64),
                                         (32, 64, 32), (67, 64, 1), (12, 8, 6), (10, 8, 5),
                                         (1, 64, 1)])
def test_chunk_edge_is_the_largest_divisor_at_most_s(side, s, edge):
  assert dct.chunk_edge(side, s) == edge


@pytest.mark.parametrize('shape,view', [((128, 512), (128, 512)), ((128, 4, 32), (512, 32)),
                                        ((4, 32, 128), (128, 128)), ((7,), (1, 7)), ((), (1, 1))])
def test_matrix_view(shape, view):
  assert dct.matrix_view(shape) == view


def test_round_trip_at_density_one_is_the_chunked_dct_and_its_inverse():
  x = np.random.default_rng(0).standard_normal((12, 20)).astype(np.float32)
  c = dct.dct_topk((12, 20), density=1.0, chunk_size=8)  # chunks 6 x 5
  payload, _ = c.encode(jnp.asarray(x), c.init(), KEY)
  assert set(payload) == {'values'}  # every coefficient, in order: no offsets
  ref = np.stack([scipy.fft.dctn(blk, norm='ortho').reshape(-1)
                  for _, blk in _ref_chunks(x.astype(np.float64), 6, 5)])
  np.testing.assert_allclose(np.asarray(payload['values']), ref, atol=2e-6)
  np.testing.assert_allclose(np.asarray(c.decode(payload)), x, atol=2e-6)


def test_topk_per_chunk_matches_numpy_with_an_all_zero_chunk():
  x = np.random.default_rng(1).standard_normal((12, 20)).astype(np.float32)
  x[6:12, 5:10] = 0.0  # chunk (1, 1), row-major chunk index 5: every coefficient ties at 0
  c = dct.dct_topk((12, 20), density=0.1, chunk_size=8)  # 6 x 5 chunks, k = 3
  payload, _ = c.encode(jnp.asarray(x), c.init(), KEY)
  off, vals, dec = _ref_topk(x.astype(np.float64), 6, 5, 3)
  assert payload['indices'].dtype == jnp.uint8
  np.testing.assert_array_equal(np.asarray(payload['indices']), off)
  np.testing.assert_allclose(np.asarray(payload['values']), vals, atol=2e-6)
  np.testing.assert_array_equal(np.asarray(payload['indices'])[5], [0, 1, 2])
  np.testing.assert_array_equal(np.asarray(payload['values'])[5], 0.0)
  decoded = np.asarray(c.decode(payload))
  np.testing.assert_allclose(decoded, dec, atol=2e-6)
  np.testing.assert_array_equal(decoded[6:12, 5:10], 0.0)


def test_ties_keep_the_lower_offset():
  rows = np.array([[1.0, -3.0, 3.0, 0.0, 3.0, -3.0],
                   [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
                   [2.0, -2.0, 5.0, -5.0, 2.0, 1.0]], np.float32)
  off, vals = dct.topk_per_chunk(jnp.asarray(rows), 3)
  ref = np.argsort(-np.abs(rows), axis=1, kind='stable')[:, :3]
  np.testing.assert_array_equal(np.asarray(off), ref)
  np.testing.assert_array_equal(np.asarray(vals), np.take_along_axis(rows, ref, axis=1))


@pytest.mark.parametrize('shape,chunk,density,bits', [
    # 2 x 8 chunks of 64 x 64, k = 32, uint16 offsets: 16 * 32 * (32 + 16)
    ((128, 512), 64, 32 / 4096, 16 * 32 * 48),
    # 65 = 5 x 13: 5 x 2 chunks of 13 x 64 = 832 entries, k = round(6.5) = 7, uint16
    ((65, 128), 64, 32 / 4096, 10 * 7 * 48),
    # (12, 10) with s = 8: 2 x 2 chunks of 6 x 5 = 30, k = round(1.5) = 2, uint8
    ((12, 10), 8, 0.05, 4 * 2 * 40),
    # (128, 4, 32) viewed as 512 x 32: 8 chunks of 64 x 32, k = 16, uint16
    ((128, 4, 32), 64, 32 / 4096, 8 * 16 * 48),
    # density 1: the dense coefficients alone, 32 bits each
    ((12, 10), 8, 1.0, 120 * 32),
])
def test_wire_bits_by_hand(shape, chunk, density, bits):
  c = dct.dct_topk(shape, density=density, chunk_size=chunk)
  assert policy.static_bits(c) == bits
  payload, _ = c.encode(jnp.zeros(shape, jnp.float32), c.init(), KEY)
  assert c.wire_bits(payload) == bits


def test_factory_and_spec_refusals_name_the_field():
  for kw, what in ((dict(density=0.0), 'density'), (dict(chunk_size=0), 'chunk_size'),
                   (dict(chunk_size=2.5), 'chunk_size'), (dict(gamma=1.5), 'gamma')):
    with pytest.raises(ValueError, match=what):
      dct.dct_topk((12, 10), **kw)
  with pytest.raises(ValueError, match=r'compression.uplink.gamma=1.5'):
    policy.build(dict(name='dct_topk', density=0.05, chunk_size=8, gamma=1.5),
                 jax.ShapeDtypeStruct((12, 10), jnp.float32), 0, 'float32',
                 field='compression.uplink')
  assert registry.example_spec('dct_topk')['name'] == 'dct_topk'


def test_a_chunk_near_float32_max_is_shrunk_to_a_finite_decode_and_residual():
  """Every entry +-3e38: the kept coefficients' norm exceeds float32's max, so they
  are scaled down (module docstring) and decode and residual stay finite."""
  rng = np.random.default_rng(2)
  x = np.where(rng.random((16, 16)) < 0.5, -3e38, 3e38).astype(np.float32)
  c = dct.dct_topk((16, 16), density=0.25, chunk_size=8)
  payload, residual, _ = ef.ef_step(c, jnp.asarray(x), jnp.zeros_like(x), c.init(), KEY)
  assert np.all(np.isfinite(np.asarray(payload['values'])))
  assert np.all(np.isfinite(np.asarray(c.decode(payload))))
  assert np.all(np.isfinite(np.asarray(residual)))


# ------------------------------------------------------------------ signum optimizer


def _opt_cfg(**kw):
  base = dict(name='signum', learning_rate=0.1, momentum=0.0, weight_decay=0.0)
  base.update(kw)
  return ml_collections.ConfigDict(base)


def test_signum_is_optax_sign_sgd_and_signum_with_decoupled_weight_decay():
  x = {'w': jnp.asarray([1.0, -2.0, 3.0, 0.5])}
  grads = [{'w': jnp.asarray([0.5, 0.0, -2.0, 1e-3])}, {'w': jnp.asarray([-1.0, 1.0, 1.0, -1.0])}]
  for mom, ref in ((0.0, optax.sign_sgd(0.1)), (0.9, optax.signum(0.1, beta=0.9))):
    ours = optim.make_optimizer(_opt_cfg(momentum=mom))
    s, r = ours.init(x), ref.init(x)
    for g in grads:
      u, s = ours.update(g, s, x)
      v, r = ref.update(g, r, x)
      np.testing.assert_array_equal(np.asarray(u['w']), np.asarray(v['w']))
  ours = optim.make_optimizer(_opt_cfg(weight_decay=0.5))
  u, _ = ours.update(grads[0], ours.init(x), x)
  want = -0.1 * (np.sign([0.5, 0.0, -2.0, 1e-3]) + 0.5 * np.asarray(x['w']))
  np.testing.assert_allclose(np.asarray(u['w']), want, rtol=1e-6)
  assert 'signum' in optim.ELEMENTWISE


def test_signum_refusals_name_the_field():
  with pytest.raises(ValueError, match='optimizer.momentum'):
    optim.make_optimizer(_opt_cfg(momentum=1.0))
  with pytest.raises(ValueError, match='optimizer.weight_decay'):
    optim.make_optimizer(_opt_cfg(weight_decay=-0.1))
  with pytest.raises(ValueError, match="optimizer.name='signsgd' is unknown.*signum"):
    optim.make_optimizer(_opt_cfg(name='signsgd'))


# ----------------------------------------------- one DeMo worker update vs Algorithm 1


def _demo_numpy(x0, grads_per_step, beta, lr, wd, a, b, k):
  """DeMo's Algorithm 1 in float64 numpy for W workers (grads_per_step[t][w]):
  m_w <- β m_w + g_w; q_w = IDCT(TopK_chunk(DCT(m_w))); m_w <- m_w - q_w;
  x <- x - lr (sign(mean_w q_w) + wd x). Returns (x, [m_w], min_t |mean_w q_w|)."""
  x = x0.astype(np.float64)
  mom = [np.zeros_like(x) for _ in grads_per_step[0]]
  smallest = np.full(x.shape, np.inf)
  for grads in grads_per_step:
    qs = []
    for w, g in enumerate(grads):
      mom[w] = beta * mom[w] + g
      _, _, q = _ref_topk(mom[w], a, b, k)
      mom[w] = mom[w] - q
      qs.append(q)
    mean_q = np.mean(qs, axis=0)
    smallest = np.minimum(smallest, np.abs(mean_q))
    x = x - lr * (np.sign(mean_q) + wd * x)
  return x, mom, smallest


@pytest.mark.parametrize('workers', [1, 2])
def test_two_demo_steps_match_algorithm_1(workers):
  """hfl's pieces as the step composes them (hfl.compress.ef.ef_step with the
  compressor state's β, ef.aggregate over the workers' gathered payloads, the
  signum optimizer with momentum 0) against the numpy loop, two steps."""
  shape, beta, lr, wd = (12, 20), 0.9, 0.01, 0.1
  rng = np.random.default_rng(3)
  x0 = rng.standard_normal(shape).astype(np.float32)
  grads = [[rng.standard_normal(shape).astype(np.float32) for _ in range(workers)]
           for _ in range(2)]
  x_ref, mom_ref, smallest = _demo_numpy(x0, grads, beta, lr, wd, 6, 5, 3)
  # sign(q) of an entry whose q is float32 rounding away from 0 may differ from
  # float64's: such entries (a handful) are left out of the comparison of x.
  settled = smallest > 1e-5
  assert settled.mean() > 0.97

  c = dct.dct_topk(shape, density=0.1, chunk_size=8, gamma=beta)  # 6 x 5 chunks, k = 3
  opt = optim.make_optimizer(_opt_cfg(name='signum', learning_rate=lr, momentum=0.0,
                                      weight_decay=wd))
  params = {'w': jnp.asarray(x0)}
  opt_state = opt.init(params)
  residual = [jnp.zeros(shape, jnp.float32) for _ in range(workers)]
  states = [c.init() for _ in range(workers)]
  for step_grads in grads:
    payloads = []
    for w, g in enumerate(step_grads):
      p, residual[w], states[w] = ef.ef_step(c, jnp.asarray(g), residual[w], states[w], KEY)
      payloads.append(p)
    gathered = jax.tree.map(lambda *leaves: jnp.stack(leaves), *payloads)
    mean_q = ef.aggregate(c, gathered, workers)
    updates, opt_state = opt.update({'w': mean_q}, opt_state, params)
    params = optax.apply_updates(params, updates)
  np.testing.assert_allclose(np.asarray(params['w'])[settled], x_ref[settled], atol=1e-6)
  for w in range(workers):
    np.testing.assert_allclose(np.asarray(residual[w]), mom_ref[w], atol=1e-5)


# ------------------------------------------------------------------- configs/demo.py


def test_demo_config_is_valid_and_is_demo_in_hfl_terms():
  c = demo_config.get_config()
  config_lib.validate(c, paths=False)  # the data may be absent here (a clone elsewhere)
  assert (c.mesh.num_dcs, c.optimizer.name, c.optimizer.momentum) == (1, 'signum', 0.0)
  up = c.compression.uplink
  assert (up.name, up.chunk_size, up.density * 4096, up.gamma) == ('dct_topk', 64, 32.0, 0.999)
  assert c.compression.downlink.name == 'identity'


def test_docs_quote_the_bytes_per_step_of_the_lm():
  """docs/demo.md's bytes per worker and iteration are the registry's wire bits of
  configs/demo.py on the LM (65 characters), as its command prints them."""
  c = demo_config.get_config()
  shapes = jax.eval_shape(lambda: models.from_config(c.model, 65).init(
      jax.random.PRNGKey(0), jnp.zeros((1, 128), jnp.int32)))['params']
  comps = setup_lib.build_compressors(c, shapes)
  up = sum(policy.static_bits(x) for x in comps.up) // 8
  down = sum(policy.static_bits(x) for x in comps.down) // 8
  leaves = jax.tree.leaves(shapes)
  one_d = 4 * sum(x.size for x in leaves if len(x.shape) < 2)
  workers = c.mesh.workers_per_dc
  with open(os.path.join(REPO, 'docs', 'demo.md'), encoding='utf-8') as f:
    doc = f.read()
  assert f'prints `{up} {down}`' in doc
  assert down == 4 * sum(x.size for x in leaves)
  for value in (up, down, one_d, (workers - 1) * up, round(2 * (workers - 1) / workers * down),
                20 * workers * up, (20 + 2) * workers * down):
    assert f'{value:,} B' in doc, value
  assert f'{down / up:.1f}× fewer' in doc
  assert f'{(down - one_d) / (up - one_d):.1f}× fewer' in doc
