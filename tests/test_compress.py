"""Tests of hfl.compress against independent numpy references (small shapes, CPU)."""

import functools
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from hfl import compress as C
from hfl.compress import dgc
from hfl.compress import quantize
from hfl.compress import sparse

KEY = jax.random.PRNGKey(0)


# float32 unit roundoff. A float32 sum of n terms, in any order, is within
# (n - 1) U of the exact sum relative to the sum of the |terms| (Higham 2002,
# "Accuracy and Stability of Numerical Algorithms", eq. 4.4); XLA may sum in any
# order, so tolerances on float32 sums and norms below use that bound.
U = 2.0**-24


def _distinct(shape, seed=0):
  """float32 values with distinct magnitudes (no ties), random signs and order."""
  rng = np.random.default_rng(seed)
  size = int(np.prod(shape))
  mags = (np.arange(1, size + 1, dtype=np.float64) / size + 0.01) * 3.0
  signs = rng.choice([-1.0, 1.0], size)
  return (rng.permutation(mags) * signs).astype(np.float32).reshape(shape)


def _roundtrip(c, x, key=KEY, state=None):
  state = c.init() if state is None else state
  payload, state = jax.jit(c.encode)(jnp.asarray(x), state, key)
  return payload, jax.jit(c.decode)(payload), state


ALL = {
    'identity': lambda s: C.identity(s),
    'bf16': lambda s: C.cast(s, jnp.bfloat16),
    'fp16': lambda s: C.cast(s, jnp.float16),
    'topk': lambda s: C.topk(s, 0.1),
    'topk_thr': lambda s: C.topk(s, 0.1, threshold_variant=True),
    'randk': lambda s: C.randk(s, 0.1),
    'qsgd': lambda s: C.qsgd(s, 4, bucket_size=None),
    'sign': lambda s: C.sign(s),
    'powersgd': lambda s: C.powersgd(s, 2),
}

# ------------------------------------------------------------------------------ top-k


@pytest.mark.parametrize('threshold_variant', [False, True])
@pytest.mark.parametrize('shape,density', [((64, 50), 0.05), ((300, 400), 0.01),
                                           ((256, 256), 0.02)])
def test_topk_matches_numpy(shape, density, threshold_variant):
  x = _distinct(shape, seed=1)
  c = C.topk(shape, density, threshold_variant=threshold_variant)
  payload, xh, _ = _roundtrip(c, x)
  size = x.size
  k = max(1, min(size, math.floor(density * size + 0.5)))
  assert payload['values'].shape == (k,) and payload['indices'].shape == (k,)
  assert payload['indices'].dtype == (np.uint16 if size <= 65536 else np.int32)
  ref = np.argpartition(-np.abs(x.ravel()), k - 1)[:k]
  np.testing.assert_array_equal(np.sort(np.asarray(payload['indices'], np.int64)),
                                np.sort(ref))
  want = np.zeros(size, np.float32)
  want[ref] = x.ravel()[ref]
  np.testing.assert_array_equal(np.asarray(xh), want.reshape(shape))
  # density achieved == configured
  assert np.count_nonzero(np.asarray(xh)) == k
  assert abs(k / size - density) <= 0.5 / size + 1e-12


def test_topk_threshold_plan_used_and_fallback():
  """The large-leaf threshold path is exercised, and its fallback (all zeros) is exact."""
  shape = (200_000,)
  assert sparse._threshold_plan(200_000, sparse.num_kept(200_000, 0.01)) is not None
  c = C.topk(shape, 0.01, threshold_variant=True)
  x = _distinct(shape, seed=3)
  payload, _, _ = _roundtrip(c, x)
  k = payload['indices'].shape[0]
  ref = np.argpartition(-np.abs(x), k - 1)[:k]
  np.testing.assert_array_equal(np.sort(np.asarray(payload['indices'])), np.sort(ref))
  # all zeros: estimate useless (every entry is a candidate) -> exact fallback, no NaN
  payload, xh, _ = _roundtrip(c, np.zeros(shape, np.float32))
  assert len(np.unique(np.asarray(payload['indices']))) == k
  assert np.all(np.asarray(xh) == 0)
  # many ties at the threshold: still exactly k distinct indices
  xt = np.ones(shape, np.float32)
  xt[:10] = 5.0
  payload, xh, _ = _roundtrip(c, xt)
  assert len(np.unique(np.asarray(payload['indices']))) == k
  assert np.count_nonzero(np.asarray(xh)) == k


