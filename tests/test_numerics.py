"""Numerics of the compressors at float32's edges (issue 51, faults 2 and 4).

Fault 2: every compressor that computes a norm or a scale must give, for every
finite input up to float32's max, a finite payload, a finite decode and a finite
residual ``x - decode``, compiled and eager alike (pre-scaling by a power of two
of the max-abs, as BLAS ``nrm2`` does: :mod:`hfl.compress.base`).

Fault 4: error feedback with memory weight 0 (CO3's and chunked top-k's ``gamma``,
an explicit ``decay = 0``) must not feed anything back, not even a non-finite
residual (0 * NaN = NaN).

References are independent of hfl: numpy in float64 (which holds float32's max
squared) for norms and means.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hfl.compress import base, co3, dgc, ef, gennorm, minifloat, policy, quantize, registry

KEY = jax.random.PRNGKey(7)
F32_MAX = float(np.finfo(np.float32).max)
# float32 unit roundoff. A float32 sum of n terms, in any order, is within (n - 1) U
# of the exact sum relative to the sum of the |terms| (Higham 2002, "Accuracy and
# Stability of Numerical Algorithms", eq. 4.4); a square root adds <= U and halves
# the relative error of its argument.
U = 2.0**-24

SHAPE = (32, 40)  # 1280 entries: 3 QSGD buckets of 512 (the last one padded)


def _mixed(kind, shape=SHAPE, seed=0):
  """float32 ``shape``: small normal values (sd 1e-3) with large finite entries.

  kind: 'e30' (+-1e30 entries), 'e38' (+-3e38 and 1e30 in one bucket and spread),
  'max' (+-float32 max), 'all' (every entry +-3e38), 'tiny' (every entry ~1e-30,
  whose squares underflow).
  """
  rng = np.random.default_rng(seed)
  x = (rng.standard_normal(shape) * 1e-3).astype(np.float32)
  flat = x.reshape(-1)
  pos = rng.permutation(flat.size)
  if kind == 'e30':
    flat[pos[:6]] = [1e30, -1e30, 1e30, 1e30, -1e30, 1e30]
  elif kind == 'e38':
    flat[[3, 5, 7, 11]] = [3e38, -3e38, 3e38, 1e30]  # one bucket of 512
    flat[pos[:6]] = [3e38, -3e38, 3e38, -3e38, 1e30, -1e30]
  elif kind == 'max':
    flat[[0, 1, 2]] = [F32_MAX, -F32_MAX, F32_MAX]
    flat[pos[:4]] = [F32_MAX, -F32_MAX, 3e38, -3e38]
  elif kind == 'all':
    flat[:] = np.where(rng.random(flat.size) < 0.5, -3e38, 3e38)
  elif kind == 'tiny':
    flat[:] = (rng.standard_normal(flat.size) * 1e-30).astype(np.float32)
  else:
    raise ValueError(kind)
  return x


KINDS = ('e30', 'e38', 'max', 'all')

# Every registry compressor, built from its registered example spec
# (hfl.compress.registry.example_spec; a registered name that does not build fails
# the tests), plus the settings the issue names where they differ (QSGD with buckets
# of 512 and one bucket, 1 level; threshold top-k; CO3 fp8; chunked top-k at density
# 1 and with f32 values).
VARIANTS = {
    'topk_thr': dict(name='topk', density=0.05, threshold_variant=True),
    'qsgd_512': dict(name='qsgd', levels=16, bucket_size=512),
    'qsgd_none': dict(name='qsgd', levels=16, bucket_size=None),
    'qsgd_s1': dict(name='qsgd', levels=1, bucket_size=512),
    'co3_fp8': dict(name='co3', fmt='fp8', gamma=0.9),
    'chunked_topk_d1': dict(name='chunked_topk', density=1.0, chunk_size=256),
    'chunked_topk_f32': dict(name='chunked_topk', density=0.05, chunk_size=256,
                             value_bits=32),
}
COMPRESSORS = {**{name: registry.example_spec(name) for name in policy.REGISTRY}, **VARIANTS}


def _build(spec, shape=SHAPE):
  [c] = policy.build(dict(spec), jax.ShapeDtypeStruct(shape, jnp.float32), 0, 'float32',
                     field='compression.wan')
  return c


def test_every_registry_compressor_is_covered():
  assert set(policy.REGISTRY) <= set(COMPRESSORS)
  assert {s['name'] for s in VARIANTS.values()} <= set(policy.REGISTRY)


def _float_leaves(tree):
  return [np.asarray(leaf, np.float32) for leaf in jax.tree.leaves(tree)
          if jnp.issubdtype(jnp.asarray(leaf).dtype, jnp.floating)]


def _minifloat_casts():
  return {f'float_cast_{fmt}': minifloat.float_cast(SHAPE, fmt) for fmt in minifloat.FORMATS}


def _all_compressors():
  out = {name: _build(spec) for name, spec in COMPRESSORS.items()}
  out.update(_minifloat_casts())
  return out


@pytest.fixture(scope='module')
def compressors():
  return _all_compressors()


def _assert_close(jitted, eager, what, scale=None):
  """Compiled vs eager leaves: integer leaves (codes, symbols, indices) bitwise; float
  leaves with NaN at the same places and ``|a - b| <= 2 n U scale`` elsewhere, n the
  leaf's size (the most terms any reduction of a step on it adds) and ``scale`` the
  leaf's max-abs unless given. XLA compiles a step's reductions, matrix products and
  QR into other summation orders and fused multiply-adds than op-by-op execution
  runs; each order is within (n - 1) U of the exact sum relative to the sum of the
  |terms| (Higham eq. 4.4), so two orders differ by at most twice that."""
  la, lb = jax.tree.leaves(jitted), jax.tree.leaves(eager)
  assert len(la) == len(lb), what
  n = int(np.prod(SHAPE))
  for u, v in zip(la, lb):
    u, v = np.asarray(u), np.asarray(v)
    assert u.dtype == v.dtype and u.shape == v.shape, what
    if not jnp.issubdtype(u.dtype, jnp.floating):
      np.testing.assert_array_equal(u, v, err_msg=what)
      continue
    u, v = u.astype(np.float64), v.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(u), np.isnan(v), err_msg=what)
    ok = ~np.isnan(u)
    ref = np.max(np.abs(u[ok]), initial=0.0) if scale is None else scale
    np.testing.assert_allclose(u[ok], v[ok], rtol=0, atol=2 * n * U * ref, err_msg=what)


@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('name', sorted(COMPRESSORS) + sorted(_minifloat_casts()))
def test_finite_inputs_give_finite_payload_decode_and_residual(compressors, name, kind):
  """Finite entries up to float32's max: payload, decode, residual x - decode and the
  new state are finite, and the compiled step equals the eager one (within float32
  rounding: :func:`_assert_close`)."""
  c = compressors[name]
  x = jnp.asarray(_mixed(kind))
  zero = jnp.zeros(SHAPE, jnp.float32)
  step = lambda x, e, s, k: ef.ef_step(c, x, e, s, k, decay=1.0)
  p_jit, r_jit, s_jit = jax.jit(step)(x, zero, c.init(), KEY)
  with jax.disable_jit():
    p_eager, r_eager, s_eager = step(x, zero, c.init(), KEY)
    d_eager = c.decode(p_eager)
  decoded = np.asarray(jax.jit(c.decode)(p_jit))
  for leaf in _float_leaves(p_jit):
    assert np.all(np.isfinite(leaf)), f'{name}/{kind}: non-finite payload'
  assert np.all(np.isfinite(decoded)), f'{name}/{kind}: non-finite decode'
  assert np.all(np.isfinite(np.asarray(r_jit))), f'{name}/{kind}: non-finite residual'
  for leaf in _float_leaves(s_jit):
    assert np.all(np.isfinite(leaf)), f'{name}/{kind}: non-finite state'
  _assert_close((p_jit, s_jit), (p_eager, s_eager), f'{name}/{kind}: jit vs eager')
  # The residual x - decode cancels: its error is relative to |x| and |decode|.
  big = max(float(np.max(np.abs(np.asarray(x, np.float64)))), float(np.max(np.abs(decoded))))
  _assert_close(decoded, d_eager, f'{name}/{kind}: decode, jit vs eager', big)
  _assert_close(r_jit, r_eager, f'{name}/{kind}: residual, jit vs eager', big)


# ------------------------------------------------------- overflow-safe norms and scales


def test_pow2_scale_gives_exact_powers_of_two():
  """down * amax lands in [1, 2) for normal amax below 2^127, [2, 4) above, < 1 for
  subnormal and zero; down and up are powers of two with down * up = 1."""
  amax = np.array([1.0, 1.5, 3.0, 1e-30, 1e30, 3e38, F32_MAX, base.FLOAT32_TINY, 1e-40, 0.0,
                   np.inf, np.nan], np.float32)
  down, up = (np.asarray(v, np.float64) for v in jax.jit(base.pow2_scale)(amax))
  np.testing.assert_array_equal(down * up, 1.0)
  np.testing.assert_array_equal(np.frexp(down)[0], 0.5)  # powers of two
  s = amax.astype(np.float64) * down
  normal = (amax >= base.FLOAT32_TINY) & (amax < 2.0**127)
  assert np.all((s[normal] >= 1) & (s[normal] < 2))
  assert np.all((s[[5, 6]] >= 2) & (s[[5, 6]] < 4))
  assert np.all(s[[8, 9]] < 1)
  np.testing.assert_array_equal(up[[10, 11]], 2.0**126)


def _norm_tolerance(n):
  """Relative error bound of a float32 Euclidean norm of n terms: n squares and n - 1
  additions (Higham eq. 4.4: n U on the sum of squares), halved by the square root,
  plus the root's own rounding; first order, so one more U for the second."""
  return (n / 2 + 2) * U


