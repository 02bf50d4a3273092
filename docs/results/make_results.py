"""Regenerates docs/results.md: hfl's sweeps next to the published numbers.

  python3 docs/results/make_results.py [--root workdirs] [--out docs] [--no-run]
      [--parallel N] [--spec docs/results/claims.py] [--archive DEST]

First runs every sweep the spec names (``hfl.sweep``: finished runs are
skipped, interrupted ones resume; ``--no-run`` skips this), then renders
``OUT/results.md`` and ``OUT/results/*.png`` from the workdirs under ROOT
(sweep ``root: NAME`` lives in ``ROOT/NAME``). Relative paths are the
caller's. What the page says is data in the spec (``docs/results/claims.py``,
whose docstring defines its vocabulary); this script only loads, computes
(with :mod:`hfl.report`) and renders. Only runs with ``summary.json`` enter the
numbers; the others are listed as missing, with their progress. When OUT is the
repository's ``docs``, the README's results summary (between its
:data:`SUMMARY_START` / :data:`SUMMARY_END` markers) is regenerated too, from the same
verdicts (:func:`summary_block`).

Cost: without ``--no-run`` every missing run of every sweep trains, including
the CIFAR-10 (4,800 iterations, about 24 minutes per run alone, 40 with two runs
sharing a 2-core CPU) and character-LM (2,000 iterations, 12 to 37 minutes per run;
Streaming DiLoCo 512) sweeps,
which take hours each on a 2-core CPU; ``--no-run`` renders their sections
from whatever runs exist and lists the rest as missing.
"""

import argparse
import datetime
import importlib.util
import json
import logging
import math
import operator
import os
import shlex
import re
import shutil
import string
import sys
from typing import Any, NamedTuple, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
if REPO not in sys.path:
  sys.path.insert(0, REPO)


# pylint: disable=g-import-not-at-top,wrong-import-position
import pandas as pd

from hfl import sweep as sweep_lib
from hfl.report import plots
from hfl.report import runs as runs_lib
from hfl.report import stats
from hfl.report import tables as tables_lib
# pylint: enable=g-import-not-at-top,wrong-import-position