@pytest.mark.parametrize('make', [
    lambda s: C.topk(s, 1.0), lambda s: C.topk(s, 1e-9),
    lambda s: C.topk(s, 0.5, threshold_variant=True), lambda s: C.randk(s, 1.0),
    lambda s: C.randk(s, 1e-9)])
@pytest.mark.parametrize('shape', [(1,), (1, 1), (3, 2)])
def test_sparse_degenerate_k(make, shape):
  c = make(shape)
  x = _distinct(shape)
  payload, xh, _ = _roundtrip(c, x)
  k = payload['indices'].shape[0]
  assert 1 <= k <= x.size
  assert len(np.unique(np.asarray(payload['indices']))) == k
  if k == x.size:
    np.testing.assert_array_equal(np.asarray(xh), x)
  _, xz, _ = _roundtrip(c, np.zeros(shape, np.float32))
  assert np.all(np.asarray(xz) == 0)


# ----------------------------------------------------------------------------- random-k


@pytest.mark.parametrize('shape,density', [((50, 40), 0.1), ((100, 100), 0.3),
                                           ((7, 3), 0.5)])
def test_randk_distinct_and_values(shape, density):
  c = C.randk(shape, density)
  x = _distinct(shape)
  k = C.num_kept(x.size, density)
  seen = set()
  for i in range(5):
    payload, xh, _ = _roundtrip(c, x, key=jax.random.PRNGKey(i))
    idx = np.asarray(payload['indices'], np.int64)
    assert idx.shape == (k,) and len(np.unique(idx)) == k
    assert idx.min() >= 0 and idx.max() < x.size
    want = np.zeros(x.size, np.float32)
    want[idx] = x.ravel()[idx]
    np.testing.assert_array_equal(np.asarray(xh).ravel(), want)
    seen.add(tuple(np.sort(idx)))
  assert len(seen) > 1  # different keys -> different subsets


def test_randk_uniform_and_unbiased():
  shape = (10, 10)
  c = C.randk(shape, 0.2, unbiased=True)
  x = np.ones(shape, np.float32)
  enc = jax.jit(jax.vmap(lambda k: c.decode(c.encode(jnp.asarray(x), (), k)[0])))
  xs = np.asarray(enc(jax.random.split(KEY, 4000)))
  np.testing.assert_allclose(xs.mean(0), x, atol=0.2)  # E = x; each coord kept w.p. 0.2
  np.testing.assert_allclose((xs != 0).mean(0), 0.2, atol=0.04)


# --------------------------------------------------------------------------------- QSGD


def _np_qsgd_levels(x, s):
  """Numpy reference: the two candidate levels floor/ceil(|x|/||x|| s)."""
  r = np.abs(x) / np.linalg.norm(x) * s
  return np.floor(r), np.ceil(r)


@pytest.mark.parametrize('levels', [1, 4, 16])
def test_qsgd_levels_and_unbiased(levels):
  shape = (13, 7)
  x = _distinct(shape, seed=2)
  c = C.qsgd(shape, levels)
  payload, xh, _ = _roundtrip(c, x)
  nb = C.level_bits(levels)
  assert payload['codes'].dtype == np.uint8
  assert payload['codes'].shape == (1 + nb, math.ceil(x.size / 8))
  # ||x||^2 summed in float32 (x.size terms, each squared with one rounding), then sqrt.
  np.testing.assert_allclose(float(payload['norm'][0]), np.linalg.norm(x), rtol=x.size * U)
  lo, hi = _np_qsgd_levels(x, levels)
  lvl = np.abs(np.asarray(xh)) / np.linalg.norm(x) * levels
  assert np.all((np.abs(lvl - lo) < 1e-4) | (np.abs(lvl - hi) < 1e-4))
  nz = np.asarray(xh) != 0
  assert np.all(np.sign(np.asarray(xh))[nz] == np.sign(x)[nz])
  # unbiased: mean over many keys ~ x
  dec = jax.jit(jax.vmap(lambda k: c.decode(c.encode(jnp.asarray(x), (), k)[0])))
  mean = np.asarray(dec(jax.random.split(KEY, 4000))).mean(0)
  err = np.abs(mean - x).max() / np.linalg.norm(x)
  assert err < 0.05 / math.sqrt(levels), err


