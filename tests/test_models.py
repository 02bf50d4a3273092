"""Model shapes and sizes."""

import jax
import jax.numpy as jnp
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
