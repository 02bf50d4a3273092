"""What a run costs, charged in one place: bits per link and the simulated clock.

The step (hfl.step) counts the bits of every payload it sends (``host_metrics``:
``up_bits``, ``down_bits``, ``wan_bits``, ``round_down_bits``, int64 per DC; what
they hold: :mod:`hfl.accounting`); this module charges them, as exact integers,
to the links of :data:`LINKS` and, through the network model (:mod:`hfl.network`),
to the simulated clock: :func:`account_iteration` per intra-DC iteration,
:func:`account_round` per inter-DC round (with the WAN exposure and peaks,
:func:`account_wan`, and Streaming DiLoCo's overlapped transfer, :class:`AtStop`).

Both ride in the host loop's state, :class:`LoopState` (checkpointed as JSON:
:func:`to_host`, :func:`from_host`, which also reads checkpoints of older
versions), with the samples processed (:func:`add_samples`) and each round's
per-DC diagnostics (:func:`round_diagnostics`). At the end they become the
summary (:func:`summary`: bytes per link, simulated time, the WAN fields of
:func:`wan_summary`, the measured step times of :func:`wall_stats`), printed by
:func:`print_results`.
"""

import json
import os
from typing import Any, Mapping, NamedTuple

import numpy as np

from hfl import metrics as metrics_lib
from hfl import network
from hfl import tasks
from hfl import workdir as workdir_lib
from hfl.sync import schedule as schedule_lib

LINKS = metrics_lib.LINKS  # ('intra_up', 'intra_down', 'inter_dc')


def to_bytes(bits: int):
  """Bytes of an exact bit count: an int when whole, else a float."""
  return bits // 8 if bits % 8 == 0 else bits / 8


def byte_totals(bits: Mapping[str, int]) -> dict:
  """Bytes per link (an int when whole, else a float) of exact bit totals."""
  return {link: to_bytes(b) for link, b in bits.items()}


def _add_bits(bits: Mapping[str, int], **more) -> dict:
  return {link: b + int(more.get(link, 0)) for link, b in bits.items()}


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


class Evaluations(NamedTuple):
  """The run's evaluations so far (part of :class:`LoopState`).

  Attributes:
    best_test_accuracy, best_test_loss: best evaluations so far (None: none yet).
    time_to_target_s, rounds_to_target: where the headline metric first reached
      its target (:func:`hfl.metrics.crossing`), None until it has.
    last_eval: the last evaluation's headline metric, ``sim_time_s`` and ``round``.
  """
  best_test_accuracy: float | None = None
  best_test_loss: float | None = None
  time_to_target_s: float | None = None
  rounds_to_target: float | None = None
  last_eval: Mapping[str, Any] | None = None


class SinceEval(NamedTuple):
  """The rounds since the last evaluation (part of :class:`LoopState`; the next
  evaluation record reports them and starts a new window).

  Attributes:
    round_loss: mean train loss of each round.
    dc_rounds: per-DC diagnostics of each round (:func:`round_diagnostics`).
  """
  round_loss: tuple[float, ...] = ()
  dc_rounds: tuple[dict, ...] = ()


class RunRecord(NamedTuple):
  """Where and how the run trained (part of :class:`LoopState`).

  Attributes:
    wall_time_s: wall-clock seconds spent by earlier sessions of the run.
    resumed_changes: each resumption with a changed config,
      ``{'at_iteration': int, 'changes': ['train.num_steps: 10 -> 20', ...]}``
      (:func:`hfl.workdir.check_workdir_config`): the summary's
      ``changed_on_resume``; such a run's results may differ from a fresh run of its
      final config.
    provenance: one :func:`hfl.provenance.collect` entry per start of the run that
      trained (fresh or resumed), oldest first: the summary's ``provenance``.
  """
  wall_time_s: float = 0.0
  resumed_changes: tuple[dict, ...] = ()
  provenance: tuple[dict, ...] = ()