@pytest.mark.parametrize('kind', KINDS + ('tiny',))
@pytest.mark.parametrize('axis', [None, 1])
def test_l2_norm_matches_float64_and_saturates(kind, axis):
  """base.l2_norm against numpy's float64 norm (float64 holds float32's max squared):
  within the float32 bound, or exactly FLOAT32_MAX where the true norm exceeds it."""
  x = _mixed(kind)
  got = np.asarray(jax.jit(lambda v: base.l2_norm(v, axis))(x), np.float64)
  with jax.disable_jit():
    eager = np.asarray(base.l2_norm(jnp.asarray(x), axis), np.float64)
  ref = np.linalg.norm(x.astype(np.float64), axis=axis)
  n = x.size if axis is None else x.shape[axis]
  big = ref > F32_MAX
  np.testing.assert_array_equal(got[big], F32_MAX)
  np.testing.assert_allclose(got[~big], ref[~big], rtol=_norm_tolerance(n), atol=0)
  np.testing.assert_allclose(eager, got, rtol=2 * _norm_tolerance(n), atol=0)
  assert np.all(np.isfinite(got))


@pytest.mark.parametrize('shape,axis', [((7,), None), ((439, 7), 1), ((6, 512), 1),
                                        ((1, 3072), 1), ((3, 5, 17), None), ((100, 33), 1)])
