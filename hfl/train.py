"""The training loop: indicator, rounds, evaluation, logging, checkpoints.

``train_and_evaluate(config, workdir)`` runs one experiment end to end and returns
its summary (the dict written to WORKDIR/summary.json, DESIGN 3).
"""

import copy
import dataclasses
import json
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from jax.sharding import NamedSharding, PartitionSpec as P

from hfl import accounting
from hfl import checkpoint as ckpt_lib
from hfl import config as config_lib
from hfl import data as data_lib
from hfl import distributed
from hfl import mesh as mesh_lib
from hfl import metrics as metrics_lib
from hfl import models
from hfl import network
from hfl import optim
from hfl import step as step_lib
from hfl import tasks
from hfl.compress import dgc
from hfl.compress import policy
from hfl.sync import aggregation, faults, outer as outer_lib, schedule as schedule_lib

# Fields that may change between a run and its resumption (they do not change what
# is computed up to the restored step).
RESUMABLE_FIELDS = ('train.num_steps', 'train.eval_every', 'train.checkpoint_every',
                    'train.log_every', 'train.target_accuracy', 'train.target_loss',
                    'dataset.cache_dir')
# Compressor names that send float32 unchanged.
UNCOMPRESSED = ('identity', 'float32')
# Sections and fields added after runs may have started: absent from an older run's
# config.json, they count as these values (their "off" defaults), so such runs still
# resume.
ADDED_SECTIONS = {('compression', 'dgc'): dict(momentum=0.0, clip_norm=0.0, warmup_steps=0,
                                               initial_density=0.25, num_stages=4),
                  ('optimizer', 'shard_state'): False,
                  ('network', 'wan_latencies_per_round'): 2.0,
                  ('dataset', 'cache_dir'): '', ('dataset', 'augment'): 'none',
                  ('optimizer', 'schedule'): 'constant', ('optimizer', 'warmup_steps'): 0,
                  ('optimizer', 'decay_steps'): 0, ('optimizer', 'final_lr_ratio'): 0.0,
                  ('train', 'target_loss'): tasks.TARGET_FIELDS['language_model'][1]}


@dataclasses.dataclass
class Setup:
  """Everything built from the config before compilation."""
  config: ml_collections.ConfigDict
  dataset: data_lib.Dataset
  partition: data_lib.Partition
  mesh: Any
  model: Any
  params_shape: Any
  optimizer: optax.GradientTransformation
  outer: optax.GradientTransformation
  comps: step_lib.Compressors
  net: network.NetworkModel
  schedule: schedule_lib.Schedule
  present_fn: Any
  dc_weights: np.ndarray  # float64 [D], n_d / n


# ------------------------------------------------------------------------------
# Setup: everything that can fail on bad input, before anything is compiled or
# written.
# ------------------------------------------------------------------------------

def dgc_options(config) -> dgc.Options:
  """The step's DGC options from ``compression.dgc`` (absent: off)."""
  g = config.compression.get('dgc')
  if g is None:
    return dgc.Options()
  return dgc.Options(momentum=float(g.get('momentum', 0.0)),
                     clip_norm=float(g.get('clip_norm', 0.0)))


def shard_state(config) -> bool:
  """``optimizer.shard_state`` (absent: False): ZeRO-1 sharded optimizer state."""
  return bool(config.optimizer.get('shard_state', False))


def warmup(config) -> tuple[int, int]:
  """(warmup_steps, num_stages) of the DGC density warm-up; warmup_steps 0 = off."""
  g = config.compression.get('dgc')
  if g is None or not g.get('warmup_steps', 0):
    return 0, 1
  return int(g.warmup_steps), int(g.num_stages)


def warmup_stage(config, step: int) -> int | None:
  """The DGC warm-up stage of ``step`` (hfl.compress.dgc.warmup_stage), None when
  the warm-up is off or finished (then the configured densities apply)."""
  steps, stages = warmup(config)
  stage = dgc.warmup_stage(step, steps, stages)
  return None if stage >= stages else stage