class LoopState(NamedTuple):
  """What the host loop carries from round to round (checkpointed as JSON,
  :func:`to_host`, whose flat layout the sub-records do not change).

  Attributes:
    step: intra-DC iterations done.
    round: inter-DC rounds done.
    clock: the simulated clock (:class:`hfl.network.Clock`, seconds per DC).
    bits: exact bit totals per link of :data:`LINKS` (Python ints).
    schedule: the K schedule's state.
    plan: the plan of the next round (``schedule.plan(schedule)`` when restored).
    samples: training samples processed so far, summed over the DCs and rounds
      (each round's ``dc_rounds[*].samples``, :func:`round_diagnostics`: K_d x W x B
      per DC not down by ``sync.faults``); what ``train.sample_budget`` stops. None:
      unknown (a checkpoint written before it existed whose metrics.jsonl cannot give
      it, :func:`hfl.workdir.samples_from_log`).
    wan: the WAN exposure and peaks so far (:func:`account_wan`); None before
      the first round (and in checkpoints written before it existed: a run
      resumed from one counts them from the resumption on).
    at_stop: the accounting of the run if it stops after the last round
      (:class:`AtStop`; None: the loop state's own, nothing in flight). Only the
      summary reads it (:func:`stopped`), so a run extended past its old end goes on
      from the same clock as a fresh run (checkpoints written before it existed
      hold the old end's transfer charged in full).
    evals: :class:`Evaluations`.
    since_eval: :class:`SinceEval`.
    run: :class:`RunRecord`.
  """
  step: int
  round: int
  clock: network.Clock
  bits: Mapping[str, int]
  schedule: schedule_lib.ScheduleState
  plan: schedule_lib.RoundPlan
  samples: int | None = 0
  wan: Mapping[str, Any] | None = None
  at_stop: AtStop | None = None
  evals: Evaluations = Evaluations()
  since_eval: SinceEval = SinceEval()
  run: RunRecord = RunRecord()


def new_loop_state(schedule: schedule_lib.Schedule, num_dcs: int) -> LoopState:
  """The loop state of a run that has not started."""
  sched = schedule.init()
  return LoopState(step=0, round=0, clock=network.new_clock(num_dcs),
                   bits={link: 0 for link in LINKS}, schedule=sched, plan=schedule.plan(sched))


def to_host(ls: LoopState, wall_time_s: float) -> dict:
  """``ls`` as the JSON-able dict a checkpoint holds (``wall_time_s``: the run's
  wall-clock so far, seconds)."""
  return dict(fault_rounds_from=workdir_lib.FAULT_ROUNDS_FROM, step=ls.step, round=ls.round,
              clock_s=ls.clock.time_s.tolist(), idle_s=ls.clock.idle_s.tolist(),
              bytes=byte_totals(ls.bits), bits=dict(ls.bits),
              schedule=schedule_lib.state_to_json(ls.schedule),
              **ls.evals._asdict(), wall_time_s=wall_time_s,
              round_loss=list(ls.since_eval.round_loss),
              dc_rounds=list(ls.since_eval.dc_rounds), wan=ls.wan,
              resumed_changes=list(ls.run.resumed_changes),
              at_stop=None if ls.at_stop is None else dict(
                  clock_s=ls.at_stop.clock.time_s.tolist(),
                  idle_s=ls.at_stop.clock.idle_s.tolist(), exposed_s=ls.at_stop.exposed_s),
              provenance=list(ls.run.provenance), samples=ls.samples)


def from_host(host: Mapping[str, Any], schedule: schedule_lib.Schedule) -> LoopState:
  """Inverse of :func:`to_host`, also for checkpoints of older versions: those
  without ``bits`` (exact totals are derived from ``bytes``), ``best_test_loss`` or
  ``samples`` (None: hfl.train.restore_or_init derives it from metrics.jsonl)."""
  bits = ({k: int(v) for k, v in host['bits'].items()} if 'bits' in host else
          {k: int(round(float(v) * 8)) for k, v in host['bytes'].items()})
  sched = schedule_lib.state_from_json(host['schedule'])
  return LoopState(
      step=int(host['step']), round=int(host['round']),
      clock=network.Clock(np.asarray(host['clock_s']), np.asarray(host['idle_s'])),
      bits=bits, schedule=sched, plan=schedule.plan(sched),
      samples=None if host.get('samples') is None else int(host['samples']),
      wan=host.get('wan'), at_stop=_at_stop(host.get('at_stop')),
      evals=Evaluations(
          best_test_accuracy=host['best_test_accuracy'],
          best_test_loss=host.get('best_test_loss'), time_to_target_s=host['time_to_target_s'],
          rounds_to_target=host['rounds_to_target'], last_eval=host['last_eval']),
      since_eval=SinceEval(round_loss=tuple(host['round_loss']),
                           dc_rounds=tuple(host.get('dc_rounds', ()))),
      run=RunRecord(wall_time_s=float(host['wall_time_s']),
                    resumed_changes=tuple(host.get('resumed_changes', ())),
                    provenance=tuple(host.get('provenance', ()))))


