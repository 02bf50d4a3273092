"""The training loop: rounds, evaluation, logging, checkpoints.

``train_and_evaluate(config, workdir)`` runs one experiment end to end and returns
its summary (the dict written to WORKDIR/summary.json, :mod:`hfl.metrics`).

The loop follows the layout of flax's ``examples/imagenet/train.py``: the config
is validated and resolved once into a frozen :class:`Setup` (data, mesh, model,
compressors of every DGC warm-up stage, the K schedule, the loop's own fields);
the host-side loop state is a :class:`LoopState` NamedTuple updated by small pure
functions (:func:`account_iteration`, :func:`account_round`, :func:`record_eval`);
the device work is the jitted step of :func:`hfl.step.make_step`. A checkpoint
holds the TrainState and ``to_host(LoopState)`` (JSON); :func:`from_host` reads
it back, also from workdirs written by older versions.
"""

import bisect
import copy
import dataclasses
import json
import os
import time
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from jax.sharding import NamedSharding, PartitionSpec as P

from hfl import accounting
from hfl import budget as budget_lib
from hfl import checkpoint as ckpt_lib
from hfl import config as config_lib
from hfl import data as data_lib
from hfl import distributed
from hfl import inflight
from hfl import mesh as mesh_lib
from hfl import metrics as metrics_lib
from hfl import models
from hfl import network
from hfl import optim
from hfl import provenance
from hfl import step as step_lib
from hfl import tasks
from hfl import workdir as workdir_lib
from hfl.compress import dgc
from hfl.compress import policy
from hfl.sync import aggregation, faults, outer as outer_lib, schedule as schedule_lib
from hfl.sync import scaffold as scaffold_lib
from hfl.sync import streaming

# Compressor names that send float32 unchanged.
UNCOMPRESSED = ('identity', 'float32')
LINKS = metrics_lib.LINKS  # ('intra_up', 'intra_down', 'inter_dc')


# ------------------------------------------------------------------------------
# Setup: the config validated and resolved once, before anything is compiled or
# written.
# ------------------------------------------------------------------------------

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


@dataclasses.dataclass(frozen=True)
class Setup:
  """Everything built from the config before compilation."""
  config: ml_collections.ConfigDict
  num_dcs: int
  workers_per_dc: int
  loop: LoopConfig
  task: tasks.Task
  dataset: data_lib.Dataset
  partition: data_lib.Partition
  mesh: Any
  model: Any
  params_shape: Any
  optimizer: optax.GradientTransformation
  outer: optax.GradientTransformation
  comps: step_lib.Compressors
  warmup: Warmup
  dgc: dgc.Options
  shard_state: bool
  net: network.NetworkModel
  schedule: schedule_lib.Schedule
  present_fn: Any
  dc_weights: np.ndarray  # float64 [D], n_d / n
  stream: Any = None      # hfl.sync.streaming.Spec (Streaming DiLoCo), or None
  # hfl.step.make_step's mode: 'mesh' (a device per DC and worker; ``mesh`` is the
  # ('dc', 'worker') device mesh) or 'vmap' (the hierarchy on one device, ``mesh`` a
  # 1 x 1 mesh of it): mesh.simulate, resolved (hfl.mesh.step_mode)
  mode: str = 'mesh'


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
      sparsifiers): one state serves every stage.

  Raises:
    ValueError: what :func:`hfl.compress.policy.build` refuses, naming the field.
  """
  c = config.compression
  up = policy.build(_link_spec(config, 'uplink', step), params_shape, c.small_threshold,
                    c.small, field='compression.uplink')
  down = policy.build(_link_spec(config, 'downlink', step), params_shape, c.small_threshold,
                      c.small, field='compression.downlink')
  # The pseudo-gradient is compressed leaf by leaf with the same size policy.
  wan = policy.build(c.wan, params_shape, c.small_threshold, c.small, field='compression.wan')
  return step_lib.Compressors(up, down, wan)


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
  return Warmup(starts, tuple(build_compressors(config, params_shape, starts[s])
                              for s in range(stages)))


def loop_config(config) -> LoopConfig:
  """The :class:`LoopConfig` of a validated config."""
  t = config.train
  return LoopConfig(int(t.num_steps), int(t.batch_size), int(t.eval_every),
                    int(t.checkpoint_every), int(t.log_every), int(t.eval_batch_size),
                    int(config.seed), config.dataset.get('augment', 'none'),
                    config.sync.aggregation, budget_lib.from_config(t),
                    config.sync.get('lr_scaling', 'none'), float(config.sync.get('prox_mu', 0.0)))


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
      lambda: model.init(jax.random.PRNGKey(0), _sample_input(dataset))['params'])
  comps = build_compressors(config, params_shape)
  t_d, c_d = planned_times(config, net, comps, params_shape)
  schedule = schedule_lib.from_config(config.sync, d, t=t_d, c=c_d)
  config_lib.check_budget_warmup(config, t_d, c_d, schedule, how='hfl.train.planned_times '
                                 "(the network model and the payloads' sizes)")
  sizes = np.asarray(part.dc_sizes, np.float64)
  return Setup(config, d, w, loop_config(config), tasks.from_config(config), dataset, part,
               mesh, model, params_shape, optimizer, outer, comps,
               make_warmup(config, params_shape), dgc_options(config), shard_state(config),
               net, schedule, present_fn, sizes / sizes.sum(),
               streaming.spec_from_config(config.sync, params_shape), mode)


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


def _sample_input(dataset):
  """One zero input of the dataset's row shape and dtype (float32 images, int32 tokens)."""
  return jnp.zeros((1,) + tuple(dataset.train_images.shape[1:]), dataset.train_images.dtype)


# ------------------------------------------------------------------------------
# The host-side loop state, and the one place that reads old workdirs.
# ------------------------------------------------------------------------------

class AtStop(NamedTuple):
  """Where a run that stops after its last round is charged more than the loop state
  holds: that round's overlapped transfer (Streaming DiLoCo) in full, since no
  iteration follows to hide it (:func:`hfl.network.advance_overlapped_round`).

  Attributes:
    clock: the clock with the transfer charged in full.
    exposed_s: the WAN exposure (:func:`account_wan`'s ``exposed_s``) with it.
  """
  clock: network.Clock
  exposed_s: float


