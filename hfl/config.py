"""Config validation: every field checked before data loading or compilation.

Errors are ``ValueError``s that name the field, the value and what is allowed.
:func:`validate` runs every check that needs only the config (and that
``dataset.data_dir`` exists), calling the constructors the run builds its
objects with (the network model, the fault plan, the outer optimizer, the K
schedule, the inner optimizer and its schedule, the stopping rule), so main.py
and :mod:`hfl.sweep`'s pre-check refuse the same configs. What needs more runs
in :func:`hfl.setup.setup`, still before anything is compiled or written: the
data (the files' contents; a batch larger than a worker's shard, also
:func:`hfl.data.partition_dataset`), the model's shapes (what a compressor's
factory refuses, e.g. CO3's gamma; Streaming DiLoCo's fragments; the payload
sizes and the K schedule's plan, which tighten the budgets' warm-up check of
:func:`check_budget_warmup`) and the devices (the mesh's device count).

Also the config-file helpers main.py and :mod:`hfl.sweep` share:
:func:`load_file`, :func:`apply_overrides` (``--config.KEY=VALUE`` semantics)
and :func:`unknown_field` (the "did you mean" of a misspelled field), which
:func:`check_fields` (the first check of :func:`validate`) also gives for a
field a config file sets that hfl does not read (:func:`known_fields`).
"""

import difflib
import functools
import importlib.util
import math
import os
import sys
from typing import Any, Mapping, Sequence

import ml_collections
import numpy as np

from hfl import budget as budget_lib
from hfl import data as data_lib
from hfl import mesh as mesh_lib, models, network, optim
from hfl.compress import policy
from hfl.sync import aggregation as aggregation_lib
from hfl.sync import faults as faults_lib
from hfl.sync import outer as outer_lib
from hfl.sync import scaffold as scaffold_lib
from hfl.sync import schedule as schedule_lib
from hfl.sync import streaming
from hfl.sync import strategies as strategies_lib

# One source for the names: the modules that implement them.
STRATEGIES = schedule_lib.STRATEGIES
AGGREGATIONS = aggregation_lib.AGGREGATIONS
PARTITIONS = ('iid', 'dirichlet', 'contiguous')  # per task: data_lib.PARTITIONS
SMALL_PRECISIONS = ('float32', 'bfloat16', 'float16')
REQUIRED = ('seed', 'mesh', 'dataset', 'model', 'optimizer', 'train', 'sync', 'compression',
            'network')
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIELDS_HELP = 'Config fields are listed in the README (config reference) and configs/default.py.'


def _get_field(config: ml_collections.ConfigDict, field: str):
  """The value of a dotted field, e.g. ``'sync.k'``."""
  for key in field.split('.'):
    config = config[key]
  return config


def _int(c, path, lo=None, hi=None, lo_name=None):
  v = _get_field(c, path)
  if isinstance(v, bool) or not isinstance(v, int):
    raise ValueError(f'{path}={v!r} must be an integer')
  if lo is not None and v < lo:
    bound = f'{lo_name} ({lo})' if lo_name else str(lo)
    raise ValueError(f'{path}={v} must be >= {bound}')
  if hi is not None and v > hi:
    raise ValueError(f'{path}={v} must be <= {hi}')
  return v


def _choice(value, path, allowed):
  if value not in allowed:
    raise ValueError(f'{path}={value!r} is unknown; allowed: {", ".join(allowed)}')


def non_finite_field(config: ml_collections.ConfigDict,
                     prefix: str = '') -> tuple[str, float] | None:
  """(dotted name, value) of the first float field (or tuple/list entry) of
  ``config`` that is ``inf`` or ``nan``, else None (no hfl field takes either)."""
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      bad = non_finite_field(value, f'{prefix}{key}.')
      if bad:
        return bad
      continue
    entries = value if isinstance(value, (tuple, list)) else (value,)
    for i, v in enumerate(entries):
      if isinstance(v, float) and not math.isfinite(v):
        return f'{prefix}{key}' + (f'[{i}]' if entries is value else ''), v
  return None


