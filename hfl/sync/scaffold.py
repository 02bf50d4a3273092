"""SCAFFOLD control variates between DCs (``sync.control_variates='scaffold'``).

Source: Karimireddy, Kale, Mohri, Reddi, Stich & Suresh, "SCAFFOLD: Stochastic
Controlled Averaging for Federated Learning", ICML 2020, Algorithm 1 with the
control-variate update of option II. Here a "client" of the paper is a DC (its W
workers' mean gradient is the client's mini-batch gradient) and the "server" is
the inter-DC round; the paper's server learning rate η_g is the outer optimizer
(hfl.sync.outer).

State (leaves shaped like the parameters ``...``):
  c_d: DC d's control variate, ``DCState.c``, leaves f32[D, ...] in the TrainState
    (``hfl.step.TrainState.scaffold``, sharded P('dc')), zeros at the start.
  c: the global control variate, leaves f32[...], replicated
    (``TrainState.scaffold_c``), zeros at the start.
  Σ_k η_{d,k}: ``DCState.lr_sum``, f32[D], the learning rates of DC d's local
    steps since the last round (below).
  update count: ``DCState.count``, int32[D], DC d's inner updates so far, the count
    its learning-rate schedule is evaluated at: the inner optimizer's own count
    (both advance on the DC's active iterations only and are checkpointed; an
    absent DC's round is rolled back for both, hfl.step.ROUND_FIELDS). Kept here
    because ZeRO-1's sharded optimizer state holds its count per worker.

Every local step (Algorithm 1's client update y_i <- y_i - η_l (g_i(y_i) - c_i + c)),
on every worker of DC d, the gradient is corrected where it is formed
(:func:`hfl.step.local_gradient`, after DGC clipping and FedProx's term):

    g <- g - c_d + c                                     (:func:`correction`)

At the round (Algorithm 1's control-variate update, option II), with x_ref the model
the DC started the round from and x_d its model after its K_d local steps (their
difference is the round's pseudo-gradient Δ_d = x_ref - x_d, hfl.step.inter_dc_round):

    c_d+ = c_d - c + Δ_d / Σ_k η_{d,k}                   (:func:`update`)

which is the paper's c_i - c + (x - y_i) / (K η_l) for a constant learning rate
η_l = η (Σ_k η_{d,k} = K_d η). This is the paper's SGD derivation: with plain SGD
Δ_d = Σ_k η_{d,k} (g_k - c_d + c), so c_d+ is the η-weighted mean of the DC's
uncorrected gradients over the round (the mean itself for a constant η).

What η means (:func:`step_lr`, :func:`spec_from_config`): the SGD step the inner
optimizer takes per unit of gradient, η = lr × gain × s_d, with lr the configured
``optimizer.learning_rate`` (at the optimizer's own step count when
``optimizer.schedule`` or a warm-up makes it vary), s_d the DC's per-round
multiplier (``sync.lr_scaling``, hfl.train.round_lr_scale) and
  - gain = 1 for ``sgd``: the paper's setting, exact;
  - gain = 1 / (1 - β) for ``momentum`` and ``nesterov`` (optax's trace
    m <- g + β m, step lr m, or lr (g + β m) for Nesterov): the step per unit of a
    steady gradient once the momentum has built up; hfl keeps the momentum across
    rounds, so after the first round Δ_d ≈ Σ_k lr/(1 - β) (g_k - c_d + c) and c_d+
    again estimates the DC's mean gradient. With gain 1 (the configured lr as it
    is) c_d+ would be ~1/(1 - β) times too large: on configs/semisync.py (β = 0.9)
    such a run diverged in round 5 (NaN test loss), with the gain it trains;
  - gain = 1 for ``adam``, ``adamw`` and ``muon``: the formula as it is, on the
    configured lr; their steps are not lr × g (per-coordinate normalised or
    orthogonalised), so c_d+ is the mean update per unit of learning rate, not the
    mean gradient, and is on another scale than the gradients it corrects (an
    approximation outside the paper; prefer SGD or momentum with SCAFFOLD).
DGC's momentum correction (``compression.dgc.momentum``, on the uplink) is not in
the gain. A DC whose Σ_k η_{d,k} is 0 (every one of its steps in a learning-rate
warm-up's first update) keeps its c_d.

The global variate (Algorithm 1's server update c <- c + (|S|/N) Δc, with data weights
in place of the paper's uniform 1/N):

    c <- c + Σ_d p_d (c_d+ - c_d),    p_d = n_d / n over all D DCs,

so that c = Σ_d p_d c_d at all times (the data-weighted mean of the global
objective Σ_d p_d f_d, which FedAvg and FedNova both target); a DC absent from
the round (hfl.sync.faults, aggregation weight 0) keeps its c_d and adds nothing,
as a client outside the paper's sampled set S.

Communication: each present DC sends c_d+ - c_d over the WAN with the round's
pseudo-gradient (the paper's clients communicate (Δy_i, Δc_i): SCAFFOLD doubles the
uplink), as an uncompressed float32 payload, whatever ``compression.wan`` is: 32 bits per
parameter per DC (:func:`payload_bits`), all-reduced over 'dc' with the weights
p_d in 1/W slices per worker and re-gathered over 'worker' like an identity WAN
leaf (hfl.step.scaffold_round). It is charged as such on the inter-DC link
(``inter_dc``) and, for the re-gather, on ``intra_down``.
"""