class LoopState(NamedTuple):
  """What the host loop carries from round to round (checkpointed as JSON).

  Attributes:
    step: intra-DC iterations done.
    round: inter-DC rounds done.
    clock: the simulated clock (:class:`hfl.network.Clock`, seconds per DC).
    bits: exact bit totals per link of :data:`LINKS` (Python ints).
    schedule: the K schedule's state.
    plan: the plan of the next round (``schedule.plan(schedule)`` when restored).
    best_test_accuracy, best_test_loss: best evaluations so far (None: none yet).
    time_to_target_s, rounds_to_target: where the headline metric first reached
      its target (:func:`hfl.metrics.crossing`), None until it has.
    last_eval: the last evaluation's headline metric, ``sim_time_s`` and ``round``.
    round_loss: mean train loss of each round since the last evaluation.
    dc_rounds: per-DC diagnostics of each round since the last evaluation
      (:func:`round_diagnostics`).
    wall_time_s: wall-clock seconds spent by earlier sessions of the run.
    wan: the WAN exposure and peaks so far (:func:`account_wan`); None before
      the first round (and in checkpoints written before it existed: a run
      resumed from one counts them from the resumption on).
    resumed_changes: each resumption with a changed config,
      ``{'at_iteration': int, 'changes': ['train.num_steps: 10 -> 20', ...]}``
      (:func:`hfl.workdir.check_workdir_config`): the summary's ``changed_on_resume``; such a
      run's results may differ from a fresh run of its final config.
    at_stop: the accounting of the run if it stops after the last round
      (:class:`AtStop`; None: the loop state's own, nothing in flight). Only the
      summary reads it (:func:`stopped`), so a run extended past its old end goes on
      from the same clock as a fresh run (checkpoints written before it existed
      hold the old end's transfer charged in full).
    provenance: one :func:`hfl.provenance.collect` entry per start of the run that
      trained (fresh or resumed), oldest first: the summary's ``provenance``.
    samples: training samples processed so far, summed over the DCs and rounds
      (each round's ``dc_rounds[*].samples``, :func:`round_diagnostics`: K_d x W x B
      per present DC); what ``train.sample_budget`` stops. None: unknown (a
      checkpoint written before it existed whose metrics.jsonl cannot give it,
      :func:`hfl.workdir.samples_from_log`).
  """
  step: int
  round: int
  clock: network.Clock
  bits: Mapping[str, int]
  schedule: schedule_lib.ScheduleState
  plan: schedule_lib.RoundPlan
  best_test_accuracy: float | None = None
  best_test_loss: float | None = None
  time_to_target_s: float | None = None
  rounds_to_target: float | None = None
  last_eval: Mapping[str, Any] | None = None
  round_loss: tuple[float, ...] = ()
  wall_time_s: float = 0.0
  dc_rounds: tuple[dict, ...] = ()
  wan: Mapping[str, Any] | None = None
  resumed_changes: tuple[dict, ...] = ()
  at_stop: AtStop | None = None
  provenance: tuple[dict, ...] = ()
  samples: int | None = 0


def new_loop_state(schedule: schedule_lib.Schedule, num_dcs: int) -> LoopState:
  """The loop state of a run that has not started."""
  sched = schedule.init()
  return LoopState(0, 0, network.new_clock(num_dcs), {link: 0 for link in LINKS}, sched,
                   schedule.plan(sched))


def to_host(ls: LoopState, wall_time_s: float) -> dict:
  """``ls`` as the JSON-able dict a checkpoint holds (``wall_time_s``: the run's
  wall-clock so far, seconds)."""
  return dict(fault_rounds_from=workdir_lib.FAULT_ROUNDS_FROM, step=ls.step, round=ls.round,
              clock_s=ls.clock.time_s.tolist(), idle_s=ls.clock.idle_s.tolist(),
              bytes=byte_totals(ls.bits), bits=dict(ls.bits),
              schedule=schedule_lib.state_to_json(ls.schedule),
              best_test_accuracy=ls.best_test_accuracy, best_test_loss=ls.best_test_loss,
              time_to_target_s=ls.time_to_target_s, rounds_to_target=ls.rounds_to_target,
              wall_time_s=wall_time_s, last_eval=ls.last_eval, round_loss=list(ls.round_loss),
              dc_rounds=list(ls.dc_rounds), wan=ls.wan,
              resumed_changes=list(ls.resumed_changes),
              at_stop=None if ls.at_stop is None else dict(
                  clock_s=ls.at_stop.clock.time_s.tolist(),
                  idle_s=ls.at_stop.clock.idle_s.tolist(), exposed_s=ls.at_stop.exposed_s),
              provenance=list(ls.provenance), samples=ls.samples)


def from_host(host: Mapping[str, Any], schedule: schedule_lib.Schedule) -> LoopState:
  """Inverse of :func:`to_host`, also for checkpoints of older versions: those
  without ``bits`` (exact totals are derived from ``bytes``), ``best_test_loss`` or
  ``samples`` (None: :func:`restore_or_init` derives it from metrics.jsonl)."""
  bits = ({k: int(v) for k, v in host['bits'].items()} if 'bits' in host else
          {k: int(round(float(v) * 8)) for k, v in host['bytes'].items()})
  sched = schedule_lib.state_from_json(host['schedule'])
  return LoopState(
      int(host['step']), int(host['round']),
      network.Clock(np.asarray(host['clock_s']), np.asarray(host['idle_s'])), bits, sched,
      schedule.plan(sched), host['best_test_accuracy'], host.get('best_test_loss'),
      host['time_to_target_s'], host['rounds_to_target'], host['last_eval'],
      tuple(host['round_loss']), float(host['wall_time_s']),
      tuple(host.get('dc_rounds', ())), host.get('wan'),
      tuple(host.get('resumed_changes', ())), _at_stop(host.get('at_stop')),
      tuple(host.get('provenance', ())),
      None if host.get('samples') is None else int(host['samples']))


def _at_stop(host: Mapping[str, Any] | None) -> AtStop | None:
  """:class:`AtStop` of :func:`to_host`'s ``at_stop`` (None: none, or a checkpoint
  written before it existed)."""
  if host is None:
    return None
  return AtStop(network.Clock(np.asarray(host['clock_s']), np.asarray(host['idle_s'])),
                float(host['exposed_s']))


def stopped(ls: LoopState) -> LoopState:
  """``ls`` as a run that stops there is charged (:class:`AtStop`): the summary's
  clock and WAN exposure. The loop goes on from ``ls`` itself."""
  if ls.at_stop is None:
    return ls
  return ls._replace(clock=ls.at_stop.clock, wan=dict(ls.wan, exposed_s=ls.at_stop.exposed_s),
                     at_stop=None)


# ------------------------------------------------------------------------------
# Pure updates of the loop state.
# ------------------------------------------------------------------------------