def validate(config: ml_collections.ConfigDict, paths: bool = True
             ) -> ml_collections.ConfigDict:
  """Checks ``config`` and returns it (unchanged): every check that needs neither
  the data's contents, the model's shapes nor the devices (module docstring).

  Args:
    config: the config.
    paths: also check that ``dataset.data_dir`` exists (False for a config that
      is compared but not run: a finished run's, :func:`hfl.sweep.check_done`).

  Raises:
    ValueError: any field hfl does not read, e.g. a misspelled one in a config
      file (:func:`check_fields`: ``unknown config field 'sync.kk'; did you mean
      'sync.k'? ...``, all such fields in one message); else the first invalid
      field, e.g. ``sync.k=0 must be >= 1``, or any float field that is
      ``inf``/``nan``; a ``dataset.data_dir`` that does not exist; an optimizer
      warm-up the time or sample budget cannot finish (:func:`check_budget_warmup`).
  """
  check_fields(config)  # first: a misspelled section is not reported as a missing one
  for key in REQUIRED:
    if key not in config:
      raise ValueError(f'config is missing the section/field {key!r}; start from configs/default.py')
  bad = non_finite_field(config)
  if bad:
    raise ValueError(f'{bad[0]}={bad[1]!r} must be a finite number (inf and nan are never '
                     'allowed in a config)')
  _int(config, 'seed', 0)
  _int(config, 'mesh.num_dcs', 1)
  _int(config, 'mesh.workers_per_dc', 1)
  _choice(mesh_lib.simulate(config), 'mesh.simulate', mesh_lib.SIMULATE)
  d = config.mesh.num_dcs
  net = network.from_config(config.network, d)
  _choice(config.model.name, 'model.name', models.MODELS)
  budget_lib.from_config(config.train, config.optimizer)  # num_steps, time or sample budget
  optim.make_optimizer(config.optimizer, config.train.num_steps)
  validate_task(config)
  if config.dataset.partition == 'dirichlet' and not float(config.dataset.dirichlet_alpha) > 0:
    raise ValueError(f'dataset.dirichlet_alpha={config.dataset.dirichlet_alpha} must be > 0')
  t = config.train
  _int(config, 'train.batch_size', 1)
  _int(config, 'train.eval_every', 1)
  _int(config, 'train.checkpoint_every', 0)
  _int(config, 'train.eval_batch_size', 1)
  _int(config, 'train.log_every', 1)
  if not 0 < float(t.target_accuracy) <= 1:
    raise ValueError(f'train.target_accuracy={t.target_accuracy} must be a fraction in (0, 1]')
  if 'target_loss' in t and not _number(t.target_loss, 'train.target_loss') > 0:
    raise ValueError(f'train.target_loss={t.target_loss} must be > 0 (nats per token)')
  s = config.sync
  _choice(s.strategy, 'sync.strategy', STRATEGIES)
  _choice(s.aggregation, 'sync.aggregation', AGGREGATIONS)
  k = _int(config, 'sync.k', 1)
  _int(config, 'sync.k_max', k, lo_name='sync.k')
  faults_lib.make_present_fn(s.faults, d)
  outer_lib.make_outer(s.outer.name, s.outer.learning_rate, s.outer.momentum)
  _choice(config.compression.small, 'compression.small', SMALL_PRECISIONS)
  _int(config, 'compression.small_threshold', 0)
  policy.dense_pattern(config.compression.get('dense_leaves', ''))
  for link in ('uplink', 'downlink', 'wan'):
    policy.check_spec(config.compression[link], f'compression.{link}')
  validate_broadcast(config)
  validate_broadcast_density(config)
  validate_correction(config)
  validate_send(config)
  validate_dgc(config)
  validate_shard_state(config)
  validate_heterogeneity_options(config)
  validate_control_variates(config)
  validate_strategy(config)
  # The K schedule's fields (sync.progress_*), with stand-in times (t = 1 s, C = 0),
  # which only semi_sync's K_d use (hfl.setup.setup builds it with the planned ones).
  schedule_lib.from_config(s, d, t=np.ones(d), c=np.zeros(d))
  validate_streaming(config)
  # Payloads unknown here: times without them, a lower bound (hfl.setup.setup checks
  # again with the planned times).
  check_budget_warmup(config, network.iteration_time(net, np.zeros(d), np.zeros(d)),
                      network.round_comm_time(net, np.zeros(d)), how='the network model '
                      'without the payloads (hfl.setup.setup counts them)')
  validate_data_dir(config, exists=paths)  # last: the fields first, then the filesystem
  return config


def check_budget_warmup(config: ml_collections.ConfigDict, t_d, c_d, schedule=None,
                        how: str = 'hfl.setup.planned_times') -> None:
  """Refuses an ``optimizer.warmup_steps`` that a budget cannot finish: under
  ``train.sim_time_budget_s`` or ``train.sample_budget`` the counterpart of
  "optimizer.warmup_steps must be < train.num_steps" (:func:`hfl.optim.make_schedule`).

  No DC runs more iterations (optimizer steps) within the budget than
  :func:`hfl.budget.max_iterations` (time: from the fastest DC's iteration time
  ``min(t_d)`` and the least round communication time ``min(c_d)``, 0 with
  ``sync.faults``: a round with one DC present exchanges nothing) or
  :func:`hfl.budget.max_iterations_of_samples` (samples: from W x B samples per
  iteration and the fewest DCs present in a round, ``mesh.num_dcs``, 1 with
  ``sync.faults``), with K the most iterations a round can hold:
  ``sync.k_max`` where K adapts (AdaComm, ``sync.progress_aware``) or, for
  'semi_sync', without ``schedule``; else the schedule's K (1 for 'sync', ``sync.k``
  for 'periodic' without one). A warm-up of at least that many steps would end the
  run below ``optimizer.learning_rate``. Nothing to check under ``train.num_steps``
  or without a warm-up.

  Args:
    config: a config whose other fields are valid.
    t_d, c_d: float [D] seconds per DC of an iteration and of a round's communication
      (lower bounds will do: they only loosen the bound; the sample budget does not
      use them).
    schedule: the run's K schedule (:mod:`hfl.sync.schedule`, built with the
      planned times), or None.
    how: where ``t_d`` and ``c_d`` come from, for the message.

  Raises:
    ValueError: naming ``optimizer.warmup_steps``, the bound, its formula and inputs.
  """
  stop = budget_lib.from_config(config.train)
  warm = config.optimizer.get('warmup_steps', 0)
  if stop.governed_by == 'num_steps' or not warm:
    return
  s = config.sync
  if (s.strategy == 'adacomm' or s.progress_aware
      or (schedule is None and s.strategy == 'semi_sync')):
    k, k_from = schedule_lib.most_k(s.strategy, s.k_max, t_d, c_d,
                                    s.get('k_max_scope', 'every_dc')), 'sync.k_max'
  elif schedule is None:
    k, k_from = (1, "sync.strategy='sync'") if s.strategy == 'sync' else (s.k, 'sync.k')
  else:
    k, k_from = int(np.max(schedule.plan(schedule.init()).k_d)), "the K schedule's plan"
  if stop.governed_by == 'sample_budget':
    per_it = config.mesh.workers_per_dc * config.train.batch_size
    p, p_from = (1, 'sync.faults') if s.faults else (config.mesh.num_dcs, 'mesh.num_dcs')
    most = budget_lib.max_iterations_of_samples(stop.sample_budget, per_it, k, p)
    if warm >= most:
      raise ValueError(
          f'optimizer.warmup_steps={warm} must be < {most}, the most iterations a DC can '
          f'run within train.sample_budget={stop.sample_budget}: the run would end before '
          'reaching optimizer.learning_rate. The bound is floor((S K - 1) / (W B (K + P '
          f'- 1))) + K with W B = {per_it} samples per iteration (mesh.workers_per_dc x '
          f'train.batch_size), K = {k} the most iterations of a round ({k_from}) and P = '
          f'{p} the fewest DCs present in a round ({p_from}; '
          'the last round may cross the budget). Lower optimizer.warmup_steps or raise '
          'train.sample_budget')
    return
  t, c = float(np.min(t_d)), 0.0 if s.faults else float(np.min(c_d))
  most = budget_lib.max_iterations(stop.sim_time_budget_s, t, c, k)
  if most is not None and warm >= most:
    raise ValueError(
        f'optimizer.warmup_steps={warm} must be < {most}, the most iterations a DC can run '
        f'within train.sim_time_budget_s={stop.sim_time_budget_s}: the run would end before '
        f'reaching optimizer.learning_rate. Estimated from {how}: floor(budget / (t + C / K))'
        f" + K with t = {t:.4g} s the fastest DC's iteration, C = {c:.4g} s the least "
        f'communication of a round and K = {k} the most iterations of a round (the last '
        'round may cross the budget). Lower optimizer.warmup_steps or raise '
        'train.sim_time_budget_s')


