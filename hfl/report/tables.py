"""Run records, seed grouping and result tables from training workdirs.

A training workdir (DESIGN 3) holds ``summary.json``, ``metrics.jsonl`` and
``config.json``. This module turns a list of workdirs into one row per *group*
(runs whose resolved configs differ only in ``seed``) and renders the rows as
Markdown and CSV.

Conventions used by every table:

* Accuracies are fractions in [0, 1] (the Markdown table prints percent).
* Bytes are raw bytes in CSV and decimal SI units (1 kB = 1000 B) in Markdown.
* Times are seconds. ``sim_time_s`` is the simulated wall-clock time of the
  network model; ``wall_time_s`` is the real time the job took.
* Mean ± std over seeds uses the sample standard deviation (``ddof=1``); a
  group of one run reports its value and no std.
* Time and rounds to target are recomputed from ``metrics.jsonl`` by
  :func:`time_to_target` (linear interpolation between the two evaluations
  that bracket the first crossing), not read from ``summary.json``; runs that
  never reach the target are excluded from the group mean and the count of
  runs that did is reported (``n_reached``). A group where no run reached the
  target shows ``never``.
* Compression ratio of a group = 1 − B / B_base and factor = B_base / B where
  B is the group's mean total bytes over all links (intra_up + intra_down +
  inter_dc) and B_base that of the baseline group (see :func:`pick_baselines`).
"""

import csv
import io
import json
import logging
import math
import os
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

import numpy as np

LINKS = ('intra_up', 'intra_down', 'inter_dc')
NEVER = 'never'
# Flattened config keys that do not make two runs different experiments.
GROUPING_IGNORED_KEYS = frozenset({'seed', 'workdir'})
# Keys that never change what is trained: not used in labels.
LABEL_IGNORED_KEYS = GROUPING_IGNORED_KEYS | {
    'train.eval_every', 'train.log_every', 'train.checkpoint_every', 'train.eval_batch_size'}
# Config keys that name the compressors; identity on all of them = uncompressed.
COMPRESSOR_KEYS = ('compression.uplink.name', 'compression.downlink.name',
                   'compression.wan.name')
DEFAULT_LABEL_KEYS = ('sync.strategy',) + COMPRESSOR_KEYS
_SHORT_NAMES = {
    'sync.strategy': '',
    'compression.uplink.name': 'up',
    'compression.downlink.name': 'down',
    'compression.wan.name': 'wan',
}


class RunRecord(NamedTuple):
  """Everything the report needs from one training workdir.

  Attributes:
    workdir: path of the workdir.
    name: basename of the workdir.
    config: resolved config as a nested dict (``summary['config']`` or
      ``config.json``; empty if neither exists).
    summary: contents of ``summary.json`` (empty dict for an unfinished run).
    metrics: evaluations from ``metrics.jsonl``, sorted by ``step``, one per
      step (a step logged twice, e.g. after a resume, keeps its last entry).
  """
  workdir: str
  name: str
  config: dict
  summary: dict
  metrics: list

  @property
  def finished(self) -> bool:
    """True when the run wrote ``summary.json``."""
    return bool(self.summary)


def _read_json(path: str) -> Any:
  with open(path, encoding='utf-8') as f:
    return json.load(f)


def read_metrics(path: str) -> list[dict]:
  """Reads a ``metrics.jsonl`` file.

  Lines that are not valid JSON (e.g. a half-written last line of an
  interrupted job) are skipped with a warning. Evaluations are sorted by
  ``step``; when a step appears more than once (a job resumed from a checkpoint
  and re-logged it) the last occurrence wins.

  Args:
    path: path of the JSONL file.

  Returns:
    List of evaluation dicts, sorted by step.
  """
  by_step: dict[Any, dict] = {}
  order = 0
  with open(path, encoding='utf-8') as f:
    for lineno, line in enumerate(f, 1):
      line = line.strip()
      if not line:
        continue
      try:
        rec = json.loads(line)
      except json.JSONDecodeError:
        logging.warning('%s:%d: skipping malformed line', path, lineno)
        continue
      if not isinstance(rec, dict):
        continue
      key = rec.get('step', ('line', order))
      order += 1
      by_step.pop(key, None)  # Re-insert so the last occurrence wins.
      by_step[key] = rec
  recs = list(by_step.values())
  recs.sort(key=lambda r: (r.get('step') is None, r.get('step') or 0))
  return recs