def test_qsgd_at_the_most_levels_stays_within_a_level_and_unbiased():
  s = quantize.MAX_LEVELS
  shape = (13, 7)
  x = _distinct(shape, seed=3)
  c = C.qsgd(shape, s)
  dec = jax.jit(jax.vmap(lambda k: c.decode(c.encode(jnp.asarray(x), (), k)[0])))
  out = np.asarray(dec(jax.random.split(KEY, 1000)), np.float64)
  norm = np.linalg.norm(x)
  # Each decode is within one level (norm / s) of x, up to float32 rounding of the
  # decoded value (|x| * 2**-23) and of the norm (x.size terms).
  step = norm / s
  assert np.all(np.abs(out - x) <= step + np.abs(x) * (x.size + 2) * U)
  # Unbiased: the mean of 1000 draws is within 6 standard errors of the mean of a
  # level draw (<= step / 2 / sqrt(1000)), plus the same float32 rounding.
  tol = 6 * step / 2 / math.sqrt(1000) + np.abs(x) * (x.size + 2) * U
  assert np.all(np.abs(out.mean(0) - x) <= tol)


def test_qsgd_buckets_and_zero():
  shape = (10, 10)
  c = C.qsgd(shape, 8, bucket_size=30)
  x = _distinct(shape)
  payload, xh, _ = _roundtrip(c, x)
  assert payload['norm'].shape == (4,)
  np.testing.assert_allclose(np.asarray(payload['norm'][:3]),
                             np.linalg.norm(x.ravel()[:90].reshape(3, 30), axis=1),
                             rtol=30 * U)
  _, xz, _ = _roundtrip(c, np.zeros(shape, np.float32))
  assert np.all(np.asarray(xz) == 0) and np.all(np.isfinite(np.asarray(xz)))


# --------------------------------------------------------------------------------- sign


@pytest.mark.parametrize('shape', [(1,), (3, 5), (17, 9)])
def test_sign_matches_numpy(shape):
  x = _distinct(shape)
  x.ravel()[0] = 0.0  # sign(0) must be a definite sign (+1)
  c = C.sign(shape)
  payload, xh, _ = _roundtrip(c, x)
  assert payload['signs'].dtype == np.uint8
  assert payload['signs'].shape == (math.ceil(x.size / 8),)
  np.testing.assert_array_equal(
      np.asarray(payload['signs']), np.packbits(x.ravel() >= 0))
  want = np.mean(np.abs(x.astype(np.float64))) * np.where(x >= 0, 1.0, -1.0)
  # mean |x| summed in float32 ((n - 1) U), divided and multiplied (2 U).
  np.testing.assert_allclose(np.asarray(xh), want, rtol=(x.size + 1) * U)
  assert set(np.unique(np.sign(np.asarray(xh)))) <= {-1.0, 1.0} or np.all(x == 0)
  _, xz, _ = _roundtrip(c, np.zeros(shape, np.float32))
  assert np.all(np.asarray(xz) == 0)


def test_pack_roundtrip():
  rng = np.random.default_rng(0)
  for n in (1, 7, 8, 9, 100):
    b = rng.random((3, n)) < 0.5
    p = C.pack_bits(jnp.asarray(b))
    np.testing.assert_array_equal(np.asarray(p), np.packbits(b, axis=-1))
    np.testing.assert_array_equal(np.asarray(C.unpack_bits(p, n)), b)


# ----------------------------------------------------------------------------- PowerSGD


