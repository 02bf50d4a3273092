"""Flax models: image classifiers (a small CNN, an MLP, a CIFAR CNN, ResNet-20) and a
decoder-only transformer language model.

The image models map float32 images [B, H, W, C] to float32 logits
[B, num_classes]; the transformer maps int32 tokens [B, T] to float32 logits
[B, T, vocabulary size]. No model has mutable collections (no BatchNorm
statistics: hfl's step keeps only parameters), so a model is fully described by
its parameter pytree; the normalised image models use GroupNorm, the usual
choice in federated learning (Hsieh et al., ICML 2020, "The non-IID data
quagmire").
"""

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

IMAGE_MODELS = ('cnn', 'mlp', 'cifar_cnn', 'resnet20')
TOKEN_MODELS = ('transformer',)
MODELS = IMAGE_MODELS + TOKEN_MODELS
# Fields of the ``model`` config section the transformer reads, with their defaults.
TRANSFORMER_FIELDS = dict(num_layers=4, num_heads=4, embed_dim=128, seq_len=64)


def _pool_windows(x):
  """[B, H, W, C] -> [B, H//2, 2, W//2, 2, C]: the 2x2 windows (odd last row/column dropped)."""
  if x.ndim != 4:
    raise ValueError(f'max_pool_2x2 takes [B, H, W, C] images, got shape {x.shape}')
  b, h, w, c = x.shape
  return x[:, :h // 2 * 2, :w // 2 * 2].reshape(b, h // 2, 2, w // 2, 2, c)


def _selected(win):
  """bool like ``win`` [B, H/2, 2, W/2, 2, C]: the entry of each window that XLA's
  select-and-scatter picks for the gradient of a max-pool (JAX's transpose of
  ``reduce_window`` max uses select ``>=``): scanning the window in row-major order,
  the current pick is kept while ``pick >= candidate`` and replaced otherwise. That
  is the first maximum when the window holds no NaN; a NaN pick is replaced by the
  next entry, and a NaN is picked when it comes after the current pick."""
  cands = [win[:, :, i:i + 1, :, j:j + 1] for i in range(2) for j in range(2)]
  pick, index = cands[0], jnp.zeros(cands[0].shape, jnp.int8)
  for k, c in enumerate(cands[1:], 1):
    keep = pick >= c
    pick, index = jnp.where(keep, pick, c), jnp.where(keep, index, jnp.int8(k))
  one_hot = [index == k for k in range(4)]
  return jnp.concatenate([jnp.concatenate(one_hot[0:2], axis=4),
                          jnp.concatenate(one_hot[2:4], axis=4)], axis=2)


@jax.custom_jvp
def max_pool_2x2(x):
  """2x2 max-pooling, stride 2, VALID padding: ``flax.linen.max_pool(x, (2, 2), (2, 2))``.

  The same values and the same gradient, bit for bit, as flax's pooling (XLA's
  reduce-window forward and select-and-scatter backward), for every input including
  ties, infinities and NaN: the whole output gradient of a window goes to the entry
  select-and-scatter picks, the first maximum in row-major order (top-left,
  top-right, bottom-left, bottom-right) when the window holds no NaN. JAX's own
  gradient of a ``max`` reduction would instead split it equally among tied entries.
  The derivative is a custom JVP (the tangent of the picked entry), so forward mode,
  reverse mode (its transpose) and higher orders all work.

  Written as reshapes and elementwise selects because XLA:CPU runs select-and-scatter
  slowly: on [256, 32, 32, 32] float32, forward and backward take 5.8 ms instead of
  52 ms on one device of the 2-core machine of docs/benchmarks.md ("Max-pooling on
  XLA:CPU", ``bench/max_pool.py``), and hfl's 2x4 training step of the small CNN
  runs 1.9x faster with it. Used on every backend; not measured off CPU.

  Args:
    x: [B, H, W, C] array of any float dtype; an odd last row or column is dropped,
      as VALID padding does.

  Returns:
    [B, H // 2, W // 2, C] array of ``x.dtype``.

  Raises:
    ValueError: ``x`` is not 4-D.
  """
  return _pool_windows(x).max(axis=(2, 4))


@max_pool_2x2.defjvp
def _max_pool_2x2_jvp(primals, tangents):
  (x,), (t,) = primals, tangents
  win = _pool_windows(x)
  picked = jnp.where(_selected(win), _pool_windows(t), jnp.zeros((), t.dtype))
  return win.max(axis=(2, 4)), picked.sum(axis=(2, 4))


class CNN(nn.Module):
  """Two 3x3 conv layers (32, 64 channels) with 2x2 max-pooling, then a 128-unit dense layer."""
  num_classes: int = 10

  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Conv(32, (3, 3))(x))
    x = max_pool_2x2(x)
    x = nn.relu(nn.Conv(64, (3, 3))(x))
    x = max_pool_2x2(x)
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


class ConvNet(nn.Module):
  """A VGG-style CNN: stages of 3x3 conv (+ GroupNorm) + ReLU, 2x2 max-pool after each
  stage, then a classifier head.

  Attributes:
    num_classes: logits per image.
    stages: channels of the conv layers of each stage.
    norm: GroupNorm (8 groups, or fewer for narrow layers) after every conv.
    dense: head: 0 = global average pooling and one linear layer; > 0 = flatten,
      a ReLU dense layer of this width, then the linear layer.
  """
  num_classes: int = 10
  stages: Sequence[Sequence[int]] = ((32, 32), (64, 64), (128, 128))
  norm: bool = True
  dense: int = 0

  @nn.compact
  def __call__(self, x):
    for stage in self.stages:
      for ch in stage:
        x = nn.Conv(ch, (3, 3), use_bias=not self.norm)(x)
        if self.norm:
          x = nn.GroupNorm(num_groups=min(8, ch))(x)
        x = nn.relu(x)
      x = max_pool_2x2(x)
    if self.dense:
      x = nn.relu(nn.Dense(self.dense)(x.reshape((x.shape[0], -1))))
    else:
      x = jnp.mean(x, axis=(1, 2))
    return nn.Dense(self.num_classes)(x)