def load_run(workdir: str) -> RunRecord:
  """Loads one training workdir.

  Args:
    workdir: directory written by ``main.py`` (DESIGN 3).

  Returns:
    A :class:`RunRecord`. Missing files give empty fields (an unfinished run
    has ``summary == {}``).

  Raises:
    FileNotFoundError: if ``workdir`` is not a directory or holds neither
      ``summary.json`` nor ``metrics.jsonl``.
  """
  if not os.path.isdir(workdir):
    raise FileNotFoundError(f'not a directory: {workdir}')
  summary_path = os.path.join(workdir, 'summary.json')
  metrics_path = os.path.join(workdir, 'metrics.jsonl')
  config_path = os.path.join(workdir, 'config.json')
  if not (os.path.exists(summary_path) or os.path.exists(metrics_path)):
    raise FileNotFoundError(
        f'{workdir}: neither summary.json nor metrics.jsonl; is it a workdir?')
  summary = _read_json(summary_path) if os.path.exists(summary_path) else {}
  metrics = read_metrics(metrics_path) if os.path.exists(metrics_path) else []
  config = summary.get('config')
  if isinstance(config, str):
    config = json.loads(config)
  if not config and os.path.exists(config_path):
    config = _read_json(config_path)
  return RunRecord(
      workdir=workdir,
      name=os.path.basename(os.path.normpath(workdir)),
      config=dict(config or {}),
      summary=summary,
      metrics=metrics)


def flatten_config(config: Mapping[str, Any], prefix: str = '') -> dict:
  """Flattens a nested config dict to dotted keys; lists become tuples.

  Args:
    config: nested dict (e.g. a resolved ConfigDict as JSON).
    prefix: prefix for the keys (used by the recursion).

  Returns:
    Dict ``{'sync.strategy': 'periodic', 'network.dc_speed': (1.0, 1.0), ...}``.
  """
  out = {}
  for k, v in config.items():
    key = f'{prefix}{k}'
    if isinstance(v, Mapping):
      out.update(flatten_config(v, key + '.'))
    elif isinstance(v, list):
      out[key] = _freeze(v)
    else:
      out[key] = v
  return out


def _freeze(v: Any) -> Any:
  if isinstance(v, (list, tuple)):
    return tuple(_freeze(x) for x in v)
  if isinstance(v, Mapping):
    return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
  return v


def get_path(record: Mapping[str, Any], key: str) -> Any:
  """Returns ``record[a][b]`` for ``key='a.b'`` (None when missing).

  The special key ``'bytes.total'`` sums all links of ``record['bytes']``.
  """
  if key == 'bytes.total':
    b = record.get('bytes')
    if not isinstance(b, Mapping):
      return None
    return float(sum(float(b.get(link, 0) or 0) for link in LINKS))
  node: Any = record
  for part in key.split('.'):
    if not isinstance(node, Mapping) or part not in node:
      return None
    node = node[part]
  return node


def _finite(v: Any) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def time_to_target(metrics: Sequence[Mapping[str, Any]], target: float,
                   x_key: str = 'sim_time_s') -> float | None:
  """When a run first reaches ``target`` test accuracy, by linear interpolation.

  Let i be the first evaluation with ``test_accuracy >= target``. If i is the
  first evaluation, returns its x. Otherwise the evaluations i-1 (below target)
  and i (at or above) bracket the crossing and the result is

      x[i-1] + (target - acc[i-1]) / (acc[i] - acc[i-1]) * (x[i] - x[i-1]).

  Evaluations whose accuracy or x is missing or not finite are ignored.

  Args:
    metrics: evaluations sorted by step, as in ``metrics.jsonl``.
    target: accuracy threshold (fraction).
    x_key: dotted key of the x value, e.g. ``'sim_time_s'`` (seconds),
      ``'round'`` (inter-DC rounds), ``'step'``, ``'bytes.inter_dc'`` (bytes)
      or ``'bytes.total'`` (bytes over all links).

  Returns:
    The interpolated x at which accuracy reaches ``target``, or None if it
    never does.
  """
  prev = None
  for m in metrics:
    acc, x = m.get('test_accuracy'), get_path(m, x_key)
    if not (_finite(acc) and _finite(x)):
      continue
    acc, x = float(acc), float(x)
    if acc >= target:
      if prev is None:
        return x
      x0, a0 = prev
      return x0 + (target - a0) / (acc - a0) * (x - x0)
    prev = (x, acc)
  return None


