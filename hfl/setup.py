"""A run's setup: the config validated and resolved once, before anything is
compiled or written.

:func:`setup` turns a config into a frozen :class:`Setup` of sub-records: data
and its partition (:class:`Data`), the hierarchy and its devices
(:class:`Placement`), model shapes, the per-leaf compressors
(:func:`build_compressors` → :func:`hfl.compress.policy.build`) and those of every
DGC warm-up stage (:class:`Compression`, :class:`Warmup`), optimizers
(:class:`Optimizers`), network model, K schedule (planned with
:func:`planned_times`), outages and Streaming DiLoCo (:class:`Sync`), and the
loop's own fields (:class:`LoopConfig`). The loop (hfl.train) reads the Setup.
"""

import bisect
import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging

from hfl import accounting
from hfl import budget as budget_lib
from hfl import config as config_lib
from hfl import data as data_lib
from hfl import mesh as mesh_lib
from hfl import models
from hfl import network
from hfl import optim
from hfl import step as step_lib
from hfl import tasks
from hfl.compress import dgc
from hfl.compress import policy
from hfl.sync import faults, outer as outer_lib, schedule as schedule_lib, strategies
from hfl.sync import scaffold as scaffold_lib
from hfl.sync import scaffold as scaffold_lib
from hfl.sync import streaming


class LoopConfig(NamedTuple):
  """The loop's own fields of ``config.train`` (and the few others it needs)."""
  num_steps: int         # intra-DC iterations in all (0: a budget governs)
  batch_size: int        # per worker
  eval_every: int        # rounds between evaluations
  checkpoint_every: int  # rounds between checkpoints (0: only at the end)
  log_every: int         # iterations between progress lines
  eval_batch_size: int
  seed: int
  augment: str           # dataset.augment
  aggregation: str       # sync.aggregation: 'fedavg' | 'fednova'
  stop: budget_lib.Stop = budget_lib.Stop(1, 0.0)  # num_steps / sim_time / sample budget
  lr_scaling: str = 'none'  # sync.lr_scaling: 'none' | 'inverse_k' (round_lr_scale)
  prox_mu: float = 0.0      # sync.prox_mu: FedProx's mu (hfl.step.local_gradient)


class Warmup(NamedTuple):
  """The DGC density warm-up (Lin et al. 2018, Sec. 3.3), resolved.

  Attributes:
    starts: first step of each stage 0..S-1, then the warm-up's end (S + 1
      ints, non-decreasing); empty when the warm-up is off.
    comps: the compressors of each stage 0..S-1 (their top-k / random-k
      densities from :func:`hfl.compress.dgc.warmup_density`).
  """
  starts: tuple[int, ...] = ()
  comps: tuple[step_lib.Compressors, ...] = ()

  def stage(self, step: int) -> int | None:
    """The warm-up stage of ``step``; None when off or finished (the configured
    compressors apply). Equals :func:`hfl.compress.dgc.warmup_stage` below S."""
    if not self.comps:
      return None
    s = bisect.bisect_right(self.starts, step) - 1
    return s if s < len(self.comps) else None


class Placement(NamedTuple):
  """The D x W hierarchy and the devices it runs on."""
  num_dcs: int
  workers_per_dc: int
  # the ('dc', 'worker') device mesh, or with mode 'vmap' a 1 x 1 mesh of one device
  mesh: Any
  # hfl.step.make_step's mode: 'mesh' (a device per DC and worker) or 'vmap' (the
  # hierarchy on one device): mesh.simulate, resolved (hfl.mesh.step_mode)
  mode: str = 'mesh'


class Data(NamedTuple):
  """The dataset and its partition over DCs and workers."""
  dataset: data_lib.Dataset
  partition: data_lib.Partition
  dc_weights: np.ndarray  # float64 [D], n_d / n


class Optimizers(NamedTuple):
  """The inner (worker) and outer optimizers."""
  optimizer: optax.GradientTransformation
  outer: optax.GradientTransformation
  shard_state: bool  # ZeRO-1 sharded optimizer state (optimizer.shard_state)


class Compression(NamedTuple):
  """The per-leaf compressors of every link, and DGC's options and warm-up."""
  comps: step_lib.Compressors
  warmup: Warmup
  dgc: dgc.Options
  broadcast: str = 'gather'  # how the round's update reaches the workers (:func:`broadcast`)
  send: str = 'gradient'  # what the workers send up: compression.send (hfl.step.SENDS)


