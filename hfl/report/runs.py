"""Training workdirs as data: find them, load them, one table row per run.

A workdir (written by ``main.py``; formats in the README) holds ``summary.json``
(finished runs only), ``metrics.jsonl`` (one record per evaluation) and
``config.json``. :func:`run_frame` gives one pandas row per run: the
:data:`METRICS` (summary values, or an unfinished run's last evaluation; time
and rounds to target recomputed from ``metrics.jsonl`` for the run's headline
metric, :func:`target_of`) and the flattened config.
"""

import json
import logging
import os
import pathlib
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

import pandas as pd

from hfl import metrics as metrics_lib
from hfl.data import TEXT_DATASETS

RUN_FILES = ('summary.json', 'metrics.jsonl')
# A directory with metrics.jsonl only (hfl.train writes config.json first): left out.
NOT_A_RUN = 'not a training run: metrics.jsonl but neither config.json nor summary.json'
WAN_FIELDS = metrics_lib.WAN_FIELDS  # hfl.cost.wan_summary's fields and their units
# Per-run quantities (columns of run_frame) and their units: accuracies are fractions,
# validation losses nats and bits per character (hfl.tasks), samples those all DCs trained on.
METRICS = {
    'final_acc': 'fraction', 'best_acc': 'fraction', 'final_loss': 'nats', 'best_loss': 'nats',
    'final_bpc': 'bits', 'rounds_to_target': 'rounds', 'time_to_target_s': 's',
    'bytes.intra_up': 'bytes', 'bytes.intra_down': 'bytes', 'bytes.inter_dc': 'bytes',
    'bytes.intra': 'bytes', 'bytes.total': 'bytes', 'inter_dc_rounds': 'rounds',
    'intra_dc_iterations': 'iterations', 'samples': 'samples', 'sim_time_s': 's',
    'wall_time_s': 's', **WAN_FIELDS}
# metric -> (summary.json key, metrics.jsonl key of an unfinished run's last evaluation)
_FROM_SUMMARY = metrics_lib.SUMMARY_SOURCES


def higher_is_better(metric: str) -> bool:
  """True for the fractions of :data:`METRICS` (accuracy, utilisation); every other
  metric (loss, bytes, time, rounds, bandwidth needed) is better when lower."""
  return METRICS.get(metric) == 'fraction'


class Target(NamedTuple):
  """A run's headline metric (hfl.tasks): metrics.jsonl key, direction, target value."""
  metric: str
  higher_is_better: bool
  value: float


def target_of(config: Mapping[str, Any]) -> Target:
  """The headline metric of a flattened config: ``test_loss`` ≤ ``train.target_loss``
  (nats per character, default 1.7) for a text dataset, else ``test_accuracy`` ≥
  ``train.target_accuracy`` (fraction, default 0.88)."""
  if config.get('dataset.name') in TEXT_DATASETS:
    return Target('test_loss', False, float(config.get('train.target_loss', 1.7)))
  return Target('test_accuracy', True, float(config.get('train.target_accuracy', 0.88)))


class Run(NamedTuple):
  """One workdir: path, basename, nested ``config`` (summary.json's or config.json;
  {} if none), ``summary`` ({} when unfinished) and ``metrics`` (metrics.jsonl in
  step order, one record per step: a step logged twice keeps the later one)."""
  workdir: str
  name: str
  config: dict
  summary: dict
  metrics: list

  @property
  def finished(self) -> bool:
    return bool(self.summary)


def is_run_dir(path: str) -> bool:
  """True for a directory holding ``summary.json`` or ``metrics.jsonl``."""
  return any(os.path.isfile(os.path.join(path, f)) for f in RUN_FILES)


def find_runs(paths: Iterable[str], exclude: Iterable[str] = ()) -> list[str]:
  """The workdirs among and below ``paths``, in the order found (sorted walk, not
  below a workdir, skipping ``exclude``), without duplicates.

  Raises:
    FileNotFoundError: a path does not exist, or holds no workdir.
  """
  skip = {os.path.abspath(p) for p in exclude}
  found: dict[str, str] = {}  # absolute path -> the path as found (a run reached twice: once)
  for path in paths:
    if not os.path.isdir(path):
      raise FileNotFoundError(f'not a directory: {path}')
    hit = False
    for top, dirs, _ in os.walk(path):
      dirs.sort()
      if os.path.abspath(top) in skip:
        dirs.clear()
      elif is_run_dir(top):
        found.setdefault(os.path.abspath(top), top)
        dirs.clear()
        hit = True
    if not hit:
      raise FileNotFoundError(f'{path}: no training workdir (a directory with '
                              f'{" or ".join(RUN_FILES)}) in it or below it')
  return list(found.values())


