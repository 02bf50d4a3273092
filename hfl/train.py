"""The training loop: rounds, evaluation, checkpoints, the summary.

``train_and_evaluate(config, workdir)`` runs one experiment end to end and returns
its summary (the dict written to WORKDIR/summary.json, :mod:`hfl.metrics`).

The loop follows the layout of flax's ``examples/imagenet/train.py``: the config
is validated and resolved once into a frozen :class:`hfl.setup.Setup` (data, mesh,
model, compressors of every DGC warm-up stage, the K schedule, the loop's own
fields); the workdir is checked (:func:`hfl.workdir.prepare`: fresh, resumed,
finished or refused); the host-side loop state is a :class:`hfl.cost.LoopState`
NamedTuple updated by small pure functions (:func:`hfl.cost.account_iteration`,
:func:`hfl.cost.account_round`, :func:`record_eval`); the device work is the
jitted step of :func:`hfl.step.make_step`. A checkpoint holds the TrainState and
``hfl.cost.to_host(LoopState)`` (JSON); :func:`hfl.cost.from_host` reads it back,
also from workdirs written by older versions. Progress lines and divergence
messages are :mod:`hfl.diagnostics`'; the summary is :func:`hfl.cost.summary`.
"""

import dataclasses
import json
import os
import time
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from jax.sharding import NamedSharding, PartitionSpec as P

from hfl import checkpoint as ckpt_lib
from hfl import cost
from hfl import data as data_lib
from hfl import diagnostics
from hfl import distributed
from hfl import inflight
from hfl import mesh as mesh_lib
from hfl import metrics as metrics_lib
from hfl import provenance
from hfl import setup as setup_lib
from hfl import step as step_lib
from hfl import tasks
from hfl import workdir as workdir_lib
from hfl.compress import policy
from hfl.sync import aggregation, faults
from hfl.sync import strategies


# ------------------------------------------------------------------------------
# Evaluation.
# ------------------------------------------------------------------------------

def eval_record(ls: cost.LoopState, task: tasks.Task, accuracy: float, loss: float,
                wall_time_s: float) -> dict:
  """The metrics.jsonl record of an evaluation of the global model at ``ls``."""
  return dict(step=ls.step, round=ls.round, samples=ls.samples,
              **tasks.eval_record(task, accuracy, loss),
              train_loss=(float(np.mean(ls.since_eval.round_loss))
                          if ls.since_eval.round_loss else None),
              bytes=cost.byte_totals(ls.bits), sim_time_s=ls.clock.now,
              wall_time_s=wall_time_s,
              k=int(ls.plan.k_base), k_d=[int(k) for k in ls.plan.k_d],
              idle_s=[float(x) for x in ls.clock.idle_s],
              dc_rounds=list(ls.since_eval.dc_rounds))


def record_eval(ls: cost.LoopState, task: tasks.Task,
                rec: Mapping[str, Any]) -> cost.LoopState:
  """The loop state after evaluation ``rec``: best values, the first crossing of
  the target (interpolated from the previous evaluation), a new round-loss window."""
  acc, loss = rec['test_accuracy'], rec['test_loss']
  ev = ls.evals
  best_acc, best_loss = ev.best_test_accuracy, ev.best_test_loss
  ttt, rtt = ev.time_to_target_s, ev.rounds_to_target
  if ttt is None and task.reached(rec[task.metric]):
    cross = lambda key: metrics_lib.crossing(ev.last_eval, rec, task.target, key,
                                             task.metric, task.higher_is_better)
    ttt, rtt = cross('sim_time_s'), cross('round')
  return ls._replace(since_eval=cost.SinceEval(), evals=cost.Evaluations(
      best_test_accuracy=acc if best_acc is None or acc > best_acc else best_acc,
      best_test_loss=loss if best_loss is None or loss < best_loss else best_loss,
      time_to_target_s=ttt, rounds_to_target=rtt,
      last_eval={k: rec[k] for k in (task.metric, 'sim_time_s', 'round')}))


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


class Programs(NamedTuple):
  """The loop's device programs (each compiled on its first call)."""
  init_fn: Callable       # () -> TrainState
  make_step: Callable     # Compressors -> step function
  step_fns: dict          # warm-up stage (None: the configured compressors) -> step
  evaluate: Callable      # global params -> (accuracy, loss)
  jitted: dict            # round_start, discard_absent, all_finite