def _bytes(bits: int):
  """Bytes of an exact bit count: an int when whole, else a float."""
  return bits // 8 if bits % 8 == 0 else bits / 8


def byte_totals(bits: Mapping[str, int]) -> dict:
  """Bytes per link (an int when whole, else a float) of exact bit totals."""
  return {link: _bytes(b) for link, b in bits.items()}


def _add_bits(bits: Mapping[str, int], **more) -> dict:
  return {link: b + int(more.get(link, 0)) for link, b in bits.items()}


def account_iteration(ls: LoopState, net: network.NetworkModel, m: Mapping[str, np.ndarray],
                      active: np.ndarray) -> LoopState:
  """Charges one intra-DC iteration: its uplink and downlink bits and its simulated
  time (:func:`hfl.network.iteration_time`) on the active DCs' clocks.

  Args:
    ls: the loop state.
    net: the network model.
    m: :func:`hfl.step.host_metrics` of the iteration (``up_bits``,
      ``down_bits``: int64 [D]).
    active: bool [D], the DCs that ran it.
  """
  bits = _add_bits(ls.bits, intra_up=m['up_bits'].sum(), intra_down=m['down_bits'].sum())
  clock = network.advance_iteration(
      ls.clock, network.iteration_time(net, m['up_bits'], m['down_bits']), active)
  return ls._replace(bits=bits, clock=clock)


def account_round(ls: LoopState, net: network.NetworkModel, schedule: schedule_lib.Schedule,
                  m: Mapping[str, np.ndarray], present: np.ndarray, steps: int,
                  train_loss: float, overlap_steps: int = 0) -> LoopState:
  """Ends a round: the inter-DC exchange, its result reaching the workers over the
  LAN (bits and :func:`hfl.network.advance_round`), and the next round's plan.

  Args:
    ls: the loop state after the round's iterations (:func:`account_iteration`).
    net: the network model.
    schedule: the K schedule (gets the round's mean train loss).
    m: :func:`hfl.step.host_metrics` of the round's last iteration (``wan_bits``,
      ``round_down_bits``: int64 [D]).
    present: bool [D], the DCs that took part.
    steps: iterations the round ran.
    train_loss: the round's mean train loss.
    overlap_steps: τ, iterations the exchange overlaps (Streaming DiLoCo): only
      the part of it longer than τ iterations of the DC is charged
      (:func:`hfl.network.exposed_comm_time`); all of it in ``at_stop``, the
      accounting of a run that stops after this round.
  """
  wan_bits = m['wan_bits']
  bits = _add_bits(ls.bits, inter_dc=network.link_bits(wan_bits, present),
                   intra_down=m['round_down_bits'].sum())
  comm = (network.round_comm_time(net, wan_bits, present)
          + network.lan_time(net, m['round_down_bits']))
  overlap = overlap_steps * network.iteration_time(net, m['up_bits'], m['down_bits'])
  clock, clock_at_stop = network.advance_overlapped_round(ls.clock, comm, overlap, present)
  at_stop = (None if not overlap_steps else
             AtStop(clock_at_stop, account_wan(ls.wan, wan_bits, present, comm)['exposed_s']))
  plan, sched = schedule.next_round(ls.schedule, train_loss)
  return ls._replace(step=ls.step + steps, round=ls.round + 1, bits=bits, clock=clock,
                     schedule=sched, plan=plan, round_loss=ls.round_loss + (train_loss,),
                     wan=account_wan(ls.wan, wan_bits, present,
                                     network.exposed_comm_time(comm, overlap)),
                     at_stop=at_stop)


def account_wan(wan: Mapping[str, Any] | None, wan_bits: np.ndarray, present: np.ndarray,
                exposed: np.ndarray) -> dict:
  """The run's WAN exposure and peaks after one sync event (round).

  Returns:
    ``{'exposed_s'``: seconds of round communication not hidden by compute,
    summed over rounds (the slowest present DC's); ``'peak_bits'``: the largest
    total of one round's WAN bits (:func:`hfl.network.link_bits`);
    ``'peak_dc_bits'``: the largest bits one DC's WAN link carried in one round,
    max(egress, ingress) (:func:`hfl.network.dc_link_bits`)}``.
  """
  wan = dict(wan or dict(exposed_s=0.0, peak_bits=0, peak_dc_bits=0))
  present = np.asarray(present, bool)
  dc = int(np.max(network.dc_link_bits(np.asarray(wan_bits, np.int64), present)))
  wan['exposed_s'] += float(np.max(np.where(present, exposed, 0.0)))
  wan['peak_bits'] = max(wan['peak_bits'], network.link_bits(wan_bits, present))
  wan['peak_dc_bits'] = max(wan['peak_dc_bits'], dc)
  return wan


def eval_record(ls: LoopState, task: tasks.Task, accuracy: float, loss: float,
                wall_time_s: float) -> dict:
  """The metrics.jsonl record of an evaluation of the global model at ``ls``."""
  return dict(step=ls.step, round=ls.round, samples=ls.samples,
              **tasks.eval_record(task, accuracy, loss),
              train_loss=(float(np.mean(ls.round_loss)) if ls.round_loss else None),
              bytes=byte_totals(ls.bits), sim_time_s=ls.clock.now, wall_time_s=wall_time_s,
              k=int(ls.plan.k_base), k_d=[int(k) for k in ls.plan.k_d],
              idle_s=[float(x) for x in ls.clock.idle_s], dc_rounds=list(ls.dc_rounds))


def record_eval(ls: LoopState, task: tasks.Task, rec: Mapping[str, Any]) -> LoopState:
  """The loop state after evaluation ``rec``: best values, the first crossing of
  the target (interpolated from the previous evaluation), a new round-loss window."""
  acc, loss = rec['test_accuracy'], rec['test_loss']
  best_acc = ls.best_test_accuracy
  best_loss = ls.best_test_loss
  ttt, rtt = ls.time_to_target_s, ls.rounds_to_target
  if ttt is None and task.reached(rec[task.metric]):
    cross = lambda key: metrics_lib.crossing(ls.last_eval, rec, task.target, key,
                                             task.metric, task.higher_is_better)
    ttt, rtt = cross('sim_time_s'), cross('round')
  return ls._replace(
      best_test_accuracy=acc if best_acc is None or acc > best_acc else best_acc,
      best_test_loss=loss if best_loss is None or loss < best_loss else best_loss,
      time_to_target_s=ttt, rounds_to_target=rtt, round_loss=(), dc_rounds=(),
      last_eval={k: rec[k] for k in (task.metric, 'sim_time_s', 'round')})


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
# The loop's resources: programs, shardings, outputs and timers (not checkpointed).
# ------------------------------------------------------------------------------

