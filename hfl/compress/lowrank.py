"""PowerSGD: rank-r compression by one power iteration with a warm start.

Reference: Vogels, Karimireddy & Jaggi, "PowerSGD: Practical Low-Rank Gradient
Compression for Distributed Optimization", NeurIPS 2019, Algorithm 1:

    P = M Q            (M: m x n, Q: n x r from the previous step = warm start)
    P_hat = orthogonalize(P)
    Q = M^T P_hat
    M_hat = P_hat Q^T

Differences from the paper, by design of hfl (the payload of ONE worker is
all-gathered and decoded individually, then the decoded matrices are averaged,
hfl.compress.ef.aggregate): the paper all-reduces P before orthogonalising and Q afterwards;
here each worker orthogonalises its own P and sends both factors, so
``payload = {'p': P_hat f32[m, r], 'q': Q f32[n, r]}`` and the wire cost is
``32 * r * (m + n)`` bits. The warm start is the worker's own Q (the paper uses
the all-reduced one). Error feedback is applied by the caller, as in the paper.

Non-matrix leaves are reshaped to 2-D like the paper reshapes conv kernels to
(output channels, everything else); in Flax's layouts the output features are
the LAST axis (Dense [in, out], Conv [h, w, in, out]), so a leaf of shape
(d_1, ..., d_k) becomes M of shape (d_1 * ... * d_{k-1}, d_k). A 1-D leaf becomes
(size, 1). The rank is clipped to min(m, n).

Orthogonalisation uses a Householder QR (``jnp.linalg.qr``), which stays finite
on rank-deficient or zero P (the paper's Gram-Schmidt would divide by zero).
A column of Q that becomes exactly zero (zero gradient) or non-finite (a
non-finite gradient, flagged by the step that sent it) is re-drawn from the
initial Gaussian Q so the warm start can get stuck neither at zero nor at NaN.

Range (hfl's). P = M Q grows like |M|^2 over the warm-started steps, so M and the
warm start Q are each pre-scaled by a power of two of their max-abs
(:func:`hfl.compress.base.pow2_scale`) before the products; orthogonalisation is
scale-invariant and the scaling exact, so the factors are those of the unscaled
products whenever these do not overflow. The sent Q = M^T P_hat is clipped
elementwise to ``+-(FLOAT32_MAX - max|M|) / (2 r)``, so that the decoded
P_hat Q^T (|P_hat| <= 1) and the residual M - P_hat Q^T are finite for every finite
M; the bound is far above any Q of a trainable gradient (it binds only within a
factor 2r of float32's max).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hfl.compress import base
from hfl.compress.base import Compressor
from hfl.compress.registry import register


class PowerSGDState(NamedTuple):
  """Warm-start state of one leaf.

  Attributes:
    q: f32[n, r], the previous step's Q (initially i.i.d. N(0, 1)).
  """
  q: jax.Array


def matrix_shape(shape) -> tuple:
  """The (m, n) view of a leaf used by PowerSGD (see module doc)."""
  shape = tuple(int(d) for d in shape)
  if len(shape) == 0:
    return (1, 1)
  if len(shape) == 1:
    return (shape[0], 1)
  return (int(np.prod(shape[:-1])), shape[-1])


def compresses(shape, rank: int) -> bool:
  """Whether rank-``rank`` factors of a leaf are smaller than the dense leaf.

  ``32 * r * (m + n) < 32 * m * n`` bits with r = min(rank, m, n), (m, n) =
  :func:`matrix_shape`. Where they are not, hfl's policy
  (:func:`hfl.compress.policy.build`) sends the leaf dense instead, as PyTorch's
  PowerSGD communication hook does (``_should_compress``).
  """
  m, n = matrix_shape(shape)
  r = min(int(rank), m, n)
  return r * (m + n) < m * n


def powersgd(shape, rank: int = 2, seed: int = 0, **unused) -> Compressor:
  """PowerSGD rank-``rank`` compressor with warm start (state: Q).

  Args:
    shape: the leaf's shape.
    rank: r >= 1 (clipped to min(m, n)).
    seed: seed of the initial Gaussian Q (same on every worker).
    **unused: other spec hyper-parameters, ignored.

  Returns:
    Compressor with state :class:`PowerSGDState` and payload
    ``{'p': f32[m, r], 'q': f32[n, r]}``; decode = p @ q.T reshaped to ``shape``.
    ``key`` is unused.

  Raises:
    ValueError: rank < 1.
  """
  del unused
  if int(rank) != rank or rank < 1:
    raise ValueError(f'rank must be an integer >= 1, got {rank!r}')
  shape = tuple(int(d) for d in shape)
  m, n = matrix_shape(shape)
  r = int(min(rank, m, n))

  def q0():
    return jax.random.normal(jax.random.PRNGKey(seed), (n, r), jnp.float32)

  def init():
    return PowerSGDState(q=q0())

  def encode(x, state, key):
    del key
    mat = x.reshape(m, n).astype(jnp.float32)
    amax = base.max_abs(mat)
    down, up = base.pow2_scale(amax)
    mat_s = mat * down
    p = mat_s @ (state.q * base.pow2_scale(base.max_abs(state.q))[0])
    p_hat, _ = jnp.linalg.qr(p)
    q = (mat_s.T @ p_hat) * up
    bound = (base.FLOAT32_MAX - jnp.minimum(amax, base.FLOAT32_MAX)) / (2 * r)
    q = jnp.where(jnp.isfinite(amax), jnp.clip(q, -bound, bound), q)
    # A zero column (zero gradient) or a non-finite one (a non-finite M, which this
    # step's payload already shows) restarts from the initial Gaussian Q.
    alive = (jnp.any(q != 0, axis=0, keepdims=True)
             & jnp.all(jnp.isfinite(q), axis=0, keepdims=True))
    return {'p': p_hat, 'q': q}, PowerSGDState(q=jnp.where(alive, q, q0()))

  def decode(payload):
    return (payload['p'] @ payload['q'].T).reshape(shape)

  return Compressor(f'powersgd(r={r})', shape, init, encode, decode)


def _powersgd_or_dense(shape, rank: int = 2, **hyper) -> Compressor:
  """PowerSGD where its factors are smaller than the leaf, float32 identity elsewhere
  (:func:`compresses`): a rank of at least a layer's smaller side would send more
  bits than the dense leaf and approximate nothing better. The
  ``compression.*.name='powersgd'`` factory."""
  if compresses(shape, rank):
    return powersgd(shape, rank=rank, **hyper)
  c = base.identity(shape)
  return c._replace(name=f'identity (powersgd r={rank} would not compress)')


register('powersgd', _powersgd_or_dense, ('rank',), example={'rank': 2})