class Stat(NamedTuple):
  """Mean ± std of a quantity over the runs of a group.

  Attributes:
    mean: mean over the runs that have a value (None if none has).
    std: sample std (ddof=1), None with fewer than 2 values.
    n: number of runs that contributed a value.
  """
  mean: float | None
  std: float | None
  n: int


def stat(values: Iterable[float | None]) -> Stat:
  """Mean and sample std of the non-None values."""
  vals = [float(v) for v in values if v is not None and _finite(float(v))]
  if not vals:
    return Stat(None, None, 0)
  std = float(np.std(vals, ddof=1)) if len(vals) >= 2 else None
  return Stat(float(np.mean(vals)), std, len(vals))


def group_runs(runs: Sequence[RunRecord]) -> list[list[RunRecord]]:
  """Groups runs whose configs differ only in ``seed`` (and ``workdir``).

  Runs without a config are never grouped. Groups keep the order of their
  first run in ``runs``; runs inside a group keep their order.

  Args:
    runs: loaded runs.

  Returns:
    List of groups (non-empty lists of runs).
  """
  groups: dict[Any, list[RunRecord]] = {}
  for i, run in enumerate(runs):
    if run.config:
      flat = flatten_config(run.config)
      key = tuple(sorted((k, repr(v)) for k, v in flat.items()
                         if k not in GROUPING_IGNORED_KEYS))
    else:
      key = ('__no_config__', i)
    groups.setdefault(key, []).append(run)
  return list(groups.values())


def _short_key(key: str) -> str:
  if key in _SHORT_NAMES:
    return _SHORT_NAMES[key]
  parts = key.split('.')
  if parts[-1] == 'name' and len(parts) >= 2:
    return parts[-2]
  return parts[-1]


def _unused_hyper(flat: Mapping[str, Any], key: str) -> bool:
  """A compressor hyper-parameter of a link whose compressor does not use it."""
  parts = key.split('.')
  if len(parts) != 3 or parts[0] != 'compression' or parts[2] == 'name':
    return False
  name = flat.get(f'compression.{parts[1]}.name')
  return name in ('identity', 'float32', 'bf16', 'bfloat16', 'fp16', 'float16')


def make_labels(groups: Sequence[Sequence[RunRecord]],
                label_by: Sequence[str] | None = None) -> list[str]:
  """One readable, unique label per group.

  With ``label_by``, a label is the values of those config keys, e.g.
  ``'periodic, up=topk'`` (``sync.strategy`` is shown bare, others as
  ``short=value``; a key the grouping ignores, such as ``seed``, lists the
  values of all the group's runs: ``'seed=0,1,2'``). Without it, the strategy and compressor keys plus every
  other config key that varies across groups are used, leaving out keys that
  are the same for all groups (but always at least the strategy and uplink
  compressor). Runs without config are labelled by their workdir name;
  duplicate labels get the workdir name appended.

  Args:
    groups: output of :func:`group_runs`.
    label_by: dotted config keys, or None for the automatic choice.

  Returns:
    List of labels, aligned with ``groups``.
  """
  flats = [flatten_config(g[0].config) for g in groups]
  if label_by:
    keys = list(label_by)
  else:
    all_keys = sorted(set().union(*flats)) if flats else []
    # Keys missing from some runs (fields added to hfl after they ran) are schema
    # differences, not settings.
    varying = [k for k in all_keys if k not in LABEL_IGNORED_KEYS
               and all(k in f for f in flats)
               and len({repr(f.get(k)) for f in flats}) > 1]
    keys = [k for k in DEFAULT_LABEL_KEYS if k in varying]
    keys += [k for k in varying if k not in keys]
    if not keys:
      keys = list(DEFAULT_LABEL_KEYS[:2])
  labels = []
  for g, flat in zip(groups, flats):
    if not flat:
      labels.append(g[0].name)
      continue
    parts = []
    for k in keys:
      if k not in flat or _unused_hyper(flat, k):
        continue
      v = flat[k]
      if k in GROUPING_IGNORED_KEYS:  # A group spans runs: show all their values.
        v = tuple(dict.fromkeys(flatten_config(r.config).get(k) for r in g))
      v = ','.join(map(str, v)) if isinstance(v, tuple) else str(v)
      short = _short_key(k)
      parts.append(f'{short}={v}' if short else v)
    labels.append(', '.join(parts) or g[0].name)
  counts: dict[str, int] = {}
  for lab in labels:
    counts[lab] = counts.get(lab, 0) + 1
  return [f'{lab} [{g[0].name}]' if counts[lab] > 1 else lab
          for lab, g in zip(labels, groups)]