LR_SCALINGS = ('none', 'inverse_k')  # hfl.train.round_lr_scale
BROADCASTS = ('downlink', 'gather')  # hfl.step.BROADCASTS
SENDS = ('gradient', 'update')  # hfl.step.SENDS


def validate_broadcast_density(config: ml_collections.ConfigDict) -> None:
  """Checks ``compression.broadcast_density`` (absent or 0: the downlink's density).

  Raises:
    ValueError: not a number in [0, 1]; or > 0 where the round's correction does not go
      through a top-k / random-k downlink (``compression.broadcast='downlink'``).
  """
  c = config.compression
  rho = _number(c.get('broadcast_density', 0.0), 'compression.broadcast_density')
  if not 0 <= rho <= 1:
    raise ValueError(f'compression.broadcast_density={rho} must be in [0, 1] (0: the '
                     "downlink's density)")
  if rho > 0 and (c.get('broadcast', 'gather') != 'downlink'
                  or c.downlink.name not in SPARSIFIERS):
    raise ValueError(
        f'compression.broadcast_density={rho} sets the density of the round\'s correction '
        f"through the downlink, which needs compression.broadcast='downlink' and a "
        f'{"/".join(SPARSIFIERS)} compression.downlink; got compression.broadcast='
        f"{c.get('broadcast', 'gather')!r}, compression.downlink.name={c.downlink.name!r}")


def validate_correction(config: ml_collections.ConfigDict) -> None:
  """Checks ``compression.correction`` (absent, or name '': the round's correction goes
  through the downlink's compressor; hfl.setup.build_compressors).

  Raises:
    ValueError: an unknown name or an out-of-range hyper-parameter
      (hfl.compress.policy.check_spec, naming ``compression.correction``); a name set
      while ``compression.broadcast`` is not 'downlink' (nothing would use it) or while
      ``compression.broadcast_density`` > 0 (two settings of the same compressor).
  """
  c = config.compression
  name = policy.correction_name(c)
  if not name:
    return
  policy.check_spec(c.correction, 'compression.correction')
  if c.get('broadcast', 'gather') != 'downlink':
    raise ValueError(
        f'compression.correction.name={name!r} sets the compressor of the round\'s '
        "correction through the downlink, which needs compression.broadcast='downlink'; "
        f"got compression.broadcast={c.get('broadcast', 'gather')!r}")
  rho = float(c.get('broadcast_density', 0.0))
  if rho > 0:
    raise ValueError(
        f'compression.correction.name={name!r} and compression.broadcast_density={rho} '
        "both set the round's correction's compressor: set the density as "
        'compression.correction.density and compression.broadcast_density=0')


def _dgc_momentum(config: ml_collections.ConfigDict) -> float:
  """``compression.dgc.momentum`` (0.0 when the section or the field is absent)."""
  g = config.compression.get('dgc')
  return float(g.get('momentum', 0.0)) if g is not None else 0.0


def validate_send(config: ml_collections.ConfigDict) -> None:
  """Checks ``compression.send`` (absent: 'gradient'; hfl.step.worker_update).

  Raises:
    ValueError: not one of :data:`SENDS`; or 'update' with ``optimizer.shard_state``
      (each worker keeps its whole optimizer state) or DGC momentum correction (its
      velocity would be a second momentum on top of the optimizer's).
  """
  send = config.compression.get('send', 'gradient')
  _choice(send, 'compression.send', SENDS)
  if send != 'update':
    return
  if config.optimizer.get('shard_state', False):
    raise ValueError(
        "compression.send='update' cannot be combined with optimizer.shard_state=True: "
        "each worker runs the optimizer on its own gradient and keeps its whole state; "
        "set optimizer.shard_state=False or compression.send='gradient'")
  m = _dgc_momentum(config)
  if m > 0:
    raise ValueError(
        f"compression.send='update' cannot be combined with compression.dgc.momentum={m}: "
        "the workers already send their optimizer's update, DGC's velocity would add a "
        "second momentum; set compression.dgc.momentum=0 or compression.send='gradient'")