def _at_stop(host: Mapping[str, Any] | None) -> AtStop | None:
  """:class:`AtStop` of :func:`to_host`'s ``at_stop`` (None: none, or a checkpoint
  written before it existed)."""
  if host is None:
    return None
  return AtStop(clock=network.Clock(np.asarray(host['clock_s']), np.asarray(host['idle_s'])),
                exposed_s=float(host['exposed_s']))


def stopped(ls: LoopState) -> LoopState:
  """``ls`` as a run that stops there is charged (:class:`AtStop`): the summary's
  clock and WAN exposure. The loop goes on from ``ls`` itself."""
  if ls.at_stop is None:
    return ls
  return ls._replace(clock=ls.at_stop.clock, wan=dict(ls.wan, exposed_s=ls.at_stop.exposed_s),
                     at_stop=None)


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
                  train_loss: float, overlap_steps: int = 0,
                  waits: np.ndarray | None = None) -> LoopState:
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
    waits: bool [D], the DCs that wait for the round's result (default: all): a DC
      that neither takes part nor adopts keeps its own time
      (:func:`hfl.network.advance_round`).
  """
  wan_bits = m['wan_bits']
  bits = _add_bits(ls.bits, inter_dc=network.link_bits(wan_bits, present),
                   intra_down=m['round_down_bits'].sum())
  comm = (network.round_comm_time(net, wan_bits, present)
          + network.lan_time(net, m['round_down_bits']))
  overlap = overlap_steps * network.iteration_time(net, m['up_bits'], m['down_bits'])
  clock, clock_at_stop = network.advance_overlapped_round(ls.clock, comm, overlap, present,
                                                          waits)
  at_stop = (None if not overlap_steps else
             AtStop(clock=clock_at_stop,
                    exposed_s=account_wan(ls.wan, wan_bits, present, comm)['exposed_s']))
  plan, sched = schedule.next_round(ls.schedule, train_loss)
  return ls._replace(step=ls.step + steps, round=ls.round + 1, bits=bits, clock=clock,
                     schedule=sched, plan=plan, since_eval=ls.since_eval._replace(
                         round_loss=ls.since_eval.round_loss + (train_loss,)),
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


def add_samples(total: int | None, round_samples) -> int | None:
  """The run's samples after a round that processed ``round_samples`` (ints per DC,
  :func:`round_diagnostics`'s ``samples``); None stays None (unknown)."""
  return None if total is None else total + sum(int(x) for x in round_samples)


def round_diagnostics(rnd: int, actives, kept, batch: int, weights, m) -> dict:
  """One round's per-DC diagnostics (the ``dc_rounds`` entries of metrics.jsonl).

  Args:
    rnd: the round's number (1-based).
    actives: bool [D] per iteration of the round (the DCs that ran it).
    kept: bool [D], the DCs whose round's work is kept: all but those down by
      ``sync.faults`` (hfl.sync.faults; a DC that sits out a partial strategy's
      exchange kept training, hfl.sync.strategies).
    batch: samples per DC per iteration (workers_per_dc x batch_size).
    weights: float [D], the round's aggregation scales s_d (hfl.sync.aggregation).
    m: :func:`hfl.step.host_metrics` of the round's last iteration.

  Returns:
    ``{'round', 'samples': [D] ints (K_d x W x B; 0 for a DC down by
    ``sync.faults``, whose work is discarded), 'weight': [D] s_d, 'update_l2': [D] ||x_d - x_ref||_2 at
    the round's end (its pseudo-gradient; x_ref = x_global unless the round's update
    goes through a lossy downlink, hfl.step.round_reference), 'drift_l2': [D] ||x_d - x_global'||_2
    from the new global model (float32 norms), 'contribution': [D]
    s_d ||Delta_d|| / sum_e s_e ||Delta_e|| (each DC's share of the weighted
    update norms; 0s when all are 0)}``.
  """
  steps = np.sum(np.asarray(actives, bool), axis=0) * np.asarray(kept, bool)
  w = np.asarray(weights, np.float64)
  upd = np.asarray(m['update_l2'], np.float64)
  share = w * upd
  total = share.sum()
  return dict(round=int(rnd), samples=[int(k) * batch for k in steps],
              weight=[float(x) for x in w], update_l2=[float(x) for x in upd],
              drift_l2=[float(x) for x in m['drift_l2']],
              contribution=[float(x) for x in (share / total if total > 0 else share * 0)])