def _summary_or_metrics(run: RunRecord, key: str) -> float | None:
  """A summary value, falling back to what ``metrics.jsonl`` implies."""
  m = run.metrics
  accs = [x['test_accuracy'] for x in m if _finite(x.get('test_accuracy'))]
  if key == 'best_test_accuracy' and key not in run.summary:
    return max(accs) if accs else None
  if key == 'final_test_accuracy' and key not in run.summary:
    return accs[-1] if accs else None
  fallback = {'inter_dc_rounds': 'round', 'sim_time_s': 'sim_time_s',
              'wall_time_s': 'wall_time_s', 'intra_dc_iterations': 'step'}
  v = get_path(run.summary, key)
  if v is None and key.startswith('bytes.'):
    v = get_path(m[-1], key) if m else None
  elif v is None and key in fallback and m:
    v = get_path(m[-1], fallback[key])
  return float(v) if _finite(v) else None


class GroupRow(NamedTuple):
  """One row of the results table (a group of seeds).

  Attributes:
    label: legend/table label.
    runs: the group's runs.
    seeds: seeds of the runs (None where the config has none).
    final_acc, best_acc: test accuracy (fraction).
    rounds_to_target: inter-DC rounds to target (interpolated).
    time_to_target_s: simulated seconds to target (interpolated).
    bytes: dict link -> Stat of total bytes over the run; also key 'total'.
    inter_dc_rounds: inter-DC rounds over the run.
    sim_time_s: simulated seconds over the run.
    wall_time_s: real seconds the runs took.
    baseline: label of the compression baseline (None if none).
    compression_ratio: 1 − bytes/bytes_baseline (total bytes, None if no
      baseline).
    compression_factor: bytes_baseline / bytes (None if no baseline).
  """
  label: str
  runs: list
  seeds: list
  final_acc: Stat
  best_acc: Stat
  rounds_to_target: Stat
  time_to_target_s: Stat
  bytes: dict
  inter_dc_rounds: Stat
  sim_time_s: Stat
  wall_time_s: Stat
  baseline: str | None = None
  compression_ratio: float | None = None
  compression_factor: float | None = None


def summarise_group(runs: Sequence[RunRecord], label: str,
                    target: float) -> GroupRow:
  """Aggregates one group of runs (without the compression columns).

  Args:
    runs: runs of one group.
    label: its label.
    target: target test accuracy (fraction).

  Returns:
    A :class:`GroupRow` with ``baseline``/``compression_*`` unset.
  """
  get = lambda key: stat(_summary_or_metrics(r, key) for r in runs)
  link_stats = {link: get(f'bytes.{link}') for link in LINKS}
  link_stats['total'] = stat(
      None if any(_summary_or_metrics(r, f'bytes.{l}') is None for l in LINKS)
      else sum(_summary_or_metrics(r, f'bytes.{l}') for l in LINKS)
      for r in runs)
  return GroupRow(
      label=label,
      runs=list(runs),
      seeds=[r.config.get('seed') for r in runs],
      final_acc=get('final_test_accuracy'),
      best_acc=get('best_test_accuracy'),
      rounds_to_target=stat(time_to_target(r.metrics, target, 'round')
                            for r in runs),
      time_to_target_s=stat(time_to_target(r.metrics, target, 'sim_time_s')
                            for r in runs),
      bytes=link_stats,
      inter_dc_rounds=get('inter_dc_rounds'),
      sim_time_s=get('sim_time_s'),
      wall_time_s=get('wall_time_s'))


