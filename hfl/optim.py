"""Inner optimizers (run on the workers between inter-DC rounds: the local steps of
FedAvg, McMahan et al. 2017, and the inner optimizer of DiLoCo, Douillard et al. 2023) and their learning-rate schedules,
built with optax."""

import re
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

OPTIMIZERS = ('sgd', 'momentum', 'nesterov', 'adam', 'adamw', 'muon', 'signum')
ELEMENTWISE = ('sgd', 'momentum', 'nesterov', 'adam', 'adamw', 'signum')  # state can be sliced (ZeRO-1)
SCHEDULES = ('constant', 'cosine', 'linear')


def _field(cfg, name, default):
  """``cfg.name``, or ``default`` for configs written before the field existed."""
  return cfg.get(name, default) if hasattr(cfg, 'get') else getattr(cfg, name, default)


def make_schedule(cfg, total_steps: int | None = None):
  """The learning rate as a function of the optimizer step count (optax schedule).

  Fields of the ``optimizer`` section: ``learning_rate`` (the peak, > 0),
  ``schedule`` (one of SCHEDULES; absent: 'constant'), ``warmup_steps`` (>= 0:
  linear warm-up from 0 to the peak over this many steps; absent: 0),
  ``decay_steps`` (steps from the start to the end of the decay, warm-up
  included; 0 = ``total_steps``), ``final_lr_ratio`` (in [0, 1]: the learning
  rate at the end of the decay, and after it, as a fraction of the peak).

  - 'constant': the peak after the warm-up.
  - 'cosine': ``optax.warmup_cosine_decay_schedule`` (Loshchilov & Hutter 2017,
    SGDR, without restarts).
  - 'linear': linear warm-up, then linear decay to the final value.

  The count is the optimizer's own: optax keeps it in the optimizer state (so it
  is checkpointed and restored with it) and advances it by one per update; the
  first update uses the value at count 0 (0 during a warm-up, the peak without
  one). A DC masked out of an iteration (semi-synchronous sync) keeps its
  optimizer state, so its count counts its own updates.

  Args:
    cfg: the ``optimizer`` config section.
    total_steps: ``train.num_steps``, used when ``decay_steps`` is 0.

  Returns:
    A float (constant without warm-up) or an optax schedule ``count -> lr``.

  Raises:
    ValueError: naming the offending ``optimizer.*`` field.
  """
  lr = float(cfg.learning_rate)
  name = _field(cfg, 'schedule', 'constant')
  warm = _field(cfg, 'warmup_steps', 0)
  decay = _field(cfg, 'decay_steps', 0)
  ratio = _field(cfg, 'final_lr_ratio', 0.0)
  if name not in SCHEDULES:
    raise ValueError(f'optimizer.schedule={name!r} is unknown; allowed: {", ".join(SCHEDULES)}')
  for field, v in (('warmup_steps', warm), ('decay_steps', decay)):
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
      raise ValueError(f'optimizer.{field}={v!r} must be an integer >= 0')
  if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio <= 1:
    raise ValueError(f'optimizer.final_lr_ratio={ratio!r} must be a number in [0, 1]')
  if name == 'constant':
    if not warm:
      return lr
    if total_steps and warm >= total_steps:
      raise ValueError(f'optimizer.warmup_steps={warm} must be < train.num_steps={total_steps}: '
                       'the run would end before reaching optimizer.learning_rate')
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warm),
                                 optax.constant_schedule(lr)], [warm])
  decay = decay or total_steps
  if not decay:
    raise ValueError(f'optimizer.schedule={name!r} needs optimizer.decay_steps > 0 or '
                     'train.num_steps')
  if decay <= warm:
    raise ValueError(f'optimizer.decay_steps={decay} (0 = train.num_steps) must exceed '
                     f'optimizer.warmup_steps={warm}: the decay starts after the warm-up '
                     '(for a short run lower optimizer.warmup_steps, e.g. '
                     f'--config.optimizer.warmup_steps={max(0, decay // 10)})')
  end = lr * float(ratio)
  if not warm:  # the same schedules without optax's warning about a 0-step warm-up
    return (optax.cosine_decay_schedule(lr, decay, end / lr if lr else 0.0) if name == 'cosine'
            else optax.linear_schedule(lr, end, decay))
  if name == 'cosine':
    return optax.warmup_cosine_decay_schedule(0.0, lr, warm, decay, end)
  return optax.join_schedules([optax.linear_schedule(0.0, lr, warm),
                               optax.linear_schedule(lr, end, decay - warm)], [warm])