@pytest.mark.parametrize('shape,rank', [((20, 12), 2), ((3, 3, 4, 8), 3), ((5, 2), 4)])
def test_powersgd_one_iteration_vs_numpy(shape, rank):
  x = _distinct(shape)
  c = C.powersgd(shape, rank)
  st = c.init()
  q0 = np.asarray(st.q)
  m, n = C.matrix_shape(shape)
  r = min(rank, m, n)
  assert q0.shape == (n, r)
  payload, xh, st = _roundtrip(c, x, state=st)
  mat = x.reshape(m, n).astype(np.float64)
  p_hat = np.linalg.qr(mat @ q0)[0]
  q = mat.T @ p_hat
  np.testing.assert_allclose(np.asarray(xh).reshape(m, n), p_hat @ q.T, atol=1e-4)
  assert payload['p'].shape == (m, r) and payload['q'].shape == (n, r)
  # warm start: the state holds this step's Q
  np.testing.assert_allclose(np.abs(np.asarray(st.q)), np.abs(q), atol=1e-4)
  # rank >= true rank -> exact after the warm-started iterations on a low-rank M
  low = (np.arange(m)[:, None] * 0.1 + 1) * (np.arange(n)[None] * 0.2 - 1)
  low = low.astype(np.float32).reshape(shape)
  st = c.init()
  for _ in range(3):
    _, xh, st = _roundtrip(c, low, state=st)
  np.testing.assert_allclose(np.asarray(xh), low, atol=1e-4)


def test_powersgd_zero_gradient_recovers():
  c = C.powersgd((8, 6), 2)
  st = c.init()
  _, xz, st = _roundtrip(c, np.zeros((8, 6), np.float32), state=st)
  assert np.all(np.asarray(xz) == 0)
  assert np.all(np.isfinite(np.asarray(st.q))) and np.any(np.asarray(st.q) != 0)
  x = _distinct((8, 6))
  _, xh, _ = _roundtrip(c, x, state=st)
  assert np.linalg.norm(np.asarray(xh)) > 0


# -------------------------------------------------------------------- edge cases, wire bits


@pytest.mark.parametrize('name', sorted(ALL))
@pytest.mark.parametrize('shape', [(1,), (1, 1), (4, 3)])
def test_edge_cases_finite(name, shape):
  c = ALL[name](shape)
  for x in (np.zeros(shape, np.float32), _distinct(shape)):
    payload, xh, _ = _roundtrip(c, x)
    assert xh.shape == shape and xh.dtype == jnp.float32
    assert np.all(np.isfinite(np.asarray(xh)))
    for leaf in jax.tree.leaves(payload):
      if jnp.issubdtype(leaf.dtype, jnp.floating):
        assert np.all(np.isfinite(np.asarray(leaf, np.float32)))
    if not x.any():
      assert np.all(np.asarray(xh) == 0)


def _hand_bits(name, shape):
  size = int(np.prod(shape))
  m, n = C.matrix_shape(shape)
  k = C.num_kept(size, 0.1)
  idx_bits = 16 if size <= 65536 else 32
  return {
      'identity': 32 * size, 'bf16': 16 * size, 'fp16': 16 * size,
      'topk': k * (32 + idx_bits), 'topk_thr': k * (32 + idx_bits),
      'randk': k * (32 + idx_bits),
      'qsgd': 32 + (1 + 3) * 8 * math.ceil(size / 8),  # s=4 -> 3 level bits + sign
      'sign': 32 + 8 * math.ceil(size / 8),
      'powersgd': 32 * min(2, m, n) * (m + n),
  }[name]


@pytest.mark.parametrize('name', sorted(ALL))
@pytest.mark.parametrize('shape', [(5, 7), (300, 300)])
def test_wire_bits_hand_count(name, shape):
  c = ALL[name](shape)
  payload, _, _ = _roundtrip(c, _distinct(shape))
  bits = c.wire_bits(payload)
  assert type(bits) is int and bits == _hand_bits(name, shape)  # exact, never float
  assert C.static_bits(c) == _hand_bits(name, shape)


@pytest.mark.parametrize('name', sorted(ALL))
def test_linear_flag(name):
  assert ALL[name]((4, 4)).linear == (name in ('identity', 'bf16', 'fp16'))


# ------------------------------------------------------------------------ error feedback


@pytest.mark.parametrize('name', ['topk', 'topk_thr', 'randk', 'qsgd', 'sign',
                                  'powersgd', 'fp16'])