@dataclasses.dataclass
class Runtime:
  """What the loop uses besides its state."""
  s: setup_lib.Setup
  workdir: str
  wall0: float            # time.time() when this session started
  state_shape: Any        # TrainState of jax.ShapeDtypeStruct
  shardings: Any          # TrainState of NamedSharding
  programs: Programs
  mngr: Any               # orbax CheckpointManager
  leaf_names: list
  timer: StepTimer
  mw: Any = None          # metrics_lib.MetricsWriter, once the start step is known
  log_at: tuple = (0.0, 0, True)  # (time, step, first?) of the last progress line
  window: Any = None      # inflight.Window: the steps in flight, timed into ``timer``

  def wall_s(self, ls: cost.LoopState) -> float:
    """The run's wall-clock so far (earlier sessions included), seconds."""
    return ls.run.wall_time_s + time.time() - self.wall0

  def put(self, x, spec=P()):
    return distributed.put_global(x, NamedSharding(self.s.place.mesh, spec))


def _init_fn(s: setup_lib.Setup) -> Callable:
  """``() -> TrainState``: the model's initial parameters and every state around them."""
  key = jax.random.PRNGKey(s.loop.seed)
  sample = setup_lib.sample_input(s.data.dataset)

  def init():
    params = s.model.init(key, sample)['params']
    return step_lib.init_state(params, s.optim.optimizer, s.optim.outer, s.compress.comps,
                               s.place.num_dcs, s.place.workers_per_dc,
                               jax.random.fold_in(key, 1),
                               dgc_momentum=s.compress.dgc.momentum > 0,
                               shard_state=s.optim.shard_state, stream=s.sync.stream,
                               broadcast=s.compress.broadcast, send=s.compress.send,
                               scaffold=s.sync.scaffold is not None)
  return init


def make_runtime(s: setup_lib.Setup, workdir: str, wall0: float) -> Runtime:
  """Builds the step of the configured compressors (compiled on its first call),
  the evaluation, and the checkpoint manager, in ``workdir`` (which
  :func:`hfl.workdir.workdir_lock` created on process 0).
  """
  apply_fn = lambda p, x: s.model.apply({'params': p}, x)
  init_fn = _init_fn(s)
  state_shape = jax.eval_shape(init_fn)
  make = lambda comps: step_lib.make_step(apply_fn, s.optim.optimizer, s.optim.outer, comps,
                                          s.place.mesh, state_shape, s.compress.dgc,
                                          prox_mu=s.loop.prox_mu, stream=s.sync.stream,
                                          mode=s.place.mode,
                                          shape=(s.place.num_dcs, s.place.workers_per_dc),
                                          scaffold=s.sync.scaffold, adoption=s.sync.partial)
  step_fns = {None: make(s.compress.comps)}
  evaluate = make_eval(s.model, s.place.mesh, s.data.dataset.test_images,
                       s.data.dataset.test_labels, s.loop.eval_batch_size)
  shardings = step_lib.state_shardings(s.place.mesh, state_shape)
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
  window = inflight.Window(inflight.depth(jax.default_backend(), s.place.mode,
                                          s.place.mesh.size), timer.iteration)
  return Runtime(s=s, workdir=workdir, wall0=wall0, state_shape=state_shape,
                 shardings=shardings,
                 programs=Programs(init_fn=init_fn, make_step=make, step_fns=step_fns,
                                   evaluate=evaluate, jitted=jitted),
                 mngr=ckpt_lib.manager(workdir), leaf_names=leaf_names, timer=timer,
                 window=window)


def _step_fn(rt: Runtime, stage: int | None, step: int) -> Callable:
  """The step of a warm-up stage, built (from its precomputed compressors) when the
  stage is first reached."""
  if stage not in rt.programs.step_fns:
    comps = rt.s.compress.warmup.comps[stage]
    logging.info('DGC warm-up stage %d from step %d, uplink policy:\n%s', stage, step,
                 policy.describe(comps.up, rt.s.params_shape))
    rt.programs.step_fns[stage] = rt.programs.make_step(comps)
  return rt.programs.step_fns[stage]


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
    state = jax.jit(rt.programs.init_fn, out_shardings=rt.shardings)()
    return state, cost.new_loop_state(rt.s.sync.schedule, rt.s.place.num_dcs), False
  _, state, host = restored
  ls = cost.from_host(host, rt.s.sync.schedule)
  if ls.samples is None:  # a checkpoint older than the count
    ls = ls._replace(samples=workdir_lib.samples_from_log(
        metrics_lib.read_jsonl(os.path.join(rt.workdir, 'metrics.jsonl')), ls))
  if rt.s.loop.stop.governed_by == 'sample_budget':  # the budget the run was trained to
    old = workdir_lib.upgrade_config(workdir_lib.stored_config(rt.workdir) or {})
    workdir_lib.check_resumed_samples(rt.s.loop.stop, ls,
                                      old.get('train', {}).get('sample_budget', 0), rt.workdir)
  if not rt.s.loop.stop.finished(ls.step, ls.clock.now, ls.samples):
    workdir_lib.check_fault_rounds(rt.s.sync.faults, host, rt.workdir)
  return state, ls, True