def is_uncompressed(config: Mapping[str, Any]) -> bool:
  """True when every compressor in the config is ``identity``."""
  flat = flatten_config(config)
  names = [flat.get(k) for k in COMPRESSOR_KEYS if k in flat]
  return bool(names) and all(n == 'identity' for n in names)


def pick_baselines(groups: Sequence[Sequence[RunRecord]], labels: Sequence[str],
                   baseline: str | None = None) -> list[int | None]:
  """Chooses the compression baseline group of every group.

  With ``baseline`` (a label), that group is every group's baseline. Otherwise
  each group is compared with the uncompressed group (all compressors
  ``identity``) whose config differs from it in the fewest keys outside
  ``compression.*`` and ``seed`` (so a periodic top-k run is compared with
  periodic identity, not with synchronous identity); ties go to the earlier
  group.

  Args:
    groups: output of :func:`group_runs`.
    labels: their labels.
    baseline: label of the baseline group, or None.

  Returns:
    Index of the baseline group for each group (None: no baseline).

  Raises:
    ValueError: if ``baseline`` is not one of ``labels``.
  """
  if baseline is not None:
    if baseline not in labels:
      raise ValueError(f'--baseline {baseline!r} is not a label; labels: '
                       f'{list(labels)}')
    return [labels.index(baseline)] * len(groups)
  flats = [flatten_config(g[0].config) for g in groups]
  candidates = [i for i, g in enumerate(groups)
                if g[0].config and is_uncompressed(g[0].config)]
  out: list[int | None] = []
  for flat in flats:
    if not candidates or not flat:
      out.append(None)
      continue
    def distance(j, flat=flat):
      other = flats[j]
      keys = (set(flat) | set(other)) - GROUPING_IGNORED_KEYS
      return sum(1 for k in keys if not k.startswith('compression.')
                 and repr(flat.get(k)) != repr(other.get(k)))
    out.append(min(candidates, key=lambda j: (distance(j), j)))
  return out


def build_rows(runs: Sequence[RunRecord], target: float,
               label_by: Sequence[str] | None = None,
               baseline: str | None = None) -> list[GroupRow]:
  """Groups runs by seed and builds the table rows.

  Args:
    runs: loaded runs.
    target: target test accuracy (fraction) for the *_to_target columns.
    label_by: config keys that make the labels (see :func:`make_labels`).
    baseline: label of the compression baseline (see :func:`pick_baselines`).

  Returns:
    One :class:`GroupRow` per group, in the order of the runs.
  """
  groups = group_runs(runs)
  labels = make_labels(groups, label_by)
  rows = [summarise_group(g, lab, target) for g, lab in zip(groups, labels)]
  out = []
  for row, b in zip(rows, pick_baselines(groups, labels, baseline)):
    if b is not None:
      base_bytes = rows[b].bytes['total'].mean
      own = row.bytes['total'].mean
      if base_bytes and own is not None:
        row = row._replace(
            baseline=rows[b].label,
            compression_ratio=1.0 - own / base_bytes,
            compression_factor=(base_bytes / own) if own > 0 else math.inf)
    out.append(row)
  return out


def default_target(runs: Sequence[RunRecord], fallback: float = 0.88) -> float:
  """``train.target_accuracy`` if all runs agree on it, else ``fallback``."""
  targets = {get_path(r.config, 'train.target_accuracy') for r in runs}
  targets.discard(None)
  if len(targets) == 1:
    return float(targets.pop())
  if targets:
    logging.warning('runs disagree on train.target_accuracy %s; using %s',
                    sorted(targets), fallback)
  return fallback


# --------------------------------------------------------------------------
# Formatting.


_BYTE_UNITS = (('TB', 1e12), ('GB', 1e9), ('MB', 1e6), ('kB', 1e3), ('B', 1.0))
_TIME_UNITS = (('h', 3600.0, 7200.0), ('min', 60.0, 120.0), ('s', 1.0, 0.0))