def test_error_feedback_conserves_sum(name):
  shape = (16, 12)
  c = ALL[name](shape)
  step = jax.jit(functools.partial(C.ef_step, c))
  e = jnp.zeros(shape)
  st = c.init()
  sent = np.zeros(shape, np.float64)
  total = np.zeros(shape, np.float64)
  rng = np.random.default_rng(0)
  for t in range(6):
    g = rng.normal(size=shape).astype(np.float32)
    payload, e_new, st = step(jnp.asarray(g), e, st, jax.random.PRNGKey(t))
    dec = np.asarray(c.decode(payload), np.float64)
    if name != 'fp16':
      assert np.abs(np.asarray(e_new)).max() > 0  # lossy step leaves a residual
    # the residual is added back: p = g + e
    np.testing.assert_allclose(dec + np.asarray(e_new), g + np.asarray(e), atol=1e-5)
    e = e_new
    sent += dec
    total += g
  np.testing.assert_allclose(sent + np.asarray(e), total, atol=1e-4)


def test_error_feedback_decay_and_tree():
  shapes = {'a': jnp.zeros((8, 8)), 'b': jnp.zeros((3,))}
  cs = C.build({'name': 'topk', 'density': 0.1}, shapes, 0, 'float32')
  xs = jax.tree.map(lambda s: jnp.ones(s.shape), shapes)
  res = jax.tree.map(lambda s: jnp.full(s.shape, 2.0), shapes)
  payloads, new_res, _ = jax.jit(
      lambda x, r: C.tree_ef_step(cs, x, r, [c.init() for c in cs], KEY, decay=0.5)
  )(xs, res)
  # p = 1 + 0.5 * 2 = 2 everywhere; top-k keeps 6 of 64 of 'a'; 'b' is dense (identity,
  # lossless): it sends x = 1 itself and passes its residual through untouched.
  assert np.count_nonzero(np.asarray(new_res['a'])) == 64 - 6
  np.testing.assert_allclose(np.asarray(new_res['b']), 2.0)
  np.testing.assert_allclose(np.asarray(cs[1].decode(payloads[1])), 1.0)
  bits = [c.wire_bits(p) for c, p in zip(cs, payloads)]
  assert all(type(b) is int for b in bits) and sum(bits) == 6 * 48 + 3 * 32


# ----------------------------------------------------------------------------- aggregation


def test_aggregate_decodes_each_payload():
  shape = (6, 5)
  w = 4
  c = C.sign(shape)
  xs = [_distinct(shape, seed=i) for i in range(w)]
  payloads = [c.encode(jnp.asarray(x), (), KEY)[0] for x in xs]
  gathered = jax.tree.map(lambda *a: jnp.stack(a), *payloads)
  got = jax.jit(lambda g: C.aggregate(c, g, w))(gathered)
  want = np.mean([np.mean(np.abs(x.astype(np.float64))) * np.where(x >= 0, 1, -1)
                  for x in xs], 0)
  # Each worker's scale: a float32 mean of x.size terms; then a float32 mean of the W
  # decoded values, of mixed signs: bounded relative to the mean of |decoded|.
  scale = np.mean([np.mean(np.abs(x.astype(np.float64))) for x in xs])
  np.testing.assert_allclose(np.asarray(got), want, rtol=0,
                             atol=(xs[0].size + 1 + w + 1) * U * scale)


@pytest.mark.parametrize('w', [3, 8, 64, 512])
def test_fp16_payloads_are_added_in_float32(w):
  """W fp16 payloads at the format's edge, decoded one by one and added in float32
  with weights: no overflow, no clipping (the old 16-bit sum had to clip each
  summand to 65504 / (W (1 + 2^-11)^(W - 1)))."""
  shape = (4, 4)
  c = C.cast(shape, jnp.float16)
  x = np.full(shape, 65504.0, np.float32)
  x[0, 0] = -65504.0
  x[1, 1] = 60000.0
  payload = jax.jit(lambda v: c.encode(v, (), KEY)[0])(jnp.asarray(x))
  gathered = jax.tree.map(lambda a: jnp.stack([a] * w), payload)
  assert gathered['values'].dtype == jnp.float16
  np.testing.assert_array_equal(np.asarray(jax.jit(lambda g: C.aggregate(c, g, w))(gathered)), x)
  weights = np.random.default_rng(0).uniform(size=w).astype(np.float32)
  got = np.asarray(jax.jit(lambda g, v: C.aggregate(c, g, w, v))(gathered, weights))
  np.testing.assert_allclose(got, x * weights.astype(np.float64).sum(), rtol=(w + 1) * 2.0**-24)


