"""Chunked top-k with 2-bit values (hfl.compress.chunked, SparseLoCo's compressor)
against a plain numpy reference, including an all-zero chunk, ties and a short last
chunk; and its exact wire size."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from hfl.compress import base, chunked, ef, policy
from hfl.compress.sparse import num_kept


def reference(x, density, chunk_size, value_bits=2):
  """numpy: per chunk the k largest magnitudes (ties: lower index first), then the
  2-bit code: sign, and magnitude > the mean kept magnitude; each class decodes to its
  mean kept magnitude (rounded to bfloat16). Returns the decoded f32 array."""
  flat = np.asarray(x, np.float64).reshape(-1)
  size = flat.size
  chunk = min(chunk_size, size)
  k = num_kept(chunk, density)
  out = np.zeros(size)
  for start in range(0, size, chunk):
    part = flat[start:start + chunk]
    keep = np.argsort(-np.abs(part), kind='stable')[:k]
    vals = part[keep]
    if value_bits == 32:
      out[start + keep] = vals.astype(np.float32)
      continue
    mag = np.abs(vals)
    large = mag > mag.mean()
    scale = {c: (mag[large == c].mean() if np.any(large == c) else 0.0) for c in (False, True)}
    bf16 = lambda v: float(jnp.asarray(v, jnp.float32).astype(jnp.bfloat16).astype(jnp.float32))
    out[start + keep] = np.where(vals < 0, -1.0, 1.0) * np.array(
        [bf16(np.float32(scale[bool(c)])) for c in large])
  return out.reshape(np.shape(x)).astype(np.float32)


def _case():
  """A 7 x 45 leaf (315 entries): chunks of 64 (the last has 59), chunk 1 all zero,
  chunk 2 with a tie at the k-th magnitude."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=315).astype(np.float32)
  x[64:128] = 0.0
  x[128:192] = np.round(x[128:192] * 2) / 2  # many equal magnitudes: ties
  return x.reshape(7, 45)


@pytest.mark.parametrize('value_bits', [2, 32])
@pytest.mark.parametrize('density', [0.05, 0.3, 1.0])
def test_chunked_topk_matches_the_numpy_reference(density, value_bits):
  x = _case()
  c = chunked.chunked_topk(x.shape, density=density, chunk_size=64, value_bits=value_bits)
  payload, _ = jax.jit(lambda v: c.encode(v, c.init(), None))(x)
  got = np.asarray(jax.jit(c.decode)(payload))
  np.testing.assert_array_equal(got, reference(x, density, 64, value_bits))
  assert np.all(got.reshape(-1)[64:128] == 0)  # the all-zero chunk
  k = num_kept(64, density)
  assert np.count_nonzero(got.reshape(-1)[128:192]) <= k


def test_chunked_topk_wire_size_is_exact():
  """Bits = n k (index bits + 2) + 32 n (bf16 scales), packed codes padded to bytes."""
  c = chunked.chunked_topk((7, 45), density=0.05, chunk_size=64)
  payload, _ = c.encode(jnp.asarray(_case()), c.init(), None)
  n, k = 5, num_kept(64, 0.05)
  codes = 2 * 8 * (-(-n * k // 8))
  assert base.payload_bits(payload) == c.wire_bits(payload) == n * k * 8 + codes + n * 2 * 16
  big = chunked.chunked_topk((4096, 1024), density=0.02, chunk_size=4096)
  shapes = jax.eval_shape(lambda v: big.encode(v, big.init(), None)[0],
                          jax.ShapeDtypeStruct((4096, 1024), jnp.float32))
  n, k = 1024, num_kept(4096, 0.02)
  assert base.payload_bits(shapes) == n * k * 16 + 2 * n * k + n * 32  # uint16 offsets
  dense = chunked.chunked_topk((4096, 1024), density=1.0, chunk_size=4096)
  shapes = jax.eval_shape(lambda v: dense.encode(v, dense.init(), None)[0],
                          jax.ShapeDtypeStruct((4096, 1024), jnp.float32))
  assert base.payload_bits(shapes) == 2 * 4096 * 1024 + 1024 * 32  # 2 bits + scales, no offsets


def test_error_feedback_keeps_what_it_does_not_send_and_gamma_is_the_memory():
  """p = x + γ e; e' = p − decode: decoded + e' = x + γ e (to float32 rounding)."""
  c = chunked.chunked_topk((7, 45), density=0.1, chunk_size=64, gamma=0.5)
  x = jnp.asarray(_case())
  e = jnp.asarray(np.random.default_rng(1).normal(size=(7, 45)), jnp.float32)
  payload, resid, _ = ef.ef_step(c, x, e, c.init(), None)
  p = np.asarray(x + 0.5 * e)
  # Two float32 roundings of |p| (forming p, then p − decode) and one of the sum.
  np.testing.assert_allclose(np.asarray(c.decode(payload) + resid), p, rtol=0,
                             atol=4 * 2.0**-24 * float(np.max(np.abs(p))))


def test_the_registry_builds_it_from_a_spec_and_refuses_bad_fields():
  spec = ml_collections.ConfigDict(dict(name='chunked_topk', density=0.02, chunk_size=256,
                                        gamma=0.95, value_bits=2))
  [c] = policy.build(spec, jax.ShapeDtypeStruct((64, 64), jnp.float32), 0, 'float32',
                     field='compression.wan')
  assert float(c.init().ef_gamma) == pytest.approx(0.95)
  for field, bad in (('chunk_size', 0), ('value_bits', 4), ('gamma', 1.5)):
    with pytest.raises(ValueError, match=f'compression.wan'):
      policy.build(dict(spec, **{field: bad}), jax.ShapeDtypeStruct((64, 64), jnp.float32),
                   0, 'float32', field='compression.wan')


def test_non_finite_inputs_stay_non_finite():
  """An inf or NaN entry must not be hidden: decoded or residual is non-finite."""
  c = chunked.chunked_topk((7, 45), density=0.05, chunk_size=64)
  for bad in (np.inf, np.nan):
    x = _case()
    x[0, 3] = bad
    payload, resid, _ = ef.ef_step(c, jnp.asarray(x), jnp.zeros_like(x), c.init(), None)
    assert not (np.all(np.isfinite(np.asarray(c.decode(payload))))
                and np.all(np.isfinite(np.asarray(resid))))