def summary(s, ls: LoopState, records, wall_time_s: float, step_wall: dict) -> dict:
  """The summary.json of a finished run (the last evaluation's metrics; ``samples``:
  training samples processed by all DCs, :attr:`LoopState.samples`; ``stop``: what
  stopped it, :mod:`hfl.budget`; ``eval_history``: every evaluation's step, round,
  samples, simulated time and metrics, to compare runs at equal simulated time, at
  equal work or at equal iterations).

  Args:
    s: the run's hfl.setup.Setup (``task``, ``loop.stop``, ``net``, ``config``).
    ls: the loop state at the end of the run.
    records: its evaluations (metrics.jsonl; at least one).
    wall_time_s: the run's wall-clock, seconds (earlier sessions included).
    step_wall: measured iteration times (:func:`wall_stats`).
  """
  final = records[-1]
  # The run stops here: it waits for its last overlapped transfer (evaluations are
  # stamped, as every round's, with the clock the run goes on with).
  ls = stopped(ls)
  return dict(
      **tasks.summary_fields(s.task, final, ls.evals._asdict()),
      inter_dc_rounds=ls.round, intra_dc_iterations=ls.step, samples=ls.samples,
      bytes=byte_totals(ls.bits),
      sim_time_s=ls.clock.now, idle_s=[float(x) for x in ls.clock.idle_s],
      wall_time_s=wall_time_s, **metrics_lib.to_target(s.task, records),
      step_wall_s=wall_stats(step_wall),
      stop=s.loop.stop.to_json(), eval_history=eval_history(records),
      **wan_summary(s, ls), config=json.loads(s.config.to_json()),
      **({'changed_on_resume': list(ls.run.resumed_changes)} if ls.run.resumed_changes
         else {}),
      provenance=list(ls.run.provenance))


def wan_summary(s, ls: LoopState) -> dict:
  """The summary's WAN exposure fields (Streaming DiLoCo's comparison; every run) of
  the run of ``s`` (hfl.setup.Setup: its ``net`` and ``config``) at ``ls``.

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
          s.sync.stream.overlap_steps if s.sync.stream is not None else 0, latency)
      need[name] = b / 1e6 if np.isfinite(b) else None
  return dict(exposed_wan_s=wan['exposed_s'], compute_s=compute,
              compute_utilisation=compute / now if now > 0 else None,
              peak_wan_bytes_per_sync=to_bytes(wan['peak_bits']),
              wan_mbps_for_95pct_utilisation=need.get(''),
              wan_mbps_for_95pct_without_latency=need.get('_without_latency'))


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


HISTORY_KEYS = ('step', 'round', 'samples', 'sim_time_s', 'test_accuracy', 'test_loss')


def eval_history(records) -> list[dict]:
  """summary.json's ``eval_history``: per evaluation of metrics.jsonl, its
  ``step`` (iterations of the fastest DC), ``round``, ``samples`` (processed by all
  DCs; null in records older than the field), ``sim_time_s`` (simulated seconds),
  ``test_accuracy`` and ``test_loss`` (nats)."""
  return [{k: r.get(k) for k in HISTORY_KEYS} for r in records]


def print_results(summary: dict, workdir: str | None = None) -> None:
  """Prints the short results table at the end of a run, and where its files are."""
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
  if workdir is not None:
    names = [n for n in ('summary.json', 'metrics.jsonl', 'config.json', 'tb')
             if os.path.exists(os.path.join(workdir, n))]
    rows.append(('written to', f'{workdir} ({", ".join(names)})'))
  width = max(len(r[0]) for r in rows)
  print('\n'.join(f'{k:<{width}}  {v}' for k, v in rows), flush=True)
