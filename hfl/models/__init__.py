"""Flax models: a small CNN (default), an MLP, and a ResNet-20 for 32x32 colour images.

All models map float32 images [B, H, W, C] to float32 logits [B, num_classes] and
have no mutable collections (no BatchNorm statistics), so a model is fully
described by its parameter pytree; ResNet-20 uses GroupNorm, the usual choice in
federated learning (Hsieh et al., ICML 2020, "The non-IID data quagmire").
"""

from typing import Sequence

import flax.linen as nn
import jax.numpy as jnp

MODELS = ('cnn', 'mlp', 'resnet20')


class CNN(nn.Module):
  """Two 3x3 conv layers (32, 64 channels) with 2x2 max-pooling, then a 128-unit dense layer."""
  num_classes: int = 10

  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Conv(32, (3, 3))(x))
    x = nn.max_pool(x, (2, 2), (2, 2))
    x = nn.relu(nn.Conv(64, (3, 3))(x))
    x = nn.max_pool(x, (2, 2), (2, 2))
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(128)(x))
    return nn.Dense(self.num_classes)(x)


class MLP(nn.Module):
  """A multilayer perceptron on flattened images."""
  num_classes: int = 10
  hidden: Sequence[int] = (256, 128)

  @nn.compact
  def __call__(self, x):
    x = x.reshape((x.shape[0], -1))
    for h in self.hidden:
      x = nn.relu(nn.Dense(h)(x))
    return nn.Dense(self.num_classes)(x)


class _Block(nn.Module):
  channels: int
  stride: int

  @nn.compact
  def __call__(self, x):
    y = nn.Conv(self.channels, (3, 3), (self.stride, self.stride), use_bias=False)(x)
    y = nn.relu(nn.GroupNorm(num_groups=min(8, self.channels))(y))
    y = nn.Conv(self.channels, (3, 3), use_bias=False)(y)
    y = nn.GroupNorm(num_groups=min(8, self.channels))(y)
    if x.shape != y.shape:
      x = nn.Conv(self.channels, (1, 1), (self.stride, self.stride), use_bias=False)(x)
      x = nn.GroupNorm(num_groups=min(8, self.channels))(x)
    return nn.relu(x + y)


class ResNet20(nn.Module):
  """ResNet-20 for CIFAR (He et al. 2016, Sec. 4.2): 3 stages x 3 blocks, 16/32/64 channels."""
  num_classes: int = 10

  @nn.compact
  def __call__(self, x):
    x = nn.Conv(16, (3, 3), use_bias=False)(x)
    x = nn.relu(nn.GroupNorm(num_groups=8)(x))
    for stage, channels in enumerate((16, 32, 64)):
      for block in range(3):
        x = _Block(channels, 2 if (stage > 0 and block == 0) else 1)(x)
    x = jnp.mean(x, axis=(1, 2))
    return nn.Dense(self.num_classes)(x)


def get_model(name: str, num_classes: int) -> nn.Module:
  """Returns the Flax module called ``name``.

  Raises:
    ValueError: ``name`` is not one of MODELS (names the field ``model.name``).
  """
  if name == 'cnn':
    return CNN(num_classes)
  if name == 'mlp':
    return MLP(num_classes)
  if name == 'resnet20':
    return ResNet20(num_classes)
  raise ValueError(f'model.name={name!r} is unknown; allowed: {", ".join(MODELS)}')