class StepTimer:
  """Measured wall-clock of each iteration (dispatch to results on the host),
  split into round iterations (with the inter-DC exchange and the round's metrics
  gather) and local ones; a program's first call, which compiles it, is left out."""

  def __init__(self):
    self.step_wall = dict(round=[], local=[], excess=[])  # seconds, see wall_stats
    self._round_local = []  # this round's timed local iterations
    self._compiled = set()
    self._last = (0.0, False)  # (start, timed) of the last iteration

  def iteration(self, program, t_start: float) -> None:
    """After an iteration of ``program`` = (warm-up stage, do_round) started at
    ``t_start`` (time.perf_counter) has finished."""
    timed = program in self._compiled
    if timed and not program[1]:
      self._round_local.append(time.perf_counter() - t_start)
      self.step_wall['local'].append(self._round_local[-1])
    self._compiled.add(program)
    self._last = (t_start, timed)

  def round_gathered(self) -> None:
    """After the round's metrics reached the host (ends the round iteration)."""
    t_start, timed = self._last
    if timed:
      self.step_wall['round'].append(time.perf_counter() - t_start)
      if self._round_local:  # against this round's own local iterations, moments before
        self.step_wall['excess'].append(
            self.step_wall['round'][-1] - float(np.median(self._round_local)))
    self._round_local = []


@dataclasses.dataclass
class Runtime:
  """What the loop uses besides its state."""
  s: Setup
  workdir: str
  wall0: float            # time.time() when this session started
  state_shape: Any        # TrainState of jax.ShapeDtypeStruct
  shardings: Any          # TrainState of NamedSharding
  init_fn: Callable       # () -> TrainState
  make_step: Callable     # Compressors -> step function
  step_fns: dict          # warm-up stage (None: the configured compressors) -> step
  evaluate: Callable      # global params -> (accuracy, loss)
  mngr: Any               # orbax CheckpointManager
  leaf_names: list
  timer: StepTimer
  jitted: dict            # round_start, discard_absent, all_finite
  mw: Any = None          # metrics_lib.MetricsWriter, once the start step is known
  log_at: tuple = (0.0, 0, True)  # (time, step, first?) of the last progress line
  window: Any = None      # inflight.Window: the steps in flight, timed into ``timer``

  def wall_s(self, ls: LoopState) -> float:
    """The run's wall-clock so far (earlier sessions included), seconds."""
    return ls.wall_time_s + time.time() - self.wall0

  def put(self, x, spec=P()):
    return distributed.put_global(x, NamedSharding(self.s.mesh, spec))


def _init_fn(s: Setup) -> Callable:
  """``() -> TrainState``: the model's initial parameters and every state around them."""
  key = jax.random.PRNGKey(s.loop.seed)
  sample = _sample_input(s.dataset)

  def init():
    params = s.model.init(key, sample)['params']
    return step_lib.init_state(params, s.optimizer, s.outer, s.comps, s.num_dcs,
                               s.workers_per_dc, jax.random.fold_in(key, 1),
                               dgc_momentum=s.dgc.momentum > 0, shard_state=s.shard_state,
                               stream=s.stream, broadcast=broadcast(s.config),
                               scaffold=scaffold_lib.enabled(s.config.sync))
  return init


def make_runtime(s: Setup, workdir: str, wall0: float) -> Runtime:
  """Builds the step of the configured compressors (compiled on its first call),
  the evaluation, and the checkpoint manager, in ``workdir`` (which
  :func:`hfl.workdir.workdir_lock` created on process 0).
  """
  apply_fn = lambda p, x: s.model.apply({'params': p}, x)
  init_fn = _init_fn(s)
  state_shape = jax.eval_shape(init_fn)
  make = lambda comps: step_lib.make_step(apply_fn, s.optimizer, s.outer, comps, s.mesh,
                                          state_shape, s.dgc, prox_mu=s.loop.prox_mu,
                                          stream=s.stream, mode=s.mode,
                                          shape=(s.num_dcs, s.workers_per_dc),
                                          scaffold=scaffold_lib.spec_from_config(
                                              s.config, s.dc_weights))
  step_fns = {None: make(s.comps)}
  evaluate = make_eval(s.model, s.mesh, s.dataset.test_images, s.dataset.test_labels,
                       s.loop.eval_batch_size)
  shardings = step_lib.state_shardings(s.mesh, state_shape)
  leaf_names = [jax.tree_util.keystr(path) for path, _ in
                jax.tree_util.tree_flatten_with_path(s.params_shape)[0]]
  # An absent DC's work in a round is discarded (hfl.sync.faults): its per-DC
  # state is copied at the round's start and restored after the round.
  jitted = dict(
      round_start=jax.jit(step_lib.round_start),
      discard_absent=jax.jit(step_lib.discard_absent, donate_argnums=(0,),
                             out_shardings=shardings),
      all_finite=jax.jit(lambda t: jnp.all(jnp.stack(
          [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(t)]))))
  timer = StepTimer()
  window = inflight.Window(inflight.depth(jax.default_backend(), s.mode, s.mesh.size),
                           timer.iteration)
  return Runtime(s, workdir, wall0, state_shape, shardings, init_fn, make, step_fns, evaluate,
                 ckpt_lib.manager(workdir), leaf_names, timer, jitted, window=window)


def _step_fn(rt: Runtime, stage: int | None, step: int) -> Callable:
  """The step of a warm-up stage, built (from its precomputed compressors) when the
  stage is first reached."""
  if stage not in rt.step_fns:
    comps = rt.s.warmup.comps[stage]
    logging.info('DGC warm-up stage %d from step %d, uplink policy:\n%s', stage, step,
                 policy.describe(comps.up, rt.s.params_shape))
    rt.step_fns[stage] = rt.make_step(comps)
  return rt.step_fns[stage]