def cifar_cnn(num_classes: int = 10) -> ConvNet:
  """The fast CIFAR-10 CNN of ``configs/cifar10.py`` (``model.name='cifar_cnn'``).

  Three 3x3 conv layers (32, 64, 128 channels) + ReLU, each followed by 2x2
  max-pooling, then a 256-unit ReLU dense layer and the linear head; no
  normalisation: 0.62M parameters, 10.8M multiply-adds per 32x32 image.
  Chosen by measurement (docs/benchmarks.md, "The fast CIFAR-10 CNN"): in hfl's
  2x4 step on this 2-core CPU it ran at 0.8x the small ``cnn``'s steps/s and
  3.4x the six-conv GroupNorm ConvNet's (both before :func:`max_pool_2x2`, which
  made its step 1.5x and the small CNN's 1.9x faster); configs/cifar10.py reaches
  80.8% test accuracy with it in 14 minutes.
  """
  return ConvNet(num_classes, ((32,), (64,), (128,)), norm=False, dense=256)


class _DecoderBlock(nn.Module):
  """Pre-LayerNorm transformer block: x + attn(LN(x)), then x + MLP(LN(x))."""
  num_heads: int
  embed_dim: int
  mlp_ratio: int = 4

  @nn.compact
  def __call__(self, x, mask):
    h = nn.LayerNorm()(x)
    x = x + nn.MultiHeadDotProductAttention(num_heads=self.num_heads, qkv_features=self.embed_dim,
                                            out_features=self.embed_dim)(h, mask=mask)
    h = nn.LayerNorm()(x)
    h = nn.gelu(nn.Dense(self.mlp_ratio * self.embed_dim)(h))
    return x + nn.Dense(self.embed_dim)(h)


class TransformerLM(nn.Module):
  """Decoder-only transformer language model (GPT; Radford et al. 2019, "Language
  Models are Unsupervised Multitask Learners", Sec. 2.3).

  Token and learned position embeddings (initialised N(0, 0.02^2) as in GPT-2),
  ``num_layers`` pre-LayerNorm blocks of causal multi-head self-attention
  (flax ``MultiHeadDotProductAttention`` with ``make_causal_mask``) and a GELU
  MLP of width 4 x ``embed_dim``, a final LayerNorm and an untied linear head.
  No dropout.

  Attributes:
    vocab_size: V, tokens (the dataset's ``num_classes``).
    num_layers: blocks (``model.num_layers``).
    num_heads: attention heads (``model.num_heads``; divides ``embed_dim``).
    embed_dim: model width (``model.embed_dim``).
    seq_len: maximum sequence length T (``model.seq_len``; position embeddings).

  Call: int tokens [B, T'] (T' <= seq_len) -> float32 logits [B, T', V]; the
  logits at position t depend only on tokens 0..t.
  """
  vocab_size: int
  num_layers: int = 4
  num_heads: int = 4
  embed_dim: int = 128
  seq_len: int = 64

  @nn.compact
  def __call__(self, tokens):
    init = nn.initializers.normal(0.02)
    x = nn.Embed(self.vocab_size, self.embed_dim, embedding_init=init)(tokens)
    pos = self.param('pos_embedding', init, (self.seq_len, self.embed_dim))
    x = x + pos[:tokens.shape[-1]]
    mask = nn.make_causal_mask(tokens)
    for _ in range(self.num_layers):
      x = _DecoderBlock(self.num_heads, self.embed_dim)(x, mask)
    return nn.Dense(self.vocab_size)(nn.LayerNorm()(x))


def input_kind(name: str) -> str:
  """``'tokens'`` (int32 [B, T]) for TOKEN_MODELS, else ``'image'`` (float32 [B, H, W, C])."""
  return 'tokens' if name in TOKEN_MODELS else 'image'


def from_config(model_cfg, num_classes: int) -> nn.Module:
  """The model of a config's ``model`` section (the transformer reads
  TRANSFORMER_FIELDS from it; absent fields take their defaults)."""
  opts = {k: model_cfg.get(k, v) for k, v in TRANSFORMER_FIELDS.items()}
  return get_model(model_cfg.name, num_classes, **opts)


def get_model(name: str, num_classes: int, **transformer_options) -> nn.Module:
  """Returns the Flax module called ``name``.

  Args:
    name: one of MODELS.
    num_classes: classes (image models) or vocabulary size (the transformer).
    **transformer_options: the transformer's num_layers, num_heads, embed_dim,
      seq_len (TRANSFORMER_FIELDS gives the defaults); ignored by image models.

  Raises:
    ValueError: ``name`` is not one of MODELS (names the field ``model.name``).
  """
  if name == 'cnn':
    return CNN(num_classes)
  if name == 'mlp':
    return MLP(num_classes)
  if name == 'cifar_cnn':
    return cifar_cnn(num_classes)
  if name == 'resnet20':
    return ResNet20(num_classes)
  if name == 'transformer':
    opts = dict(TRANSFORMER_FIELDS, **transformer_options)
    return TransformerLM(num_classes, **{k: int(v) for k, v in opts.items()})
  raise ValueError(f'model.name={name!r} is unknown; allowed: {", ".join(MODELS)}')