@pytest.mark.parametrize('dtype', [jnp.float16, jnp.bfloat16])
def test_casts_saturate_finite_values_and_keep_non_finite_ones(dtype):
  """A finite value beyond the format's max saturates (never inf: bf16's max is below
  float32's); inf and NaN stay inf and NaN."""
  big = float(jnp.finfo(dtype).max)
  c = C.cast((5,), dtype)
  x = jnp.array([np.finfo(np.float32).max, -np.finfo(np.float32).max, np.inf, np.nan, 1.0],
                jnp.float32)
  got = np.asarray(c.decode(c.encode(x, (), KEY)[0]))
  np.testing.assert_array_equal(got[[0, 1, 4]], [big, -big, 1.0])
  assert got[2] == np.inf and np.isnan(got[3])


# --------------------------------------------------------------------------------- policy


def _spec(**kw):
  d = ml_collections.ConfigDict()
  d.name = 'topk'
  d.density = 0.01
  d.levels = 16
  d.rank = 2
  d.threshold_variant = False
  d.update(kw)
  return d


SHAPES = {'bias': jax.ShapeDtypeStruct((512,), jnp.float32),
          'big': jax.ShapeDtypeStruct((256, 512), jnp.float32),
          'small2d': jax.ShapeDtypeStruct((8, 8), jnp.float32),
          'conv': jax.ShapeDtypeStruct((3, 3, 64, 64), jnp.float32)}


@pytest.mark.parametrize('name,prefix', [('identity', 'identity'), ('bf16', 'bfloat16'),
                                         ('fp16', 'float16'), ('topk', 'topk'),
                                         ('randk', 'randk'), ('qsgd', 'qsgd'),
                                         ('sign', 'sign'), ('powersgd', 'powersgd')])
@pytest.mark.parametrize('small', ['float32', 'bfloat16', 'float16'])
def test_policy_by_size_and_ndim(name, prefix, small):
  cs = C.build(_spec(name=name), SHAPES, 1000, small, field='compression.uplink')
  leaves = jax.tree.leaves(SHAPES)
  assert len(cs) == len(leaves)
  small_name = {'float32': 'identity', 'bfloat16': 'bfloat16', 'float16': 'float16'}
  for leaf, c in zip(leaves, cs):
    assert c.shape == leaf.shape
    big = leaf.ndim >= 2 and leaf.size >= 1000
    assert c.name.startswith(prefix if big else small_name[small]), (leaf, c.name)
  text = C.describe(cs, SHAPES)
  assert "['conv']" in text and 'bits/entry' in text


def test_policy_hyper_passed():
  cs = C.build(_spec(name='topk', density=0.1, threshold_variant=True),
               {'w': jnp.zeros((100, 100))}, 0, 'float32')
  assert cs[0].name == 'topk_thr(0.1)'
  cs = C.build(_spec(name='qsgd', levels=3), {'w': jnp.zeros((10, 10))}, 0, 'float32')
  assert cs[0].name == 'qsgd(s=3,d=100)'  # default bucket 512, capped at the leaf size
  cs = C.build(_spec(name='qsgd', levels=3, bucket_size=20), {'w': jnp.zeros((10, 10))}, 0,
               'float32')
  assert cs[0].name == 'qsgd(s=3,d=20)'
  cs = C.build(_spec(name='powersgd', rank=4), {'w': jnp.zeros((10, 10))}, 0, 'float32')
  assert cs[0].name == 'powersgd(r=4)'