# ------------------------------------------------------------------------------
# One round: its iterations on the devices, then their accounting on the host.
# ------------------------------------------------------------------------------

def _round_weights(s: setup_lib.Setup, plan, it: int, active, present) -> np.ndarray:
  """float32 [D]: the round's aggregation scales (:mod:`hfl.sync.aggregation`) of
  the present DCs, with the local steps each ran (``it + 1`` iterations so far)."""
  local = np.where(active, np.minimum(plan.k_d, it + 1), plan.k_d)
  p = aggregation.fedavg_weights(s.data.dc_weights, present)
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
  idx = data_lib.batch_indices(s.data.partition, loop.batch_size, step, loop.seed)
  # Each process gathers only the rows of its own (dc, worker) devices.
  batch_sh = NamedSharding(s.place.mesh, P(mesh_lib.DC, mesh_lib.WORKER))
  batch = tuple(distributed.put_rows(src, rows, batch_sh) for src, rows in data_lib.batch_rows(
      s.data.dataset, idx, step, loop.seed, loop.augment))
  stage = s.compress.warmup.stage(step)
  t_start = time.perf_counter()
  step_fn = _step_fn(rt, stage, step)
  # With learning-rate scaling, ``active`` carries each DC's multiplier (0: inactive).
  act = active if lr_scale is None else np.where(active, lr_scale, 0.0).astype(np.float32)
  state, m = step_fn(state, batch, rt.put(act, P(mesh_lib.DC)), rt.put(weights), do_round)
  rt.window.push(m, (stage, step_lib.syncs(do_round), do_round), t_start)  # waits if full
  return state, m, step_fn.info[step_lib.program_key(do_round)]


class Round(NamedTuple):
  """A round's iterations, run, as the host accounts them (:func:`account`).

  Attributes:
    pending: (device metrics, active bool [D], ProgramInfo) per iteration.
    weights: float32 [D], the aggregation scales (0: not exchanging).
    up: bool [D], the DCs not down by ``sync.faults`` (their round's work is kept).
    present: bool [D], the DCs that exchanged (up and taking part by the plan).
    adopt: float32 [D], each DC's adoption of the new global model (1 for a DC out
      by ``sync.faults``: its work is discarded).
    waits: bool [D], the DCs that wait for the round's result (:func:`hfl.network.advance_round`).
  Masks from :func:`hfl.sync.strategies.round_masks`.
  """
  pending: list
  weights: np.ndarray
  up: np.ndarray
  present: np.ndarray
  adopt: np.ndarray
  waits: np.ndarray


def run_round(rt: Runtime, state, ls: cost.LoopState):
  """Runs one round's iterations (K_d per DC; with ``train.num_steps`` governing, at
  most ``num_steps`` in all; with a time or sample budget, always the whole round).

  The metrics stay on the devices until the round ends: with DCs on different
  hosts, fetching every DC's metrics is an inter-DC collective, which local
  iterations must not pay.

  Returns:
    ``(state, Round)``.
  """
  s, plan = rt.s, ls.plan
  kmax = int(np.max(plan.k_d))
  if s.sync.stream is not None:  # one fragment's sync event every K / P iterations
    kmax = s.sync.stream.k // len(s.sync.stream.fragments)
  up = s.sync.present_fn(ls.round + 1)  # this round's number (hfl.sync.faults)
  present, adopt, waits = strategies.round_masks(plan, up)
  start = None if np.all(up) else rt.programs.jitted['round_start'](state)
  pending = []
  weights = np.zeros((2,) * s.sync.partial + (s.place.num_dcs,), np.float32)
  lr_scale = (None if s.loop.lr_scaling == 'none'
              else round_lr_scale(s.loop.lr_scaling, plan.k_d))
  cap = s.loop.stop.step_cap()
  for it in range(kmax):
    active = it < plan.k_d
    do_round = it + 1 >= kmax or ls.step + it + 1 == cap
    if do_round:
      weights = _round_weights(s, plan, it, active, present)
      if s.sync.partial:  # the step's round argument: weights and adoption (hfl.step)
        weights = np.stack([weights, adopt])
    key = s.sync.stream.event(ls.step + it + 1) if s.sync.stream is not None else do_round
    state, m, info = _run_iteration(rt, state, ls.step + it, active, weights, key, lr_scale)
    pending.append((m, active, info))
    if do_round:
      break
  if start is not None:
    state = rt.programs.jitted['discard_absent'](state, start, rt.put(up))
  rt.window.drain()  # every step timed before the round's metrics are gathered
  weights = weights[0] if s.sync.partial else weights
  return state, Round(pending, weights, up, present, adopt, waits)