def _byte_unit(n: float) -> tuple[str, float]:
  for unit, scale in _BYTE_UNITS:
    if abs(n) >= scale:
      return unit, scale
  return 'B', 1.0


def human_bytes(n: float | None, unit: tuple[str, float] | None = None) -> str:
  """Bytes in decimal SI units, e.g. ``1.50 MB`` (1 MB = 10^6 bytes).

  Args:
    n: bytes.
    unit: (name, scale) to use instead of the one chosen from ``n``.
  """
  if n is None:
    return '–'
  name, scale = unit or _byte_unit(n)
  return f'{n:.0f} B' if name == 'B' else f'{n / scale:.2f} {name}'


def _time_unit(s: float) -> tuple[str, float]:
  for unit, scale, threshold in _TIME_UNITS:
    if abs(s) >= threshold:
      return unit, scale
  return 's', 1.0


def human_seconds(s: float | None, unit: tuple[str, float] | None = None
                  ) -> str:
  """Seconds as ``12.3 s``, ``4.5 min`` (from 120 s) or ``1.20 h`` (from 2 h).

  Args:
    s: seconds.
    unit: (name, scale) to use instead of the one chosen from ``s``.
  """
  if s is None:
    return '–'
  name, scale = unit or _time_unit(s)
  v = s / scale
  if name == 'h':
    return f'{v:.2f} h'
  if name == 's' and abs(v) < 1:
    return f'{v:.3g} s'
  return f'{v:.1f} {name}'


def _fmt_stat(st: Stat, fmt, n_runs: int, never: bool = False,
              unit_of=None) -> str:
  """``mean ± std``; std in the mean's unit, left out when it is 0."""
  if st.mean is None:
    return NEVER if never else '–'
  unit = unit_of(st.mean) if unit_of else None
  s = fmt(st.mean, unit) if unit_of else fmt(st.mean)
  if st.std:
    s += ' ± ' + (fmt(st.std, unit) if unit_of else fmt(st.std))
  if never and st.n < n_runs:
    s += f' ({st.n}/{n_runs} reached)'
  return s


def _pct(x: float) -> str:
  return f'{100 * x:.2f}'


def _compression_cell(row: GroupRow) -> str:
  if row.compression_ratio is None:
    return '–'
  if row.compression_factor == math.inf:
    return '100% (∞×)'
  return f'{100 * row.compression_ratio:.1f}% ({row.compression_factor:.1f}×)'


MD_COLUMNS = ('label', 'runs', 'final acc (%)', 'best acc (%)',
              'rounds to target', 'sim time to target', 'intra-DC up',
              'intra-DC down', 'inter-DC', 'compression (vs baseline)',
              'inter-DC rounds', 'sim time', 'wall time')


def to_markdown(rows: Sequence[GroupRow], target: float) -> str:
  """Renders the rows as a Markdown document with a notes section.

  Args:
    rows: output of :func:`build_rows`.
    target: the target accuracy used for the rows.

  Returns:
    Markdown text.
  """
  lines = ['# Results', '',
           '| ' + ' | '.join(MD_COLUMNS) + ' |',
           '|' + '|'.join('---' for _ in MD_COLUMNS) + '|']
  for r in rows:
    n = len(r.runs)
    cells = [
        r.label.replace('|', '\\|'),
        str(n),
        _fmt_stat(r.final_acc, _pct, n),
        _fmt_stat(r.best_acc, _pct, n),
        _fmt_stat(r.rounds_to_target, lambda x: f'{x:.1f}', n, never=True),
        _fmt_stat(r.time_to_target_s, human_seconds, n, never=True,
                  unit_of=_time_unit),
        *(_fmt_stat(r.bytes[l], human_bytes, n, unit_of=_byte_unit)
          for l in LINKS),
        _compression_cell(r),
        _fmt_stat(r.inter_dc_rounds, lambda x: f'{x:.0f}', n),
        _fmt_stat(r.sim_time_s, human_seconds, n, unit_of=_time_unit),
        _fmt_stat(r.wall_time_s, human_seconds, n, unit_of=_time_unit),
    ]
    lines.append('| ' + ' | '.join(cells) + ' |')
  baselines = sorted({r.baseline for r in rows if r.baseline})
  lines += [
      '',
      '## Notes',
      '',
      f'- Target test accuracy: {100 * target:.2f}%. Rounds (inter-DC) and '
      'simulated time to target are recomputed from `metrics.jsonl` by linear '
      'interpolation between the two evaluations that bracket the first '
      'crossing; `never` = not reached. With several seeds, seeds that did not '
      'reach it are left out of the mean and the count that did is shown.',
      '- `runs` > 1: configs differ only in `seed`; cells show mean ± sample '
      'std (ddof=1) over seeds (± left out when all seeds agree).',
      '- Bytes are totals over the run per link, in decimal units '
      '(1 MB = 10^6 bytes); raw bytes are in `results.csv`.',
      '- Compression = 1 − total bytes / baseline total bytes (all links), '
      'with the × reduction factor. Baseline: '
      + (', '.join(f'`{b}`' for b in baselines) if baselines else 'none')
      + ' (each run vs the uncompressed run closest to it in config, unless '
      '`--baseline` is given).',
      '- sim time: simulated wall-clock of the network model; wall time: real '
      'time of the job.',
      '',
      '## Runs',
      '',
  ]
  for r in rows:
    lines.append(f'- {r.label}: ' + ', '.join(f'`{x.workdir}`' for x in r.runs))
  return '\n'.join(lines) + '\n'


