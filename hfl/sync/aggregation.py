"""Inter-DC aggregation weights: FedAvg (McMahan et al. 2017) and FedNova (Wang et al. 2020).

At the end of a round each DC d holds ``x_d`` and has a pseudo-gradient
``Delta_d = x_prev - x_d`` (``x_prev`` = the global model at the start of the
round). The aggregate pseudo-gradient handed to the outer optimizer
(:mod:`hfl.sync.outer`) is::

    Delta = sum_d scale_d * Delta_d

- FedAvg (McMahan et al. 2017): ``scale_d = p_d`` with data weights
  ``p_d = n_d / sum_{present} n_e`` over the DCs present in the round, so
  ``x_prev - Delta = sum_d p_d x_d`` (the FedAvg model average).
- FedNova (Wang, Liu, Liang, Joshi & Poor, "Tackling the Objective
  Inconsistency Problem in Heterogeneous Federated Optimization", NeurIPS
  2020): with unequal local step counts K_d, FedAvg converges to the optimum of
  ``sum_d p_d K_d f_d`` instead of ``sum_d p_d f_d``. FedNova averages the
  *normalised* updates ``Delta_d / K_d`` and rescales by the effective number of
  steps ``tau_eff = sum_d p_d K_d``::

      Delta = tau_eff * sum_d p_d Delta_d / K_d,   i.e.  scale_d = p_d tau_eff / K_d

  Normalising by K_d is the paper's ``||a_d||_1`` for plain local SGD; for local
  momentum/Adam the paper's normaliser differs and ``K_d`` is an approximation.
  With equal K_d, FedNova equals FedAvg.
- Samples (``'samples'``): weights proportional to the samples each present DC
  actually processed in the round, ``K_d W B`` (equal W and B across DCs)::

      scale_d = present_d K_d / sum_e present_e K_e

  the model average of FedAvg's eq. (McMahan et al. 2017, Algorithm 1: weights
  n_k / n) with n_k the round's processed samples instead of the DC's dataset
  size; with equal K_d it weights present DCs equally (not by n_d).

How the training loop uses it (inside the jitted / shard_map'd round):
``p = fedavg_weights(n_d, present)``; ``scale = aggregation_scale(
config.sync.aggregation, p, k_d)``; then each DC multiplies its pseudo-gradient
by its ``scale_d`` and the loop sums over the ``'dc'`` mesh axis (``psum``), or
calls :func:`weighted_sum` on a pytree with a leading ``[D]`` axis. An absent DC
has ``p_d = 0`` hence ``scale_d = 0``, so its (discarded) work contributes
nothing (see :mod:`hfl.sync.faults`).
"""

from typing import Any

import jax
import jax.numpy as jnp

AGGREGATIONS = ('fedavg', 'fednova', 'samples')


def fedavg_weights(n_d: jax.Array, present: jax.Array) -> jax.Array:
  """Data-size weights renormalised over the present DCs.

  ``p_d = present_d n_d / sum_e present_e n_e``. Safe under jit: if no DC with
  data is present (which :mod:`hfl.sync.faults` rules out), all weights are 0
  instead of NaN.

  Args:
    n_d: [D] numbers of training samples per DC (int or float, >= 0).
    present: bool [D], True where the DC takes part in the round.

  Returns:
    float32 [D], non-negative, summing to 1 over present DCs (0 where absent).
  """
  n = jnp.asarray(n_d, jnp.float32) * jnp.asarray(present, jnp.float32)
  total = jnp.sum(n)
  safe = jnp.where(total > 0, total, 1.0)
  return jnp.where(total > 0, n / safe, jnp.zeros_like(n))


def fedavg_scale(p: jax.Array, k: jax.Array) -> jax.Array:
  """FedAvg multipliers: ``scale_d = p_d`` (``k`` is unused).

  Args:
    p: float [D], aggregation weights (e.g. from :func:`fedavg_weights`).
    k: int [D], local steps K_d of each DC in the round (ignored).

  Returns:
    float32 [D], equal to ``p``.
  """
  del k
  return jnp.asarray(p, jnp.float32)


def fednova_scale(p: jax.Array, k: jax.Array) -> jax.Array:
  """FedNova multipliers ``scale_d = p_d tau_eff / K_d``, ``tau_eff = sum p_d K_d``.

  Source: Wang et al. 2020 (FedNova), the normalised-averaging update with
  ``||a_d||_1 = K_d`` (plain local SGD) and ``tau_eff = sum_d p_d K_d``.
  ``sum_d scale_d Delta_d`` is the FedNova aggregate pseudo-gradient.

  Args:
    p: float [D], aggregation weights summing to 1 over present DCs (0 where
      absent).
    k: int [D], local optimizer steps K_d of each DC in the round (>= 1; values
      below 1 are treated as 1 so that an unused entry cannot divide by 0).

  Returns:
    float32 [D]; ``sum_d scale_d = tau_eff * sum_d p_d / K_d``; equals ``p`` when
    all present K_d are equal.
  """
  p = jnp.asarray(p, jnp.float32)
  k = jnp.maximum(jnp.asarray(k, jnp.float32), 1.0)
  tau_eff = jnp.sum(p * k)
  return p * tau_eff / k


def samples_scale(p: jax.Array, k: jax.Array) -> jax.Array:
  """Multipliers by samples processed: ``scale_d = [p_d > 0] K_d / sum_e [p_e > 0] K_e``.

  Args:
    p: float [D], data weights (only whether ``p_d > 0``, i.e. DC d is present,
      is used).
    k: int [D], local steps K_d of each DC in the round (values below 1 count as 1).

  Returns:
    float32 [D], summing to 1 over present DCs (all 0 when none is).
  """
  q = jnp.where(jnp.asarray(p) > 0, jnp.maximum(jnp.asarray(k, jnp.float32), 1.0), 0.0)
  total = jnp.sum(q)
  return jnp.where(total > 0, q / jnp.where(total > 0, total, 1.0), 0.0)


def aggregation_scale(name: str, p: jax.Array, k: jax.Array) -> jax.Array:
  """Per-DC multipliers of the pseudo-gradients for ``sync.aggregation``.

  Args:
    name: 'fedavg', 'fednova' or 'samples' (static Python string).
    p: float [D], aggregation weights.
    k: int [D], local steps K_d.

  Returns:
    float32 [D].

  Raises:
    ValueError: naming ``sync.aggregation`` for an unknown name.
  """
  if name == 'fedavg':
    return fedavg_scale(p, k)
  if name == 'fednova':
    return fednova_scale(p, k)
  if name == 'samples':
    return samples_scale(p, k)
  raise ValueError(
      f'sync.aggregation must be one of {AGGREGATIONS}, got {name!r}.')


def weighted_sum(tree: Any, scale: jax.Array) -> Any:
  """``sum_d scale_d * tree[d]`` for a pytree whose leaves have a leading [D] axis.

  For use outside ``shard_map``; inside it, multiply by the DC's own
  ``scale_d`` and ``psum`` over the ``'dc'`` axis instead.

  Args:
    tree: pytree of float arrays [D, ...].
    scale: float [D].

  Returns:
    The pytree of leaves [...], in each leaf's dtype (the sum is computed in
    float32 at least).
  """
  scale = jnp.asarray(scale, jnp.float32)

  def leaf_sum(x):
    acc = jnp.promote_types(x.dtype, jnp.float32)
    out = jnp.tensordot(scale.astype(acc), x.astype(acc), axes=1)
    return out.astype(x.dtype)

  return jax.tree.map(leaf_sum, tree)