def account(rt: Runtime, ls: cost.LoopState, rnd: Round):
  """Gathers a round's metrics (one inter-DC transfer) and charges its iterations
  and its inter-DC exchange to ``ls``; checks every value was finite.

  Returns:
    ``(loop state after the round, the last iteration's weighted train loss)``.
  """
  s, pending, weights = rt.s, rnd.pending, rnd.weights
  round_ms = distributed.to_host_stacked([pm for pm, _, _ in pending])
  rt.timer.round_gathered()
  first, end = ls.step + 1, ls.step + len(pending)
  losses = []
  for at, raw, (_, act, info) in zip(range(first, end + 1), round_ms, pending):
    # ``at``: this iteration's step number (1-based).
    m = step_lib.host_metrics(info, raw, act, weights if info.do_round else None,
                              rnd.adopt if info.do_round else None)
    diagnostics.check_finite(rt, m, at, end, ls.round + 1)
    ls = cost.account_iteration(ls, s.net, m, act)
    losses.append(float(np.dot(s.data.dc_weights, m['loss'])))
    if at < end and at % s.loop.log_every == 0:
      diagnostics.log_progress(rt, ls, at, losses[-1])
  round_loss = sum(losses) / len(losses)
  # The exchange overlaps the next τ iterations; a run that stops after this round
  # waits for all of it (``at_stop``: the summary's, hfl.cost.stopped).
  tau = s.sync.stream.overlap_steps if s.sync.stream is not None else 0
  ls = cost.account_round(ls, s.net, s.sync.schedule, m, rnd.present, len(pending),
                          round_loss, tau, rnd.waits)
  diag = cost.round_diagnostics(ls.round, [act for _, act, _ in pending], rnd.up,
                           s.place.workers_per_dc * s.loop.batch_size, weights, m)
  diag['train_loss'] = round_loss  # what the K schedule saw (hfl.sync.schedule)
  return ls._replace(since_eval=ls.since_eval._replace(
      dc_rounds=ls.since_eval.dc_rounds + (diag,)),
                     samples=cost.add_samples(ls.samples, diag['samples'])), losses[-1]


def evaluate(rt: Runtime, state, ls: cost.LoopState):
  """Evaluates the global model, writes the record: ``(loop state, record)``.

  Raises:
    FloatingPointError: the test loss is not finite (nothing is written).
  """
  acc, loss = rt.programs.evaluate(state.global_params)
  if not np.isfinite(loss):  # nothing non-finite is written or checkpointed
    raise diagnostics.diverged(rt, ls.step, ls.round,
                               f'the test loss of the global model is {loss}')
  rec = eval_record(ls, rt.s.task, acc, loss, rt.wall_s(ls))
  rt.mw.write(rec)
  return record_eval(ls, rt.s.task, rec), rec


def end_round(rt: Runtime, state, ls: cost.LoopState, loss: float) -> cost.LoopState:
  """After a round: checks the global model, then evaluates, checkpoints and logs
  when due (``loss``: the round's last train loss, for the progress line)."""
  loop = rt.s.loop
  # Every DC restarts from the global model: checked before it is evaluated or saved.
  if not bool(distributed.to_host(rt.programs.jitted['all_finite'](state.global_params))):
    raise diagnostics.diverged(rt, ls.step, ls.round, 'the global model has non-finite parameters')
  last = loop.stop.finished(ls.step, ls.clock.now, ls.samples)
  if ls.round % loop.eval_every == 0 or last:
    ls, rec = evaluate(rt, state, ls)
    logging.info('eval step %d round %d: %s', ls.step, ls.round, ' '.join(
        f'{k} {v:.4f}' for k, v in rec.items() if k.startswith('test_')))
  if last or (loop.checkpoint_every and ls.round % loop.checkpoint_every == 0):
    ckpt_lib.save(rt.mngr, ls.step, state, cost.to_host(ls, rt.wall_s(ls)))
  if ls.step % loop.log_every == 0 or last:
    diagnostics.log_progress(rt, ls, ls.step, loss)
  return ls