def test_l2_norm_is_bitwise_the_plain_norm_on_ordinary_values(shape, axis):
  """Where the plain sum of squares is a normal float, l2_norm is bitwise the plain
  jnp.sqrt(jnp.sum(x * x)), compiled and eager, so ordinary runs are unchanged."""
  x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
  plain = lambda v: jnp.sqrt(jnp.sum(v * v, axis=axis))
  np.testing.assert_array_equal(np.asarray(jax.jit(lambda v: base.l2_norm(v, axis))(x)),
                                np.asarray(jax.jit(plain)(x)))
  np.testing.assert_array_equal(np.asarray(base.l2_norm(jnp.asarray(x), axis)),
                                np.asarray(plain(jnp.asarray(x))))


def test_l2_norm_of_non_finite_values_stays_non_finite():
  x = np.ones((3, 4), np.float32)
  x[0, 1], x[1, 2], x[2, 0], x[2, 3] = np.inf, np.nan, 3e38, -np.inf
  got = np.asarray(jax.jit(lambda v: base.l2_norm(v, 1))(x))
  assert got[0] == np.inf and np.isnan(got[1]) and got[2] == np.inf


@pytest.mark.parametrize('kind', KINDS + ('tiny',))
def test_mean_abs_matches_float64(kind):
  """base.mean_abs (plain or pre-scaled) against numpy's float64 mean, with and
  without a mask: within n U (Higham eq. 4.4) plus the division's U; a mean of
  finite values never exceeds their max, so it never saturates."""
  x = _mixed(kind)
  where = np.random.default_rng(1).random(SHAPE) < 0.7
  got = np.asarray(jax.jit(lambda v: base.mean_abs(v, axis=1))(x), np.float64)
  got_w = np.asarray(jax.jit(lambda v, w: base.mean_abs(v, axis=1, where=w))(x, where),
                     np.float64)
  a = np.abs(x.astype(np.float64))
  tol = (SHAPE[1] + 1) * U
  np.testing.assert_allclose(got, a.mean(axis=1), rtol=tol, atol=0)
  np.testing.assert_allclose(got_w, (a * where).sum(1) / np.maximum(where.sum(1), 1),
                             rtol=tol, atol=0)
  whole = float(jax.jit(base.mean_abs)(x))
  np.testing.assert_allclose(whole, a.mean(), rtol=(x.size + 1) * U, atol=0)