class Sync(NamedTuple):
  """What happens between DCs: the K schedule, outages, Streaming DiLoCo."""
  schedule: schedule_lib.Schedule
  present_fn: Any  # round (1-based) -> bool [D], the DCs present (hfl.sync.faults)
  stream: Any = None  # hfl.sync.streaming.Spec (Streaming DiLoCo), or None
  # plans may leave DCs out of the exchange or the adoption (hfl.sync.strategies)
  partial: bool = False
  scaffold: Any = None  # hfl.sync.scaffold.Spec (SCAFFOLD's control variates), or None
  faults: str = ''      # sync.faults, the outages' spec (for messages)


@dataclasses.dataclass(frozen=True)
class Setup:
  """Everything built from the config before compilation."""
  config: ml_collections.ConfigDict
  loop: LoopConfig
  task: tasks.Task
  place: Placement
  data: Data
  model: Any
  params_shape: Any
  optim: Optimizers
  compress: Compression
  net: network.NetworkModel
  sync: Sync


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


def _link_spec(config, link: str, step: int | None):
  """A link's compressor spec, its density replaced by the warm-up's at ``step``.

  DGC warm-up (Lin et al. 2018, Sec. 3.3; hfl.compress.dgc.warmup_density):
  density = initial * (final / initial) ** (stage / num_stages) for a top-k /
  random-k uplink or downlink (``final`` = the link's configured density). Other
  links, ``step=None`` and steps after the warm-up keep the config's spec.
  """
  spec = config.compression[link]
  steps, stages = warmup(config)
  if (step is None or dgc.warmup_stage(step, steps, stages) >= stages
      or spec.name not in config_lib.SPARSIFIERS):
    return spec
  spec = ml_collections.ConfigDict(spec.to_dict())
  spec.density = dgc.warmup_density(step, float(spec.density), steps,
                                    float(config.compression.dgc.initial_density), stages)
  return spec


def build_compressors(config, params_shape, step: int | None = None
                      ) -> step_lib.Compressors:
  """Per-leaf uplink, downlink and inter-DC compressors (:mod:`hfl.compress.policy`).

  Args:
    config: the experiment config.
    params_shape: pytree of the model's parameter shapes.
    step: build for this step's DGC warm-up stage (None: the configured
      densities). Only the top-k/random-k uplink and downlink densities change, so
      payload shapes change but no state shape does (dense residuals, stateless
      sparsifiers): one state serves every stage. The round's correction
      (``Compressors.bcast``: ``compression.correction`` where its name is set, else
      the downlink's compressor at ``compression.broadcast_density`` > 0) keeps its
      density.

  Raises:
    ValueError: what :func:`hfl.compress.policy.build` refuses, naming the field.
  """
  c = config.compression
  dense = c.get('dense_leaves', '')
  up = policy.build(_link_spec(config, 'uplink', step), params_shape, c.small_threshold,
                    c.small, field='compression.uplink', dense_leaves=dense)
  down = policy.build(_link_spec(config, 'downlink', step), params_shape, c.small_threshold,
                      c.small, field='compression.downlink', dense_leaves=dense)
  # The pseudo-gradient is compressed leaf by leaf with the same size policy.
  wan = policy.build(c.wan, params_shape, c.small_threshold, c.small, field='compression.wan',
                     dense_leaves=dense)
  bcast = None
  if policy.correction_name(c):  # the round's correction through its own compressor
    bcast = policy.build(c.correction, params_shape, c.small_threshold, c.small,
                         field='compression.correction', dense_leaves=dense)
  elif float(c.get('broadcast_density', 0.0)) > 0:  # ... or the downlink's at its own density
    spec = ml_collections.ConfigDict(c.downlink.to_dict())
    spec.density = float(c.broadcast_density)
    bcast = policy.build(spec, params_shape, c.small_threshold, c.small,
                         field='compression.broadcast_density', dense_leaves=dense)
  return step_lib.Compressors(up, down, wan, bcast)


