"""Registrations of the dense compressors: float32 (identity) and the 16-bit casts.

The compressors themselves are :func:`hfl.compress.base.identity` (32 bits per
entry, summed by an all-reduce) and :func:`hfl.compress.base.cast` (bfloat16 or
float16, 16 bits per entry, saturating). They are registered here, not in
:mod:`hfl.compress.base`, because :mod:`hfl.compress.registry` imports ``base``.
``float32``, ``bfloat16`` and ``float16`` are also the values of
``compression.small`` (:func:`hfl.compress.policy.build`), which uses
:func:`factory` too.
"""

from typing import Callable

import jax.numpy as jnp

from hfl.compress import base
from hfl.compress.registry import register


def factory(dtype) -> Callable[..., base.Compressor]:
  """``make(shape) -> base.cast(shape, dtype)``, the factory of a 16-bit cast.

  Args:
    dtype: jnp.bfloat16 or jnp.float16 (or their names); any other dtype makes
      the returned factory raise ValueError when called.
  """
  def make(shape):
    return base.cast(shape, dtype)
  return make


bf16 = factory(jnp.bfloat16)
fp16 = factory(jnp.float16)

register('identity', base.identity)
register('float32', base.identity)
register('bf16', bf16)
register('bfloat16', bf16)
register('fp16', fp16)
register('float16', fp16)