def validate_broadcast(config: ml_collections.ConfigDict) -> None:
  """Checks ``compression.broadcast`` (absent: 'gather', how older runs ran;
  hfl.step.broadcast_leaves).

  Raises:
    ValueError: not one of :data:`BROADCASTS`; or 'downlink' with a correction that may
      be lossy (hfl.compress.policy.lossy_correction: ``compression.downlink.name``, or
      ``compression.correction.name`` where set, not identity/float32, or
      ``compression.small`` not float32) under Streaming DiLoCo
      (hfl.sync.streaming.enabled): a fragment's merge adopts the global fragment as
      it is, so the round's update would have to be re-gathered there.
  """
  c = config.compression
  mode = c.get('broadcast', 'gather')
  _choice(mode, 'compression.broadcast', BROADCASTS)
  if mode == 'downlink' and policy.lossy_correction(c) and streaming.enabled(config.sync):
    s = config.sync
    raise ValueError(
        f"compression.broadcast='downlink' sends the round's update through the lossy "
        f'downlink (compression.downlink.name={c.downlink.name!r}, '
        f'compression.correction.name={policy.correction_name(c)!r}, compression.small='
        f'{c.small!r}), which Streaming DiLoCo (sync.fragments={s.get("fragments", 1)}, '
        f'sync.overlap_steps={s.get("overlap_steps", 0)}, sync.mixing_alpha='
        f'{s.get("mixing_alpha", 0.0)}, sync.eager={s.get("eager", False)}) does not '
        "support: its fragments merge the global model as it is. Set "
        "compression.broadcast='gather', or a lossless downlink (compression.downlink.name="
        "'identity', compression.correction.name='' and compression.small='float32'), or "
        "turn streaming off")


def validate_heterogeneity_options(config: ml_collections.ConfigDict) -> None:
  """Checks the semi-sync remedies of ``sync`` (each absent: off).

  Raises:
    ValueError: ``sync.k_min_ratio`` not in [0, 1]; ``sync.lr_scaling`` not one
      of :data:`LR_SCALINGS`; ``sync.prox_mu`` not a finite number >= 0;
      ``sync.progress_test`` not one of ``hfl.sync.schedule.PROGRESS_TESTS``;
      ``sync.k_max_scope`` not one of ``hfl.sync.schedule.K_MAX_SCOPES``;
      ``sync.k_min_ratio`` > 0, ``sync.lr_scaling`` != 'none' or
      ``sync.k_max_scope`` != 'every_dc' with a strategy
      other than 'semi_sync', or ``sync.progress_test`` != 'endpoints' without
      ``sync.progress_aware`` (each would silently do nothing).
  """
  s = config.sync
  r = _number(s.get('k_min_ratio', 0.0), 'sync.k_min_ratio')
  if not 0 <= r <= 1:
    raise ValueError(f'sync.k_min_ratio={r} must be in [0, 1] (0: off; the least fraction '
                     "of the round's largest K_d any DC runs)")
  _choice(s.get('lr_scaling', 'none'), 'sync.lr_scaling', LR_SCALINGS)
  _choice(s.get('progress_test', 'endpoints'), 'sync.progress_test', schedule_lib.PROGRESS_TESTS)
  _choice(s.get('k_max_scope', 'every_dc'), 'sync.k_max_scope', schedule_lib.K_MAX_SCOPES)
  # A remedy set where it cannot act is a mistake in the experiment, not a no-op.
  if s.strategy != 'semi_sync':  # the only strategy whose DCs run different K_d
    for field, value, off in (('k_min_ratio', r, 0.0),
                              ('lr_scaling', s.get('lr_scaling', 'none'), 'none'),
                              ('k_max_scope', s.get('k_max_scope', 'every_dc'), 'every_dc')):
      if value != off:
        raise ValueError(f'sync.{field}={value!r} has no effect with sync.strategy='
                         f"{s.strategy!r}: it acts only on 'semi_sync' (per-DC K_d); unset it")
  if s.get('progress_test', 'endpoints') != 'endpoints' and not s.get('progress_aware', False):
    raise ValueError(f'sync.progress_test={s.progress_test!r} has no effect without '
                     'sync.progress_aware=True (it is the plateau test of the progress-aware '
                     'K adjustment); unset it or set sync.progress_aware=True')
  mu = _number(s.get('prox_mu', 0.0), 'sync.prox_mu')
  if not 0 <= mu < float('inf'):
    raise ValueError(f'sync.prox_mu={mu} must be a finite number >= 0 (FedProx mu; 0: off)')


def validate_strategy(config: ml_collections.ConfigDict) -> None:
  """Checks the sync strategy's own fields and rules (hfl.sync.strategies).

  Raises:
    ValueError: another registered strategy's own field (``Strategy.hyper``) set to
      a value other than its default (it would silently do nothing); the chosen
      strategy's ``check`` refusing the config.
  """
  s = config.sync
  chosen = strategies_lib.get(s.strategy)
  for other in strategies_lib.REGISTRY.values():
    for field, default in other.hyper.items():
      if field not in chosen.hyper and s.get(field, default) != default:
        raise ValueError(f'sync.{field}={s.get(field)!r} has no effect with sync.strategy='
                         f'{s.strategy!r}: it is a field of sync.strategy={other.name!r}; unset it')
  if chosen.check is not None:
    chosen.check(config)