def warmup_starts(warmup_steps: int, num_stages: int) -> tuple[int, ...]:
  """First step of each warm-up stage 0..S-1, then the warm-up's end (S + 1 ints).

  Stage ``s`` of :func:`hfl.compress.dgc.warmup_stage` starts at the first step
  with ``step * S // warmup_steps >= s``, i.e. ``ceil(s * warmup_steps / S)``.
  """
  return tuple(-(-s * warmup_steps // num_stages) for s in range(num_stages + 1))


def make_warmup(config, params_shape) -> Warmup:
  """The warm-up's stage boundaries and every stage's compressors (empty when off)."""
  steps, stages = warmup(config)
  if not steps:
    return Warmup()
  starts = warmup_starts(steps, stages)
  return Warmup(starts=starts, comps=tuple(build_compressors(config, params_shape, starts[s])
                                           for s in range(stages)))


def loop_config(config) -> LoopConfig:
  """The :class:`LoopConfig` of a validated config."""
  t = config.train
  return LoopConfig(num_steps=int(t.num_steps), batch_size=int(t.batch_size),
                    eval_every=int(t.eval_every), checkpoint_every=int(t.checkpoint_every),
                    log_every=int(t.log_every), eval_batch_size=int(t.eval_batch_size),
                    seed=int(config.seed), augment=config.dataset.get('augment', 'none'),
                    aggregation=config.sync.aggregation, stop=budget_lib.from_config(t),
                    lr_scaling=config.sync.get('lr_scaling', 'none'),
                    prox_mu=float(config.sync.get('prox_mu', 0.0)))


def _check_batch_fits(config, n: int) -> None:
  """Every worker's shard must hold one batch: a quick check before partitioning.

  Raises:
    ValueError: ``train.batch_size`` times the number of workers exceeds the ``n``
      training samples (no partition can give every worker a batch).
  """
  b, d, w = config.train.batch_size, config.mesh.num_dcs, config.mesh.workers_per_dc
  if b * d * w > n:
    raise ValueError(
        f'train.batch_size={b} x {d * w} workers (mesh.num_dcs={d} x mesh.workers_per_dc={w}) '
        f'= {b * d * w} exceeds the {n} training samples of dataset.name='
        f'{config.dataset.name!r}: every worker\'s shard must hold at least one batch. '
        'Lower train.batch_size or use fewer workers.')


def setup(config: ml_collections.ConfigDict) -> Setup:
  """Validates the config (:func:`hfl.config.validate`: every check that needs only
  the config) and builds data, mesh, model, compressors and schedule, checking on
  the way, before anything is compiled or written, what needs them: the devices
  (:func:`hfl.mesh.make_mesh`), the data (its files, :func:`hfl.data.load`; a
  batch per worker, :func:`_check_batch_fits`, the partition and
  :func:`hfl.data.check_batch_size`), the model's shapes (the compressors'
  factories, Streaming DiLoCo's fragments) and the planned times (semi_sync's K_d;
  a warm-up a budget cannot finish, :func:`hfl.config.check_budget_warmup`).

  Raises:
    ValueError / FileNotFoundError: bad config or data, naming the field.
  """
  config_lib.validate(config)
  if config.sync.k != 1 and 'sync.k' in (ignored := config_lib.ignored_fields(config)):
    logging.warning('sync.k=%s is not used: %s', config.sync.k, ignored['sync.k'])
  d, w = config.mesh.num_dcs, config.mesh.workers_per_dc
  net = network.from_config(config.network, d)
  present_fn = faults.make_present_fn(config.sync.faults, d)
  outer = outer_lib.make_outer(config.sync.outer.name, config.sync.outer.learning_rate,
                               config.sync.outer.momentum)
  optimizer = optim.make_optimizer(config.optimizer, config.train.num_steps)
  mode = mesh_lib.step_mode(mesh_lib.simulate(config), d, w)
  mesh = mesh_lib.placement_mesh(mode, d, w)
  if mode == 'vmap':
    logging.info('Simulating %d DCs x %d workers on one device (mesh.simulate=%r)', d, w,
                 mesh_lib.simulate(config))
  dataset = data_lib.load(config.dataset.name, config.dataset.data_dir,
                          cache_dir=config.dataset.get('cache_dir', ''),
                          seq_len=config.model.get('seq_len'))
  logging.info('Dataset %s', dataset.describe())
  _check_batch_fits(config, len(dataset.train_labels))
  part = data_lib.partition_dataset(dataset, d, w, config.dataset.partition,
                                    float(config.dataset.dirichlet_alpha), config.seed,
                                    min_size=config.train.batch_size)
  data_lib.check_batch_size(part, config.train.batch_size)
  model = models.from_config(config.model, dataset.num_classes)
  params_shape = jax.eval_shape(
      lambda: model.init(jax.random.PRNGKey(0), sample_input(dataset))['params'])
  comps = build_compressors(config, params_shape)
  t_d, c_d = planned_times(config, net, comps, params_shape)
  schedule = schedule_lib.from_config(config.sync, d, t=t_d, c=c_d)
  config_lib.check_budget_warmup(config, t_d, c_d, schedule, how='hfl.setup.planned_times '
                                 "(the network model and the payloads' sizes)")
  sizes = np.asarray(part.dc_sizes, np.float64)
  return Setup(config=config, loop=loop_config(config), task=tasks.from_config(config),
               place=Placement(num_dcs=d, workers_per_dc=w, mesh=mesh, mode=mode),
               data=Data(dataset=dataset, partition=part, dc_weights=sizes / sizes.sum()),
               model=model, params_shape=params_shape,
               optim=Optimizers(optimizer=optimizer, outer=outer,
                                shard_state=shard_state(config)),
               compress=Compression(comps=comps, warmup=make_warmup(config, params_shape),
                                    dgc=dgc_options(config), broadcast=broadcast(config),
                                    send=config.compression.get('send', 'gradient')),
               net=net,
               sync=Sync(schedule=schedule, present_fn=present_fn,
                         stream=streaming.spec_from_config(config.sync, params_shape),
                         partial=strategies.get(config.sync.strategy).partial,
                         scaffold=scaffold_lib.spec_from_config(config, sizes / sizes.sum()),
                         faults=config.sync.faults))


def planned_times(config, net: network.NetworkModel, comps, params_shape
                  ) -> tuple[np.ndarray, np.ndarray]:
  """Each DC's planned iteration time t_d and round communication time C_d (seconds,
  f64[D] each) from payload shapes (nothing runs): what the sync schedule plans with
  (hfl.sync.schedule) and, with every DC present, what the clock charges a round.

  t_d = hfl.network.iteration_time of W workers' uplink and downlink bits;
  C_d = hfl.network.round_comm_time of the DC's WAN payload + hfl.network.lan_time
  of the round's fan-out inside the DC (hfl.accounting.round_down_bits). A
  synchronous round (K = 1) then lasts max_d(t_d + C_d).
  """
  d, w = config.mesh.num_dcs, config.mesh.workers_per_dc
  up, down, wan = accounting.static_bits(comps, params_shape, w, shard_state(config))
  # SCAFFOLD's control-variate deltas: a second, float32 WAN payload, re-gathered.
  cv = scaffold_lib.payload_bits(params_shape) if scaffold_lib.enabled(config.sync) else 0
  t_d = network.iteration_time(net, np.full(d, up * w), np.full(d, down * w))
  c_d = (network.round_comm_time(net, np.full(d, wan + cv))
         + network.lan_time(net, np.full(d, accounting.round_down_bits(
             comps, w, d, broadcast(config)) + w * cv)))
  return t_d, c_d


def broadcast(config) -> str:
  """How the round's update reaches the workers: ``compression.broadcast``
  (hfl.step.broadcast_leaves); 'gather' when absent (a config older than the field,
  which ran that way: hfl.workdir.ADDED_SECTIONS)."""
  return config.compression.get('broadcast', 'gather')


def sample_input(dataset):
  """One zero input of the dataset's row shape and dtype (float32 images, int32 tokens)."""
  return jnp.zeros((1,) + tuple(dataset.train_images.shape[1:]), dataset.train_images.dtype)


def describe_sync(config, k_d) -> str:
  """One line of what happens between DCs: strategy, first round's K_d (int [D]),
  aggregation, outer optimizer, and the options that are on."""
  y = config.sync
  on = [f'{f}={y.get(f)!r}' for f, off in (
      ('progress_aware', False), ('k_min_ratio', 0.0), ('lr_scaling', 'none'),
      ('prox_mu', 0.0), ('control_variates', 'none'), ('faults', ''), ('fragments', 1))
        if y.get(f, off) != off]
  return (f'sync.strategy={y.strategy!r}, first round K_d={[int(k) for k in k_d]}, '
          f'aggregation={y.aggregation!r}, outer={y.outer.name!r} (lr '
          f'{y.outer.learning_rate}, momentum {y.outer.momentum})' +
          (f'; {", ".join(on)}' if on else ''))


def log_policies(s: Setup) -> None:
  """Logs what happens between DCs (:func:`describe_sync`) and the per-leaf compression
  policy of each link that compresses."""
  logging.info('Sync: %s', describe_sync(s.config, s.sync.schedule.plan(
      s.sync.schedule.init()).k_d))
  c = s.config.compression
  logging.info('Compression policy (uplink):\n%s',
               policy.describe(s.compress.comps.up, s.params_shape))
  if c.downlink.name != 'identity' or c.small != 'float32':
    logging.info('Compression policy (downlink):\n%s',
                 policy.describe(s.compress.comps.down, s.params_shape))
  if c.wan.name != 'identity':
    logging.info('Compression policy (inter-DC):\n%s',
                 policy.describe(s.compress.comps.wan, s.params_shape))
  if s.sync.stream is not None:
    logging.info('Streaming DiLoCo fragments (one syncs every %d iterations):\n%s',
                 s.config.sync.k // len(s.sync.stream.fragments),
                 streaming.describe(s.sync.stream.fragments, s.params_shape))