def _import_here(name: str):
  spec = importlib.util.spec_from_file_location(f'_results_{name}', os.path.join(HERE, f'{name}.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


factor_plot_lib = _import_here('factor_plot')

PLOTS_DIR = 'results'
COMMAND = 'python3 docs/results/make_results.py'
_OPS = {'>=': (operator.ge, '≥'), '>': (operator.gt, '>'), '<=': (operator.le, '≤'),
        '<': (operator.lt, '<')}
_NOT = {'>=': '<', '>': '≤', '<=': '>', '<': '≥'}
_WORDS = {'bytes.intra': 'intra-DC bytes', 'bytes.intra_up': 'uplink bytes',
          'bytes.intra_down': 'downlink bytes', 'bytes.inter_dc': 'inter-DC bytes',
          'bytes.total': 'bytes', 'time_to_target_s': 'simulated time to target',
          'rounds_to_target': 'inter-DC rounds to target', 'final_acc': 'final accuracy',
          'acc_at_iters': 'accuracy at equal iterations', 'final_loss': 'final validation loss',
          'best_loss': 'best validation loss', 'final_bpc': 'final bits per character',
          'peak_wan_bytes_per_sync': 'peak WAN bytes per sync event',
          'wan_mbps_for_95pct_utilisation': 'WAN bandwidth for 95% compute utilisation',
          'wan_mbps_for_95pct_without_latency': 'WAN bandwidth for 95% utilisation at zero '
          'latency', 'exposed_wan_s': 'exposed WAN time',
          'compute_utilisation': 'compute utilisation'}
# Metrics whose value null in a finished run's summary.json means "no value suffices"
# (hfl.cost.wan_summary: not even an infinite WAN bandwidth keeps 95% utilisation).
NONE_SUFFICES = {'wan_mbps_for_95pct_utilisation', 'wan_mbps_for_95pct_without_latency'}
# A metric of this page only (not of hfl.report): a table's ``equal_iterations`` = N
# gives each run its test accuracy after N iterations of the fastest DC.
runs_lib.METRICS.setdefault('acc_at_iters', 'fraction')


def load_spec(path: str):
  """Imports the claims spec (a Python file of data)."""
  spec = importlib.util.spec_from_file_location('_results_spec', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


# ------------------------------------------------------------------------------
# Loading: a table is the points of one sweep (optionally filtered), grouped up to seed.

class Point(NamedTuple):
  """One sweep point: its RunSpec, flattened config, status, loaded run and group."""
  spec: sweep_lib.RunSpec
  config: dict
  status: str
  run: runs_lib.Run | None
  group: str


class Table(NamedTuple):
  """A table of the page (see the spec's docstring).

  Attributes:
    spec: its entry in the spec.
    base: the sweep's base config, relative to the repository when inside it.
    points: its sweep points (those matching ``where``), in grid order.
    all_points: every point of its sweep.
    groups: group ids (the overrides without seed), baseline first.
    labels: group id -> label.
    flats: group id -> flattened config of its first point.
    base_gid: the baseline's group id (None when the sweep has none).
    frame: the finished runs (:func:`hfl.report.runs.run_frame`, column ``gid``).
    summary: :func:`hfl.report.stats.summarize` of ``frame`` by ``gid``.
    target: the runs' headline metric and its target (:class:`hfl.report.runs.Target`).
    extra: directories under the sweep root that are no point of the sweep.
    base_cfg: the sweep's base config, flattened (what the sweep file gives now).
    cache: paired statistics computed so far.
  """
  spec: dict
  base: str
  points: list
  all_points: list
  groups: list
  labels: dict
  flats: dict
  base_gid: str | None
  frame: pd.DataFrame
  summary: pd.DataFrame
  target: runs_lib.Target
  extra: list
  base_cfg: dict
  cache: dict


def _matches(flat: dict, want: dict) -> bool:
  return all(k in flat and (flat[k] == v or repr(flat[k]) == repr(v)) for k, v in want.items())


def _base_config(config_arg: str) -> dict:
  """The sweep's base config (its config file's ``get_config``), flattened as a run's."""
  path, _, arg = config_arg.partition(':')
  spec = importlib.util.spec_from_file_location('_results_base_config', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return runs_lib.flatten(json.loads(module.get_config(arg or None).to_json()))


def resolved(base_cfg: dict, overrides: dict) -> dict:
  """A point's flattened config as the sweep gives it now (an int for a float field
  becomes a float, as ``--config.KEY=VALUE`` makes it)."""
  out = dict(base_cfg)
  for k, v in overrides.items():
    is_int = isinstance(v, int) and not isinstance(v, bool)
    out[k] = float(v) if is_int and isinstance(out.get(k), float) else runs_lib.flatten({k: v})[k]
  return out


def _points(sweep_path: str, sweep_root: str) -> tuple[list, Any, str]:
  """The sweep's points (status, run, config), its base ConfigDict and config path."""
  base, grid = sweep_lib.load_sweep(sweep_path)
  config_arg = sweep_lib.resolve_base(base, sweep_root, write=False)
  base_cfg = _base_config(config_arg)
  out = []
  for spec in sweep_lib.make_runs(config_arg, grid, sweep_root):
    status, run = sweep_lib.run_status(spec.workdir), None
    if status != 'pending' and runs_lib.is_run_dir(spec.workdir):
      run = runs_lib.load_run(spec.workdir)
    flat = (runs_lib.flatten(run.config) if run and run.config
            else resolved(base_cfg, spec.overrides))
    gid = json.dumps(sorted((k, repr(v)) for k, v in spec.overrides.items() if k != 'seed'))
    out.append(Point(spec, flat, status if run or status == 'pending' else 'partial', run, gid))
  return out, base_cfg, config_arg


def _label(rules, flat: dict) -> str:
  """The template of the first label rule whose config values match (a string: the
  template itself)."""
  for want, template in ([({}, rules)] if isinstance(rules, str) else rules):
    if _matches(flat, want):
      return Template(flat).format(template)
  raise ValueError(f'no label rule of the results spec matches {flat.get("seed")=} and '
                   f'{rules}; end the list with a catch-all ({{}}, template)')


def acc_at_iterations(records: Sequence[dict], n: int) -> float | None:
  """Test accuracy after ``n`` iterations (``step``) of a run's evaluations,
  linearly interpolated between the two around it; None when no evaluation is at
  or after ``n`` (or none is at or before it)."""
  pts = [(r['step'], r['test_accuracy']) for r in records
         if isinstance(r.get('step'), int) and isinstance(r.get('test_accuracy'), float)]
  before = [p for p in pts if p[0] <= n]
  after = [p for p in pts if p[0] >= n]
  if not before or not after:
    return None
  (s0, a0), (s1, a1) = max(before), min(after)
  return a0 if s1 == s0 else a0 + (a1 - a0) * (n - s0) / (s1 - s0)


def load_table(spec: dict, root: str) -> Table:
  """Loads one table of the spec from ``ROOT/<spec['root']>``."""
  sweep_root = os.path.join(root, spec['root'])
  all_points, base_cfg, config_arg = _points(os.path.join(REPO, spec['sweep']), sweep_root)
  if spec.get('lan_recost'):  # the same runs on another LAN's clock (runs_lib.lan_recost),
    # less those whose clock another LAN changes in more than its bits' cost (e.g. CO3's
    # per-DC code lengths: runs_lib.lan_recost_problem)
    all_points = [p for p in all_points if not runs_lib.lan_recost_problem(p.config)]
    all_points = [p._replace(run=runs_lib.lan_recost(p.run, spec['lan_recost']))
                  if p.status == 'done' else p for p in all_points]
  known = {p.spec.name for p in all_points}
  points = [p for p in all_points if _matches(p.config, spec.get('where', {}))]
  firsts = {}
  for p in points:
    firsts.setdefault(p.group, p)
  labels = {g: _label(spec['labels'], p.config) for g, p in firsts.items()}
  base_gid = next((g for g, p in firsts.items() if _matches(p.config, spec['baseline'])), None)
  def order(g):  # baseline first, then by ``order_by`` (numbers, then text); else grid order
    v = firsts[g].config.get(spec['order_by']) if spec.get('order_by') else None
    return g != base_gid, v is None, v if isinstance(v, (int, float)) else 0, str(v)
  groups = sorted(firsts, key=order)  # stable
  done = [p for p in points if p.status == 'done']
  targets = list(dict.fromkeys(runs_lib.target_of(p.config) for p in points))
  targets = targets or [runs_lib.Target('test_accuracy', True, 0.88)]
  if len(targets) > 1:
    logging.warning('%s: runs disagree on the target %s; using %s', spec['name'],
                    targets, targets[0])
  frame = runs_lib.run_frame([p.run for p in done], targets[0].value)
  frame['gid'] = [p.group for p in done]
  if spec.get('equal_iterations'):
    frame['acc_at_iters'] = [acc_at_iterations(p.run.metrics, spec['equal_iterations'])
                             for p in done]
  summary = stats.summarize(frame, frame['gid']) if len(frame) else pd.DataFrame()
  extra = sorted(d for d in (os.listdir(sweep_root) if os.path.isdir(sweep_root) else ())
                 if os.path.isdir(os.path.join(sweep_root, d)) and d != sweep_lib.REPORT_DIR
                 and d not in known)
  rel = os.path.relpath(config_arg, REPO)
  return Table(spec, config_arg if rel.startswith('..') else rel, points, all_points, groups,
               labels, {g: p.config for g, p in firsts.items()}, base_gid, frame, summary,
               targets[0], extra, base_cfg, {})


# ------------------------------------------------------------------------------
# Numbers and cells of a table row (a group).

class Template(string.Formatter):
  """``str.format`` over a flattened config and named extras (``{sync.k}``, ``{x:pct}``)."""

  def __init__(self, flat: dict, **extras):
    super().__init__()
    self.flat, self.extras = flat, extras

  def format(self, format_string, /, *args, **kwargs):  # pylint: disable=arguments-differ
    return self.vformat(format_string, args, kwargs)

  def get_field(self, field_name, args, kwargs):
    for d in (self.extras, self.flat):
      if field_name in d:
        return d[field_name], field_name
    raise KeyError(f'unknown field {{{field_name}}} in a template of the results spec')

  def format_field(self, value, format_spec):
    if format_spec == 'pct':
      return f'{100 * float(value):.3g}%'
    return format(value, format_spec)


def done(t: Table, gid: str) -> bool:
  """True when the group has a finished run."""
  return gid in t.summary.index


def metric_stat(t: Table, gid: str, metric: str) -> stats.Stat:
  return stats.group_stat(t.summary, gid, metric) if done(t, gid) else stats.Stat(None, None, 0)


def _scale(metric: str) -> float:
  """Δ of a fraction (accuracy) in pts; of any other metric in its own unit."""
  return 100.0 if runs_lib.METRICS[metric] == 'fraction' else 1.0


# Expression kinds compared seed by seed with the baseline run of the same seed
# (hfl.report.stats.compare): their values are means over the paired seeds.
PER_SEED = {'paired': 'delta', 'reduction': 'reduction', 'saved': 'reduction',
            'factor': 'factor', 'change': 'change'}


def paired(t: Table, gid: str, metric: str, kind: str = 'delta') -> tuple[stats.Stat, dict]:
  """The group's per-seed comparison with the baseline run of the same seed (``kind``
  of :func:`hfl.report.stats.compare`; a Δ in pts for accuracies): its Stat over the
  seeds both have, and the per-seed values."""
  if t.base_gid is None or gid == t.base_gid or not done(t, gid) or not done(t, t.base_gid):
    return stats.Stat(None, None, 0), {}
  if (gid, metric, kind) not in t.cache:
    t.cache[gid, metric, kind] = stats.paired(t.frame, t.frame['gid'], gid, t.base_gid, metric,
                                              _scale(metric), kind=kind)
  return t.cache[gid, metric, kind]


def seed_stat(t: Table, gid: str, expr: str) -> stats.Stat:
  """The per-seed Stat of an expression a verdict judges: ``paired``, ``reduction``,
  ``saved``, ``factor`` and ``change`` per seed, ``delta`` as its paired Δ."""
  kind, _, metric = expr.partition(':')
  return paired(t, gid, metric, PER_SEED.get(kind, 'delta'))[0]


def number(t: Table, gid: str, expr: str) -> float | None:
  """The value of an expression for one group (see the spec's docstring): reductions,
  factors and relative changes are means over the seeds paired with the baseline."""
  kind, _, metric = expr.partition(':') if ':' in expr else ('metric', '', expr)
  ours = metric_stat(t, gid, metric).mean
  if kind == 'metric':
    return ours
  if kind not in PER_SEED and kind not in ('delta', 'bits'):
    raise ValueError(f'unknown expression {expr!r} in the results spec')
  if kind in PER_SEED:
    st = seed_stat(t, gid, expr)
    if st.n == 0 and kind == 'factor' and ours and none_suffices(t, t.base_gid, metric):
      return math.inf  # the baseline needs more than any value (bandwidth) gives
    return st.mean
  base = metric_stat(t, t.base_gid, metric).mean if t.base_gid else None
  if ours is None or base is None or (gid == t.base_gid and kind != 'bits'):
    return None
  if kind == 'delta':
    return _scale(metric) * (ours - base)
  return 32.0 * ours / base if base > 0 else None


def none_suffices(t: Table, gid: str | None, metric: str) -> bool:
  """The group has finished runs and ``metric`` (of :data:`NONE_SUFFICES`) is null in all."""
  return (metric in NONE_SUFFICES and gid is not None and done(t, gid)
          and metric_stat(t, gid, metric).n == 0)


def better(expr: str) -> int:
  """+1 when a larger value of ``expr`` is better, −1 when a smaller one is: reductions
  and factors are savings (+1), bits per entry a cost (−1); a metric, its Δ and its
  relative change follow the metric (:func:`hfl.report.runs.higher_is_better`)."""
  kind, _, metric = expr.partition(':') if ':' in expr else ('metric', '', expr)
  if kind in ('reduction', 'saved', 'factor', 'bits'):
    return -1 if kind == 'bits' else 1
  return 1 if runs_lib.higher_is_better(metric) else -1


def fmt_number(expr: str, x: float | None) -> str:
  """A number of :func:`number` as printed."""
  kind, _, metric = expr.partition(':') if ':' in expr else ('metric', '', expr)
  if x is None:
    return '–'
  if kind in ('delta', 'paired'):
    return tables_lib.fmt_points(x, unit=runs_lib.METRICS[metric])
  if kind == 'change':
    return f'{100 * x:+.2f}%'.replace('-', '−')
  if kind == 'reduction':
    return tables_lib.fmt_pct(x)
  if kind == 'factor':
    return tables_lib.fmt_factor(x)
  if kind == 'bits':
    return f'{x:.2f}'
  if kind == 'saved':
    return tables_lib.fmt_pct(x, 2)
  return tables_lib.fmt_stat(stats.Stat(x, None, 1), runs_lib.METRICS[metric])


def fmt_spread(expr: str, x: float) -> str:
  """A standard error or std of an expression's value, unsigned, in its unit."""
  kind, _, metric = expr.partition(':')
  if kind in ('delta', 'paired'):
    return tables_lib.fmt_points(x, unit=runs_lib.METRICS[metric]).lstrip('+')
  if kind == 'factor':
    return tables_lib.fmt_factor(x)
  return tables_lib.fmt_pct(x, 2 if kind in ('saved', 'change') else 1)


def fmt_seeds(t: Table, gid: str, expr: str) -> str:
  """A per-seed expression's cell: the mean, ``± standard error`` over n ≥ 2 seeds and
  ``(n=…)`` when fewer seeds are paired than the row has finished."""
  st = seed_stat(t, gid, expr)
  x = number(t, gid, expr)
  if x is None or st.n == 0:
    return fmt_number(expr, x)
  s = fmt_number(expr, x)
  if st.sem:
    s += f' ± {fmt_spread(expr, st.sem)}'
  finished = sum(p.group == gid and p.status == 'done' for p in t.points)
  return s + (f' (n={st.n})' if st.n < finished else '')


def seeds_cell(t: Table, gid: str) -> str:
  """'0, 1, 2', or '0, 1 (2 of 3)' while seeds are missing."""
  pts = [p for p in t.points if p.group == gid]
  fin = [p.config.get('seed') for p in pts if p.status == 'done']
  s = ', '.join(map(str, fin))
  return s + (f' ({len(fin)} of {len(pts)})' if len(fin) < len(pts) else '')


def cell(t: Table, gid: str, expr: str) -> str:
  """One table cell."""
  kind, _, arg = expr.partition(':') if ':' in expr else (expr, '', '')
  flat = t.flats[gid]
  if kind == 'label':
    return t.labels[gid]
  if kind == 'seeds':
    return seeds_cell(t, gid)
  if kind == 'config':
    key, _, fmt = arg.partition(':')
    if tables_lib.unused_hyper(flat, key):
      return '–'
    return Template(flat).format(f'{{{key}:{fmt}}}')
  if kind == 'idle_s':
    run = next(p.run for p in t.points if p.group == gid and p.status == 'done')
    idle = run.summary.get('idle_s')
    return ' / '.join(f'{x:.1f}' for x in idle) if isinstance(idle, list) else '–'
  if kind in runs_lib.METRICS:
    if none_suffices(t, gid, kind):
      return 'none suffices'
    n = sum(p.group == gid and p.status == 'done' for p in t.points)
    return tables_lib.fmt_stat(metric_stat(t, gid, kind), runs_lib.METRICS[kind], n,
                               to_target='to_target' in kind)
  if gid == t.base_gid and kind != 'bits':
    return 'baseline'
  if kind == 'paired':
    st = paired(t, gid, arg)[0]
    return tables_lib.fmt_points(st.mean, st.std, st.n or None, runs_lib.METRICS[arg])
  if kind == 'saved':
    r, f = number(t, gid, expr), number(t, gid, f'factor:{arg}')
    return '–' if r is None else f'{fmt_seeds(t, gid, expr)} ({tables_lib.fmt_factor(f)})'
  if kind in ('reduction', 'factor', 'change'):
    return fmt_seeds(t, gid, expr)
  return fmt_number(expr, number(t, gid, expr))


def prose(t: Table, gid: str, expr: str) -> str:
  """An expression's value in a sentence, e.g. 'paired Δ −0.44 ± 0.24 pts (n=3, standard
  error 0.14 pts)'."""
  kind, _, metric = expr.partition(':') if ':' in expr else ('metric', '', expr)
  words = _WORDS.get(metric, metric)
  x = number(t, gid, expr)
  if kind == 'paired':
    st, unit = paired(t, gid, metric)[0], runs_lib.METRICS[metric]
    se = (f', standard error {tables_lib.fmt_points(st.sem, unit=unit).lstrip("+")}'
          if st.sem is not None else '')
    return f'paired Δ {tables_lib.fmt_points(st.mean, st.std, unit=unit)} (n={st.n}{se})'
  if kind == 'delta':
    return f'Δ of the seed means {fmt_number(expr, x)}'
  if kind in PER_SEED and x is not None and not math.isinf(x):
    st = seed_stat(t, gid, expr)
    se = f' (mean ± standard error over n={st.n} seeds)' if st.sem else f' (n={st.n})'
    shown = fmt_number(expr, x) + (f' ± {fmt_spread(expr, st.sem)}' if st.sem else '')
  else:
    se, shown = '', fmt_number(expr, x)
  if kind == 'change':
    return f'{words} {shown} relative to the baseline{se}'
  if kind == 'saved':
    f = tables_lib.fmt_factor(number(t, gid, 'factor:' + metric))
    return f'{shown} fewer {words} ({f}){se}'
  less = 'less' if any(w in words for w in ('bandwidth', 'time')) else 'fewer'
  if kind == 'factor':
    return f'{shown} {less} {words}{se}'
  if kind == 'reduction':
    return f'{shown} {less} {words}{se}'
  if kind == 'bits':
    return f'{fmt_number(expr, x)} bits per {words.replace(" bytes", "")} entry'
  return f'{words} {fmt_number(expr, x)}'


# ------------------------------------------------------------------------------
# Claims: pick a row, test a number.

MIN_SEEDS = 3  # default of the spec's MIN_SEEDS: paired seeds a verdict of "met" needs


class Judged(NamedTuple):
  """A claim evaluated: the row it picked, its number and the verdict.

  ``status``: ``met``, ``not met``, ``provisional`` (fewer than MIN_SEEDS paired seeds),
  ``not judged`` (no meaningful baseline, with the reason), ``not measured``, or ``''``
  for a reading without a verdict; ``met`` is True / False for the first two, else None.
  """
  claim: dict
  row: tuple | None
  value: float | None
  met: bool | None
  ours: str
  verdict: str
  status: str = ''


class Assessment(NamedTuple):
  """One row's number against one rule (:func:`assess`)."""
  status: str  # met, not met, provisional, not judged, not measured
  text: str
  mean_passes: bool  # the rule holds for the mean (what a provisional row would say)


def _rule(text: str) -> tuple[str, str, float]:
  m = re.fullmatch(r'\s*(\S+?)?\s*(>=|<=|>|<)\s*(-?[\d.]+)\s*', text)
  if not m:
    raise ValueError(f'bad rule {text!r} in the results spec: expected "[EXPR] OP NUMBER"')
  return m.group(1), m.group(2), float(m.group(3))


def _name(expr: str) -> str:
  return {'paired': 'paired Δ', 'delta': 'paired Δ', 'factor': 'factor',
          'reduction': 'reduction', 'saved': 'reduction', 'bits': 'bits per entry',
          'change': 'relative change'}.get(expr.partition(':')[0], expr)


def _bound(expr: str, op: str, threshold: float) -> str:
  """'paired Δ ≥ −0.50 pts'."""
  return f'{_name(expr)} {_OPS[op][1]} {fmt_number(expr, threshold)}'


def baseline_problem(t: Table, expr: str) -> str | None:
  """Why a factor, reduction or relative change of ``expr`` cannot be judged against the
  table's baseline (missing, zero or infinite), or None when it can."""
  kind, _, metric = expr.partition(':')
  if kind not in ('factor', 'reduction', 'saved', 'change'):
    return None
  words = _WORDS.get(metric, metric)
  if t.base_gid is None or not done(t, t.base_gid):
    return 'the baseline has no finished run'
  label = t.labels[t.base_gid]
  if none_suffices(t, t.base_gid, metric):
    return (f'the baseline ({label}) has no finite {words}: no value suffices in any of its '
            f'runs, so any finite value would be an infinite {_name(expr)}')
  base = metric_stat(t, t.base_gid, metric)
  if base.mean is None:
    return f'the baseline ({label}) has no {words} (e.g. never reached the target)'
  if base.mean == 0:
    return f'the baseline ({label}) has 0 {words}'
  return None


def assess(t: Table, gid: str, expr: str, op: str, threshold: float,
           min_seeds: int = MIN_SEEDS) -> Assessment:
  """One row's per-seed ``expr`` (:func:`seed_stat`) against ``OP threshold``.

  The rule of the page: *met* needs at least ``min_seeds`` seeds paired with the
  baseline, and the end of mean ± one standard error on the unfavourable side (mean −
  SE for a lower bound, mean + SE for an upper bound) satisfying the rule; with fewer
  seeds the row is *provisional*, whatever its mean; a factor, reduction or relative
  change whose baseline is missing, zero or infinite is *not judged*.
  """
  problem = baseline_problem(t, expr)
  if problem:
    return Assessment('not judged', f'not judged: {problem}', False)
  st = seed_stat(t, gid, expr)
  if st.n == 0:
    return Assessment('not measured', 'not measured (no seed finished both here and in '
                      'the baseline)', False)
  ok, sym = _OPS[op][0], lambda good: _OPS[op][1] if good else _NOT[op]
  mean_ok = ok(st.mean, threshold)
  if st.n < min_seeds:
    return Assessment('provisional', f'provisional (n={st.n}; a verdict needs n ≥ {min_seeds} '
                      f'paired seeds): {_name(expr)} {fmt_number(expr, st.mean)} '
                      f'{sym(mean_ok)} {fmt_number(expr, threshold)}', mean_ok)
  lower = op in ('>=', '>')
  end = st.mean - st.sem if lower else st.mean + st.sem
  met = ok(end, threshold)
  spread = (f' ± {fmt_spread(expr, st.sem)} (± standard error), mean {"−" if lower else "+"} '
            f'SE {fmt_number(expr, end)}' if st.sem else ' (standard error 0)')
  return Assessment('met' if met else 'not met', f'{"met" if met else "not met"} (n={st.n}): '
                    f'{_name(expr)} {fmt_number(expr, st.mean)}{spread} {sym(met)} '
                    f'{fmt_number(expr, threshold)}', mean_ok)


def judge(claim: dict, by_name: dict, min_seeds: int = MIN_SEEDS) -> Judged:
  """Evaluates one claim or reading (see the spec's docstring).

  A ``require`` selects among the rows that meet it by :func:`assess`'s rule; when none
  does but some would on their mean with fewer than ``min_seeds`` seeds, among those,
  and the verdict is then provisional at best. ``pick`` takes the best of the selected
  rows; ``verdict`` is judged on it by :func:`assess`.
  """
  value = claim['value']
  rows = [(t, g) for t in (by_name[n] for n in claim['tables']) for g in t.groups
          if g != t.base_gid and done(t, g) and _matches(t.flats[g], claim.get('rows', {}))]
  measured = [r for r in rows if number(*r, value) is not None]
  passing, provisional = measured, False
  if claim.get('require'):
    rexpr, rop, rthr = _rule(claim['require'])
    other = by_name[claim['require_table']] if claim.get('require_table') else None
    at = lambda r: r if other is None else (other, r[1])  # the same point, other baseline
    if other is not None:
      measured = [r for r in measured if r[1] in other.groups and r[1] != other.base_gid]
    checks = [assess(*at(r), rexpr, rop, rthr, min_seeds) for r in measured]
    passing = [r for r, a in zip(measured, checks) if a.status == 'met']
    if not passing:
      passing = [r for r, a in zip(measured, checks) if a.status == 'provisional'
                 and a.mean_passes]
      provisional = bool(passing)
  pick = claim.get('pick', value)
  cands = [r for r in passing if number(*r, pick) is not None]
  if not measured or (not cands and not claim.get('require')):
    return Judged(claim, None, None, None, '–', 'not measured (no finished row with a '
                  'finished baseline of the same seed)', 'not measured')
  if not cands:  # closest to passing by the same rule: the unfavourable end of mean ± SE
    sign = 1 if rop in ('>=', '>') else -1
    def end(r):
      st = seed_stat(*at(r), rexpr)
      return -math.inf if st.mean is None else sign * st.mean - (st.sem or 0.0)
    closest = max(measured, key=end)
    return Judged(claim, None, None, False, f'none (closest: {_row_name(closest, claim)}, '
                  f'{prose(*at(closest), rexpr)})', f'not met: no row with {_require_text(claim)} '
                  f'by mean ± standard error over ≥ {min_seeds} seeds', 'not met')
  row = max(cands, key=lambda r: better(pick) * number(*r, pick))  # the best by ``pick``
  x = number(*row, value)
  first = prose(*row, value) if value.partition(':')[0] in PER_SEED else fmt_number(value, x)
  ours = first + ''.join(f', {prose(*row, e)}' for e in claim.get('show', ())
                                        if e != value) + f' ({_row_name(row, claim)})'
  chosen = (f'provisional: no row has {_require_text(claim)} by mean ± standard error over '
            f'≥ {min_seeds} seeds; chosen among rows with fewer seeds') if provisional else ''
  if not claim.get('verdict'):
    return Judged(claim, row, x, None, ours, chosen, 'provisional' if provisional else '')
  _, op, thr = _rule(claim['verdict'])
  a = assess(*row, value, op, thr, min_seeds)
  status, verdict = a.status, a.text
  if provisional and status in ('met', 'not met'):  # (a provisional a.text says its n)
    status, verdict = 'provisional', f'{chosen}; {a.text}'
  return Judged(claim, row, x, {'met': True, 'not met': False}.get(status), ours, verdict, status)


def _row_name(row, claim) -> str:
  t, g = row
  tag = t.spec.get('tag')
  return t.labels[g] + (f', {tag}' if tag and len(claim['tables']) > 1 else '')


def _require_text(claim) -> str:
  return _bound(*_rule(claim['require']))


# ------------------------------------------------------------------------------
# Rendering.

def extras(t: Table, spec_module, published: dict) -> dict:
  """The named fields of templates for one table."""
  c = t.flats[t.groups[0]] if t.groups else {}
  part = c.get('dataset.partition')
  lan = c.get('network.lan_bandwidth_gbps')
  return dict(
      baseline=t.labels.get(t.base_gid, 'missing'), bar=f'{spec_module.BAR:g}',
      loss_bar=f'{getattr(spec_module, "LOSS_BAR", 0.05):g}',
      target=_target_value(t.target), lan=_lan(lan),
      partition={'iid': 'IID', 'dirichlet': 'non-IID (Dirichlet α = '
                 f'{c.get("dataset.dirichlet_alpha")})'}.get(part, f'`{part}`'),
      **{f'@{k}': v for k, v in published.items()})


def _target_value(target: runs_lib.Target) -> str:
  """'88.00%' or '1.70 nats/char'."""
  return (tables_lib.fmt_acc(target.value) if target.higher_is_better
          else f'{target.value:g} nats/char')


def _lan(gbps) -> str:
  if gbps is None:
    return '?'
  return f'{float(gbps):g} Gbit/s' if float(gbps) >= 1 else f'{1000 * float(gbps):g} Mbit/s'


def text(t: Table, template: str, ctx: dict) -> str:
  return Template(t.flats[t.groups[0]] if t.groups else {}, **ctx).format(template)


def table_lines(t: Table, ctx: dict) -> list[str]:
  """The Markdown table: finished groups in full, the others as *not finished*."""
  header = [text(t, h, ctx) for h, _ in t.spec['columns']]
  rows = []
  for g in t.groups:
    if done(t, g):
      rows.append([cell(t, g, e) for _, e in t.spec['columns']])
    else:
      rows.append([t.labels[g], '*not finished*'] + ['–'] * (len(header) - 2))
  return tables_lib.markdown_table(header, rows)


def run_label(t: Table, p: Point, all_points: bool = False) -> str:
  """A run's label: its group's, plus the table's tag and the seed when seeds vary.

  With ``all_points`` the point may lie outside the table's ``where``: its
  label then names the setting that puts it there (the LAN, say).
  """
  pts = t.all_points if all_points else t.points
  seeds = {q.config.get('seed') for q in pts}
  label = (t.labels[p.group] if p.group in t.labels else _label(t.spec['labels'], p.config)
           + _where_suffix(t, p))
  # The tag describes the table's ``where``: a point outside it is named by its setting alone.
  tagged = t.spec.get('tag') and _matches(p.config, t.spec.get('where', {}))
  return (label + (f', {t.spec["tag"]}' if tagged else '')
          + (f', seed {p.config.get("seed")}' if len(seeds) > 1 else ''))


def _where_suffix(t: Table, p: Point) -> str:
  return ''.join(f', {tables_lib.short_key(k)}={p.config.get(k)}' for k in t.spec.get('where', {}))


def settings_lines(t: Table, root_display: str) -> list[str]:
  """The exact settings and commands of a table's runs, as Markdown bullets."""
  c = t.all_points[0].config
  flats = [p.config for p in t.all_points]
  shared = set.intersection(*(set(f) for f in flats))
  varying = sorted(k for k in shared if k not in stats.IGNORED
                   and len({repr(f[k]) for f in flats}) > 1)
  ov = [p.spec.overrides for p in t.all_points]
  common = {k: v for k, v in ov[0].items() if k not in varying
            and all(k in o and repr(o[k]) == repr(v) for o in ov)}
  seeds = list(dict.fromkeys(f.get('seed') for f in flats))
  lans = list(dict.fromkeys(f.get('network.lan_bandwidth_gbps') for f in flats))
  sweep_root = f'{root_display.rstrip("/")}/{t.spec["root"]}'
  g = lambda k: c.get(k)
  shown = lambda k, fmt='{}': 'per run' if k in varying else fmt.format(c.get(k))
  lines = [
      f'- **Config**: `{t.base}` (sweep file `{t.spec["sweep"]}`); overrides common to all '
      'runs: ' + (', '.join(f'`{k}={sweep_lib.flag_value(v)}`' for k, v in sorted(common.items()))
                  or 'none') + '; per run: '
      + (', '.join(f'`{k}`' for k in varying + (['seed'] if len(seeds) > 1 else [])) or 'none')
      + ' (see the table and the commands below).',
      '- **Steps**: ' + (f'until the simulated clock reaches `train.sim_time_budget_s` = '
                         f'{g("train.sim_time_budget_s"):g} s (hfl.budget)'
                         if g('train.sim_time_budget_s') else
                         f'until all DCs together have processed `train.sample_budget` = '
                         f'{g("train.sample_budget"):,} training samples (hfl.budget)'
                         if g('train.sample_budget') else
                         f'`train.num_steps` = {g("train.num_steps")} intra-DC iterations (of '
                         'the fastest DC)')
      + f', batch {g("train.batch_size")} per worker, evaluation every '
      f'`train.eval_every` inter-DC rounds; target: {tables_lib.fmt_target(t.target)} (`train.'
      + ('target_accuracy' if t.target.higher_is_better else 'target_loss') + '`).',
      f'- **Mesh**: {g("mesh.num_dcs")} DCs × {g("mesh.workers_per_dc")} workers per DC; data '
      f'`{g("dataset.name")}`, partition `{g("dataset.partition")}`'
      + (f' (Dirichlet α = {g("dataset.dirichlet_alpha")})'
         if g('dataset.partition') == 'dirichlet' else '')
      + f'; model {shown("model.name", "`{}`")}; optimizer {shown("optimizer.name", "`{}`")} (lr '
      f'{shown("optimizer.learning_rate")}); '
      + (f'seeds {", ".join(map(str, seeds))} (per run)' if len(seeds) > 1 else f'seed {seeds[0]}')
      + '; sync ' + ('strategy per run' if 'sync.strategy' in varying
                     else f'`{g("sync.strategy")}`')
      + f', K = {shown("sync.k")}, K_max = {shown("sync.k_max")}, aggregation '
      f'{shown("sync.aggregation", "`{}`")}, outer {shown("sync.outer.name", "`{}`")}.',
      f'- **Network**: compute {g("network.compute_time_s")} s per iteration at speed 1, DC '
      f'speeds {", ".join(f"{float(s):g}" for s in g("network.dc_speed") or ())} (relative); '
      f'LAN (PS NIC) {" / ".join(_lan(x) for x in lans)}, latency {g("network.lan_latency_s")} '
      f's; WAN {g("network.wan_bandwidth_mbps")} Mbit/s per DC, latency '
      f'{g("network.wan_latency_s")} s.',
      f'- **Command**: `python3 -m hfl.sweep --sweep={t.spec["sweep"]} --root={sweep_root}` '
      f'(run by `{COMMAND} --root={root_display}`); one run per point:',
      '', '  <details><summary>per-run commands</summary>', '']
  for p in t.all_points:
    cmd = shlex.join(['python3', 'main.py', f'--config={t.base}',
                      f'--workdir={sweep_root}/{p.spec.name}']
                     + [f'--config.{k}={sweep_lib.flag_value(v)}'
                        for k, v in p.spec.overrides.items()])
    lines.append(f'  - {run_label(t, p, all_points=True)}: `{cmd.strip()}`')
  return lines + ['', '  </details>', '']


def progress(t: Table, p: Point) -> str:
  """'not started' or 'running or interrupted: step 120/600, ...'."""
  if p.status == 'pending':
    return 'not started'
  m = p.run.metrics if p.run else []
  steps = p.config.get('train.num_steps')
  if not m:
    return f'running or interrupted: no evaluation yet (of {steps} steps)'
  loss = m[-1].get('test_loss')
  last = (f'last test accuracy {tables_lib.fmt_acc(m[-1].get("test_accuracy"))}'
          if t.target.higher_is_better else
          f'last validation loss {"–" if loss is None else f"{loss:.3f} nats/char"}')
  return (f'running or interrupted: step {m[-1].get("step")}/{steps}, round '
          f'{m[-1].get("round")}, {last}')


def missing_lines(t: Table, root_display: str) -> list[str]:
  """The unfinished runs, and directories under the sweep root that are no point."""
  miss = [p for p in t.points if p.status != 'done']
  lines = []
  if miss:
    lines += ['', f'**Missing runs ({len(miss)})** — not finished (no `summary.json`), so not '
              'in the numbers above:', '']
    lines += [f'- {run_label(t, p)}: {progress(t, p)} (`{root_display.rstrip("/")}/'
              f'{t.spec["root"]}/{p.spec.name}`)' for p in miss]
  if t.extra:
    lines += ['', 'Workdirs under the sweep root that are not points of the sweep (ignored): '
              + ', '.join(f'`{x}`' for x in t.extra)]
  return lines


def paired_list_lines(t: Table, spec: dict, bar: float, ctx: dict,
                      min_seeds: int = MIN_SEEDS) -> list[str]:
  """Per non-baseline row: its paired Δ against the bar (``spec['bar']``, default ``bar``,
  in the Δ's unit: Δ ≥ −bar when higher is better, Δ ≤ +bar for a loss) by the page's
  rule (:func:`assess`: ✓ met, ✗ not met, ? provisional), paired Δ ± std (n) and seeds."""
  lines = ['', text(t, spec['title'], ctx) + ' — ✓ by the verdict rule (mean ∓ one standard '
           f'error within the bar, n ≥ {min_seeds}), ✗ not, ? fewer seeds:', '']
  metric = spec.get('metric', 'final_acc')
  unit, edge = runs_lib.METRICS[metric], -better(metric) * spec.get('bar', bar)
  op = '>=' if better(metric) > 0 else '<='
  for g in t.groups:
    if g == t.base_gid:
      continue
    name = _label(spec['name'], t.flats[g])
    st, per_seed = paired(t, g, metric)
    if st.mean is None:
      lines.append(f'- {name}: not measured yet')
      continue
    a = assess(t, g, f'paired:{metric}', op, edge, min_seeds)
    total = sum(p.group == g for p in t.points)
    s = ({'met': '✓', 'not met': '✗'}.get(a.status, '?')
         + f' {name}: {tables_lib.fmt_points(st.mean, st.std, st.n, unit)}')
    s += f', {st.n} of {total} seeds' if st.n < total else ''
    if len(per_seed) > 1:
      s += ' — per seed: ' + ', '.join(f'{k}: {tables_lib.fmt_points(v, unit=unit)}'
                                       for k, v in per_seed.items())
    lines.append('- ' + s + f' — {a.text}')
  return lines


def same_as_lines(t: Table, spec: dict, by_name: dict) -> list[str]:
  """Checks that a metric equals that of the twin run (same overrides but one key) elsewhere."""
  other, key, metric = by_name[spec['table']], spec['differ_in'], spec['metric']
  strip = lambda p: json.dumps(sorted((k, repr(v)) for k, v in p.spec.overrides.items()
                                      if k != key))
  twins = {strip(p): p for p in other.points if p.status == 'done'}
  same, diff = [], []
  for p in t.points:
    q = twins.get(strip(p))
    if p.status != 'done' or q is None:
      continue
    a, b = (runs_lib.run_metrics(r.run, t.target.value)[metric] for r in (p, q))
    (same if a == b else diff).append((run_label(t, p), _scale(metric) * (a - b)))
  if diff:
    unit = runs_lib.METRICS[metric]
    return ['', f'- ⚠ {_WORDS.get(metric, metric).capitalize()} differs from the same run in '
            f'the table above ({key} aside): ' + ', '.join(
                f'{l}: {tables_lib.fmt_points(d, unit=unit)}' for l, d in diff)
            + '; the runs were not trained identically (e.g. by different code versions).']
  if same:
    return ['', f'- {_WORDS.get(metric, metric).capitalize()} equals that of the same run in '
            f'the table above for every run here: {spec["text"]}.']
  return []


def _sections(keys: list, have) -> tuple:
  """Dotted config keys, a section the run's config lacks entirely named once as
  ``section.*`` (e.g. ``compression.dgc.*`` for all of its fields), in order."""
  out = []
  for k in keys:
    parts = k.split('.')
    name = k
    for i in range(1, len(parts) - 1):
      prefix = '.'.join(parts[:i + 1])
      if not any(h.startswith(prefix + '.') for h in have):
        name = prefix + '.*'
        break
    if name not in out:
      out.append(name)
  return tuple(out)


def drift_notes(t: Table) -> list[str]:
  """Finished runs trained with another config than the sweep file gives now, as notes."""
  notes, absent = [], {}
  for p in t.points:
    if p.status != 'done':
      continue
    want, have = resolved(t.base_cfg, p.spec.overrides), p.config
    added = _sections(sorted(k for k in set(want) - set(have) if k != 'workdir'), have)
    diff = sorted(k for k in set(want) & set(have) if k != 'workdir'
                  and repr(want[k]) != repr(have[k]))
    if diff:
      notes.append(f'- ⚠ `{p.spec.name}` ({run_label(t, p)}) was trained with a config that '
                   'differs from what the sweep file gives now at ' + ', '.join(
                       f'`{k}` (ran {have[k]!r}, now {want[k]!r})' for k in diff[:8])
                   + (' …' if len(diff) > 8 else '') + '; its numbers are for the config it '
                   'ran with.')
    if added:
      absent.setdefault(added, []).append(run_label(t, p))
  for keys, labels in absent.items():
    many = len(labels) > 1
    notes.append(f'- {len(labels)} run{"s" if many else ""} {"predate" if many else "predates"} '
                 'config fields added to hfl later (absent from '
                 f'{"their" if many else "its"} `config.json`; trained by the code of that '
                 'time): ' + ', '.join(f'`{k}`' for k in keys) + ' — ' + '; '.join(labels) + '.')
  return notes


def commits(points: Sequence[Point]) -> tuple[dict, int]:
  """({short commit (+ '-dirty'): finished runs trained (in part) at it}, runs without a
  provenance record) over finished ``points``, each run counted once per commit of its
  starts (``summary.json``'s ``provenance``, :mod:`hfl.provenance`)."""
  seen, unknown = {}, 0
  for p in points:
    if p.status != 'done':
      continue
    entries = p.run.summary.get('provenance') or []
    if not entries:
      unknown += 1
    for c in dict.fromkeys((e.get('git_commit') or 'unknown')[:7] + ('-dirty' if e.get('git_dirty')
                                                                      else '') for e in entries):
      seen[c] = seen.get(c, 0) + 1
  return seen, unknown


def commits_text(points: Sequence[Point]) -> str | None:
  """'`abc1234` (10 runs), `def5678` (2 runs); not recorded for 5 runs (...)' over the
  finished ``points``; None when none has finished."""
  seen, unknown = commits(points)
  if not seen and not unknown:
    return None
  parts = [f'`{c}` ({n} run{"s" if n > 1 else ""})' for c, n in seen.items()]
  if unknown:
    parts.append(f'not recorded for {unknown} run{"s" if unknown > 1 else ""} (trained before '
                 'summary.json recorded its provenance)')
  return '; '.join(parts)


def commits_note(points: Sequence[Point]) -> str | None:
  """A section's note naming the commits its finished runs were trained at."""
  text_ = commits_text(points)
  return text_ and f'- Code: the commits this section\'s finished runs were trained at: {text_}.'


def steps_notes(t: Table) -> list[str]:
  """Finished runs with another number of intra-DC iterations than the baseline's first run."""
  base = next((p for p in t.points if p.group == t.base_gid and p.status == 'done'), None)
  budget = base and base.run.summary.get('config', {}).get('train', {}).get('sample_budget')
  if base is None or t.spec.get('equal_time') or budget:  # equal time or work: iterations
    return []                                              # differ by design
  steps = lambda p: p.run.summary.get('intra_dc_iterations')
  return [f'- ⚠ `{run_label(t, p)}` ran {steps(p)} intra-DC iterations, the baseline '
          f'{steps(base)}: its byte ratios and Δ compare unequal amounts of training.'
          for p in t.points if p.status == 'done' and steps(p) != steps(base)]


def _min_seeds(spec_module) -> int:
  return getattr(spec_module, 'MIN_SEEDS', MIN_SEEDS)


def claims_table(judged: Sequence[Judged], sources: dict) -> list[str]:
  """The published-vs-ours table."""
  rows = [[sources[j.claim['source']]['short'], j.claim['where'], j.claim['quantity'],
           j.claim['published'], j.ours, j.verdict] for j in judged]
  return tables_lib.markdown_table(('source', 'where in the source', 'claim', 'published', 'ours',
                           'verdict'), rows)


def reading_line(j: Judged, t: Table, ctx: dict) -> str:
  """A bold headline sentence: the row a claim or reading picked, its numbers and verdict."""
  head = f'**{text(t, j.claim["reading"], ctx)}**: '
  if j.row is None:
    return head + (j.ours if j.met is False else 'not measured yet') + (
        f' — {j.verdict}' if j.met is False else '') + '.'
  rt, g = j.row
  shown = [e for e in j.claim.get('show', ()) if e != j.claim['value']]
  body = '; '.join(prose(rt, g, e) for e in [j.claim['value']] + shown)
  return head + f'**{rt.labels[g]}**: {body}' + (f' — {j.verdict}' if j.verdict else '') + '.'


def table_block(t: Table, sec: dict, spec_module, ctx: dict, by_name: dict, root_display: str,
                first_of_sweep: bool) -> list[str]:
  """Heading, settings, table, checks, readings and missing runs of one table.

  The settings and commands of a sweep are printed once, before its first
  table: after a ``###`` heading (which opens a sub-section), before any other.
  """
  heading = [text(t, t.spec['heading'], ctx), ''] if t.spec.get('heading') else []
  settings = settings_lines(t, root_display) if first_of_sweep else []
  opens = t.spec.get('heading', '').startswith('#')
  lines = heading + settings if opens else settings + heading
  lines += table_lines(t, ctx)
  if t.spec.get('same_as'):
    lines += same_as_lines(t, t.spec['same_as'], by_name)
  for c in sec.get('readings', []) + sec['claims']:
    if c.get('reading') and c['tables'][0] == t.spec['name']:
      lines += ['', reading_line(judge(c, by_name, _min_seeds(spec_module)), t, ctx)]
  if t.spec.get('paired_list'):
    lines += paired_list_lines(t, t.spec['paired_list'], spec_module.BAR, ctx,
                               _min_seeds(spec_module))
  if t.base_gid is not None and not done(t, t.base_gid):
    lines.append(f'- ⚠ the baseline ({t.labels[t.base_gid]}) has not finished: no Δ, ratios '
                 'or reductions yet')
  return lines + missing_lines(t if first_of_sweep else t._replace(extra=[]), root_display) + ['']


class Section(NamedTuple):
  """A rendered section: its Markdown, judged claims and plot lines."""
  key: str
  markdown: str
  judged: list
  tables: list


def section(sec: dict, by_name: dict, spec_module, published: dict, root_display: str,
            seen_roots: set) -> Section:
  """Renders one section of the spec."""
  ts = [by_name[t['name']] for t in sec['tables']]
  ctx = extras(ts[0], spec_module, published)
  lines = [f'## {sec["title"]}', '', text(ts[0], sec['intro'], ctx), '']
  for t in ts:
    first = t.spec['root'] not in seen_roots
    seen_roots.add(t.spec['root'])
    lines += table_block(t, sec, spec_module, extras(t, spec_module, published), by_name,
                         root_display, first)
  judged = [judge(c, by_name, _min_seeds(spec_module)) for c in sec['claims']]
  if judged:  # a section of readings only has no published-vs-ours table
    lines += [f'**Published vs ours** {sec.get("claims_caption", "")}:'.replace(' :', ':'), '']
    lines += claims_table(judged, spec_module.SOURCES)
  notes = [f'- {text(ts[0], n, ctx)}' for n in sec.get('notes', [])]
  for status in ('not met', 'provisional', 'not judged'):
    notes += [f'- {status.capitalize()}: {spec_module.SOURCES[j.claim["source"]]["short"]}, '
              f'{j.claim["quantity"]} — {j.verdict}.' for j in judged if j.status == status]
  for t in ts:
    notes += steps_notes(t) + drift_notes(t)
  note = commits_note(list({p.spec.workdir: p for t in ts for p in t.points}.values()))
  notes += [note] if note else []
  lines += ['', 'Notes:', ''] + notes
  return Section(sec['key'], '\n'.join(lines) + '\n', judged, ts)


def section_plots(sec: dict, by_name: dict, plot_dir: str) -> list[str]:
  """The section's accuracy curves and, if asked, its accuracy-vs-factor figure."""
  spec = sec.get('plots')
  if not spec:
    return []
  panels = []  # one per table: each comparison against its own baseline
  for name in spec['tables']:
    t = by_name[name]
    curves = [plots.Curves(t.labels[g], runs) for g in t.groups
              if (runs := [p.run.metrics for p in t.points if p.group == g and p.status == 'done'])]
    if curves:
      base = f'vs {t.labels[t.base_gid]}' if t.base_gid is not None else ''
      panels.append((', '.join(x for x in (t.spec.get('tag') or t.spec['name'], base) if x),
                     curves))
  if not panels:
    return []
  target = by_name[spec['tables'][0]].target
  axes = [plots.AXIS_BY_KEY[k] for k in spec['axes']] if spec.get('axes') else plots.AXES
  written = plots.write_plots([], plot_dir, target.value, prefix=f'{sec["key"]}_',
                              title=spec['title'], y=plots.y_axis(target.metric), axes=axes,
                              panels=panels)
  factors = spec.get('factor') or []
  for f in [factors] if isinstance(factors, dict) else factors:  # one spec or a list
    path = factor_plot(by_name[f['table']], f,
                       os.path.join(plot_dir, f'{sec["key"]}_{f.get("file", "accuracy_vs_ratio")}.png'))
    written += [path] if path else []
  return written


def factor_plot(t: Table, spec: dict, path: str) -> str | None:
  """The final metric (accuracy, or the LM's loss) and its paired Δ against the
  compression factor of a table's rows; the bar is ``spec['bar']`` in Δ units (default
  0.5 pts) or ``spec['bar_relative']`` times the baseline's mean. Rows matching one of
  ``spec['exclude']`` (config values) are left out."""
  if t.base_gid is None or not done(t, t.base_gid):
    return None
  lm = not t.target.higher_is_better
  m, metric = ('final_loss', factor_plot_lib.LOSS) if lm else ('final_acc',
                                                               factor_plot_lib.ACCURACY)
  pts = []
  for g in t.groups:
    if g != t.base_gid and any(_matches(t.flats[g], w) for w in spec.get('exclude', ())):
      continue
    st = metric_stat(t, g, m)
    x = 1.0 if g == t.base_gid else number(t, g, spec['x'])
    if st.mean is None or x is None:
      continue
    pd_ = paired(t, g, m)[0]
    name = t.labels[g] if g == t.base_gid else _label(spec['name'], t.flats[g])
    pts.append(factor_plot_lib.FactorPoint(name, x, st.mean, st.std, st.n, pd_.mean, pd_.std,
                                           pd_.n))
  base = metric_stat(t, t.base_gid, m).mean * metric.scale
  bar = spec['bar_relative'] * base if 'bar_relative' in spec else spec.get('bar', 0.5)
  ctx = dict(lan=_lan(t.flats[t.groups[0]].get('network.lan_bandwidth_gbps')))
  return factor_plot_lib.plot_accuracy_vs_factor(
      pts, path, text(t, spec['title'], ctx), spec['xlabel'], bar=bar,
      shade=tuple(spec['shade']) if spec.get('shade') else None,
      line=tuple(spec['line']) if spec.get('line') else None, metric=metric,
      log_fit=bool(spec.get('log_fit')))


def anchor(title: str) -> str:
  """GitHub's anchor of a heading."""
  return '#' + re.sub(r'[^\w\- ]', '', title.lower()).replace(' ', '-')


def render_page(spec_module, sections: Sequence[Section], plot_files: dict, root_display: str,
                out_display: str, now: datetime.datetime) -> str:
  """The Markdown of results.md."""
  status = {p.spec.workdir: p.status == 'done' for s in sections for t in s.tables
            for p in t.points}
  n_missing = sum(not d for d in status.values())
  lines = [f'# {spec_module.TITLE}', '', f'Generated {now.strftime("%Y-%m-%d %H:%M UTC")} by',
           '', '```', f'{COMMAND} --root {root_display} --out {out_display}', '```', '',
           '(which first runs the sweeps — finished runs are skipped, interrupted ones resume; '
           'add `--no-run` to only rebuild this page from the workdirs). What the page claims '
           'and compares is data in `docs/results/claims.py`. Sections: ' + ', '.join(
               f'[{s["title"].split(" (")[0]}]({anchor(s["title"])})'
               for s in spec_module.SECTIONS) + '.', '']
  lines += ([f'> **Incomplete: {len(status) - n_missing} of {len(status)} runs have finished.** '
             f'The {n_missing} missing runs are listed in each section; tables show them as '
             '*not finished* and leave them out of every number and plot. Re-run the command '
             'when they are done.'] if n_missing else [f'All {len(status)} runs have finished.'])
  lines += ['', spec_module.HOW_TO_READ]
  for s in sections:
    lines.append(s.markdown)
    files = plot_files.get(s.key, [])
    if files:
      target = s.tables[0].target
      lines += ['**Plots** (one line per finished point: mean over its finished seeds, shaded '
                f'±1 std where there are several, (n=…) seeds; dashed line: target '
                f'{_target_value(target)}):', '']
      lines += [f'![{os.path.splitext(os.path.basename(f))[0]}]({f})' for f in files] + ['']
    else:
      lines += ['*No plots yet: no finished run in this section.*', '']
  used = list(dict.fromkeys(j.claim['source'] for s in sections for j in s.judged))
  lines += ['## Sources', '']
  for key in used:
    src = spec_module.SOURCES[key]
    lines.append(f'- **{src["short"]}**: {src["reference"]}'
                 + (f' <{src["url"]}>' if src.get('url') else '') + '.')
  return '\n'.join(lines) + '\n'


def build(spec_module, root: str, root_display: str | None = None) -> tuple[list, dict]:
  """Loads every table and renders every section: (sections, tables by name)."""
  by_name = {t['name']: load_table(t, root) for sec in spec_module.SECTIONS
             for t in sec['tables']}
  published = {c['id']: c['published'] for sec in spec_module.SECTIONS
               for c in sec['claims'] if c.get('id')}
  seen: set = set()
  sections = [section(sec, by_name, spec_module, published,
                      root if root_display is None else root_display, seen)
              for sec in spec_module.SECTIONS]
  return sections, by_name


def write_results(spec_module, root: str, out: str, root_display: str | None = None,
                  out_display: str | None = None,
                  now: datetime.datetime | None = None) -> dict[str, Any]:
  """Regenerates ``OUT/results.md`` and ``OUT/results/*.png`` (stale PNGs there are deleted).

  Returns:
    ``{'results.md': path, 'plots': [paths], 'sections': [Section]}``.
  """
  sections, by_name = build(spec_module, root, root_display)
  plot_dir = os.path.join(out, PLOTS_DIR)
  os.makedirs(plot_dir, exist_ok=True)
  for name in os.listdir(plot_dir):
    if name.endswith('.png'):
      os.remove(os.path.join(plot_dir, name))
  plot_files, written = {}, []
  for sec in spec_module.SECTIONS:
    files = section_plots(sec, by_name, plot_dir)
    written += files
    plot_files[sec['key']] = [f'{PLOTS_DIR}/{os.path.basename(f)}' for f in files]
  page = render_page(spec_module, sections, plot_files,
                     root if root_display is None else root_display,
                     out if out_display is None else out_display,
                     now or datetime.datetime.now(datetime.timezone.utc))
  path = os.path.join(out, 'results.md')
  with open(path + '.tmp', 'w', encoding='utf-8') as f:
    f.write(page)
  os.replace(path + '.tmp', path)
  return {'results.md': path, 'plots': written, 'sections': sections}


SUMMARY_START = '<!-- results-summary: generated by docs/results/make_results.py; do not edit -->'
SUMMARY_END = '<!-- /results-summary -->'


def summary_block(spec_module, sections: Sequence[Section]) -> str:
  """The README's results summary: every verdict of the page (section, claim,
  published, ours, verdict with its n), between :data:`SUMMARY_START` and
  :data:`SUMMARY_END`."""
  titles = {sec['key']: sec['title'].split(' (')[0] for sec in spec_module.SECTIONS}
  rows = []
  for s in sections:
    for j in s.judged:
      if j.status == 'not measured':
        continue
      ours = j.ours
      if j.row is not None:
        ours = (prose(*j.row, j.claim['value']) if j.claim['value'].partition(':')[0] in PER_SEED
                else fmt_number(j.claim['value'], j.value)) + f' ({_row_name(j.row, j.claim)})'
      rows.append([f'[{titles[s.key]}](docs/results.md{anchor(_title(spec_module, s.key))})',
                   j.claim['quantity'], j.claim['published'], ours, j.verdict])
  counts = {st: sum(j.status == st for s in sections for j in s.judged)
            for st in ('met', 'not met', 'provisional', 'not judged', 'not measured')}
  lines = [SUMMARY_START, '',
           'Every verdict of `docs/results.md` (' + ', '.join(
               f'{n} {st}' for st, n in counts.items() if n) + '). "Met" needs '
           f'{_min_seeds(spec_module)} or more seeds paired with the baseline and mean ± one '
           'standard error inside the published bound; fewer seeds are "provisional". '
           'Claims without finished runs yet ("not measured") are listed on the page only.', '']
  lines += tables_lib.markdown_table(('section', 'claim', 'published', 'ours', 'verdict'), rows)
  return '\n'.join(lines + ['', SUMMARY_END])


def _title(spec_module, key: str) -> str:
  return next(sec['title'] for sec in spec_module.SECTIONS if sec['key'] == key)


def write_summary(readme: str, block: str) -> bool:
  """Replaces the block between the summary markers in ``readme`` with ``block``;
  False (nothing written) when the file lacks the markers."""
  with open(readme, encoding='utf-8') as f:
    text_ = f.read()
  a, b = text_.find(SUMMARY_START), text_.find(SUMMARY_END)
  if a < 0 or b < a:
    return False
  with open(readme + '.tmp', 'w', encoding='utf-8') as f:
    f.write(text_[:a] + block + text_[b + len(SUMMARY_END):])
  os.replace(readme + '.tmp', readme)
  return True


def run_sweeps(spec_module, root: str, parallel: int = 1) -> list:
  """Runs every sweep of the spec, after checking the configs of all their missing runs."""
  todo, missing = {}, {}
  for sec in spec_module.SECTIONS:
    for t in sec['tables']:
      if t['root'] in todo:
        continue
      base, grid = sweep_lib.load_sweep(os.path.join(REPO, t['sweep']))
      sweep_root = os.path.join(root, t['root'])
      arg = sweep_lib.resolve_base(base, sweep_root, write=False)
      runs = [r for r in sweep_lib.make_runs(arg, grid, sweep_root)
              if sweep_lib.run_status(r.workdir) != 'done']
      sweep_lib.check_runs(base, arg, runs)  # every sweep before any launches
      todo[t['root']] = (base, grid, sweep_root)
      missing[t['root']] = len(runs)
  if sum(missing.values()):
    logging.info('%d runs missing (%s) under %s: launching them now (each one trains); pass '
                 '--no-run to render the page from the runs that exist.', sum(missing.values()),
                 ', '.join(f'{k}: {v}' for k, v in missing.items() if v), root)
  return [sweep_lib.run_sweep(b, g, r, parallel=parallel) for b, g, r in todo.values()]


RECORD_FILES = ('summary.json', 'config.json', 'metrics.jsonl')  # what the page reads of a run


def archive_runs(sections, root: str, dest: str, notes: dict | None = None) -> int:
  """Copies the record (:data:`RECORD_FILES`, no checkpoints) of every finished run
  of the page from ``ROOT/<path>`` to ``DEST/<path>``, so that ``--root DEST --no-run``
  rebuilds the same page and ``hfl.sweep`` on DEST skips those runs, and writes
  ``DEST/README.md`` (:func:`archive_readme`, with the spec's ``notes``); returns how many."""
  done = {p.spec.workdir for s in sections for t in s.tables for p in t.points
          if p.status == 'done'}
  for workdir in sorted(done):
    target = os.path.join(dest, os.path.relpath(workdir, root))
    os.makedirs(target, exist_ok=True)
    for name in RECORD_FILES:
      if os.path.isfile(os.path.join(workdir, name)):
        shutil.copy2(os.path.join(workdir, name), os.path.join(target, name))
  with open(os.path.join(dest, 'README.md'), 'w', encoding='utf-8') as f:
    f.write(archive_readme(dest, notes))
  return len(done)


def archive_readme(dest: str, notes: dict | None = None) -> str:
  """The Markdown of ``DEST/README.md``: per sweep root under ``dest``, its finished runs
  and where their provenance says they were trained (commits, dates, machines); then
  ``notes`` (``{sweep root: text}``, the spec's ``ARCHIVE_NOTES``: what is known of runs
  trained before their summaries recorded it)."""
  lines = ['# Run records behind docs/results.md', '',
           'Generated by `python3 docs/results/make_results.py --root workdirs --out docs '
           '--no-run --archive docs/results/runs` from the runs below; do not edit by hand.',
           '', 'One directory per finished run, `<sweep root>/<run name>/`, holding what the '
           'results page reads of it: ' + ', '.join(f'`{f}`' for f in RECORD_FILES) +
           ' (no checkpoints).', '',
           '- Rebuild the page from them without training: `python3 docs/results/make_results.py '
           '--root docs/results/runs --out /tmp/page --no-run`',
           '- Train only the missing runs: `cp -r docs/results/runs workdirs`, then '
           '`python3 docs/results/make_results.py --root workdirs --out docs` (finished runs '
           'are skipped).', '',
           'Where each run was trained is in its `summary.json` (`provenance`: one entry per '
           'start of the run, `hfl.provenance`); runs trained before it was recorded have none.',
           '', '| sweep root | finished runs | commits (runs) | first start – last start (UTC) '
           '| machines (CPU, device) |', '|---|---:|---|---|---|']
  for sub in sorted(glob_dirs(dest)) if os.path.isdir(dest) else ():
    name = os.path.basename(sub)
    runs = sorted(d for d in glob_dirs(sub) if os.path.isfile(os.path.join(d, 'summary.json')))
    if not runs:
      continue
    entries, points = [], []
    for d in runs:
      with open(os.path.join(d, 'summary.json'), encoding='utf-8') as f:
        summary = json.load(f)
      entries += summary.get('provenance') or []
      points.append(Point(None, {}, 'done', runs_lib.Run(d, name, {}, summary, []), ''))
    starts = sorted(e['started_utc'] for e in entries if e.get('started_utc'))
    when = f'{starts[0][:16]} – {starts[-1][:16]}'.replace('T', ' ') if starts else 'not recorded'
    machines = sorted({f'{e.get("cpu_model")}, {e.get("device_kind")} × {e.get("device_count")}'
                       for e in entries})
    lines.append(f'| `{name}` | {len(runs)} | {commits_text(points)} | {when} | '
                 f'{"; ".join(machines) or "not recorded"} |')
  if notes:
    lines += ['', 'Known of runs whose summaries do not record it (from the commit history):', '']
    lines += [f'- `{root}`: {text}' for root, text in sorted(notes.items())]
  return '\n'.join(lines) + '\n'


def glob_dirs(path: str) -> list[str]:
  """The directories directly under ``path``."""
  return [os.path.join(path, d) for d in os.listdir(path)
          if os.path.isdir(os.path.join(path, d))]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  """Parses the command line."""
  p = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split('\n\n')[0])
  p.add_argument('--root', default='workdirs', help='results root: ROOT/<sweep> per sweep '
                 '(default: workdirs)')
  p.add_argument('--out', default=os.path.relpath(os.path.dirname(HERE)),
                 help='writes OUT/results.md and OUT/results/*.png (default: this docs/)')
  p.add_argument('--spec', default=os.path.join(HERE, 'claims.py'), help='the claims spec')
  p.add_argument('--no-run', '--no_run', dest='run', action='store_false',
                 help='do not run the sweeps; only rebuild the page')
  p.add_argument('--parallel', type=int, default=1, help='training runs at the same time')
  p.add_argument('--archive', metavar='DEST', help='also copy every finished run\'s '
                 'summary.json, config.json and metrics.jsonl to DEST/<sweep>/<run>')
  return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
  """Exit status 1 on failed runs, 2 on a bad run config or spec, 130 on Ctrl-C."""
  args = parse_args(argv)
  logging.basicConfig(level=logging.INFO, format='%(levelname)s %(message)s')
  spec_module = load_spec(args.spec)
  failed = False
  if args.run:
    try:
      failed = any(r.failed for r in run_sweeps(spec_module, args.root, args.parallel))
    except (FileNotFoundError, ValueError) as e:
      print(f'error: {e}', file=sys.stderr)
      return 2
    except KeyboardInterrupt:
      return sweep_lib.interrupted()
  written = write_results(spec_module, args.root, args.out)
  print(written['results.md'])
  if os.path.realpath(args.out) == os.path.join(REPO, 'docs'):  # the repository's page
    readme = os.path.join(REPO, 'README.md')
    if write_summary(readme, summary_block(spec_module, written['sections'])):
      print(f'{readme} (results summary)')
  print('\n'.join(written['plots']))
  if args.archive:
    n = archive_runs(written['sections'], args.root, args.archive,
                     getattr(spec_module, 'ARCHIVE_NOTES', None))
    print(f'{n} finished runs archived under {args.archive}')
  missing = {p.spec.workdir for s in written['sections'] for t in s.tables for p in t.points
             if p.status != 'done'}
  if missing:
    print(f'{len(missing)} runs not finished; listed as missing on the page', file=sys.stderr)
  return 1 if failed else 0


if __name__ == '__main__':
  sys.exit(main())