class FrozenAdamState(NamedTuple):
  """State of :func:`scale_by_adam_frozen_variance`: ``count`` (int32 scalar, the steps
  taken), ``mu`` and ``nu`` (pytrees like the parameters, float32: Adam's first and
  second moments; ``nu`` stops changing after the warm-up)."""
  count: jax.Array
  mu: optax.Updates
  nu: optax.Updates


def scale_by_adam_frozen_variance(freeze_after: int, b1: float = 0.9, b2: float = 0.999,
                                  eps: float = 1e-8) -> optax.GradientTransformation:
  """Adam's scaling whose second moment is frozen after ``freeze_after`` steps.

  1-bit Adam's two stages (Tang et al., ICML 2021, "1-bit Adam: Communication Efficient
  Large-Scale Training with Adam's Convergence Speed", Algorithm 1): for steps
  t <= T = ``freeze_after`` plain Adam (Kingma & Ba 2015, Algorithm 1: m ← β1 m +
  (1 − β1) g, v ← β2 v + (1 − β2) g², update m̂ / (√v̂ + ε) with m̂ = m / (1 − β1^t),
  v̂ = v / (1 − β2^t)); after it v and its bias correction stay at step T's, so the
  update is linear in the momentum, m̂ / (√v̂_T + ε). Why it matters under sparse
  gradients: a coordinate that receives its error-feedback sum S once every n steps
  instead of S / n each step keeps v ≈ S² / n, so Adam moves it about √n times less
  than the dense gradient would; a v frozen from dense-enough early steps does not.

  Args:
    freeze_after: T >= 1, the last step that updates v.
    b1, b2, eps: as ``optax.scale_by_adam``.

  Returns:
    An optax transformation; its state is :class:`FrozenAdamState`.
  """
  def init_fn(params):
    zeros = lambda p: jnp.zeros_like(p, dtype=jnp.float32)
    return FrozenAdamState(jnp.zeros([], jnp.int32), jax.tree.map(zeros, params),
                           jax.tree.map(zeros, params))

  def update_fn(updates, state, params=None):
    del params
    count = state.count + 1
    live = count <= freeze_after
    mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, updates)
    nu = jax.tree.map(lambda v, g: jnp.where(live, b2 * v + (1 - b2) * g * g, v),
                      state.nu, updates)
    t_nu = jnp.minimum(count, freeze_after).astype(jnp.float32)
    c1 = 1 - b1 ** count.astype(jnp.float32)
    c2 = 1 - b2 ** t_nu
    out = jax.tree.map(lambda m, v: (m / c1) / (jnp.sqrt(v / c2) + eps), mu, nu)
    return out, FrozenAdamState(count, mu, nu)

  return optax.GradientTransformation(init_fn, update_fn)