@pytest.mark.parametrize('shape,rank,compressed', [
    ((10, 10), 4, True),    # 4 * 20 = 80 < 100 entries
    ((10, 10), 5, False),   # 5 * 20 = 100: the factors are as large as the leaf
    ((3, 3, 1, 8), 8, False),  # (9, 8), r clipped to 8: 136 > 72
    ((3, 3, 16, 32), 2, True),
])
def test_powersgd_sends_dense_where_factors_would_not_be_smaller(shape, rank, compressed):
  c = C.build(_spec(name='powersgd', rank=rank), {'w': jnp.zeros(shape)}, 0, 'float32')[0]
  m, n = C.matrix_shape(shape)
  dense_bits = 32 * m * n
  if compressed:
    assert c.name == f'powersgd(r={rank})' and not c.lossless
    assert C.static_bits(c) == 32 * min(rank, m, n) * (m + n) < dense_bits
  else:
    assert c.lossless and c.name.startswith('identity') and 'powersgd' in c.name
    assert C.static_bits(c) == dense_bits
    x = _distinct(shape)
    _, xh, _ = _roundtrip(c, x)
    np.testing.assert_array_equal(np.asarray(xh), x)


@pytest.mark.parametrize('kw,match', [
    ({'name': 'nope'}, r"compression\.uplink\.name='nope'.*allowed:.*topk"),
    ({'density': 0.0}, r"compression\.uplink\.density=0\.0.*\(0, 1\]"),
    ({'density': 1.5}, r"compression\.uplink\.density=1\.5"),
    ({'name': 'randk', 'density': -0.1}, r'compression\.uplink\.density=-0\.1'),
    ({'name': 'qsgd', 'levels': 0}, r"compression\.uplink\.levels=0.*>= 1"),
    ({'name': 'qsgd', 'levels': 2**16 + 1}, r"compression\.uplink\.levels=65537.*at most 65536"),
    ({'name': 'qsgd', 'levels': 2**31}, r"compression\.uplink\.levels=2147483648.*at most"),
    ({'name': 'powersgd', 'rank': 0}, r"compression\.uplink\.rank=0.*>= 1"),
])
def test_policy_rejects_bad_spec(kw, match):
  with pytest.raises(ValueError, match=match):
    C.build(_spec(**kw), SHAPES, 1000, 'float32', field='compression.uplink')


@pytest.mark.parametrize('kw,message', [
    ({'gamma': 1.5}, 'compression.uplink.gamma=1.5: co3: gamma must be in [0, 1]'),
    ({'refit_every': 0}, 'compression.uplink.refit_every=0: co3: refit_every must be an int >= 1'),
    ({'coder': 'zip'}, "compression.uplink.coder='zip': co3: coder must be one of "
     "('huffman', 'ans')"),
    ({'fmt': 'e9m9'}, "compression.uplink.fmt='e9m9': co3: fmt is not a float format; "
     "allowed: 'fp4', 'fp8' or \"s,e,m\" bit counts such as \"1,2,1\""),
])
def test_policy_names_the_hyper_parameter_a_factory_refuses(kw, message):
  spec = _spec(name='co3', fmt='fp4', gamma=0.9, coder='huffman', refit_every=1)
  spec.update(kw)
  with pytest.raises(ValueError) as e:
    C.build(spec, SHAPES, 1000, 'float32', field='compression.uplink')
  assert str(e.value) == message


def test_policy_names_the_spec_when_the_error_is_not_about_one_hyper_parameter():
  def picky(shape, a=1, b=2):
    del shape
    raise ValueError('picky: a must be odd' if a % 2 == 0
                     else f'picky: a must be < b, got a={a}, b={b}')
  C.register('picky', picky, hyper=('a', 'b'))
  try:
    for kw, message in [
        ({'a': 2, 'b': 5}, 'compression.uplink.a=2: picky: a must be odd'),
        ({'a': 3, 'b': 2}, "compression.uplink (name='picky', a=3, b=2): picky: a must be "
         '< b, got a=3, b=2')]:
      with pytest.raises(ValueError) as e:
        C.build(dict(name='picky', **kw), SHAPES, 1000, 'float32', field='compression.uplink')
      assert str(e.value) == message
  finally:
    del C.REGISTRY['picky']


def test_policy_rejects_bad_small():
  with pytest.raises(ValueError, match=r"compression\.small='int8'.*float16"):
    C.build(_spec(), SHAPES, 1000, 'int8', field='compression.uplink')
  with pytest.raises(ValueError, match=r'compression\.small_threshold=-1'):
    C.build(_spec(), SHAPES, -1, 'float32', field='compression.uplink')


