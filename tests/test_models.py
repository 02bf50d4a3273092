"""Model shapes and sizes."""

import jax
import jax.numpy as jnp
import pytest

from hfl import models


@pytest.mark.parametrize('name,shape,params', [
    ('cnn', (2, 28, 28, 1), 421_642),   # 320 + 18,496 + 401,536 + 1,290
    ('mlp', (2, 28, 28, 1), 235_146),   # 200,960 + 32,896 + 1,290
    ('resnet20', (2, 32, 32, 3), None),
])
def test_output_shape_and_parameter_count(name, shape, params):
  net = models.get_model(name, 10)
  variables = net.init(jax.random.PRNGKey(0), jnp.zeros(shape))
  assert set(variables) == {'params'}  # no mutable collections (no BatchNorm state)
  out = net.apply(variables, jnp.ones(shape))
  assert out.shape == (2, 10) and out.dtype == jnp.float32
  n = sum(x.size for x in jax.tree.leaves(variables))
  if params is not None:
    assert n == params
  else:  # ResNet-20 has ~0.27M parameters (He et al. 2016, Table 6)
    assert 260_000 < n < 290_000


def test_unknown_model_names_the_field():
  with pytest.raises(ValueError, match='model.name'):
    models.get_model('vgg', 10)