def restore_or_init(rt: Runtime):
  """``(state, loop_state, restored)``: the newest checkpoint that restores, or a
  new run's state initialised directly sharded. A checkpoint older than
  :attr:`LoopState.samples` gets them from metrics.jsonl (:func:`hfl.workdir.samples_from_log`).

  Raises:
    ValueError: :func:`hfl.workdir.check_resumed_samples`,
      :func:`hfl.workdir.check_fault_rounds`.
  """
  restored = ckpt_lib.restore_latest(rt.mngr, ckpt_lib.abstract(rt.state_shape, rt.shardings))
  if restored is None:
    state = jax.jit(rt.init_fn, out_shardings=rt.shardings)()
    return state, new_loop_state(rt.s.schedule, rt.s.num_dcs), False
  _, state, host = restored
  ls = from_host(host, rt.s.schedule)
  if ls.samples is None:  # a checkpoint older than the count
    ls = ls._replace(samples=workdir_lib.samples_from_log(
        metrics_lib.read_jsonl(os.path.join(rt.workdir, 'metrics.jsonl')), ls))
  if rt.s.loop.stop.governed_by == 'sample_budget':  # the budget the run was trained to
    old = workdir_lib.upgrade_config(workdir_lib.stored_config(rt.workdir) or {})
    workdir_lib.check_resumed_samples(rt.s.loop.stop, ls,
                                      old.get('train', {}).get('sample_budget', 0), rt.workdir)
  if not rt.s.loop.stop.finished(ls.step, ls.clock.now, ls.samples):
    workdir_lib.check_fault_rounds(rt.s.config.sync.faults, host, rt.workdir)
  return state, ls, True


# ------------------------------------------------------------------------------
# One round: its iterations on the devices, then their accounting on the host.
# ------------------------------------------------------------------------------

def _round_weights(s: Setup, plan, it: int, active, present) -> np.ndarray:
  """float32 [D]: the round's aggregation scales (:mod:`hfl.sync.aggregation`) of
  the present DCs, with the local steps each ran (``it + 1`` iterations so far)."""
  local = np.where(active, np.minimum(plan.k_d, it + 1), plan.k_d)
  p = aggregation.fedavg_weights(s.dc_weights, present)
  return np.asarray(aggregation.aggregation_scale(s.loop.aggregation, p,
                                                  jnp.asarray(local, jnp.float32)))


def round_lr_scale(lr_scaling: str, k_d) -> np.ndarray:
  """float32 [D]: each DC's learning-rate multiplier in a round with local steps
  ``k_d`` (int [D]).

  ``'none'``: 1. ``'inverse_k'``: min_e K_e / K_d, so every DC's K_d steps move it
  about as far as the slowest DC's K_min steps (the step-count normalisation of
  FedNova, Wang et al. NeurIPS 2020, applied to the inner learning rate instead of
  the aggregation weights).
  """
  k = np.asarray(k_d, np.float64)
  if lr_scaling == 'inverse_k':
    return (k.min() / k).astype(np.float32)
  return np.ones(k.shape, np.float32)


def _run_iteration(rt: Runtime, state, step: int, active, weights, do_round: bool,
                   lr_scale=None):
  """One step on the devices: ``(state, device metrics, ProgramInfo)``."""
  s, loop = rt.s, rt.s.loop
  idx = data_lib.batch_indices(s.partition, loop.batch_size, step, loop.seed)
  # Each process gathers only the rows of its own (dc, worker) devices.
  batch_sh = NamedSharding(s.mesh, P(mesh_lib.DC, mesh_lib.WORKER))
  batch = tuple(distributed.put_rows(src, rows, batch_sh) for src, rows in data_lib.batch_rows(
      s.dataset, idx, step, loop.seed, loop.augment))
  stage = s.warmup.stage(step)
  t_start = time.perf_counter()
  step_fn = _step_fn(rt, stage, step)
  # With learning-rate scaling, ``active`` carries each DC's multiplier (0: inactive).
  act = active if lr_scale is None else np.where(active, lr_scale, 0.0).astype(np.float32)
  state, m = step_fn(state, batch, rt.put(act, P(mesh_lib.DC)), rt.put(weights), do_round)
  rt.window.push(m, (stage, step_lib.syncs(do_round), do_round), t_start)  # waits if full
  return state, m, step_fn.info[step_lib.program_key(do_round)]


def run_round(rt: Runtime, state, ls: LoopState):
  """Runs one round's iterations (K_d per DC; with ``train.num_steps`` governing, at
  most ``num_steps`` in all; with a time or sample budget, always the whole round).

  The metrics stay on the devices until the round ends: with DCs on different
  hosts, fetching every DC's metrics is an inter-DC collective, which local
  iterations must not pay.

  Returns:
    ``(state, pending, weights, present)``: ``pending`` lists (device metrics,
    active [D], ProgramInfo) per iteration; ``weights`` the round's aggregation
    scales; ``present`` bool [D].
  """
  s, plan = rt.s, ls.plan
  kmax = int(np.max(plan.k_d))
  if s.stream is not None:  # one fragment's sync event every K / P iterations
    kmax = int(s.config.sync.k) // len(s.stream.fragments)
  present = s.present_fn(ls.round + 1)  # this round's number (hfl.sync.faults)
  start = None if np.all(present) else rt.jitted['round_start'](state)
  pending, weights = [], np.zeros(s.num_dcs, np.float32)
  lr_scale = (None if s.loop.lr_scaling == 'none'
              else round_lr_scale(s.loop.lr_scaling, plan.k_d))
  cap = s.loop.stop.step_cap()
  for it in range(kmax):
    active = it < plan.k_d
    do_round = it + 1 >= kmax or ls.step + it + 1 == cap
    if do_round:
      weights = _round_weights(s, plan, it, active, present)
    key = (streaming.event_at(ls.step + it + 1, int(s.config.sync.k),
                              len(s.stream.fragments), int(s.config.sync.overlap_steps))
           if s.stream is not None else do_round)
    state, m, info = _run_iteration(rt, state, ls.step + it, active, weights, key, lr_scale)
    pending.append((m, active, info))
    if do_round:
      break
  if start is not None:
    state = rt.jitted['discard_absent'](state, start, rt.put(present))
  rt.window.drain()  # every step timed before the round's metrics are gathered
  return state, pending, weights, present