def make_optimizer(cfg, total_steps: int | None = None) -> optax.GradientTransformation:
  """Builds the inner optimizer from the ``optimizer`` config section.

  Fields: name (one of OPTIMIZERS), learning_rate (> 0; the peak of the
  schedule), momentum (in [0, 1), used by momentum/nesterov), weight_decay
  (>= 0; decoupled for adamw and signum — scaled by the scheduled learning rate, as
  in optax —, L2 for the others), and the schedule fields of :func:`make_schedule`.
  (``shard_state`` is read by the training loop, hfl.step.ShardedOptState.)
  ``freeze_second_moment_after`` (int >= 0, 0 = off; adam and adamw only): Adam's
  second moment frozen after that many steps (:func:`scale_by_adam_frozen_variance`),
  a remedy for sparse-compressed gradients under Adam.

  The optimizers of :data:`ELEMENTWISE` are elementwise — an entry's update depends
  only on that entry's gradient, parameter and state, and on step counts — so their
  state can be sliced across a DC's workers (``optimizer.shard_state``); hfl.config
  refuses ``shard_state`` with any other.

  ``muon``: ``optax.contrib.muon`` (Jordan et al. 2024, "Muon: an optimizer for hidden
  layers"; MuLoCo, Thérien et al., arXiv:2505.23725, uses it as DiLoCo's inner
  optimizer): the Nesterov momentum (β = ``momentum``) of each 2-D leaf
  orthogonalised by 5 Newton-Schulz iterations, and Nesterov AdamW (β1 0.9, β2 0.999) for
  every other leaf (biases, norms, convolution kernels), both at the scheduled
  learning rate; ``weight_decay`` applies to both (scaled by the learning rate).

  Muon's options (``muon_*``, :func:`_muon`) are refused with other optimizers.

  ``signum``: signSGD with momentum and decoupled weight decay (:func:`_signum`;
  momentum 0: DeMo's update, ``docs/demo.md``).

  Args:
    cfg: the ``optimizer`` section.
    total_steps: ``train.num_steps`` (the default decay length).

  Raises:
    ValueError: naming the offending ``optimizer.*`` field.
  """
  name = cfg.name
  if name not in OPTIMIZERS:
    raise ValueError(f'optimizer.name={name!r} is unknown; allowed: {", ".join(OPTIMIZERS)}')
  if not float(cfg.learning_rate) > 0:
    raise ValueError(f'optimizer.learning_rate={cfg.learning_rate} must be > 0')
  mom, wd = float(cfg.momentum), float(cfg.weight_decay)
  if not 0 <= mom < 1:
    raise ValueError(f'optimizer.momentum={cfg.momentum} must be in [0, 1)')
  if not wd >= 0:
    raise ValueError(f'optimizer.weight_decay={cfg.weight_decay} must be >= 0')
  lr = make_schedule(cfg, total_steps)
  freeze = _field(cfg, 'freeze_second_moment_after', 0)
  if isinstance(freeze, bool) or not isinstance(freeze, int) or freeze < 0:
    raise ValueError(f'optimizer.freeze_second_moment_after={freeze!r} must be an integer '
                     '>= 0 (0: off)')
  if freeze and name not in ('adam', 'adamw'):
    raise ValueError(f'optimizer.freeze_second_moment_after={freeze} needs optimizer.name '
                     f'adam or adamw (it freezes Adam\'s second moment), got {name!r}')
  if freeze:
    decay = [optax.add_decayed_weights(wd)] if name == 'adamw' else []
    opt = optax.chain(scale_by_adam_frozen_variance(freeze), *decay,
                      optax.scale_by_learning_rate(lr))
    return optax.chain(optax.add_decayed_weights(wd), opt) if wd and name == 'adam' else opt
  adam_lr, leaves, exclude = _muon_fields(cfg)
  if name == 'muon':
    return _muon(cfg, lr, mom, wd)
  if adam_lr or leaves != 'matrices' or exclude is not None:
    raise ValueError(f'optimizer.muon_adam_learning_rate, muon_leaves and muon_exclude are '
                     f'options of optimizer.name=muon, got {name!r} with '
                     f'{adam_lr!r}, {leaves!r}, {_field(cfg, "muon_exclude", "")!r} '
                     "(their defaults: 0.0, 'matrices', '')")
  if name == 'adamw':
    return optax.adamw(lr, weight_decay=wd)
  if name == 'signum':
    return _signum(lr, mom, wd)
  if name == 'adam':
    opt = optax.adam(lr)
  elif name == 'sgd':
    opt = optax.sgd(lr)
  else:
    opt = optax.sgd(lr, momentum=mom, nesterov=(name == 'nesterov'))
  if wd:
    opt = optax.chain(optax.add_decayed_weights(wd), opt)
  return opt


MUON_LEAVES = ('matrices', 'kernels')
_ATTENTION_IN = ('query', 'key', 'value')  # flax attention kernels [in, heads, head_dim]


def _muon(cfg, lr, mom: float, wd: float) -> optax.GradientTransformation:
  """optax's Muon with hfl's options (:func:`make_optimizer`).

  ``muon_adam_learning_rate`` (> 0: the peak learning rate of the AdamW fallback, on
  ``lr``'s schedule; 0: ``learning_rate``), ``muon_leaves`` ('matrices': the 2-D
  leaves, optax's rule; 'kernels': every weight kernel of 2 or more axes,
  :func:`muon_dimensions`) and ``muon_exclude`` (a regular expression on leaf paths
  that take AdamW instead, e.g. the embeddings and the output head).
  """
  if not mom > 0:
    raise ValueError(f'optimizer.momentum={cfg.momentum} must be in (0, 1) for muon (its '
                     'Nesterov momentum β; 0.95 in the Muon and MuLoCo papers)')
  adam_lr, leaves, exclude = _muon_fields(cfg)
  ratio = adam_lr / float(cfg.learning_rate) if adam_lr else 1.0
  adam_sched = None if not adam_lr else (
      (lambda count: lr(count) * ratio) if callable(lr) else lr * ratio)
  dims = None if leaves == 'matrices' and exclude is None else (
      lambda params: muon_dimensions(params, leaves, exclude))
  return optax.contrib.muon(lr, beta=mom, weight_decay=wd, adam_weight_decay=wd,
                            adam_learning_rate=adam_sched, muon_weight_dimension_numbers=dims)


