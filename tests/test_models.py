"""Model shapes and sizes; the pooling op against flax's."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hfl import models


@pytest.mark.parametrize('name,shape,params', [
    ('cnn', (2, 28, 28, 1), 421_642),   # 320 + 18,496 + 401,536 + 1,290
    ('mlp', (2, 28, 28, 1), 235_146),   # 200,960 + 32,896 + 1,290
    ('resnet20', (2, 32, 32, 3), None),
    # 3 x (conv3x3 + GroupNorm) pairs: 896+18,496 / 18,496+36,928 / 73,856+147,584 minus the
    # biases GroupNorm replaces, + 2 x channels per GroupNorm, + the 1,290-entry head.
    ('cifar_cnn', (2, 32, 32, 3), 620_362),
])
def test_output_shape_and_parameter_count(name, shape, params):
  net = models.get_model(name, 10)
  variables = net.init(jax.random.PRNGKey(0), jnp.zeros(shape))
  assert set(variables) == {'params'}  # no mutable collections (no BatchNorm state)
  out = net.apply(variables, jnp.ones(shape))
  assert out.shape == (2, 10) and out.dtype == jnp.float32
  assert models.input_kind(name) == 'image'
  n = sum(x.size for x in jax.tree.leaves(variables))
  if params is not None:
    assert n == params
  else:  # ResNet-20 has ~0.27M parameters (He et al. 2016, Table 6)
    assert 260_000 < n < 290_000


def _flax_pool(x):
  return nn.max_pool(x, (2, 2), (2, 2))


def _pool_input(shape, dtype, values, rng):
  if values == 'normal':
    return jnp.asarray(rng.standard_normal(shape), dtype)
  # Small integers: most windows hold tied maxima, where a different gradient rule
  # (e.g. splitting among ties) would show.
  x = rng.integers(0, 3, shape).astype(np.float64)
  if values == 'nonfinite':  # NaN and infinities in every position of the windows
    x[rng.random(shape) < 0.15] = np.nan
    x[rng.random(shape) < 0.1] = np.inf
    x[rng.random(shape) < 0.1] = -np.inf
  return jnp.asarray(x, dtype)


@pytest.mark.parametrize('shape', [(4, 7, 9, 3), (2, 28, 28, 5), (3, 6, 6, 2)])
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize('values', ['ties', 'normal', 'nonfinite'])
def test_max_pool_2x2_is_flax_max_pool_bit_for_bit(shape, dtype, values):
  # Reference: flax's pooling, i.e. XLA's reduce-window, its select-and-scatter
  # gradient and select-and-gather tangent. NaN compares equal to NaN here.
  rng = np.random.default_rng(0)
  x = _pool_input(shape, dtype, values, rng)
  out = (shape[0], shape[1] // 2, shape[2] // 2, shape[3])
  g = jnp.asarray(rng.standard_normal(out), dtype)
  t = jnp.asarray(rng.standard_normal(shape), dtype)
  same = lambda a, b: np.testing.assert_array_equal(np.asarray(a, np.float32),
                                                    np.asarray(b, np.float32))
  for fn in (lambda f: f, jax.jit):
    y, vjp = jax.vjp(fn(models.max_pool_2x2), x)
    y_ref, vjp_ref = jax.vjp(fn(_flax_pool), x)
    assert y.dtype == dtype and y.shape == y_ref.shape == out
    same(y, y_ref)
    (gx,), (gx_ref,) = vjp(g), vjp_ref(g)
    assert gx.dtype == dtype and gx.shape == x.shape
    same(gx, gx_ref)
    (_, ty), (_, ty_ref) = (jax.jvp(fn(f), (x,), (t,)) for f in (models.max_pool_2x2,
                                                                 _flax_pool))
    assert ty.dtype == dtype
    same(ty, ty_ref)


def test_max_pool_2x2_rejects_non_images():
  with pytest.raises(ValueError, match=r'\[B, H, W, C\].*\(3, 4\)'):
    models.max_pool_2x2(jnp.zeros((3, 4)))


@pytest.mark.parametrize('name,shape', [('cnn', (8, 28, 28, 1)), ('cifar_cnn', (8, 32, 32, 3))])
def test_model_gradient_unchanged_by_the_pooling_op(name, shape, monkeypatch):
  net = models.get_model(name, 10)
  x = jax.random.normal(jax.random.PRNGKey(1), shape)
  labels = jnp.arange(shape[0]) % 10
  params = net.init(jax.random.PRNGKey(0), x)

  def loss(p):
    logits = net.apply(p, x)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1))

  grads = jax.grad(loss)(params)
  monkeypatch.setattr(models, 'max_pool_2x2', _flax_pool)
  grads_ref = jax.grad(loss)(params)
  # Same operations in the same order; only XLA's fusion of the surrounding ops may
  # differ, which moves float32 results by a few ulps at most.
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_ref)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * float(jnp.abs(b).max()))


def test_unknown_model_names_the_field():
  with pytest.raises(ValueError, match='model.name'):
    models.get_model('vgg', 10)


def _lm(**kw):
  net = models.get_model('transformer', 11, **dict(dict(num_layers=2, num_heads=2, embed_dim=16,
                                                         seq_len=8), **kw))
  tokens = jax.random.randint(jax.random.PRNGKey(1), (3, 8), 0, 11)
  return net, net.init(jax.random.PRNGKey(0), tokens), tokens


def test_transformer_shapes_and_parameter_count():
  net, variables, tokens = _lm()
  assert set(variables) == {'params'} and models.input_kind('transformer') == 'tokens'
  out = net.apply(variables, tokens)
  assert out.shape == (3, 8, 11) and out.dtype == jnp.float32
  d, v, t, layers = 16, 11, 8, 2
  # embeddings + per block (2 LayerNorms, q/k/v/out with biases, MLP 4d) + final LN + head
  block = 2 * 2 * d + 4 * (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d)
  expected = v * d + t * d + layers * block + 2 * d + d * v + v
  assert sum(x.size for x in jax.tree.leaves(variables)) == expected
  assert net.apply(variables, tokens[:, :5]).shape == (3, 5, 11)  # shorter contexts work


def test_transformer_is_causal():
  # Changing the token at position t leaves the logits at positions < t unchanged
  # and changes them at t (the model sees tokens 0..t at position t).
  # Exact equality: a masked key's attention weight is exactly 0 (exp of the mask's
  # large negative logit minus the row max underflows to 0), so the changed value
  # enters earlier rows only as 0 * v.
  net, variables, tokens = _lm()
  apply = jax.jit(net.apply)
  base = apply(variables, tokens)
  for t in (0, 3, 7):
    changed = tokens.at[:, t].set((tokens[:, t] + 1) % 11)
    out = apply(variables, changed)
    assert jnp.array_equal(out[:, :t], base[:, :t]), t
    assert not jnp.allclose(out[:, t], base[:, t]), t


def test_transformer_field_on_an_image_config_points_to_the_lm_config():
  from configs import default, shakespeare  # pylint: disable=g-import-not-at-top
  from hfl import config as config_lib  # pylint: disable=g-import-not-at-top
  msg = config_lib.unknown_field(default.get_config(), 'model.num_layers')
  assert msg.startswith("unknown config field 'model.num_layers': the transformer's fields")
  assert 'configs/shakespeare.py' in msg and 'did you mean' not in msg
  assert config_lib.unknown_field(shakespeare.get_config(), 'model.num_layers') is None


def test_transformer_options_from_config():
  import ml_collections  # pylint: disable=g-import-not-at-top
  cfg = ml_collections.ConfigDict(dict(name='transformer', num_layers=1, num_heads=4,
                                       embed_dim=32, seq_len=16))
  net = models.from_config(cfg, 7)
  assert (net.num_layers, net.num_heads, net.embed_dim, net.seq_len, net.vocab_size) == (
      1, 4, 32, 16, 7)