def _link_spec(config, link: str, step: int | None):
  """A link's compressor spec, its density replaced by the warm-up's at ``step``.

  DGC warm-up (Lin et al. 2018, Sec. 3.3; hfl.compress.dgc.warmup_density):
  density = initial * (final / initial) ** (stage / num_stages) for a top-k /
  random-k uplink or downlink (``final`` = the link's configured density). Other
  links, ``step=None`` and steps after the warm-up keep the config's spec.
  """
  spec = config.compression[link]
  if (step is None or warmup_stage(config, step) is None
      or spec.name not in config_lib.SPARSIFIERS):
    return spec
  steps, stages = warmup(config)
  spec = ml_collections.ConfigDict(spec.to_dict())
  spec.density = dgc.warmup_density(step, float(spec.density), steps,
                                    float(config.compression.dgc.initial_density), stages)
  return spec


def build_compressors(config, params_shape, step: int | None = None
                      ) -> step_lib.Compressors:
  """Per-leaf uplink, downlink and WAN compressors (policy of DESIGN 4.2).

  Args:
    config: the experiment config.
    params_shape: pytree of the model's parameter shapes.
    step: build for this step's DGC warm-up stage (None: the configured
      densities). Only the top-k/random-k uplink and downlink densities change, so
      payload shapes change but no state shape does (dense residuals, stateless
      sparsifiers): one state serves every stage.
  """
  c = config.compression
  up = policy.build(_link_spec(config, 'uplink', step), params_shape, c.small_threshold,
                    c.small, field='compression.uplink')
  down = policy.build(_link_spec(config, 'downlink', step), params_shape, c.small_threshold,
                      c.small, field='compression.downlink')
  # The pseudo-gradient is compressed leaf by leaf with the same size policy.
  wan = policy.build(c.wan, params_shape, c.small_threshold, c.small, field='compression.wan')
  return step_lib.Compressors(up, down, wan)


def _min_shard(config, n: int) -> int | None:
  """Smallest worker shard to ask of the partitioner: one full batch, when possible."""
  b = config.train.batch_size
  return b if b * config.mesh.num_dcs * config.mesh.workers_per_dc <= n else None


def setup(config: ml_collections.ConfigDict) -> Setup:
  """Validates the config and builds data, mesh, model, compressors and schedule.

  Raises:
    ValueError / FileNotFoundError: bad config or data, naming the field.
  """
  config_lib.validate(config)
  d, w = config.mesh.num_dcs, config.mesh.workers_per_dc
  net = network.from_config(config.network, d)
  present_fn = faults.make_present_fn(config.sync.faults, d)
  outer = outer_lib.make_outer(config.sync.outer.name, config.sync.outer.learning_rate,
                               config.sync.outer.momentum)
  optimizer = optim.make_optimizer(config.optimizer, config.train.num_steps)
  mesh = mesh_lib.make_mesh(d, w)
  dataset = data_lib.load(config.dataset.name, config.dataset.data_dir,
                          cache_dir=config.dataset.get('cache_dir', ''),
                          seq_len=config.model.get('seq_len'))
  logging.info('Dataset %s', dataset.describe())
  part = data_lib.partition_dataset(dataset, d, w, config.dataset.partition,
                                    float(config.dataset.dirichlet_alpha), config.seed,
                                    min_size=_min_shard(config, len(dataset.train_labels)))
  data_lib.check_batch_size(part, config.train.batch_size)
  model = models.from_config(config.model, dataset.num_classes)
  params_shape = jax.eval_shape(
      lambda: model.init(jax.random.PRNGKey(0), _sample_input(dataset))['params'])
  comps = build_compressors(config, params_shape)
  up, down, wan = accounting.static_bits(comps, params_shape, w, shard_state(config))
  t_d = network.iteration_time(net, np.full(d, up * w), np.full(d, down * w))
  c_d = (network.round_comm_time(net, np.full(d, wan))
         + network.lan_time(net, np.full(d, accounting.round_down_bits(comps, w, d))))
  schedule = schedule_lib.from_config(config.sync, d, t=t_d, c=c_d)
  sizes = np.asarray(part.dc_sizes, np.float64)
  return Setup(config, dataset, part, mesh, model, params_shape, optimizer, outer, comps, net,
               schedule, present_fn, sizes / sizes.sum())