def read_metrics(path: str) -> list[dict]:
  """``metrics.jsonl`` in step order, one record per step (the last logged); lines that
  are not JSON are skipped with a warning; a missing file reads as [].

  Raises:
    ValueError: a record's ``step`` is not a finite number (the file and value named).
  """
  by_step = {}
  for r in metrics_lib.read_jsonl(path, strict=False):
    if isinstance(r, dict):
      if not metrics_lib.finite(step := r.get('step')):
        raise ValueError(f'{path}: a record has step {json.dumps(step)[:40]}, not a number; '
                         'fix or remove that run')
      by_step.pop(step, None)
      by_step[step] = r
  return sorted(by_step.values(), key=lambda r: r['step'])


def load_run(workdir: str) -> Run:
  """Loads one workdir (see :class:`Run`).

  Raises:
    FileNotFoundError: ``workdir`` holds neither summary.json nor metrics.jsonl.
    ValueError: as :func:`read_summary` (config.json read even when the summary holds the
      config, as the sweep does).
    OSError: a file cannot be read.
  """
  if not is_run_dir(workdir):
    raise FileNotFoundError(f'{workdir}: not a training workdir (no {" or ".join(RUN_FILES)})')
  summary, config = read_summary(workdir, config_json=True)
  return Run(workdir, os.path.basename(os.path.normpath(workdir)), config, summary,
             read_metrics(os.path.join(workdir, 'metrics.jsonl')))


# What to do about a summary.json that is no finished run's (main.py's remedy).
REBUILD_SUMMARY = ('delete that summary.json and rerun main.py on the workdir to rebuild it '
                   'from metrics.jsonl and the last checkpoint')


def read_summary(workdir: str, config_json: bool = False) -> tuple[dict, dict]:
  """A workdir's summary.json ({} if missing) and nested config (the summary's, else
  config.json's; {} if none), checked as the report and hfl.sweep.run_status need them.

  Raises:
    ValueError: summary.json or config.json (read with ``config_json``, or for the config)
      is no JSON object, the config not an object, or the summary not a finished run's
      (:func:`summary_problem`); the path and field named.
    OSError: a file cannot be read.
  """
  path = lambda f: os.path.join(workdir, f)
  def read(f):
    if os.path.isdir(path(f)):  # main.py refuses such a workdir
      raise ValueError(f'{path(f)} is a directory, not a JSON file; fix or remove that run')
    if not os.path.isfile(path(f)):
      return {}
    try:
      out = json.loads(pathlib.Path(path(f)).read_text(encoding='utf-8'))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise ValueError(f'{path(f)} is not valid JSON ({e}); fix or remove that run') from None
    if not isinstance(out, dict):
      raise ValueError(f'{path(f)} is not a JSON object (it holds {json.dumps(out)[:40]}); fix '
                       'or remove that run')
    return out
  summary = read('summary.json')
  stored = read('config.json') if config_json or not summary.get('config') else {}
  config = summary.get('config') or stored
  try:
    config = json.loads(config) if isinstance(config, str) else config  # early workdirs
  except json.JSONDecodeError as e:
    raise ValueError(f'{path("summary.json")}: config is a string that is not valid JSON ({e}); '
                     'fix or remove that run') from None
  if not isinstance(config, dict):
    raise ValueError(f'{path("summary.json")}: config is {json.dumps(config)[:40]}, not a JSON '
                     'object; fix or remove that run')
  if (os.path.isfile(path('summary.json'))
      and (problem := summary_problem(summary, target_of(flatten(config)).metric))):
    raise ValueError(f'{path("summary.json")}: {problem}; {REBUILD_SUMMARY}, or remove that run')
  return summary, config


# Why a summary.json is no finished run's (the check hfl.train makes too).
summary_problem = metrics_lib.summary_problem