@pytest.mark.parametrize('grid_max', [0.5, 1.0, 3.0, 6.0, 8.0, 448.0, 57344.0])
def test_min_scale_is_the_smallest_scale_that_decodes_every_level(grid_max):
  s = np.float32(base.min_scale(grid_max))
  with np.errstate(over='ignore'):
    assert s >= base.FLOAT32_TINY and np.isfinite(np.float32(grid_max) / s)
    below = np.nextafter(s, np.float32(0))
    assert below < base.FLOAT32_TINY or not np.isfinite(np.float32(grid_max) / below)


@pytest.mark.parametrize('bucket', [512, None])
@pytest.mark.parametrize('value', [1e30, 3e38])
def test_qsgd_of_a_large_finite_leaf(bucket, value):
  """The issue's input: every entry +-1e30 (or +-3e38). The norm is the float64 one
  rounded (or FLOAT32_MAX beyond float32's range), decoded values are multiples of
  norm / s with the input's signs, and the code stays unbiased: the mean over K
  keys is within 6 standard errors of x (Bernoulli levels, Alistarh et al. 2017)."""
  shape, s = (4, 256), 16
  signs = np.where(np.random.default_rng(2).random(shape) < 0.5, -1.0, 1.0)
  x = (signs * value).astype(np.float32)
  c = quantize.qsgd(shape, s, bucket)
  enc = jax.jit(lambda v, k: c.encode(v, (), k)[0])
  payload = enc(x, KEY)
  norm = np.asarray(payload['norm'], np.float64)
  d = x.size if bucket is None else bucket
  ref = np.sqrt(d) * np.float64(np.float32(value))
  if ref > F32_MAX:
    np.testing.assert_array_equal(norm, F32_MAX)
  else:
    np.testing.assert_allclose(norm, ref, rtol=_norm_tolerance(d), atol=0)
  keys = jax.random.split(KEY, 400)
  dec = np.asarray(jax.jit(jax.vmap(lambda k: c.decode(enc(x, k))))(keys), np.float64)
  assert np.all(np.isfinite(dec))
  n_sent = norm.reshape(-1)[np.arange(x.size) // d].reshape(shape)
  lvl = np.abs(dec) / (n_sent / s)
  np.testing.assert_allclose(lvl, np.round(lvl), atol=1e-5)
  assert np.all((dec == 0) | (np.sign(dec) == signs))
  p = np.abs(x.astype(np.float64)) / (n_sent / s) % 1.0  # P(level rounded up)
  se = n_sent / s * np.sqrt(p * (1 - p) / len(keys))
  assert np.all(np.abs(dec.mean(0) - x) <= 6 * se + 4 * U * np.abs(x))


def test_gennorm_fit_is_scale_free_beyond_float32_moments():
  """fit_moments of x 2^j, whose plain moments overflow (j = 64, 100) or underflow
  (j = -90), uses the moments of x pre-scaled to max-abs in [1, 2): its beta is
  bitwise that of that pre-scaled x, its alpha that one's times 2^(j + k); finite
  at float32's max."""
  x = np.random.default_rng(4).standard_normal(1280).astype(np.float32)
  down, _ = base.pow2_scale(np.max(np.abs(x)))
  x0 = x * np.asarray(down)  # exact; max-abs in [1, 2)
  fit0 = jax.jit(gennorm.fit_moments)(x0)
  for j in (64, 100, -90):
    c = np.float32(2.0**j)
    fit = jax.jit(gennorm.fit_moments)(x * c)
    assert float(fit.beta) == float(fit0.beta)
    assert float(fit.alpha) == float(np.float32(fit0.alpha) * c / np.asarray(down))
  fit = jax.jit(gennorm.fit_moments)(_mixed('max').reshape(-1))
  assert np.isfinite(float(fit.beta)) and 0 < float(fit.alpha) <= F32_MAX


def test_dgc_clip_local_on_a_tree_whose_norm_overflows():
  """Entries up to 3e38: the clipped tree is finite, its global norm (float64) is the
  threshold, and every entry is scaled by the same factor; the plain formula holds
  bitwise on an ordinary tree (bf16 leaves included); inf and NaN stay non-finite."""
  tree = {'a': _mixed('e38'), 'b': np.array([1e30, -2e30, 3.0, 0.0, 5e37], np.float32)}
  max_norm, workers = 1.0, 4
  thr = np.float64(np.float32(max_norm) / np.sqrt(np.float32(workers)))
  out = jax.jit(lambda t: dgc.clip_local(t, max_norm, workers))(tree)
  leaves = [np.asarray(v, np.float64) for v in jax.tree.leaves(out)]
  xs = [np.asarray(v, np.float64) for v in jax.tree.leaves(tree)]
  assert all(np.all(np.isfinite(v)) for v in leaves)
  n = sum(v.size for v in xs)
  norm = np.sqrt(sum(np.sum(v * v) for v in leaves))
  np.testing.assert_allclose(norm, thr, rtol=(n + 4) * U, atol=0)
  factor = thr / np.sqrt(sum(np.sum(x * x) for x in xs))
  # Entries whose clipped value is a float32 normal (smaller ones are subnormal,
  # which XLA:CPU flushes to zero).
  ratio = np.concatenate([o[m] / x[m] for o, x in zip(leaves, xs)
                          for m in [np.abs(x) * factor >= base.FLOAT32_TINY]])
  assert ratio.size >= 10
  np.testing.assert_allclose(ratio, factor, rtol=(n + 4) * U, atol=0)
  # An ordinary tree: bitwise x * min(1, thr / max(norm, 1e-30)), in each leaf's dtype.
  rng = np.random.default_rng(5)
  plain_tree = {'a': jnp.asarray(rng.standard_normal((13, 11)), jnp.float32),
                'b': jnp.asarray(rng.standard_normal(7), jnp.bfloat16)}
  def plain(t, max_norm):
    thr = jnp.float32(max_norm) / jnp.sqrt(jnp.float32(workers))
    norm = jnp.sqrt(sum(jnp.sum(jnp.square(v.astype(jnp.float32))) for v in jax.tree.leaves(t)))
    scale = jnp.minimum(1.0, thr / jnp.maximum(norm, 1e-30))
    return jax.tree.map(lambda v: v * scale.astype(v.dtype), t)
  for mn in (0.1, 100.0):
    _assert_close(jax.jit(lambda t: dgc.clip_local(t, mn, workers))(plain_tree),
                  jax.jit(lambda t: plain(t, mn))(plain_tree), 'clip_local vs plain', 0.0)
  bad = {'a': jnp.asarray(_mixed('e30')).at[0, 0].set(jnp.inf)}
  assert not np.all(np.isfinite(np.asarray(jax.jit(
      lambda t: dgc.clip_local(t, max_norm, workers))(bad)['a'])))


# ---------------------------------------------- error feedback with memory weight 0


def _gamma0(name):
  """(compressor, step(x, e, state, key) -> (payload, residual, state)) with memory
  weight 0: CO3's and chunked top-k's state ``ef_gamma`` (as hfl.step feeds back,
  hfl.compress.ef.tree_ef_step with no decay), an explicit decay = 0 of ef_step,
  and co3_ef_step's gamma."""
  if name in ('co3', 'chunked_topk'):
    c = _build(dict(COMPRESSORS[name], gamma=0.0))
    def step(x, e, s, k):
      p, r, s = ef.tree_ef_step([c], [x], [e], [s], k)
      return p[0], r[0], s[0]
    return c, step
  if name == 'co3_ef_step':
    c = _build(COMPRESSORS['co3'])  # gamma 0.9 in its state, 0 given
    def step(x, e, s, k):
      p, _, r, s = co3.co3_ef_step(c, x, e, s, k, gamma=0.0)
      return p, r, s
    return c, step
  c = _build(COMPRESSORS[name])
  return c, lambda x, e, s, k: ef.ef_step(c, x, e, s, k, decay=0.0)


@pytest.mark.parametrize('name', ['co3', 'chunked_topk', 'co3_ef_step', 'qsgd_512', 'topk',
                                  'sign', 'e3m0'])
def test_zero_memory_weight_never_feeds_a_non_finite_residual_back(name):
  """Step 1 holds +inf: its payload or residual is non-finite and hfl.step flags it.
  Step 2, finite, with step 1's residual and state: with weight 0 its payload,
  decode and residual are finite, unflagged, and bitwise those of step 2 without
  any residual (before: p = x + 0 * NaN = NaN, flagged again)."""
  from hfl import links as link_lib  # pylint: disable=g-import-not-at-top
  c, step = _gamma0(name)
  step = jax.jit(step)
  x1 = _mixed('e30')
  x1[3, 7] = np.inf
  x2 = np.random.default_rng(9).standard_normal(SHAPE).astype(np.float32)
  zero = jnp.zeros(SHAPE, jnp.float32)
  k1, k2 = jax.random.split(KEY)
  p1, r1, s1 = step(jnp.asarray(x1), zero, c.init(), k1)
  flags1 = int(link_lib.finiteness_flags(x1, p1, c.decode(p1), r1))
  assert flags1 & (link_lib.BAD_PAYLOAD | link_lib.BAD_RESIDUAL)
  assert not np.all(np.isfinite(np.asarray(r1)))
  p2, r2, s2 = step(jnp.asarray(x2), r1, s1, k2)
  d2 = c.decode(p2)
  assert int(link_lib.finiteness_flags(x2, p2, d2, r2)) == 0
  p_ref, r_ref, s_ref = step(jnp.asarray(x2), zero, s1, k2)
  _assert_close((p2, r2, s2, d2), (p_ref, r_ref, s_ref, c.decode(p_ref)),
                f'{name}: step 2 with vs without the residual', 0.0)


def test_a_nonzero_memory_weight_feeds_the_non_finite_residual_back():
  """Documented (hfl.compress.ef): with weight > 0 a non-finite residual is carried,
  as classic error feedback carries every error, and the next step is flagged too
  (the run stops at the round's end naming the first flagged iteration)."""
  from hfl import links as link_lib  # pylint: disable=g-import-not-at-top
  c = _build(COMPRESSORS['co3'])  # gamma 0.9
  step = jax.jit(lambda x, e, s, k: ef.tree_ef_step([c], [x], [e], [s], k))
  x1 = _mixed('e30')
  x1[3, 7] = np.inf
  zero = jnp.zeros(SHAPE, jnp.float32)
  _, [r1], [s1] = step(jnp.asarray(x1), zero, c.init(), KEY)
  [p2], [r2], _ = step(jnp.asarray(_mixed('e30')), r1, s1, KEY)
  assert int(link_lib.finiteness_flags(zero, p2, c.decode(p2), r2)) != 0