CSV_COLUMNS = (
    'label', 'n_runs', 'seeds', 'workdirs',
    'final_test_accuracy_mean', 'final_test_accuracy_std',
    'best_test_accuracy_mean', 'best_test_accuracy_std',
    'rounds_to_target_mean', 'rounds_to_target_std',
    'time_to_target_s_mean', 'time_to_target_s_std', 'n_reached_target',
    'target_accuracy',
    'bytes_intra_up_mean', 'bytes_intra_up_std',
    'bytes_intra_down_mean', 'bytes_intra_down_std',
    'bytes_inter_dc_mean', 'bytes_inter_dc_std',
    'bytes_total_mean', 'bytes_total_std',
    'baseline', 'compression_ratio', 'compression_factor',
    'inter_dc_rounds_mean', 'inter_dc_rounds_std',
    'sim_time_s_mean', 'sim_time_s_std',
    'wall_time_s_mean', 'wall_time_s_std',
)


def csv_records(rows: Sequence[GroupRow], target: float) -> list[dict]:
  """Rows as flat dicts with raw numbers (bytes, seconds, fractions).

  Missing values are ``''``; a group that never reached the target has
  ``'never'`` in the ``*_to_target_*_mean`` columns.
  """
  def num(v):
    return '' if v is None else v

  out = []
  for r in rows:
    d = {
        'label': r.label,
        'n_runs': len(r.runs),
        'seeds': ';'.join('' if s is None else str(s) for s in r.seeds),
        'workdirs': ';'.join(x.workdir for x in r.runs),
        'n_reached_target': r.time_to_target_s.n,
        'target_accuracy': target,
        'baseline': r.baseline or '',
        'compression_ratio': num(r.compression_ratio),
        'compression_factor': num(r.compression_factor),
    }
    stats = {
        'final_test_accuracy': r.final_acc,
        'best_test_accuracy': r.best_acc,
        'rounds_to_target': r.rounds_to_target,
        'time_to_target_s': r.time_to_target_s,
        'inter_dc_rounds': r.inter_dc_rounds,
        'sim_time_s': r.sim_time_s,
        'wall_time_s': r.wall_time_s,
    }
    stats.update({f'bytes_{k}': v for k, v in r.bytes.items()})
    for name, st in stats.items():
      d[f'{name}_mean'] = num(st.mean)
      d[f'{name}_std'] = num(st.std)
    for name in ('rounds_to_target', 'time_to_target_s'):
      if stats[name].mean is None:
        d[f'{name}_mean'] = NEVER
    out.append(d)
  return out


def to_csv(rows: Sequence[GroupRow], target: float) -> str:
  """Renders the rows as CSV text with the columns :data:`CSV_COLUMNS`."""
  buf = io.StringIO()
  w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, lineterminator='\n')
  w.writeheader()
  for d in csv_records(rows, target):
    w.writerow(d)
  return buf.getvalue()