# ------------------------------------------------------------------------------
# The experiment.
# ------------------------------------------------------------------------------

def _write_config(rt: Runtime) -> None:
  if metrics_lib.is_writer():
    metrics_lib.write_json(os.path.join(rt.workdir, 'config.json'),
                           json.loads(rt.s.config.to_json()))


def _resumed(rt: Runtime, ls: cost.LoopState, resume: workdir_lib.Resume) -> dict | None:
  """Checks a restored run against its stopping rule (:mod:`hfl.budget`; a shorter
  ``train.num_steps`` was refused by :func:`hfl.workdir.prepare`); its summary
  when it already finished (printed again, :func:`hfl.workdir.reported_summary`),
  else None.

  Raises:
    ValueError: as :func:`hfl.workdir.reported_summary`.
  """
  if rt.s.loop.stop.finished(ls.step, ls.clock.now, ls.samples) and resume.has_summary:
    logging.info('%s already finished %d iterations; nothing to do.', rt.workdir, ls.step)
    return _reported(workdir_lib.reported_summary(rt.workdir, rt.s.task, rt.s.config),
                     rt.workdir)
  logging.info('Resumed from %s at step %d (round %d).', rt.workdir, ls.step, ls.round)
  if resume.changed:
    logging.info('Continuing with changed %s.', '; '.join(resume.changed))
    _write_config(rt)
  return None


def _reported(summary: dict, workdir: str) -> dict:
  """``summary``, a finished run's reported again: printed (process 0)."""
  if metrics_lib.is_writer():
    cost.print_results(summary, workdir)
  return summary


def summarize(rt: Runtime, state, ls: cost.LoopState) -> dict:
  """The summary.json of a finished run (:func:`hfl.cost.summary`), after one last
  evaluation if the run has none."""
  records = metrics_lib.read_jsonl(rt.mw.path)
  if not records:
    ls, final = evaluate(rt, state, ls)
    records = [final]
  return cost.summary(rt.s, ls, records, rt.wall_s(ls), rt.timer.step_wall)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Runs (or resumes) one experiment and returns its summary.

  Args:
    config: the experiment config (see configs/default.py).
    workdir: output directory; an existing run there is resumed from its newest
      checkpoint that restores (the config must match, except
      hfl.workdir.RESUMABLE_FIELDS; unusable newer step directories are moved
      aside, hfl.checkpoint).

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
  s = setup_lib.setup(config)
  resume = workdir_lib.prepare(workdir, config)
  setup_lib.log_policies(s)
  rt = make_runtime(s, workdir, wall0)
  state, ls, restored = restore_or_init(rt)
  if not restored and resume.has_summary:
    return _reported(workdir_lib.finished_without_checkpoint(workdir, s.task.metric,
                                                             s.loop.stop), workdir)
  if not restored or not resume.has_config:
    _write_config(rt)  # on resume: restored from summary.json's copy, checked above
  else:
    summary = _resumed(rt, ls, resume)
    if summary is not None:
      return summary
    workdir_lib.check_metrics_log(workdir, ls)
    if resume.changed:
      ls = ls._replace(run=ls.run._replace(resumed_changes=ls.run.resumed_changes + (
          dict(at_iteration=ls.step, changes=list(resume.changed)),)))
  ls = ls._replace(run=ls.run._replace(
      provenance=ls.run.provenance + (provenance.collect(ls.step),)))
  rt.mw = metrics_lib.MetricsWriter(workdir, resume_step=ls.step)
  rt.log_at = (time.time(), ls.step, True)
  while not s.loop.stop.finished(ls.step, ls.clock.now, ls.samples):
    state, rnd = run_round(rt, state, ls)
    ls, loss = account(rt, ls, rnd)
    ls = end_round(rt, state, ls, loss)
  for o in faults.unreached(s.sync.faults, s.place.num_dcs, ls.round):
    logging.warning('sync.faults: DC %d was to be absent in round %s, but the run ended '
                    'after %d rounds (rounds 1-%d): that outage did not (fully) happen.',
                    o.dc, o.first if o.first == o.last else f'{o.first}-{o.last}',
                    ls.round, ls.round)
  summary = summarize(rt, state, ls)
  rt.mw.close()
  rt.mngr.close()
  if metrics_lib.is_writer():
    metrics_lib.write_json(os.path.join(workdir, 'summary.json'), summary)
    cost.print_results(summary, workdir)
  return summary