def _sample_input(dataset):
  """One zero input of the dataset's row shape and dtype (float32 images, int32 tokens)."""
  return jnp.zeros((1,) + tuple(dataset.train_images.shape[1:]), dataset.train_images.dtype)


def _check_workdir_config(workdir: str, config) -> list[str]:
  """Refuses to resume a workdir that was started with a different config.

  Returns:
    The RESUMABLE_FIELDS that changed, as 'field: old -> new' strings.

  Raises:
    ValueError: another field differs.
  """
  path = os.path.join(workdir, 'config.json')
  if not os.path.exists(path):
    return []
  with open(path) as f:
    old = json.load(f)
  new = json.loads(config.to_json())
  for (*parents, leaf), default in ADDED_SECTIONS.items():
    sub = old
    for p in parents:
      sub = sub.get(p, {}) if isinstance(sub, dict) else {}
    if isinstance(sub, dict) and parents and leaf not in sub:
      sub[leaf] = copy.deepcopy(default)
  diffs = []

  def walk(a, b, prefix):
    for key in sorted(set(a) | set(b)):
      name = f'{prefix}{key}'
      va, vb = a.get(key), b.get(key)
      if isinstance(va, dict) and isinstance(vb, dict):
        walk(va, vb, name + '.')
      elif va != vb:
        (resumable if name in RESUMABLE_FIELDS else diffs).append(f'{name}: {va!r} -> {vb!r}')
  resumable = []
  walk(old, new, '')
  if diffs:
    raise ValueError(
        f'--workdir={workdir} holds a run with a different config ({"; ".join(diffs)}); '
        'use a new workdir, or the same config to resume.')
  return resumable


# ------------------------------------------------------------------------------
# Evaluation.
# ------------------------------------------------------------------------------