from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
from hfl import optim

CONTROL_VARIATES = ('none', 'scaffold')


class Spec(NamedTuple):
  """What the step needs to run SCAFFOLD (static at trace time).

  Attributes:
    weights: p_d = n_d / n, one Python float per DC (all D DCs, summing to 1).
    learning_rate: the inner optimizer's learning rate: a float, or the optax
      schedule ``count -> lr`` (hfl.optim.make_schedule) evaluated at the DC's
      optimizer step count.
    gain: the SGD step per unit of learning rate and gradient (module docstring:
      1, or 1 / (1 - β) for heavy-ball and Nesterov momentum β).
  """
  weights: tuple
  learning_rate: float | Callable
  gain: float = 1.0


class DCState(NamedTuple):
  """Per-DC SCAFFOLD state (``hfl.step.TrainState.scaffold``; leading [D] axis).

  Attributes:
    c: c_d, pytree like the parameters, f32 leaves [D, ...].
    lr_sum: f32[D], Σ_k η_{d,k} over DC d's local steps since the last round.
    count: int32[D], the DC's inner updates so far (its schedule's count).
  """
  c: Any
  lr_sum: jax.Array
  count: jax.Array


def enabled(sync_config) -> bool:
  """Whether ``sync.control_variates`` is 'scaffold' (absent: 'none')."""
  return sync_config.get('control_variates', 'none') == 'scaffold'


def spec(weights: Sequence[float], learning_rate: float | Callable, gain: float = 1.0) -> Spec:
  """:class:`Spec` from per-DC data weights (float [D]), the inner learning rate and
  its gain."""
  return Spec(tuple(float(w) for w in weights), learning_rate, float(gain))


# Inner optimizers whose step per unit of a steady gradient is lr / (1 - momentum).
MOMENTUM_OPTIMIZERS = ('momentum', 'nesterov')


def gain(optimizer_config) -> float:
  """The gain of η for the ``optimizer`` config section (module docstring): 1 / (1 -
  ``momentum``) for 'momentum' and 'nesterov', else 1."""
  if optimizer_config.name in MOMENTUM_OPTIMIZERS:
    return 1.0 / (1.0 - float(optimizer_config.momentum))
  return 1.0


def spec_from_config(config, dc_weights) -> Spec | None:
  """The run's :class:`Spec` (None unless ``sync.control_variates='scaffold'``):
  ``dc_weights`` (float [D], n_d / n), the inner learning rate of
  ``config.optimizer`` (hfl.optim.make_schedule with ``train.num_steps``, as the
  inner optimizer is built) and its :func:`gain`."""
  if not enabled(config.sync):
    return None
  return spec(dc_weights, optim.make_schedule(config.optimizer, config.train.num_steps),
              gain(config.optimizer))


def init(params, num_dcs: int) -> tuple[DCState, Any]:
  """Zero control variates: (DCState with c_d leaves f32[D, ...], lr_sum f32[D] and
  count int32[D] zeros, the global c with leaves f32[...] like ``params``)."""
  zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), params)
  per_dc = jax.tree.map(lambda x: jnp.zeros((num_dcs,) + x.shape, jnp.float32), params)
  return DCState(per_dc, jnp.zeros((num_dcs,), jnp.float32),
                 jnp.zeros((num_dcs,), jnp.int32)), zeros


def correction(c_d, c):
  """c - c_d, the term added to a DC's local gradient (per device: pytrees like
  the parameters, f32)."""
  return jax.tree.map(lambda a, b: b - a, c_d, c)


def step_lr(learning_rate: float | Callable, count, lr_scale=None,
            gain: float = 1.0) -> jax.Array:
  """f32[]: η of the DC's update number ``count`` (int32[], from 0): the constant
  ``learning_rate``, or the schedule at ``count`` (the value optax uses for that
  update), times ``gain`` and ``lr_scale`` (f32[], None: 1)."""
  if callable(learning_rate):
    eta = jnp.asarray(learning_rate(count), jnp.float32)
  else:
    eta = jnp.float32(learning_rate)
  eta = eta * jnp.float32(gain)
  return eta if lr_scale is None else eta * lr_scale.astype(jnp.float32)


def update(c_d, c, pseudo, lr_sum):
  """Option II (per device): c_d+ = c_d - c + Δ_d / Σ_k η_{d,k}, leaves f32 like
  the parameters; c_d itself where ``lr_sum`` (f32[]) is 0.

  Args:
    c_d: this DC's control variate; c: the global one; pseudo: Δ_d = x_ref - x_d
      (pytrees like the parameters, f32); lr_sum: f32[], Σ_k η_{d,k}.
  """
  ok = lr_sum > 0
  inv = jnp.where(ok, 1.0 / jnp.where(ok, lr_sum, 1.0), 0.0).astype(jnp.float32)
  return jax.tree.map(lambda a, b, p: jnp.where(ok, a - b + p.astype(jnp.float32) * inv, a),
                      c_d, c, pseudo)


def payload_bits(params_shape) -> int:
  """Bits of one DC's c_d+ - c_d on the WAN per round: 32 per parameter (float32,
  uncompressed), a Python int."""
  return int(sum(32 * int(x.size) for x in jax.tree.leaves(params_shape)))