def test_policy_register_and_default_config():
  C.register('half_topk', lambda shape, density=0.5: C.topk(shape, density / 2),
             hyper=('density',))
  try:
    cs = C.build(_spec(name='half_topk', density=0.2), {'w': jnp.zeros((10, 10))}, 0,
                 'float32')
    assert cs[0].name == 'topk(0.1)'
  finally:
    del C.REGISTRY['half_topk']
  from configs import default  # pylint: disable=g-import-not-at-top
  cfg = default.get_config()
  cs = C.build(cfg.compression.uplink, SHAPES, cfg.compression.small_threshold,
               cfg.compression.small, field='compression.uplink')
  assert all(c.name == 'identity' for c in cs)


# ------------------------------------------------------------------------------------ DGC


def test_dgc_momentum_correction_vs_numpy():
  shape = (10, 10)
  m = 0.9
  c = C.topk(shape, 0.05)
  k = C.num_kept(100, 0.05)
  step = jax.jit(lambda g, s, key: dgc.dgc_step(c, g, s, (), key, m))
  st = dgc.init(shape)
  u = np.zeros(100)
  v = np.zeros(100)
  rng = np.random.default_rng(0)
  for t in range(8):
    g = rng.normal(size=shape).astype(np.float32)
    payload, st, _ = step(jnp.asarray(g), st, jax.random.PRNGKey(t))
    u = m * u + g.ravel()
    v = v + u
    sel = np.argpartition(-np.abs(v), k - 1)[:k]
    sent = np.zeros(100)
    sent[sel] = v[sel]
    np.testing.assert_allclose(np.asarray(c.decode(payload)).ravel(), sent,
                               rtol=1e-5, atol=1e-5)
    u[sel] = 0.0
    v[sel] = 0.0
    np.testing.assert_allclose(np.asarray(st.u).ravel(), u, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(st.v).ravel(), v, rtol=1e-5, atol=1e-5)


def test_dgc_clip_and_warmup():
  g = {'a': jnp.full((4,), 3.0), 'b': jnp.full((9,), 4.0 / 3)}  # norm sqrt(36+16)
  out = dgc.clip_local(g, max_norm=2.0, num_workers=4)  # threshold 1
  norm = np.sqrt(sum(float(jnp.sum(x * x)) for x in jax.tree.leaves(out)))
  np.testing.assert_allclose(norm, 1.0, rtol=1e-6)
  z = dgc.clip_local({'a': jnp.zeros(3)}, 1.0, 4)
  assert np.all(np.asarray(z['a']) == 0)
  ds = [dgc.warmup_density(s, 0.001, 400) for s in (0, 100, 200, 300, 400, 10_000)]
  want = [0.25 * 0.004**(i / 4) for i in range(5)] + [0.001]  # ~25, 6.25, 1.6, 0.4, 0.1 %
  np.testing.assert_allclose(ds, want, rtol=1e-12)
  assert dgc.warmup_density(5, 0.01, 0) == 0.01
  with pytest.raises(ValueError, match='final_density'):
    dgc.warmup_density(0, 0.0, 10)


def test_dense_leaves_pattern_keeps_matching_leaves_in_the_small_precision():
  """compression.dense_leaves: leaves whose keystr path matches skip the compressor (the
  small precision); others keep it; a bad expression names the field."""
  from hfl.compress import policy  # pylint: disable=g-import-not-at-top
  shapes = {'embedding': jax.ShapeDtypeStruct((65, 128), 'float32'),
            'dense': jax.ShapeDtypeStruct((128, 128), 'float32')}
  comps = policy.build({'name': 'topk', 'density': 0.02}, shapes, 0, 'bfloat16',
                       field='compression.uplink', dense_leaves='embed')
  names = dict(zip(sorted(shapes), [c.name for c in comps]))  # dict leaves: sorted keys
  assert names['embedding'] != names['dense'] and names['dense'].startswith('topk'), names
  plain = policy.build({'name': 'topk', 'density': 0.02}, shapes, 0, 'bfloat16')
  assert all(c.name.startswith('topk') for c in plain)
  with pytest.raises(ValueError, match=r'compression\.dense_leaves=.*regular expression'):
    policy.build({'name': 'topk', 'density': 0.02}, shapes, 0, 'bfloat16',
                 field='compression.uplink', dense_leaves='(')