def flatten(config: Mapping[str, Any], prefix: str = '') -> dict:
  """A nested config as ``{'sync.strategy': 'periodic', ...}``; lists become tuples."""
  out = {}
  for k, v in config.items():
    if isinstance(v, Mapping):
      out.update(flatten(v, f'{prefix}{k}.'))
    else:
      out[f'{prefix}{k}'] = _freeze(v)
  return out


def _freeze(v: Any) -> Any:
  return tuple(_freeze(x) for x in v) if isinstance(v, (list, tuple)) else v


def _number(x: Any) -> float | None:
  return float(x) if metrics_lib.finite(x) else None


def lan_recost_problem(config: Mapping[str, Any]) -> str:
  """Why a run's simulated clock cannot be re-costed for another LAN ('' if it can).

  :func:`lan_recost` is exact when the training does not depend on the LAN and every
  DC is charged the same LAN bits at the same moments: equal DC speeds, a schedule that
  plans no K from times (``sync`` or ``periodic``), every DC present in every round
  (no ``sync.faults``), no WAN overlap (Streaming DiLoCo's τ), a stop that is not a
  simulated-time budget, and no variable-length code on any link.
  """
  flat = flatten(config)
  speeds = flat.get('network.dc_speed') or ()
  if len({float(v) for v in speeds}) > 1:
    return f'the DCs run at different speeds ({list(speeds)})'
  if flat.get('sync.strategy') not in ('sync', 'periodic'):
    return f'sync.strategy={flat.get("sync.strategy")!r} plans K from times or the loss'
  if flat.get('sync.faults'):
    return 'DCs are absent in some rounds (sync.faults)'
  if flat.get('sync.overlap_steps') or (flat.get('sync.fragments') or 1) > 1:
    return 'WAN transfers overlap compute (Streaming DiLoCo)'
  if flat.get('train.sim_time_budget_s'):
    return 'the run stops at a simulated-time budget, which another LAN moves'
  # Only here: hfl.compress imports JAX, which the reports otherwise never load.
  from hfl.compress import policy  # lazy: jax  pylint: disable=g-import-not-at-top
  for link in ('uplink', 'downlink', 'wan'):
    if flat.get(f'compression.{link}.name') in policy.VARIABLE_LENGTH_NAMES:
      return f'compression.{link} is a variable-length code (DCs may be charged different bits)'
  return ''


def lan_recost(run: Run, lan_bandwidth_gbps: float) -> Run:
  """The run as its simulated clock would have charged it with a PS NIC of
  ``lan_bandwidth_gbps`` instead of its own ``network.lan_bandwidth_gbps``.

  The LAN's time is linear in bits (:func:`hfl.network.iteration_time`: compute +
  (up + down bits) / lan_bps + latencies per iteration; :func:`hfl.network.lan_time`
  for the round's fan-out), so when the training itself does not depend on the LAN
  (:func:`lan_recost_problem`) the clock at any moment moves by
  8 (intra_up + intra_down bytes so far) / D x (1 / B' - 1 / B) seconds: every DC
  carries a D-th of the intra-DC bytes, on its own PS NIC, in step. Each evaluation's
  ``sim_time_s`` and the summary's move so; ``time_to_target_s`` is recomputed from them
  (:func:`hfl.metrics.time_to_target`), and the config says the new LAN. Accuracy,
  bytes and rounds are the run's own.

  Args:
    run: a finished run.
    lan_bandwidth_gbps: the PS NIC's bandwidth, Gbit/s, > 0.

  Returns:
    A new :class:`Run` (the input is not changed); ``summary['lan_recost_from_gbps']``
    names the LAN it was trained with.

  Raises:
    ValueError: a run :func:`lan_recost_problem` refuses (with its reason), an
      unfinished run, or a bandwidth <= 0.
  """
  if not run.finished:
    raise ValueError(f'{run.workdir}: not finished (no summary.json): nothing to re-cost')
  if not lan_bandwidth_gbps > 0:
    raise ValueError(f'lan_bandwidth_gbps must be > 0, got {lan_bandwidth_gbps!r}')
  why = lan_recost_problem(run.config)
  if why:
    raise ValueError(f'{run.workdir}: its clock cannot be re-costed for another LAN: {why}')
  net = run.config['network']
  dcs = int(run.config['mesh']['num_dcs'])
  per_byte = 8.0 / dcs * (1.0 / (float(lan_bandwidth_gbps) * 1e9)
                          - 1.0 / (float(net['lan_bandwidth_gbps']) * 1e9))
  def moved(sim, links):
    return sim + per_byte * (float(links.get('intra_up', 0)) + float(links.get('intra_down', 0)))
  metrics = [dict(r, sim_time_s=moved(r['sim_time_s'], r.get('bytes') or {}))
             if metrics_lib.finite(r.get('sim_time_s')) else dict(r) for r in run.metrics]
  summary = dict(run.summary, sim_time_s=moved(run.summary['sim_time_s'], run.summary['bytes']),
                 lan_recost_from_gbps=float(net['lan_bandwidth_gbps']))
  t = target_of(flatten(run.config))
  summary['time_to_target_s'] = metrics_lib.time_to_target(metrics, t.value, 'sim_time_s',
                                                           t.metric, t.higher_is_better)
  config = dict(run.config, network=dict(net, lan_bandwidth_gbps=float(lan_bandwidth_gbps)))
  return run._replace(config=config, summary=summary, metrics=metrics)


