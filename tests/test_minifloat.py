"""Tests of the fixed-width E3M0 cast (hfl.compress.minifloat) against hand-written values."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hfl import compress as C
from hfl.compress import floatgrid
from hfl.compress import minifloat
from hfl.compress import policy

U = 2.0**-24  # float32 unit roundoff
KEY = jax.random.PRNGKey(0)


def _roundtrip(c, x):
  payload, _ = jax.jit(c.encode)(jnp.asarray(x, jnp.float32), c.init(), KEY)
  return payload, np.asarray(jax.jit(c.decode)(payload))


def test_e3m0_grid_is_the_hand_written_list():
  g = floatgrid.make_grid(minifloat.E3M0)
  np.testing.assert_array_equal(
      g.levels, [-8, -4, -2, -1, -0.5, -0.25, 0, 0.25, 0.5, 1, 2, 4, 8])
  assert g.bits == 4 and g.max == 8.0 and g.nan_mag == 7
  # Symbols: sign << 3 | E, the magnitude 2**(E - 3) for E = 1..6 (bias 3).
  sym = np.array([0, 1, 2, 3, 4, 5, 6, 9, 10, 11, 12, 13, 14], np.uint8)
  want = [0, .25, .5, 1, 2, 4, 8, -.25, -.5, -1, -2, -4, -8]
  np.testing.assert_array_equal(np.asarray(floatgrid.dequantize(sym, g)), want)
  assert np.isnan(np.asarray(floatgrid.dequantize(np.uint8(7), g)))


@pytest.mark.parametrize('x,want', [
    (0.125, 0.0), (0.375, 0.5), (0.75, 0.5), (1.5, 2.0), (3.0, 2.0), (6.0, 8.0),
    (-6.0, -8.0), (5.9, 4.0), (100.0, 8.0), (-1e30, -8.0), (0.1, 0.0), (-0.0, 0.0)])
def test_e3m0_rounding_ties_and_saturation(x, want):
  g = floatgrid.make_grid(minifloat.E3M0)
  got = np.asarray(floatgrid.dequantize(floatgrid.quantize(np.float32(x), g), g))
  assert got == want and not np.signbit(got) if want == 0 else got == want


def test_e3m0_roundtrip_against_numpy_reference():
  shape = (7, 9)  # 63 entries: an odd count, so the last byte holds one symbol
  c = minifloat.e3m0(shape)
  rng = np.random.default_rng(0)
  x = (rng.standard_normal(shape) * np.exp(rng.uniform(-4, 2, shape))).astype(np.float32)
  payload, dec = _roundtrip(c, x)
  g = floatgrid.make_grid(minifloat.E3M0)
  scale = np.float32(8.0) / np.float32(np.abs(x).max())
  assert np.float32(payload['scale']) == scale
  ref = floatgrid.dequantize(floatgrid.quantize_reference(x * scale, g), g)
  np.testing.assert_array_equal(dec, np.asarray(ref) / scale)
  # The largest entry is exact up to one float32 rounding of the scale.
  i = np.argmax(np.abs(x))
  assert abs(dec.reshape(-1)[i] - x.reshape(-1)[i]) <= 2 * U * abs(x.reshape(-1)[i])
  # Values already on the scaled grid come back exactly (scale 1 when max|x| = 8).
  on_grid = np.resize(g.levels, shape).astype(np.float32)
  np.testing.assert_array_equal(_roundtrip(c, on_grid)[1], on_grid)


def test_e3m0_zero_and_non_finite():
  c = minifloat.e3m0((3, 4))
  payload, dec = _roundtrip(c, np.zeros((3, 4), np.float32))
  assert float(payload['scale']) == 1.0 and np.all(dec == 0)
  x = np.arange(12, dtype=np.float32).reshape(3, 4)
  x[1, 2] = np.nan
  x[2, 0] = np.inf
  _, dec = _roundtrip(c, x)
  assert np.isnan(dec[1, 2]) and not np.isfinite(dec[2, 0])
  assert np.all(np.isfinite(np.delete(dec.reshape(-1), [6, 8])))


@pytest.mark.parametrize('shape', [(1, 1), (5, 7), (300, 301)])
def test_e3m0_wire_bytes_hand_count(shape):
  c = policy.build({'name': 'e3m0'}, jax.ShapeDtypeStruct(shape, jnp.float32), 0,
                   'float32')[0]
  n = int(np.prod(shape))
  payload, _ = _roundtrip(c, np.ones(shape, np.float32))
  assert payload['packed'].dtype == jnp.uint8 and payload['packed'].shape == (math.ceil(n / 2),)
  bits = c.wire_bits(payload)
  assert type(bits) is int and bits == 8 * math.ceil(n / 2) + 32  # 4 bits/entry + scale
  assert C.static_bits(c) == bits and not c.linear and not c.lossless


def test_pack_symbols_roundtrip_high_nibble_first():
  sym = jnp.asarray([1, 2, 15, 0, 7], jnp.uint8)
  packed = minifloat.pack_symbols(sym, 4)
  np.testing.assert_array_equal(np.asarray(packed), [0x12, 0xF0, 0x70])
  np.testing.assert_array_equal(np.asarray(minifloat.unpack_symbols(packed, 4, 5)), sym)


def test_receiver_accumulates_decoded_e3m0_payloads_in_float32():
  """Members' payloads each have their own scale: the receiver decodes each one
  and sums in float32 (never in 4 bits); compare with a float64 sum."""
  shape, members = (16, 8), 5
  c = minifloat.e3m0(shape)
  rng = np.random.default_rng(1)
  xs = rng.normal(size=(members,) + shape).astype(np.float32) * np.float32(
      10.0 ** np.arange(members)).reshape(-1, 1, 1)
  payloads = [jax.jit(c.encode)(jnp.asarray(x), c.init(), KEY)[0] for x in xs]
  gathered = jax.tree.map(lambda *a: jnp.stack(a), *payloads)
  w = np.asarray([0.1, 0.2, 0.3, 0.15, 0.25], np.float32)
  got = np.asarray(C.aggregate(c, gathered, members, jnp.asarray(w)))
  dec = np.stack([np.asarray(c.decode(p), np.float64) for p in payloads])
  ref = np.tensordot(w.astype(np.float64), dec, axes=1)
  bound = members * 2 * U * np.tensordot(np.abs(w).astype(np.float64), np.abs(dec), axes=1)
  assert np.all(np.abs(got - ref) <= bound)
  # A sum in 4-bit precision could not hold values spanning 5 decades.
  assert len(np.unique(np.round(np.abs(ref[ref != 0]) / np.abs(ref).max(), 12))) > 13


def test_e3m0_error_feedback_sends_the_sum():
  """Error feedback over many steps: Σ sent + e = Σ g (float32 rounding), and the
  residual stays bounded (EF, Stich et al. 2018)."""
  shape = (16, 12)
  c = minifloat.e3m0(shape)
  step = jax.jit(functools.partial(C.ef_step, c))
  e, st = jnp.zeros(shape), c.init()
  sent = np.zeros(shape, np.float64)
  total = np.zeros(shape, np.float64)
  rng = np.random.default_rng(0)
  for t in range(20):
    g = rng.normal(size=shape).astype(np.float32)
    payload, e, st = step(jnp.asarray(g), e, st, jax.random.PRNGKey(t))
    sent += np.asarray(c.decode(payload), np.float64)
    total += g
  np.testing.assert_allclose(sent + np.asarray(e), total, atol=1e-4)
  assert np.abs(np.asarray(e)).max() < 8.0  # bounded, not accumulating
