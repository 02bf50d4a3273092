"""Inner optimizers (run on the workers, DESIGN 4.1), built with optax."""

import optax

OPTIMIZERS = ('sgd', 'momentum', 'nesterov', 'adam', 'adamw')


def make_optimizer(cfg) -> optax.GradientTransformation:
  """Builds the inner optimizer from the ``optimizer`` config section.

  Fields: name (one of OPTIMIZERS), learning_rate (> 0), momentum (in [0, 1), used
  by momentum/nesterov), weight_decay (>= 0; decoupled for adamw, L2 for the others).
  (``shard_state`` is read by the training loop, hfl.step.ShardedOptState.)

  Every optimizer built here is elementwise — an entry's update depends only on
  that entry's gradient, parameter and state, and on step counts — so its state can
  be sliced across a DC's workers (``optimizer.shard_state``). Keep it so, or make
  hfl.config refuse the new one with ``shard_state``.

  Raises:
    ValueError: naming the offending ``optimizer.*`` field.
  """
  name, lr = cfg.name, float(cfg.learning_rate)
  if name not in OPTIMIZERS:
    raise ValueError(f'optimizer.name={name!r} is unknown; allowed: {", ".join(OPTIMIZERS)}')
  if not lr > 0:
    raise ValueError(f'optimizer.learning_rate={cfg.learning_rate} must be > 0')
  mom, wd = float(cfg.momentum), float(cfg.weight_decay)
  if not 0 <= mom < 1:
    raise ValueError(f'optimizer.momentum={cfg.momentum} must be in [0, 1)')
  if not wd >= 0:
    raise ValueError(f'optimizer.weight_decay={cfg.weight_decay} must be >= 0')
  if name == 'adamw':
    return optax.adamw(lr, weight_decay=wd)
  if name == 'adam':
    opt = optax.adam(lr)
  elif name == 'sgd':
    opt = optax.sgd(lr)
  else:
    opt = optax.sgd(lr, momentum=mom, nesterov=(name == 'nesterov'))
  if wd:
    opt = optax.chain(optax.add_decayed_weights(wd), opt)
  return opt