def account(rt: Runtime, ls: LoopState, pending, weights, present):
  """Gathers a round's metrics (one inter-DC transfer) and charges its iterations
  and its inter-DC exchange to ``ls``; checks every value was finite.

  Returns:
    ``(loop state after the round, the last iteration's weighted train loss)``.
  """
  s = rt.s
  round_ms = distributed.to_host_stacked([pm for pm, _, _ in pending])
  rt.timer.round_gathered()
  first, end = ls.step + 1, ls.step + len(pending)
  losses = []
  for at, raw, (_, act, info) in zip(range(first, end + 1), round_ms, pending):
    # ``at``: this iteration's step number (1-based).
    m = step_lib.host_metrics(info, raw, act, weights if info.do_round else None)
    _check_finite(rt, m, at, end, ls.round + 1)
    ls = account_iteration(ls, s.net, m, act)
    losses.append(float(np.dot(s.dc_weights, m['loss'])))
    if at < end and at % s.loop.log_every == 0:
      _log_progress(rt, ls, at, losses[-1])
  round_loss = sum(losses) / len(losses)
  # The exchange overlaps the next τ iterations; a run that stops after this round
  # waits for all of it (``at_stop``: the summary's, hfl.train.stopped).
  tau = int(s.config.sync.get('overlap_steps', 0)) if s.stream is not None else 0
  ls = account_round(ls, s.net, s.schedule, m, present, len(pending), round_loss, tau)
  diag = round_diagnostics(ls.round, [act for _, act, _ in pending], present,
                           s.workers_per_dc * s.loop.batch_size, weights, m)
  diag['train_loss'] = round_loss  # what the K schedule saw (hfl.sync.schedule)
  return ls._replace(dc_rounds=ls.dc_rounds + (diag,),
                     samples=add_samples(ls.samples, diag['samples'])), losses[-1]


def add_samples(total: int | None, round_samples) -> int | None:
  """The run's samples after a round that processed ``round_samples`` (ints per DC,
  :func:`round_diagnostics`'s ``samples``); None stays None (unknown)."""
  return None if total is None else total + sum(int(x) for x in round_samples)


def round_diagnostics(rnd: int, actives, present, batch: int, weights, m) -> dict:
  """One round's per-DC diagnostics (the ``dc_rounds`` entries of metrics.jsonl).

  Args:
    rnd: the round's number (1-based).
    actives: bool [D] per iteration of the round (the DCs that ran it).
    present: bool [D], the DCs that took part (hfl.sync.faults).
    batch: samples per DC per iteration (workers_per_dc x batch_size).
    weights: float [D], the round's aggregation scales s_d (hfl.sync.aggregation).
    m: :func:`hfl.step.host_metrics` of the round's last iteration.

  Returns:
    ``{'round', 'samples': [D] ints (K_d x W x B; 0 for an absent DC, whose work
    is discarded), 'weight': [D] s_d, 'update_l2': [D] ||x_d - x_ref||_2 at
    the round's end (its pseudo-gradient; x_ref = x_global unless the round's update
    goes through a lossy downlink, hfl.step.round_reference), 'drift_l2': [D] ||x_d - x_global'||_2
    from the new global model (float32 norms), 'contribution': [D]
    s_d ||Delta_d|| / sum_e s_e ||Delta_e|| (each DC's share of the weighted
    update norms; 0s when all are 0)}``.
  """
  steps = np.sum(np.asarray(actives, bool), axis=0) * np.asarray(present, bool)
  w = np.asarray(weights, np.float64)
  upd = np.asarray(m['update_l2'], np.float64)
  share = w * upd
  total = share.sum()
  return dict(round=int(rnd), samples=[int(k) * batch for k in steps],
              weight=[float(x) for x in w], update_l2=[float(x) for x in upd],
              drift_l2=[float(x) for x in m['drift_l2']],
              contribution=[float(x) for x in (share / total if total > 0 else share * 0)])


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


def _diverged(rt: Runtime, step: int, rnd: int, what: str) -> FloatingPointError:
  return FloatingPointError(f'{what} at step {step}, round {rnd}: training diverged. '
                            + divergence_advice(rt.s.config, rt.workdir, rt.mngr.latest_step()))


def _check_finite(rt: Runtime, m, at: int, step: int, rnd: int) -> None:
  """Stops the run on a non-finite train loss, gradient, payload or residual of
  iteration ``at`` (round ``rnd``, numbered from 1, ends at ``step``)."""
  where = step_lib.first_nonfinite(m['flags'], rt.leaf_names)
  where = f'the first non-finite value is the {where}' if where else ''
  if not np.all(np.isfinite(m['loss'])):
    raise _diverged(rt, step, rnd, f'the train loss is {m["loss"].tolist()} (per DC) at '
                    f'iteration {at}' + (f'; {where}' if where else ''))
  if where:
    raise _diverged(rt, step, rnd, f'at iteration {at} {where}')


def evaluate(rt: Runtime, state, ls: LoopState):
  """Evaluates the global model, writes the record: ``(loop state, record)``.

  Raises:
    FloatingPointError: the test loss is not finite (nothing is written).
  """
  acc, loss = rt.evaluate(state.global_params)
  if not np.isfinite(loss):  # nothing non-finite is written or checkpointed
    raise _diverged(rt, ls.step, ls.round, f'the test loss of the global model is {loss}')
  rec = eval_record(ls, rt.s.task, acc, loss, rt.wall_s(ls))
  rt.mw.write(rec)
  return record_eval(ls, rt.s.task, rec), rec


def _k_text(plan: schedule_lib.RoundPlan) -> str:
  """The progress line's K: one number when every DC runs K_base iterations, else
  the per-DC K_d (semi-sync) with K_base, e.g. ``'[9,7,5,4] (K_base 4)'``."""
  k_d = [int(k) for k in np.asarray(plan.k_d).reshape(-1)]
  if all(k == plan.k_base for k in k_d):
    return str(plan.k_base)
  return f'[{",".join(map(str, k_d))}] (K_base {plan.k_base})'


def _log_progress(rt: Runtime, ls: LoopState, at: int, loss: float) -> None:
  """The progress line of iteration ``at`` (``loss``: its train loss)."""
  now = time.time()
  rate = (at - rt.log_at[1]) / max(now - rt.log_at[0], 1e-9)
  first = rt.log_at[2]  # since the loop started: compilation included
  rt.log_at = (now, at, False)
  stop = rt.s.loop.stop
  if stop.governed_by == 'num_steps':
    total, eta = str(stop.num_steps), f'{(stop.num_steps - at) / max(rate, 1e-9):.0f}s'
    eta = f'<{eta} (this rate includes compiling)' if first and at < stop.num_steps else eta
  elif stop.governed_by == 'sim_time_budget_s':  # no iteration count: the budget instead
    total, eta = '?', f'at sim {stop.sim_time_budget_s:g}s'
  else:  # samples counted at each round's end
    total, eta = '?', f'at {stop.sample_budget} samples ({ls.samples} done)'
  fmt = lambda link: metrics_lib.format_bytes(_bytes(ls.bits[link]), digits=1)
  logging.info(
      'step %d/%s round %d K=%s loss %.4f %s sim %.1fs bytes intra_up %s intra_down %s '
      'inter_dc %s | %.1f steps/s ETA %s', at, total, ls.round, _k_text(ls.plan), loss,
      tasks.progress(rt.s.task, ls.last_eval), ls.clock.now, fmt('intra_up'),
      fmt('intra_down'), fmt('inter_dc'), rate, eta)