def _muon_fields(cfg) -> tuple:
  """(muon_adam_learning_rate, muon_leaves, muon_exclude compiled or None), checked;
  ValueError naming the field."""
  adam_lr = _field(cfg, 'muon_adam_learning_rate', 0.0)
  if isinstance(adam_lr, bool) or not isinstance(adam_lr, (int, float)) or not adam_lr >= 0:
    raise ValueError(f'optimizer.muon_adam_learning_rate={adam_lr!r} must be a number >= 0 '
                     '(0: optimizer.learning_rate)')
  leaves = _field(cfg, 'muon_leaves', 'matrices')
  if leaves not in MUON_LEAVES:
    raise ValueError(f'optimizer.muon_leaves={leaves!r} is unknown; allowed: '
                     f'{", ".join(MUON_LEAVES)}')
  pattern = _field(cfg, 'muon_exclude', '')
  if not isinstance(pattern, str):
    raise ValueError(f'optimizer.muon_exclude={pattern!r} must be a string (a regular '
                     "expression on leaf paths such as \"['Embed_0']['embedding']\"; '' = none)")
  try:
    exclude = re.compile(pattern) if pattern else None
  except re.error as e:
    raise ValueError(f'optimizer.muon_exclude={pattern!r} is not a valid regular expression '
                     f'({e})') from e
  return float(adam_lr), leaves, exclude


def muon_dimensions(params, leaves: str, exclude):
  """Per leaf of ``params``: how Muon sees it as a matrix
  (``optax.contrib.MuonDimensionNumbers``), or None for the AdamW fallback.

  ``leaves='matrices'``: every 2-D leaf, [fan_in, fan_out] (optax's default rule).
  ``'kernels'``: every weight kernel (a leaf named ``kernel``, flax's name for the
  weights of Dense, Conv and attention layers) of 2 or more axes, its last axis the
  output and the others reduced (a convolution kernel [kh, kw, in, out] as a [kh·kw·in, out] matrix, flax
  attention's output kernel [heads, head_dim, out] as [heads·head_dim, out]), except
  flax attention's query, key and value kernels [in, heads, head_dim], whose output
  is (heads, head_dim): each attention projection orthogonalised whole, as Muon's
  reference implementation does with the fused matrices (Jordan et al. 2024). Leaves
  whose path (``jax.tree_util.keystr``) matches ``exclude`` (a compiled regular
  expression, or None) take AdamW: MuLoCo (Thérien et al. 2025) and Muon keep the
  embeddings and the output head on AdamW.
  """
  def rule(path, x):
    key = jax.tree_util.keystr(path)
    if x.ndim < 2 or (exclude is not None and exclude.search(key)):
      return None
    if leaves == 'matrices':
      return optax.contrib.MuonDimensionNumbers(0, 1) if x.ndim == 2 else None
    names = [getattr(k, 'key', getattr(k, 'name', None)) for k in path]
    if names[-1] != 'kernel':  # flax's biases, norms' scales, embeddings
      return None
    if x.ndim == 3 and len(names) >= 2 and names[-2] in _ATTENTION_IN:
      return optax.contrib.MuonDimensionNumbers((0,), (1, 2))
    return optax.contrib.MuonDimensionNumbers(tuple(range(x.ndim - 1)), (x.ndim - 1,))
  return jax.tree_util.tree_map_with_path(rule, params)


def _signum(lr, beta: float, weight_decay: float) -> optax.GradientTransformation:
  """signSGD with momentum (Bernstein et al., "signSGD: Compressed Optimisation for
  Non-Convex Problems", ICML 2018, Algorithm 3) and decoupled weight decay.

  ``m <- β m + (1 - β) g`` (optax.signum's EMA, not debiased: only its sign is used),
  ``x <- x - lr (sign(m) + weight_decay x)``: the decay as DeMo's (Peng et al.,
  arXiv:2411.19870, Algorithm 1; ``x <- (1 - lr λ) x`` before the step in its reference
  code, the same update). With ``beta = 0`` it is signSGD, ``x <- x - lr sign(g)``, and
  keeps no state (optax.sign_sgd): DeMo's update of the averaged fast components, whose
  momentum lives in the uplink's error-feedback residual (``docs/demo.md``).
  ``sign(0) = 0``. Elementwise (:data:`ELEMENTWISE`).

  Args:
    lr: the learning rate, a float or an optax schedule.
    beta: the momentum β in [0, 1) (``optimizer.momentum``, checked by the caller).
    weight_decay: λ >= 0 (``optimizer.weight_decay``).

  Returns:
    optax.chain(ema if beta, scale_by_sign, add_decayed_weights if weight_decay,
    scale_by_learning_rate).
  """
  parts = [optax.ema(beta, debias=False)] if beta else []
  parts.append(optax.scale_by_sign())
  if weight_decay:
    parts.append(optax.add_decayed_weights(weight_decay))
  parts.append(optax.scale_by_learning_rate(lr))
  return optax.chain(*parts)