def validate_control_variates(config: ml_collections.ConfigDict) -> None:
  """Checks ``sync.control_variates`` (absent: 'none'; hfl.sync.scaffold).

  Raises:
    ValueError: a value not in ``hfl.sync.scaffold.CONTROL_VARIATES``; 'scaffold'
      with ``sync.strategy='sync'`` (every gradient is taken at the global model:
      no local steps, no drift to correct). Streaming DiLoCo refuses it too
      (:func:`validate_streaming`).
  """
  s = config.sync
  value = s.get('control_variates', 'none')
  _choice(value, 'sync.control_variates', scaffold_lib.CONTROL_VARIATES)
  if value == 'scaffold' and s.strategy == 'sync':
    raise ValueError(
        "sync.control_variates='scaffold' has no effect with sync.strategy='sync': K = 1 "
        'takes every gradient at the global model, so there is no client drift for '
        "SCAFFOLD's control variates to correct; use it with a strategy of K > 1 "
        "('periodic', 'semi_sync', 'adacomm'), or set sync.control_variates='none'")


def validate_streaming(config: ml_collections.ConfigDict) -> None:
  """Checks Streaming DiLoCo's ``sync.fragments``, ``sync.overlap_steps``,
  ``sync.mixing_alpha`` and ``sync.eager`` (absent: off; hfl.sync.streaming).

  Raises:
    ValueError: a field out of range (:func:`hfl.sync.streaming.check`); streaming
      with another ``sync.strategy`` than 'periodic', FedNova, progress-aware K,
      ``sync.faults``, ``sync.prox_mu``, ``sync.lr_scaling``,
      ``sync.control_variates``, a
      ``train.sim_time_budget_s`` or ``train.sample_budget`` (streaming stops at
      ``train.num_steps``) or a
      ``train.num_steps`` that is not a multiple of
      ``sync.k / sync.fragments``.
  """
  s = config.sync
  if not streaming.enabled(s):
    return
  p, tau = s.get('fragments', 1), s.get('overlap_steps', 0)
  streaming.check(s.k, p, tau, s.get('mixing_alpha', 0.0), s.get('eager', False))
  what = (f'Streaming DiLoCo (sync.fragments={p}, sync.overlap_steps={tau}, '
          f'sync.mixing_alpha={s.get("mixing_alpha", 0.0)}, sync.eager={s.get("eager", False)})')
  for field, value, allowed in (('sync.strategy', s.strategy, 'periodic'),
                                ('sync.aggregation', s.aggregation, 'fedavg'),
                                ('sync.progress_aware', s.progress_aware, False),
                                ('sync.faults', s.faults, ''),
                                ('sync.prox_mu', s.get('prox_mu', 0.0), 0.0),
                                ('sync.lr_scaling', s.get('lr_scaling', 'none'), 'none'),
                                ('sync.control_variates',
                                 s.get('control_variates', 'none'), 'none'),
                                ('train.sim_time_budget_s',
                                 config.train.get('sim_time_budget_s', 0.0), 0.0),
                                ('train.sample_budget', config.train.get('sample_budget', 0),
                                 0)):
    if value != allowed:
      raise ValueError(f'{field}={value!r}: {what} needs {field}={allowed!r}')
  if config.train.num_steps % (s.k // p):
    raise ValueError(f'train.num_steps={config.train.num_steps} must be a multiple of '
                     f'sync.k / sync.fragments = {s.k // p} for {what}')


def validate_data_dir(config: ml_collections.ConfigDict, exists: bool = True) -> None:
  """Checks ``dataset.data_dir`` ('' : the dataset's default, :func:`hfl.data.load`):
  with ``exists``, that it exists (a relative path: from the working directory, else
  from the repository root, :func:`hfl.data.resolve_path`); and that it is not
  another IDX dataset's default directory.

  ``configs/default.py`` points ``dataset.data_dir`` at Fashion-MNIST's IDX
  files, which have MNIST's layout: ``dataset.name='mnist'`` alone would train
  on Fashion-MNIST while logging "Dataset mnist". Whether the files it holds are
  the dataset's is checked when they are read (:func:`hfl.data.load`).

  Raises:
    ValueError: ``dataset.data_dir`` is not a string or (``exists``) does not exist; or
      ``dataset.name`` is an IDX dataset and ``dataset.data_dir`` is the default
      directory of a different one.
  """
  name, data_dir = config.dataset.name, config.dataset.get('data_dir', '')
  if not isinstance(data_dir, str):
    raise ValueError(f'dataset.data_dir={data_dir!r} must be a string (a path; \'\' = the '
                     "dataset's default)")
  try:
    found = data_lib.resolve_path(data_dir) if exists else ''
  except FileNotFoundError as e:
    raise ValueError(str(e)) from None
  if exists and data_dir and not os.path.exists(os.path.expanduser(found)):
    raise ValueError(f'dataset.data_dir={data_dir!r} does not exist; pass the path of the '
                     f"files of dataset.name={name!r} (the README's dataset.data_dir row says "
                     'what it holds)')
  if name not in data_lib.IDX_DATASETS or not data_dir:
    return
  here = os.path.realpath(os.path.expanduser(os.fspath(data_dir)))
  for other, default in data_lib.IDX_DATASETS.items():
    if other != name and default and here == os.path.realpath(default):
      raise ValueError(
          f'dataset.data_dir={os.fspath(data_dir)!r} is the default directory of '
          f'dataset.name={other!r}, but dataset.name={name!r}: set dataset.data_dir to '
          f"{name}'s own IDX directory (its train-images-idx3-ubyte[.gz], "
          'train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz] and '
          't10k-labels-idx1-ubyte[.gz])')


def validate_task(config: ml_collections.ConfigDict) -> None:
  """Checks the fields that depend on the task (image classification or text).

  The task follows from ``dataset.name`` (:func:`hfl.data.task_of`): text
  datasets need a token model and its ``model.num_layers``, ``num_heads``,
  ``embed_dim`` and ``seq_len``; image datasets an image model.

  Raises:
    ValueError: a model of the other kind, a partition or augmentation the task
      does not support, a missing or invalid transformer field, a
      ``dataset.cache_dir`` that is not a string.
  """
  ds, name = config.dataset, config.model.name
  task = data_lib.task_of(ds.name)
  if task == 'language_model' and name not in models.TOKEN_MODELS:
    raise ValueError(f'model.name={name!r} takes images, but dataset.name={ds.name!r} is a '
                     f'text dataset; allowed: {", ".join(models.TOKEN_MODELS)}')
  if task == 'classification' and name not in models.IMAGE_MODELS:
    raise ValueError(f'model.name={name!r} takes tokens, but dataset.name={ds.name!r} is an '
                     f'image dataset; allowed: {", ".join(models.IMAGE_MODELS)} (text datasets: '
                     f'{", ".join(data_lib.TEXT_DATASETS)})')
  if ds.partition in PARTITIONS and ds.partition not in data_lib.PARTITIONS[task]:
    raise ValueError(f'dataset.partition={ds.partition!r} does not apply to {task} data; '
                     f'allowed: {", ".join(data_lib.PARTITIONS[task])}')
  _choice(ds.partition, 'dataset.partition', data_lib.PARTITIONS[task])
  augment = ds.get('augment', 'none')
  _choice(augment, 'dataset.augment', data_lib.AUGMENTATIONS)
  if augment != 'none' and task != 'classification':
    raise ValueError(f'dataset.augment={augment!r} augments images; dataset.name={ds.name!r} '
                     "is text: set dataset.augment='none'")
  if not isinstance(ds.get('cache_dir', ''), str):
    raise ValueError(f'dataset.cache_dir={ds.cache_dir!r} must be a string (a directory; '
                     "'' = $HFL_CACHE_DIR or ~/.cache/hfl)")
  if name in models.TOKEN_MODELS:
    missing = [f'model.{k}' for k in models.TRANSFORMER_FIELDS if k not in config.model]
    if missing:
      raise ValueError(f'model.name={name!r} needs {", ".join(missing)} in the config '
                       '(see configs/shakespeare.py)')
    for k in models.TRANSFORMER_FIELDS:
      _int(config, f'model.{k}', 1)
    m = config.model
    if m.embed_dim % m.num_heads:
      raise ValueError(f'model.embed_dim={m.embed_dim} must be a multiple of '
                       f'model.num_heads={m.num_heads}')


def validate_shard_state(config: ml_collections.ConfigDict) -> None:
  """Checks ``optimizer.shard_state`` (absent: False).

  Raises:
    ValueError: not a bool; or combined with DGC momentum correction, whose
      momentum lives in each worker's own velocity (before aggregation, so it
      cannot be split across the workers) while the SGD optimizer it needs keeps
      no state to shard.
  """
  shard = config.optimizer.get('shard_state', False)
  if not isinstance(shard, bool):
    raise ValueError(f'optimizer.shard_state={shard!r} must be True or False')
  if shard and config.optimizer.name not in optim.ELEMENTWISE:
    raise ValueError(
        f'optimizer.shard_state=True cannot be combined with optimizer.name='
        f'{config.optimizer.name!r}: its update of a matrix depends on the whole matrix, so '
        f'its state cannot be sliced across the workers; allowed: {", ".join(optim.ELEMENTWISE)}')
  m = _dgc_momentum(config)
  if shard and m > 0:
    raise ValueError(
        f'optimizer.shard_state=True cannot be combined with compression.dgc.momentum={m}: '
        "DGC keeps the momentum in each worker's own velocity, before aggregation, which "
        "cannot be split across the DC's workers, and the SGD optimizer it needs has no "
        'state to shard; set optimizer.shard_state=False or compression.dgc.momentum=0')


SPARSIFIERS = ('topk', 'randk')  # compressors with a density the DGC warm-up can schedule


def _number(v, path):
  if isinstance(v, bool) or not isinstance(v, (int, float)):
    raise ValueError(f'{path}={v!r} must be a number')
  return float(v)


def validate_dgc(config: ml_collections.ConfigDict) -> None:
  """Checks ``compression.dgc`` (absent: DGC off).

  Raises:
    ValueError: a field out of range; DGC momentum with an inner optimizer other
      than plain SGD (the momentum is already in the sent velocity, Lin et al.
      2018 eq. 7); a warm-up without a top-k/random-k uplink or downlink.
  """
  g = config.compression.get('dgc')
  if g is None:
    return
  m = _number(g.get('momentum', 0.0), 'compression.dgc.momentum')
  if not 0 <= m < 1:
    raise ValueError(f'compression.dgc.momentum={m} must be in [0, 1) (0: off)')
  if m > 0 and config.optimizer.name != 'sgd':
    raise ValueError(
        f'compression.dgc.momentum={m} (DGC momentum correction) needs '
        f"optimizer.name='sgd', got optimizer.name={config.optimizer.name!r}: the workers "
        'already send a momentum velocity, a momentum optimizer would apply it twice')
  c = _number(g.get('clip_norm', 0.0), 'compression.dgc.clip_norm')
  if not c >= 0:
    raise ValueError(f'compression.dgc.clip_norm={c} must be >= 0 (0: off)')
  warm = _int(config, 'compression.dgc.warmup_steps', 0) if 'warmup_steps' in g else 0
  if warm:
    _int(config, 'compression.dgc.num_stages', 1)
    d0 = _number(g.initial_density, 'compression.dgc.initial_density')
    if not 0 < d0 <= 1:
      raise ValueError(f'compression.dgc.initial_density={d0} must be in (0, 1]')
    links = [n for n in ('uplink', 'downlink')
             if config.compression[n].name in SPARSIFIERS]
    if not links:
      raise ValueError(
          f'compression.dgc.warmup_steps={warm} schedules the density of a '
          f'{"/".join(SPARSIFIERS)} compression.uplink or compression.downlink, but '
          f'compression.uplink.name={config.compression.uplink.name!r} and '
          f'compression.downlink.name={config.compression.downlink.name!r}')


# ------------------------------------------------------------------------------
# Config files and dotted overrides (main.py's --config.KEY=VALUE, hfl.sweep).
# ------------------------------------------------------------------------------

def load_file(config_arg: str) -> ml_collections.ConfigDict:
  """Loads ``get_config(arg)`` from a config file, as ``--config=`` does.

  Args:
    config_arg: ``'path'`` or ``'path:arg'``; a relative path is tried against
      the current directory, then the repository root.

  Returns:
    The (unlocked) ``ml_collections.ConfigDict``.

  Raises:
    FileNotFoundError: the file does not exist, or is a directory.
    ValueError: the file raised (a SyntaxError, an import that fails, ``get_config``
      raising or needing an argument it was not given), defines no ``get_config``,
      or it returned no ConfigDict: one line naming the file and the exception.
  """
  if REPO_ROOT not in sys.path:  # config files import configs.*
    sys.path.insert(0, REPO_ROOT)
  path, _, arg = config_arg.partition(':')
  if not os.path.isfile(path) and os.path.isfile(os.path.join(REPO_ROOT, path)):
    path = os.path.join(REPO_ROOT, path)
  if os.path.isdir(path):
    raise FileNotFoundError(f'config file {path} is a directory; pass a config file, e.g. '
                            'configs/default.py')
  if not os.path.isfile(path):
    raise FileNotFoundError(f'config file not found: {path}')
  spec = importlib.util.spec_from_file_location('_hfl_config_file', path)
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
    if not callable(getattr(module, 'get_config', None)):
      raise ValueError(f'config file {path} defines no get_config()')
    # As ml_collections' --config= calls it: without an argument unless 'path:arg'.
    config = module.get_config(arg) if arg else module.get_config()
  except ValueError as e:  # e.g. the shipped configs' "takes no argument": its words, named
    raise ValueError(str(e) if str(e).startswith('config file ') else
                     f'config file {path}: {" ".join(str(e).split())}') from e
  except Exception as e:  # pylint: disable=broad-except  (the file's own error, in one line)
    where = f', line {e.lineno}' if isinstance(e, SyntaxError) else ''
    raise ValueError(f'config file {path} did not load: {type(e).__name__}{where}: '
                     f'{" ".join(str(e).split())}') from e
  if not isinstance(config, ml_collections.ConfigDict):
    raise ValueError(f'config file {path}: get_config() returned {type(config).__name__}, '
                     'not an ml_collections.ConfigDict')
  return config


def ignored_fields(config: ml_collections.ConfigDict) -> dict[str, str]:
  """Fields of a valid config that the run does not use, each with the reason.

  ``sync.k`` under ``sync.strategy='sync'`` (it runs K = 1), and every
  compressor hyper-parameter of a link whose compressor does not take it (e.g.
  ``compression.uplink.density`` of ``identity``; hfl.compress.policy.REGISTRY).
  Two runs that differ only in these fields train the same experiment
  (:func:`hfl.sweep.check_runs` warns).

  Returns:
    ``{field: reason}``, e.g. ``{'sync.k': "sync.strategy='sync' runs K = 1"}``.
  """
  out = {}
  if config.sync.strategy == 'sync':
    out['sync.k'] = "sync.strategy='sync' runs K = 1 (use 'periodic' for a fixed K)"
  for link in ('uplink', 'downlink', 'wan'):
    spec = config.compression[link]
    if not isinstance(spec, ml_collections.ConfigDict):
      continue
    used = policy.REGISTRY[spec.name][1]
    for h in spec:
      if h != 'name' and h not in used:
        out[f'compression.{link}.{h}'] = (f'compression.{link}.name={spec.name!r} takes '
                                          f'{", ".join(used) or "no hyper-parameters"}')
  return out


def experiment_key(config: ml_collections.ConfigDict) -> str:
  """The config without its :func:`ignored_fields`, as a string: equal for two
  configs that train the same experiment."""
  ignored = ignored_fields(config)
  return repr([(f, _get_field(config, f)) for f in field_names(config) if f not in ignored])


def field_names(config: ml_collections.ConfigDict, prefix: str = '') -> list[str]:
  """Dotted names of the leaf fields of ``config``, e.g. ``'optimizer.learning_rate'``."""
  out = []
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      out += field_names(value, f'{prefix}{key}.')
    else:
      out.append(f'{prefix}{key}')
  return out


def unknown_field(config: ml_collections.ConfigDict | None, field: str,
                  names: Sequence[str] | None = None) -> str | None:
  """None when ``field`` is a leaf of ``config`` (or one of ``names``), else what
  is wrong with it.

  Args:
    config: the config whose fields ``field`` must be one of.
    field: a dotted field name.
    names: the reference field names instead of ``config``'s (e.g.
      :func:`known_fields`; ``config`` is then not read).

  Returns:
    E.g. ``"unknown config field 'optimizer.learnin_rate'; did you mean
    'optimizer.learning_rate'?"`` (the closest field name, if one is close); for
    a transformer field on a config without one, the config that has them.
  """
  names = field_names(config) if names is None else list(names)
  if field in names:
    return None
  group, _, leaf = field.rpartition('.')
  if group == 'model' and leaf in models.TRANSFORMER_FIELDS:
    return (f'unknown config field {field!r}: the transformer\'s fields '
            f'({", ".join("model." + k for k in models.TRANSFORMER_FIELDS)}) are in the '
            'configs that train it; start from --config=configs/shakespeare.py')
  close = closest_field(field, names)
  if not close:
    return f'unknown config field {field!r}'
  return f'unknown config field {field!r}; did you mean {close!r}?'


def closest_field(field: str, names: Sequence[str]) -> str | None:
  """The name of ``names`` that ``field`` most likely misspells, or None if none is
  close: an abbreviation of a field of the same section ('optimizer.lr' ->
  'optimizer.learning_rate'), else the closest by :func:`difflib.get_close_matches`."""
  group, _, leaf = field.rpartition('.')
  close = [n for n in names if n.rpartition('.')[0] == group and len(leaf) > 1
           and ''.join(w[0] for w in n.rpartition('.')[2].split('_') if w) == leaf]
  close = close or difflib.get_close_matches(field, names, n=1)
  return close[0] if close else None


DEFAULT_CONFIG = os.path.join(REPO_ROOT, 'configs', 'default.py')


@functools.cache
def known_fields() -> dict[str, Any]:
  """The fields hfl reads, ``{dotted name: default value}``: the leaves of
  configs/default.py's config, then the transformer's ``model.<name>`` of
  :data:`hfl.models.TRANSFORMER_FIELDS` (which configs/shakespeare.py adds).
  Loaded once (:func:`load_file`); do not modify the returned dict."""
  default = load_file(DEFAULT_CONFIG)
  known = {n: _get_field(default, n) for n in field_names(default)}
  for k, v in models.TRANSFORMER_FIELDS.items():
    known.setdefault(f'model.{k}', v)
  return known


def check_fields(config: ml_collections.ConfigDict) -> None:
  """Refuses a config with a field hfl does not read: every leaf must be one of
  :func:`known_fields`. ``--config.FIELD=VALUE`` cannot add one
  (:func:`apply_overrides`), but a config file can (``c.sync.kk = 3``), and the
  run would silently use the default of the field it meant. Fields may be absent
  (older configs; each check says what absent means).

  Raises:
    ValueError: naming every such field, each with what is wrong: None where the
      default is a value (a run would silently use the default); a misspelled
      field or section, with the closest known name (:func:`unknown_field`); a
      value where configs/default.py has a section, or a section where it has a
      value. E.g. ``unknown config field 'sync.kk'; did you mean 'sync.k'? A
      config's fields must be ones hfl reads: ...``; with several, one per line
      after ``2 config fields are not ones hfl reads:``.
  """
  known_set = known_fields()
  known = tuple(known_set)
  sections = {n.rsplit('.', i)[0] for n in known for i in range(1, n.count('.') + 1)}
  problems, grouped, nones = [], set(), []
  for field in field_names(config):
    if field in known_set:
      if _get_field(config, field) is None and known_set[field] is not None:
        nones.append(f'{field} (default {known_set[field]!r})')
      continue
    parts = field.split('.')
    prefixes = ['.'.join(parts[:i]) for i in range(1, len(parts))]
    if field in sections:  # a value where the default has a section
      inside = [n for n in known if n.startswith(field + '.')]
      problems.append(f'config field {field!r} must be a section (with fields '
                      f'{", ".join(inside)}), not a value: got {_get_field(config, field)!r}')
      continue
    top = next((p for p in prefixes if p not in sections), field)
    if top in grouped:
      continue
    grouped.add(top)
    held = [n for n in field_names(config) if n.startswith(top + '.')]
    if top in known_set:  # a section where the default has a value
      problems.append(f'config field {top!r} must be a value, not a section (it holds '
                      f'{", ".join(held)})')
    elif top == field:
      problems.append(unknown_field(None, field, known + tuple(sorted(sections))))
    else:  # a misspelled (or made-up) section: named once, with what it holds
      close = closest_field(top, sorted(sections))
      problems.append(f'unknown config section {top!r} (it holds {", ".join(held)})'
                      + (f'; did you mean {close!r}?' if close else ''))
  if not problems and nones:
    raise ValueError(f'config field{"s" * (len(nones) > 1)} {", ".join(nones)} '
                     f'{"are" if len(nones) > 1 else "is"} None: give a value (None is no '
                     'value of a field whose default holds one; some fields ran their default '
                     f'and recorded None). {FIELDS_HELP}')
  if not problems:
    return
  why = ("A config's fields must be ones hfl reads: those of configs/default.py, and the "
         f'transformer\'s {", ".join("model." + k for k in models.TRANSFORMER_FIELDS)} '
         f'(as configs/shakespeare.py sets them). {FIELDS_HELP}')
  if len(problems) == 1:
    raise ValueError(f'{problems[0]}{"" if problems[0].endswith("?") else "."} {why}')
  raise ValueError(f'{len(problems)} config fields are not ones hfl reads:\n'
                   + ''.join(f'  {p}\n' for p in problems) + why)


def apply_overrides(config: ml_collections.ConfigDict,
                    overrides: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """Sets dotted fields of ``config`` in place, refusing any the config lacks.

  Like ``--config.KEY=VALUE``: only existing fields can be set, and a value
  must fit the field's type (an int for a float field is converted).

  Args:
    config: the config (locked or not; no field is added either way).
    overrides: dotted field name -> value.

  Returns:
    ``config``.

  Raises:
    ValueError: an unknown field (with the closest names) or a value of the
      wrong type, naming the field.
  """
  for key, value in overrides.items():
    problem = unknown_field(config, key)
    if problem:
      raise ValueError(problem)
    *parents, leaf = key.split('.')
    section = config
    for p in parents:
      section = section[p]
    try:
      section[leaf] = value
    except TypeError:
      raise ValueError(f'{key}={value!r} has type {type(value).__name__}; the field takes '
                       f'{type(section[leaf]).__name__}') from None
  return config