def end_round(rt: Runtime, state, ls: LoopState, loss: float) -> LoopState:
  """After a round: checks the global model, then evaluates, checkpoints and logs
  when due (``loss``: the round's last train loss, for the progress line)."""
  loop = rt.s.loop
  # Every DC restarts from the global model: checked before it is evaluated or saved.
  if not bool(distributed.to_host(rt.jitted['all_finite'](state.global_params))):
    raise _diverged(rt, ls.step, ls.round, 'the global model has non-finite parameters')
  last = loop.stop.finished(ls.step, ls.clock.now, ls.samples)
  if ls.round % loop.eval_every == 0 or last:
    ls, rec = evaluate(rt, state, ls)
    logging.info('eval step %d round %d: %s', ls.step, ls.round, ' '.join(
        f'{k} {v:.4f}' for k, v in rec.items() if k.startswith('test_')))
  if last or (loop.checkpoint_every and ls.round % loop.checkpoint_every == 0):
    ckpt_lib.save(rt.mngr, ls.step, state, to_host(ls, rt.wall_s(ls)))
  if ls.step % loop.log_every == 0 or last:
    _log_progress(rt, ls, ls.step, loss)
  return ls


# ------------------------------------------------------------------------------
# The experiment.
# ------------------------------------------------------------------------------

def _log_policies(s: Setup) -> None:
  """Logs the per-leaf compression policy of each link that compresses."""
  c = s.config.compression
  logging.info('Compression policy (uplink):\n%s', policy.describe(s.comps.up, s.params_shape))
  if c.downlink.name != 'identity' or c.small != 'float32':
    logging.info('Compression policy (downlink):\n%s',
                 policy.describe(s.comps.down, s.params_shape))
  if c.wan.name != 'identity':
    logging.info('Compression policy (inter-DC):\n%s',
                 policy.describe(s.comps.wan, s.params_shape))
  if s.stream is not None:
    logging.info('Streaming DiLoCo fragments (one syncs every %d iterations):\n%s',
                 s.config.sync.k // len(s.stream.fragments),
                 streaming.describe(s.stream.fragments, s.params_shape))


def _write_config(rt: Runtime) -> None:
  if metrics_lib.is_writer():
    metrics_lib.write_json(os.path.join(rt.workdir, 'config.json'),
                           json.loads(rt.s.config.to_json()))


def _resumed(rt: Runtime, ls: LoopState, resume: workdir_lib.Resume) -> dict | None:
  """Checks a restored run against its stopping rule (:mod:`hfl.budget`; a shorter
  ``train.num_steps`` was refused by :func:`hfl.workdir.prepare`); its summary
  when it already finished (printed again, :func:`hfl.workdir.reported_summary`),
  else None.

  Raises:
    ValueError: as :func:`hfl.workdir.reported_summary`.
  """
  if rt.s.loop.stop.finished(ls.step, ls.clock.now, ls.samples) and resume.has_summary:
    logging.info('%s already finished %d iterations; nothing to do.', rt.workdir, ls.step)
    return _reported(workdir_lib.reported_summary(rt.workdir, rt.s.task, rt.s.config))
  logging.info('Resumed from %s at step %d (round %d).', rt.workdir, ls.step, ls.round)
  if resume.changed:
    logging.info('Continuing with changed %s.', '; '.join(resume.changed))
    _write_config(rt)
  return None


def _reported(summary: dict) -> dict:
  """``summary``, a finished run's reported again: printed (process 0)."""
  if metrics_lib.is_writer():
    print_results(summary)
  return summary


def summarize(rt: Runtime, state, ls: LoopState) -> dict:
  """The summary.json of a finished run (the last evaluation's metrics; ``samples``:
  training samples processed by all DCs, :attr:`LoopState.samples`; ``stop``: what
  stopped it, :mod:`hfl.budget`; ``eval_history``: every evaluation's step, round,
  samples, simulated time and metrics, to compare runs at equal simulated time, at
  equal work or at equal iterations)."""
  records = metrics_lib.read_jsonl(rt.mw.path)
  if records:
    final = records[-1]
  else:
    ls, final = evaluate(rt, state, ls)
    records = [final]
  # The run stops here: it waits for its last overlapped transfer (evaluations are
  # stamped, as every round's, with the clock the run goes on with).
  ls = stopped(ls)
  return dict(
      **tasks.summary_fields(rt.s.task, final, ls._asdict()),
      inter_dc_rounds=ls.round, intra_dc_iterations=ls.step, samples=ls.samples,
      bytes=byte_totals(ls.bits),
      sim_time_s=ls.clock.now, idle_s=[float(x) for x in ls.clock.idle_s],
      wall_time_s=rt.wall_s(ls), **metrics_lib.to_target(rt.s.task, records),
      step_wall_s=wall_stats(rt.timer.step_wall),
      stop=rt.s.loop.stop.to_json(), eval_history=eval_history(records),
      **wan_summary(rt.s, ls), config=json.loads(rt.s.config.to_json()),
      **({'changed_on_resume': list(ls.resumed_changes)} if ls.resumed_changes else {}),
      provenance=list(ls.provenance))


def wan_summary(s: Setup, ls: LoopState) -> dict:
  """The summary's WAN exposure fields (Streaming DiLoCo's comparison; every run).

  ``exposed_wan_s``: simulated seconds of round communication (WAN + the round's
  LAN delivery) not hidden behind compute; ``compute_s``: the slowest DC's
  compute, iterations x ``network.compute_time_s`` / speed; ``compute_utilisation``
  = compute_s / sim_time_s; ``peak_wan_bytes_per_sync``: the most bytes one sync
  event (round) put on the WAN; ``wan_mbps_for_95pct_utilisation``: per-DC WAN
  bandwidth (Mbit/s) at which the model's steady state spends at least 95% of
  its wall time outside WAN stalls (:func:`hfl.network.wan_bandwidth_for_utilisation`
  with the largest per-DC event, iterations per event = iterations / rounds, an
  iteration's time t = (sim_time_s - exposed_wan_s) / iterations counted whole
  as busy time (the LAN is not the WAN's to hide) and τ = ``sync.overlap_steps``;
  null when no bandwidth suffices, e.g. the latency alone stalls more, or no
  round ran); ``wan_mbps_for_95pct_without_latency``: the same with the WAN
  latency taken as 0 (the bandwidth term alone). :func:`hfl.bandwidth.planned_event`
  derives both from the config alone (tests/test_bandwidth.py).
  """
  wan = ls.wan or dict(exposed_s=0.0, peak_bits=0, peak_dc_bits=0)
  compute = ls.step * float(np.max(s.net.compute_s))
  now = ls.clock.now
  need = {}
  if ls.round and ls.step:
    t = (now - wan['exposed_s']) / ls.step
    for name, latency in (('', s.net.wan_latencies_per_round * s.net.wan_latency_s),
                          ('_without_latency', 0.0)):
      b = network.wan_bandwidth_for_utilisation(
          wan['peak_dc_bits'], ls.step / ls.round, t, t,
          int(s.config.sync.get('overlap_steps', 0)), latency)
      need[name] = b / 1e6 if np.isfinite(b) else None
  return dict(exposed_wan_s=wan['exposed_s'], compute_s=compute,
              compute_utilisation=compute / now if now > 0 else None,
              peak_wan_bytes_per_sync=_bytes(wan['peak_bits']),
              wan_mbps_for_95pct_utilisation=need.get(''),
              wan_mbps_for_95pct_without_latency=need.get('_without_latency'))