def make_eval(model, mesh, images, labels: np.ndarray, batch_size: int):
  """Returns ``evaluate(params) -> (accuracy, loss)`` on the whole test set.

  The test set is padded with zero images to a multiple of the device count and
  sharded over all devices once; padded entries are masked out. Each process
  reads (and, for a NormalisedRows source, converts) only the test rows of its
  own devices.

  Args:
    model: the Flax model.
    mesh: the ('dc', 'worker') mesh.
    images: test inputs [M, ...]: a numpy array or a row source such as
      ``Dataset.test_images`` (float32 rows on indexing; int32 token windows).
    labels: int [M] test labels, or int [M, T] next-token targets (the means are
      then per token, :func:`hfl.tasks.eval_sums`).
    batch_size: evaluation batch size (rounded to a multiple of the devices).
  """
  n_dev = mesh.devices.size
  chunk = max(n_dev, (batch_size // n_dev) * n_dev)
  n = len(labels)
  total = -(-n // chunk) * chunk
  pad = total - n
  y = np.concatenate([labels, np.zeros((pad,) + labels.shape[1:], labels.dtype)])
  mask = np.concatenate([np.ones(n, np.float32), np.zeros(pad, np.float32)])
  sh = NamedSharding(mesh, P(None, (mesh_lib.DC, mesh_lib.WORKER)))
  # Each process transfers only its own devices' blocks (hfl.distributed).
  put = lambda a: distributed.put_global(a.reshape((total // chunk, chunk) + a.shape[1:]), sh)
  rows = np.arange(total).reshape(total // chunk, chunk)
  x = distributed.put_rows(data_lib.PaddedRows(images, total), rows, sh)
  y, mask = put(y), put(mask)

  @jax.jit
  def run(params, x, y, mask):  # arguments, not closures: they span all processes
    def body(carry, batch):
      xb, yb, mb = batch
      correct, loss = tasks.eval_sums(model.apply({'params': params}, xb), yb, mb)
      return (carry[0] + correct, carry[1] + loss), None
    (c, l), _ = jax.lax.scan(body, (jnp.float32(0), jnp.float32(0)), (x, y, mask))
    return c / n, l / n

  def evaluate(params):
    acc, loss = run(params, x, y, mask)
    return float(acc), float(loss)
  return evaluate


# ------------------------------------------------------------------------------
# The loop.
# ------------------------------------------------------------------------------

def _bytes(bits: int):
  """Bytes of an exact bit count: an int when whole, else a float."""
  return bits // 8 if bits % 8 == 0 else bits / 8


def _fmt_bytes(b: float) -> str:
  for unit in ('B', 'KB', 'MB', 'GB', 'TB'):
    if abs(b) < 1000:
      return f'{b:.1f}{unit}'
    b /= 1000
  return f'{b:.1f}PB'


def divergence_advice(config, workdir: str, last_checkpoint: int | None) -> str:
  """What a diverged run keeps and which config changes may help.

  Args:
    config: the run's config.
    workdir: its workdir.
    last_checkpoint: step of its latest checkpoint, None when it has none.

  Returns:
    The checkpoints kept (only if there are any), then only changes that differ
    from ``config``: a lower learning rate, and milder compression of the links
    that are compressed.
  """
  kept = (f'The checkpoints in {workdir} (up to step {last_checkpoint}, before the '
          'divergence) are kept. ' if last_checkpoint is not None else '')
  compressed = [f'compression.{link}.name={config.compression[link].name!r}'
                for link in ('uplink', 'downlink', 'wan')
                if config.compression[link].name not in UNCOMPRESSED]
  milder = f' or use milder compression than {", ".join(compressed)}' if compressed else ''
  return (f'{kept}Lower optimizer.learning_rate (now {config.optimizer.learning_rate}){milder} '
          'in a new --workdir (a workdir keeps its config).')


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Runs (or resumes) one experiment and returns its summary.

  Args:
    config: the experiment config (see configs/default.py).
    workdir: output directory; an existing run there is resumed from its newest
      checkpoint that restores (the config must match, except RESUMABLE_FIELDS;
      unusable newer step directories are moved aside, hfl.checkpoint).

  Returns:
    The summary dict (DESIGN 3), also written to WORKDIR/summary.json.

  Raises:
    ValueError / FileNotFoundError: bad config or data, before anything is compiled
      or written.
    FloatingPointError: the train loss became NaN or infinite.
    hfl.checkpoint.UnrestorableError (a ValueError): no checkpoint in the workdir
      restores and one looks committed; nothing is moved.
  """
  wall0 = time.time()
  s = setup(config)
  changed = _check_workdir_config(workdir, config)
  cfg = s.config
  d, w = cfg.mesh.num_dcs, cfg.mesh.workers_per_dc
  mesh = s.mesh
  writer = metrics_lib.is_writer()
  logging.info('Compression policy (uplink):\n%s', policy.describe(s.comps.up, s.params_shape))
  if cfg.compression.downlink.name != 'identity' or cfg.compression.small != 'float32':
    logging.info('Compression policy (downlink):\n%s',
                 policy.describe(s.comps.down, s.params_shape))
  if cfg.compression.wan.name != 'identity':
    logging.info('Compression policy (WAN):\n%s', policy.describe(s.comps.wan, s.params_shape))

  # --- State: shapes first, then restore or initialise directly sharded. -------
  apply_fn = lambda p, x: s.model.apply({'params': p}, x)
  key = jax.random.PRNGKey(cfg.seed)
  sample = _sample_input(s.dataset)
  task = tasks.from_config(cfg)

  dgc_opts = dgc_options(cfg)

  def init_fn():
    params = s.model.init(key, sample)['params']
    return step_lib.init_state(params, s.optimizer, s.outer, s.comps, d, w,
                               jax.random.fold_in(key, 1),
                               dgc_momentum=dgc_opts.momentum > 0,
                               shard_state=shard_state(cfg))
  state_shape = jax.eval_shape(init_fn)
  shardings = step_lib.state_shardings(mesh, state_shape)
  # One step function per DGC warm-up stage (None: the configured compressors);
  # built when a stage is first reached, compiled on its first call.
  step_fns = {None: step_lib.make_step(apply_fn, s.optimizer, s.outer, s.comps, mesh,
                                       state_shape, dgc_opts)}

  def step_fn_at(step):
    stage = warmup_stage(cfg, step)
    if stage not in step_fns:
      comps = build_compressors(cfg, s.params_shape, step)
      logging.info('DGC warm-up stage %d from step %d, uplink policy:\n%s', stage, step,
                   policy.describe(comps.up, s.params_shape))
      step_fns[stage] = step_lib.make_step(apply_fn, s.optimizer, s.outer, comps, mesh,
                                           state_shape, dgc_opts)
    return step_fns[stage]
  evaluate = make_eval(s.model, mesh, s.dataset.test_images, s.dataset.test_labels,
                       cfg.train.eval_batch_size)

  if writer:
    os.makedirs(workdir, exist_ok=True)
  mngr = ckpt_lib.manager(workdir)
  restored = ckpt_lib.restore_latest(mngr, ckpt_lib.abstract(state_shape, shardings))
  if restored is None:
    state = jax.jit(init_fn, out_shardings=shardings)()
    host = dict(step=0, round=0, clock_s=[0.0] * d, idle_s=[0.0] * d,
                bytes=dict(intra_up=0, intra_down=0, inter_dc=0),
                bits=dict(intra_up=0, intra_down=0, inter_dc=0),
                schedule=schedule_lib.state_to_json(s.schedule.init()),
                **tasks.host_init(), time_to_target_s=None, rounds_to_target=None,
                wall_time_s=0.0, last_eval=None, round_loss=[])
    if writer:
      metrics_lib.write_json(os.path.join(workdir, 'config.json'), json.loads(cfg.to_json()))
  else:
    _, state, host = restored
    if host['step'] > cfg.train.num_steps:
      raise ValueError(
          f'train.num_steps={cfg.train.num_steps} is below the {host["step"]} iterations '
          f'--workdir={workdir} has already done; use a new workdir for a shorter run.')
    summary_path = os.path.join(workdir, 'summary.json')
    if host['step'] == cfg.train.num_steps and os.path.exists(summary_path):
      logging.info('%s already finished %d iterations; nothing to do.', workdir, host['step'])
      with open(summary_path) as f:
        summary = json.load(f)
      if writer:
        print_results(summary)
      return summary
    logging.info('Resumed from %s at step %d (round %d).', workdir, host['step'], host['round'])
    if changed:
      logging.info('Continuing with changed %s.', '; '.join(changed))
      if writer:
        metrics_lib.write_json(os.path.join(workdir, 'config.json'), json.loads(cfg.to_json()))
  wall_offset = float(host['wall_time_s'])
  leaf_names = [jax.tree_util.keystr(path) for path, _ in
                jax.tree_util.tree_flatten_with_path(s.params_shape)[0]]
  mw = metrics_lib.MetricsWriter(workdir, resume_step=host['step'])

  sched_state = schedule_lib.state_from_json(host['schedule'])
  plan = s.schedule.plan(sched_state)
  clock = network.Clock(np.asarray(host['clock_s']), np.asarray(host['idle_s']))
  # Exact bit totals per link (Python ints); checkpoints written before they were
  # kept hold only bytes.
  totals_bits = {k: int(v) for k, v in host['bits'].items()} if 'bits' in host else {
      k: int(round(float(v) * 8)) for k, v in host['bytes'].items()}
  totals = {}

  def count(link, bits):
    totals_bits[link] += int(bits)
    totals[link] = _bytes(totals_bits[link])
  for link in totals_bits:
    count(link, 0)
  step = int(host['step'])
  rnd = int(host['round'])
  num_steps = cfg.train.num_steps
  round_loss = list(host['round_loss'])
  last_eval = host['last_eval']
  dc_sh = NamedSharding(mesh, P(mesh_lib.DC))
  batch_sh = NamedSharding(mesh, P(mesh_lib.DC, mesh_lib.WORKER))
  rep_sh = NamedSharding(mesh, P())
  it_in_round = 0
  loss_sum, loss_n = 0.0, 0
  # Measured wall-clock of each iteration (dispatch to results on the host), split
  # into round iterations (with the inter-DC exchange) and local ones.
  step_wall = dict(round=[], local=[], excess=[])
  round_local = []  # this round's timed local iterations (seconds)
  compiled = set()
  t_log = time.time()
  step_log = step

  all_finite = jax.jit(lambda t: jnp.all(jnp.stack(
      [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(t)])))

  def diverged(what):
    return FloatingPointError(f'{what} at step {step}, round {rnd}: training diverged. '
                              + divergence_advice(cfg, workdir, mngr.latest_step()))

  def check_finite(m, at):
    """Stops the run on a non-finite train loss, gradient, payload or residual."""
    where = step_lib.first_nonfinite(m['flags'], leaf_names)
    where = f'the first non-finite value is the {where}' if where else ''
    if not np.all(np.isfinite(m['loss'])):
      raise diverged(f'the train loss is {m["loss"].tolist()} (per DC) at iteration {at}'
                     + (f'; {where}' if where else ''))
    if where:
      raise diverged(f'at iteration {at} {where}')

  def do_eval():
    nonlocal last_eval
    acc, tloss = evaluate(state.global_params)
    if not np.isfinite(tloss):  # nothing non-finite is written or checkpointed
      raise diverged(f'the test loss of the global model is {tloss}')
    rec = dict(step=step, round=rnd, **tasks.eval_record(task, acc, tloss),
               train_loss=(float(np.mean(round_loss)) if round_loss else None),
               bytes=dict(totals), sim_time_s=clock.now,
               wall_time_s=wall_offset + time.time() - wall0, k=int(plan.k_base),
               k_d=[int(k) for k in plan.k_d], idle_s=[float(x) for x in clock.idle_s])
    if host['best_test_accuracy'] is None or acc > host['best_test_accuracy']:
      host['best_test_accuracy'] = acc
    if host.get('best_test_loss') is None or tloss < host['best_test_loss']:
      host['best_test_loss'] = tloss
    if host['time_to_target_s'] is None and task.reached(rec[task.metric]):
      host['time_to_target_s'] = tasks.interpolate_crossing(task, last_eval, rec, 'sim_time_s')
      host['rounds_to_target'] = tasks.interpolate_crossing(task, last_eval, rec, 'round')
    mw.write(rec)
    last_eval = {k: rec[k] for k in (task.metric, 'sim_time_s', 'round')}
    round_loss.clear()
    return rec

  def save_host():
    host.update(step=step, round=rnd, clock_s=clock.time_s.tolist(),
                idle_s=clock.idle_s.tolist(), bytes=dict(totals), bits=dict(totals_bits),
                schedule=schedule_lib.state_to_json(sched_state),
                wall_time_s=wall_offset + time.time() - wall0, last_eval=last_eval,
                round_loss=list(round_loss))
    return host

  def log_progress(at, m):
    nonlocal t_log, step_log
    now = time.time()
    rate = (at - step_log) / max(now - t_log, 1e-9)
    t_log, step_log = now, at
    logging.info(
        'step %d/%d round %d K=%s loss %.4f %s sim %.1fs bytes up %s down %s wan %s '
        '| %.1f steps/s ETA %.0fs', at, num_steps, rnd, plan.k_base,
        float(np.dot(s.dc_weights, m['loss'])), tasks.progress(task, last_eval), clock.now,
        _fmt_bytes(totals['intra_up']), _fmt_bytes(totals['intra_down']),
        _fmt_bytes(totals['inter_dc']), rate, (num_steps - at) / max(rate, 1e-9))

  # An absent DC's work in a round is discarded (hfl.sync.faults): its per-DC
  # state is copied at the round's start and restored after the round.
  round_start = jax.jit(step_lib.round_start)
  discard_absent = jax.jit(step_lib.discard_absent, donate_argnums=(0,),
                           out_shardings=shardings)
  start = None
  pending = []  # (device metrics, active, program info) of this round's iterations so far
  while step < num_steps:
    # ---- Indicator: where in the round are we, and does this iteration end it?
    kmax = int(np.max(plan.k_d))
    active = it_in_round < plan.k_d
    last = step + 1 == num_steps
    do_round = it_in_round + 1 >= kmax or last
    present = s.present_fn(rnd)
    if it_in_round == 0 and not np.all(present):
      start = round_start(state)
    weights = np.zeros(d, np.float32)
    if do_round:
      local = np.where(active, np.minimum(plan.k_d, it_in_round + 1), plan.k_d)
      p = jnp.asarray(s.dc_weights * present, jnp.float32)
      p = p / jnp.sum(p)
      weights = np.asarray(aggregation.aggregation_scale(cfg.sync.aggregation, p,
                                                         jnp.asarray(local, jnp.float32)))
    idx = data_lib.batch_indices(s.partition, cfg.train.batch_size, step, cfg.seed)
    # Each process gathers only the rows of its own (dc, worker) devices.
    batch = tuple(distributed.put_rows(src, rows, batch_sh) for src, rows in data_lib.batch_rows(
        s.dataset, idx, step, cfg.seed, cfg.dataset.get('augment', 'none')))
    program = (warmup_stage(cfg, step), do_round)
    t_step = time.perf_counter()
    step_fn = step_fn_at(step)
    state, m = step_fn(state, batch, distributed.put_global(active, dc_sh),
                       distributed.put_global(weights, rep_sh), do_round)
    jax.block_until_ready(m)
    timed = program in compiled  # a program's first call includes its compilation
    if timed and not do_round:
      round_local.append(time.perf_counter() - t_step)
      step_wall['local'].append(round_local[-1])
    compiled.add(program)
    # The metrics stay on the devices until the round ends: with DCs on different
    # hosts, fetching every DC's metrics is an inter-DC collective, which local
    # iterations must not pay. The round's metrics then cross in one gather.
    pending.append((m, active, step_fn.info[do_round]))
    step += 1
    it_in_round += 1
    if not do_round:
      continue
    if start is not None:
      state = discard_absent(state, start, distributed.put_global(present, rep_sh))
      start = None

    # ---- Accounting and the simulated clock, iteration by iteration.
    round_ms = distributed.to_host_stacked([pm for pm, _, _ in pending])
    if timed:  # a round iteration: the step with the exchange, and the metrics gather
      step_wall['round'].append(time.perf_counter() - t_step)
      if round_local:  # against this round's own local iterations, moments before
        step_wall['excess'].append(step_wall['round'][-1] - float(np.median(round_local)))
    round_local = []
    for i, (raw, (_, act, info)) in enumerate(zip(round_ms, pending)):
      at = step - len(pending) + i + 1  # this iteration's step number (1-based)
      m = step_lib.host_metrics(info, raw, act, weights if info.do_round else None)
      check_finite(m, at)
      count('intra_up', m['up_bits'].sum())
      count('intra_down', m['down_bits'].sum())
      clock = network.advance_iteration(
          clock, network.iteration_time(s.net, m['up_bits'], m['down_bits']), act)
      loss_sum += float(np.dot(s.dc_weights, m['loss']))
      loss_n += 1
      if at < step and at % cfg.train.log_every == 0:
        log_progress(at, m)
    pending.clear()

    # ---- The inter-DC round, and its result reaching the workers over the LAN.
    wan_bits = m['wan_bits']
    count('inter_dc', network.link_bits(wan_bits, present))
    count('intra_down', m['round_down_bits'].sum())
    clock = network.advance_round(
        clock, network.round_comm_time(s.net, wan_bits, present)
        + network.lan_time(s.net, m['round_down_bits']), present)
    rnd += 1
    it_in_round = 0
    round_loss.append(loss_sum / loss_n)
    plan, sched_state = s.schedule.next_round(sched_state, loss_sum / loss_n)
    loss_sum, loss_n = 0.0, 0
    # Every DC restarts from the global model: checked before it is evaluated or saved.
    if not bool(distributed.to_host(all_finite(state.global_params))):
      raise diverged('the global model has non-finite parameters')
    if rnd % cfg.train.eval_every == 0 or step == num_steps:
      rec = do_eval()
      logging.info('eval step %d round %d: %s', step, rnd, ' '.join(
          f'{k} {v:.4f}' for k, v in rec.items() if k.startswith('test_')))
    every = cfg.train.checkpoint_every
    if step == num_steps or (every and rnd % every == 0):
      ckpt_lib.save(mngr, step, state, save_host())
    if step % cfg.train.log_every == 0 or step == num_steps:
      log_progress(step, m)

  # ---- Summary. ---------------------------------------------------------------
  records = metrics_lib.read_jsonl(mw.path)
  final = records[-1] if records else do_eval()
  summary = dict(
      **tasks.summary_fields(task, final, host),
      inter_dc_rounds=rnd, intra_dc_iterations=step, bytes=dict(totals),
      sim_time_s=clock.now, idle_s=[float(x) for x in clock.idle_s],
      wall_time_s=wall_offset + time.time() - wall0,
      time_to_target_s=host['time_to_target_s'], rounds_to_target=host['rounds_to_target'],
      step_wall_s=wall_stats(step_wall),
      config=json.loads(cfg.to_json()))
  mw.close()
  mngr.close()
  if writer:
    metrics_lib.write_json(os.path.join(workdir, 'summary.json'), summary)
    print_results(summary)
  return summary


def wall_stats(step_wall: dict) -> dict:
  """Median and count of the measured iteration wall-clock, per kind of iteration.

  Args:
    step_wall: ``{'round': [...], 'local': [...], 'excess': [...]}``, seconds per
      iteration (the first call of each compiled program, which compiles it,
      left out).

  Returns:
    ``{'round_median': s | None, 'round_min': s | None, 'round_n': int,
    'local_median': s | None, 'local_min': s | None, 'local_n': int,
    'excess_median': s | None, 'excess_min': s | None, 'excess_n': int}``,
    seconds. A round iteration includes the inter-DC exchange and the host
    loop's one gather of the round's metrics (both cross the WAN), so on a real
    or emulated WAN ``round_median - local_median`` (or the difference of
    ``round_median`` against the same run on a fast network) measures the
    inter-DC communication time that ``hfl.network.round_comm_time`` predicts.
    ``excess`` is, per round with local iterations (K > 1), the round iteration
    minus the median of the same round's local iterations: paired with
    iterations run moments before, it is robust to a machine whose load drifts.
  """
  out = {}
  for kind in ('round', 'local', 'excess'):
    v = step_wall.get(kind, [])
    out[f'{kind}_median'] = float(np.median(v)) if v else None
    out[f'{kind}_min'] = float(np.min(v)) if v else None
    out[f'{kind}_n'] = len(v)
  return out


def print_results(summary: dict) -> None:
  """Prints the short results table at the end of a run."""
  b = summary['bytes']
  metric_rows, target = tasks.result_rows(summary)
  rows = metric_rows + [
      ('inter-DC rounds', str(summary['inter_dc_rounds'])),
      ('intra-DC iterations', str(summary['intra_dc_iterations'])),
      ('bytes intra-DC up', _fmt_bytes(b['intra_up'])),
      ('bytes intra-DC down', _fmt_bytes(b['intra_down'])),
      ('bytes inter-DC', _fmt_bytes(b['inter_dc'])),
      ('simulated time', f'{summary["sim_time_s"]:.1f} s'),
      ('wall time', f'{summary["wall_time_s"]:.1f} s'),
      (f'time to {target}',
       'never' if summary['time_to_target_s'] is None else f'{summary["time_to_target_s"]:.1f} s'),
      (f'rounds to {target}',
       'never' if summary['rounds_to_target'] is None else f'{summary["rounds_to_target"]:.1f}'),
  ]
  width = max(len(r[0]) for r in rows)
  print('\n'.join(f'{k:<{width}}  {v}' for k, v in rows), flush=True)