def run_metrics(run: Run, target: float | None = None) -> dict[str, float | None]:
  """The :data:`METRICS` of one run (None where unknown): summary values, else (an
  unfinished run) its last evaluation's; time and rounds to ``target`` (of the run's
  headline metric, :func:`target_of`; default its config's) recomputed by
  :func:`hfl.metrics.time_to_target`."""
  last = run.metrics[-1] if run.metrics else {}
  out = {k: _number(run.summary.get(s, last.get(m))) for k, (s, m) in _FROM_SUMMARY.items()}
  for name, key, best in (('best_acc', 'test_accuracy', max), ('best_loss', 'test_loss', min)):
    seen = [m[key] for m in run.metrics if _number(m.get(key)) is not None]
    out[name] = _number(run.summary.get(f'best_{key}', best(seen, default=None)))
  links = run.summary.get('bytes') or last.get('bytes') or {}
  for link in metrics_lib.LINKS:
    out[f'bytes.{link}'] = _number(links.get(link))
  up, down, inter = (out[f'bytes.{l}'] for l in metrics_lib.LINKS)
  out['bytes.intra'] = None if None in (up, down) else up + down
  out['bytes.total'] = None if None in (up, down, inter) else up + down + inter
  t = target_of(flatten(run.config))
  value = t.value if target is None else float(target)
  for key, name in (('sim_time_s', 'time_to_target_s'), ('round', 'rounds_to_target')):
    out[name] = metrics_lib.time_to_target(run.metrics, value, key, t.metric, t.higher_is_better)
  return out


def run_frame(runs: Sequence[Run], target: float | None = None) -> pd.DataFrame:
  """One row per run: ``workdir``, ``name``, ``finished``, ``seed``, ``run``
  (the :class:`Run`), the :data:`METRICS` (to ``target``, default each run's own),
  ``config`` (flattened dict) and ``changed`` (the summary's ``changed_on_resume`` as
  text, e.g. ``'at 10: train.num_steps: 10 -> 20'``, else '')."""
  rows = []
  for r in runs:
    flat = flatten(r.config)
    changed = '; '.join(f'at {c.get("at_iteration")}: {", ".join(map(str, c.get("changes", [])))}'
                        for c in r.summary.get('changed_on_resume') or [] if isinstance(c, dict))
    rows.append(dict(workdir=r.workdir, name=r.name, finished=r.finished, seed=flat.get('seed'),
                     run=r, config=flat, changed=changed, **run_metrics(r, target)))
  columns = ['workdir', 'name', 'finished', 'seed', 'run', 'config', 'changed', *METRICS]
  return pd.DataFrame(rows, columns=columns)


def default_target(runs: Sequence[Run]) -> Target:
  """The runs' common headline target (:func:`target_of`; the first run's when they
  disagree, with a warning; test accuracy ≥ 0.88 without runs)."""
  targets = list(dict.fromkeys(target_of(flatten(r.config)) for r in runs))
  if len(targets) > 1:
    logging.warning('runs disagree on the target %s; using %s', targets, targets[0])
  return targets[0] if targets else Target('test_accuracy', True, 0.88)