HISTORY_KEYS = ('step', 'round', 'samples', 'sim_time_s', 'test_accuracy', 'test_loss')


def eval_history(records) -> list[dict]:
  """summary.json's ``eval_history``: per evaluation of metrics.jsonl, its
  ``step`` (iterations of the fastest DC), ``round``, ``samples`` (processed by all
  DCs; null in records older than the field), ``sim_time_s`` (simulated seconds),
  ``test_accuracy`` and ``test_loss`` (nats)."""
  return [{k: r.get(k) for k in HISTORY_KEYS} for r in records]


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Runs (or resumes) one experiment and returns its summary.

  Args:
    config: the experiment config (see configs/default.py).
    workdir: output directory; an existing run there is resumed from its newest
      checkpoint that restores (the config must match, except
      hfl.workdir.RESUMABLE_FIELDS;
      unusable newer step directories are moved aside, hfl.checkpoint).

  Returns:
    The summary dict (:mod:`hfl.metrics`), also written to WORKDIR/summary.json.

  Raises:
    ValueError / FileNotFoundError: bad config or data, before anything is compiled
      or written.
    FloatingPointError: the train loss became NaN or infinite.
    hfl.checkpoint.UnrestorableError (a ValueError): no checkpoint in the workdir
      restores and one looks committed; nothing is moved.
    hfl.workdir.WorkdirInUseError (a ValueError): another run holds the workdir
      (:func:`hfl.workdir.workdir_lock`); nothing there is read or written.
    hfl.metrics.WriteError (an OSError): a file of the run could not be written
      (e.g. no space left on device): a checkpoint (hfl.checkpoint.save),
      metrics.jsonl, summary.json or config.json; what was written before stays whole.
  """
  # The lock asks for the process index, which starts JAX's backend: a backend
  # that cannot start (a bad JAX_PLATFORMS) is explained here first.
  mesh_lib.global_devices()
  with workdir_lib.workdir_lock(workdir):
    return _train_and_evaluate(config, workdir)


def _train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """:func:`train_and_evaluate` while the workdir is held."""
  wall0 = time.time()
  s = setup(config)
  resume = workdir_lib.prepare(workdir, config)
  _log_policies(s)
  rt = make_runtime(s, workdir, wall0)
  state, ls, restored = restore_or_init(rt)
  if not restored and resume.has_summary:
    return _reported(workdir_lib.finished_without_checkpoint(workdir, s.task.metric,
                                                             s.loop.stop))
  if not restored or not resume.has_config:
    _write_config(rt)  # on resume: restored from summary.json's copy, checked above
  else:
    summary = _resumed(rt, ls, resume)
    if summary is not None:
      return summary
    workdir_lib.check_metrics_log(workdir, ls)
    if resume.changed:
      ls = ls._replace(resumed_changes=ls.resumed_changes + (
          dict(at_iteration=ls.step, changes=list(resume.changed)),))
  ls = ls._replace(provenance=ls.provenance + (provenance.collect(ls.step),))
  rt.mw = metrics_lib.MetricsWriter(workdir, resume_step=ls.step)
  rt.log_at = (time.time(), ls.step, True)
  while not s.loop.stop.finished(ls.step, ls.clock.now, ls.samples):
    state, pending, weights, present = run_round(rt, state, ls)
    ls, loss = account(rt, ls, pending, weights, present)
    ls = end_round(rt, state, ls, loss)
  for o in faults.unreached(config.sync.faults, s.num_dcs, ls.round):
    logging.warning('sync.faults: DC %d was to be absent in round %s, but the run ended '
                    'after %d rounds (rounds 1-%d): that outage did not (fully) happen.',
                    o.dc, o.first if o.first == o.last else f'{o.first}-{o.last}',
                    ls.round, ls.round)
  summary = summarize(rt, state, ls)
  rt.mw.close()
  rt.mngr.close()
  if metrics_lib.is_writer():
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
  fmt = lambda n: metrics_lib.format_bytes(n, digits=1)
  metric_rows, target = tasks.result_rows(summary)
  rows = metric_rows + [
      ('inter-DC rounds', str(summary['inter_dc_rounds'])),
      ('intra-DC iterations', str(summary['intra_dc_iterations'])),
      ('bytes intra-DC up', fmt(b['intra_up'])),
      ('bytes intra-DC down', fmt(b['intra_down'])),
      ('bytes inter-DC', fmt(b['inter_dc'])),
      ('simulated time', f'{summary["sim_time_s"]:.1f} s'),
      ('wall time', f'{summary["wall_time_s"]:.1f} s'),
      (f'time to {target}',
       'never' if summary['time_to_target_s'] is None else f'{summary["time_to_target_s"]:.1f} s'),
      (f'rounds to {target}',
       'never' if summary['rounds_to_target'] is None else f'{summary["rounds_to_target"]:.1f}'),
  ]
  stop = summary.get('stop') or {}
  if stop.get('governed_by') == 'sim_time_budget_s':
    rows.insert(len(metric_rows), ('stopped at', f'simulated-time budget '
                                   f'{stop["sim_time_budget_s"]:g} s (train.sim_time_budget_s)'))
  elif stop.get('governed_by') == 'sample_budget':
    rows.insert(len(metric_rows), ('stopped at', f'sample budget {stop["sample_budget"]} '
                                   f'(train.sample_budget; {summary.get("samples")} '
                                   'processed)'))
  width = max(len(r[0]) for r in rows)
  print('\n'.join(f'{k:<{width}}  {v}' for k, v in rows), flush=True)
