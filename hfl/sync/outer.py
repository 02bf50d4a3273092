"""Outer optimizers on the inter-DC pseudo-gradient (FedAvg, FedAvgM, DiLoCo).

The inter-DC step treats the aggregate pseudo-gradient
``Delta = sum_d scale_d (x_prev - x_d)`` (:mod:`hfl.sync.aggregation`) as a
gradient and applies an optax optimizer to the global model ``x_prev``::

    updates, outer_state = tx.update(Delta, outer_state, x_prev)
    x_new = optax.apply_updates(x_prev, updates)

- ``'avg'``: ``optax.sgd(1.0)``, so ``x_new = x_prev - Delta = sum_d p_d x_d``:
  plain FedAvg model averaging (McMahan et al. 2017; the seed HPS).
- ``'sgd'``: ``optax.sgd(lr)`` (with heavy-ball momentum if ``momentum > 0``):
  FedAvg with a server learning rate / server momentum (Reddi et al. 2021,
  "Adaptive Federated Optimization"; Hsu et al. 2019, FedAvgM).
- ``'nesterov'``: ``optax.sgd(lr, momentum, nesterov=True)``: DiLoCo (Douillard
  et al. 2023, "DiLoCo: Distributed Low-Communication Training of Language
  Models"), outer lr 0.7 and momentum 0.9. optax's Nesterov form is
  ``m <- mu m + Delta;  x <- x - lr (mu m + Delta)``.

How the training loop uses it: ``tx = make_outer(cfg.sync.outer.name,
cfg.sync.outer.learning_rate, cfg.sync.outer.momentum)`` once; ``outer_state =
tx.init(global_params)``; at each round end :func:`apply_outer`. The outer state
is global (identical on every DC; replicate it over the ``'dc'`` axis) and is
checkpointed with the model. Absent DCs (:mod:`hfl.sync.faults`) change only
the weights in ``Delta``, never the outer state.
"""

import math
from typing import Any

import optax

OUTER_OPTIMIZERS = ('avg', 'sgd', 'nesterov')


def make_outer(name: str, learning_rate: float = 1.0,
               momentum: float = 0.0) -> optax.GradientTransformation:
  """Builds the outer optimizer for ``sync.outer``.

  Args:
    name: ``sync.outer.name``: 'avg', 'sgd' or 'nesterov'.
    learning_rate: ``sync.outer.learning_rate`` (outer lr, > 0). Must be 1.0
      for 'avg' (use 'sgd' for another server lr).
    momentum: ``sync.outer.momentum`` in [0, 1). Must be 0 for 'avg' and > 0
      for 'nesterov'.

  Returns:
    An ``optax.GradientTransformation`` to apply to the pseudo-gradient.

  Raises:
    ValueError: naming ``sync.outer.name`` for an unknown name,
      ``sync.outer.learning_rate`` for a non-positive/non-finite lr (or lr != 1
      with 'avg'), ``sync.outer.momentum`` for a momentum outside [0, 1) (or
      != 0 with 'avg', or 0 with 'nesterov').
  """
  if name not in OUTER_OPTIMIZERS:
    raise ValueError(
        f'sync.outer.name must be one of {OUTER_OPTIMIZERS}, got {name!r}.')
  lr = float(learning_rate)
  mu = float(momentum)
  if not math.isfinite(lr) or lr <= 0:
    raise ValueError(
        f'sync.outer.learning_rate must be finite and > 0, got {learning_rate!r}.')
  if not math.isfinite(mu) or not 0.0 <= mu < 1.0:
    raise ValueError(f'sync.outer.momentum must be in [0, 1), got {momentum!r}.')
  if name == 'avg':
    if lr != 1.0:
      raise ValueError(
          f'sync.outer.learning_rate must be 1.0 for sync.outer.name="avg" '
          f'(plain averaging), got {lr}; use name="sgd" for a server lr.')
    if mu != 0.0:
      raise ValueError(
          f'sync.outer.momentum must be 0 for sync.outer.name="avg", got {mu}; '
          'use name="sgd" or "nesterov" for outer momentum.')
    return optax.sgd(1.0)
  if name == 'sgd':
    return optax.sgd(lr, momentum=mu if mu > 0 else None)
  if mu == 0.0:
    raise ValueError(
        'sync.outer.momentum must be > 0 for sync.outer.name="nesterov" '
        '(DiLoCo: learning_rate 0.7, momentum 0.9).')
  return optax.sgd(lr, momentum=mu, nesterov=True)


def apply_outer(tx: optax.GradientTransformation, params: Any,
                pseudo_grad: Any, state: Any) -> tuple[Any, Any]:
  """One outer step: ``params`` minus the optimizer's step on ``pseudo_grad``.

  Args:
    tx: from :func:`make_outer`.
    params: pytree, the global model ``x_prev`` at the start of the round.
    pseudo_grad: pytree like ``params``, ``Delta = sum_d scale_d (x_prev -
      x_d)``.
    state: the outer optimizer state (``tx.init(params)`` at the start).

  Returns:
    ``(new_params, new_state)``. Pure and jit-compatible.
  """
  updates, state = tx.update(pseudo_grad, state, params)
  return optax.apply_updates(params, updates), state
