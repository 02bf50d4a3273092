"""``docs/results.md``: thesis and CO3 comparisons next to published numbers.

One command runs the four sweeps (finished runs are skipped, interrupted ones
resume) and regenerates the results page and its plots from scratch::

  python -m hfl.report.results [--root workdirs] [--out docs] [--no-run]

Sweeps (``configs/sweeps/``) and what the page makes of them:

* ``semisync.py`` -> ``ROOT/semisync``: optimised HPS vs synchronous HPS
  (thesis comparisons 1 and 2). Baseline: ``sync.strategy=sync`` (K = 1).
* ``compression.py`` -> ``ROOT/compression``: bidirectional top-k + bf16 small
  tensors vs uncompressed (thesis comparison 3). Baseline: the identity run.
* ``co3_iid.py`` -> ``ROOT/co3_iid``: CO3 fp4 at several γ in the CO3 paper's
  training setup (synchronous PS, ``sync.k=1``, IID shards, SGD lr 0.01), seeds
  0-2 for γ = 0 and 0.9. Baseline: the sweep's own identity runs, seed by seed.
  Judges the paper's claim (γ = 0.9 ≈ uncompressed accuracy).
* ``co3_paper.py`` -> ``ROOT/co3_paper``: the same in hfl's hierarchical
  non-IID setting (Dirichlet shards, periodic K = 4); a second table of the CO3
  section, context only (no verdict). Baseline: its own identity runs.

Definitions (all tables):

* Accuracy: test accuracy, printed in percent; differences (Δ) are in
  percentage points (pts) against the section's baseline, ours − baseline.
* Rounds / simulated time to target: first crossing of the runs'
  ``train.target_accuracy``, linearly interpolated between evaluations
  (:func:`hfl.report.tables.time_to_target`); ``never`` if not reached.
* Reduction vs baseline: 1 − ours / baseline (positive = fewer / faster).
* Seeds (compression and CO3 sweeps): points that differ only in ``seed`` are
  one row, mean ± sample std (ddof=1) over the finished seeds; Δ of the seed
  means = mean(ours) − mean(baseline); paired Δ = mean ± std over seeds s
  finished on both sides of acc(ours, s) − acc(baseline, s). "Loses ≤ 0.5
  pts" (CO3: "≈ uncompressed accuracy" at γ = 0.9) is judged on the mean
  paired Δ. Compression points at another LAN bandwidth than the sweep's first
  get their own table, against the uncompressed run at that bandwidth.
* Intra-DC compression ratio: 1 − (up + down bytes) / (up + down bytes of the
  uncompressed run); factor: uncompressed / ours (×).
* Uplink factor (CO3): uplink bytes of the uncompressed runs / ours; bits per
  uplink entry: 32 × ours / uncompressed (the uncompressed uplink sends every
  entry as float32, so this is the mean over all entries, 1-D leaves included).

Only runs with ``summary.json`` enter the tables and plots; unfinished runs are
listed as missing, with their progress.
"""

import argparse
import datetime
import json
import logging
import math
import os
import sys
from typing import Any, Callable, Mapping, NamedTuple, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from hfl import sweep as sweep_lib
from hfl.report import anchors
from hfl.report import plots
from hfl.report import tables

REPO_ROOT = sweep_lib.REPO_ROOT
RESULTS_MD = 'results.md'
PLOTS_DIR = 'results'
NEVER = tables.NEVER
TOL = anchors.NO_LOSS_TOLERANCE_POINTS


class SweepDef(NamedTuple):
  """One sweep of the results page.

  Attributes:
    name: sub-directory of the root and key of the section.
    path: sweep file, relative to the repository root.
  """
  name: str
  path: str


SWEEPS = (
    SweepDef('compression', 'configs/sweeps/compression.py'),
    SweepDef('semisync', 'configs/sweeps/semisync.py'),
    SweepDef('co3_iid', 'configs/sweeps/co3_iid.py'),
    SweepDef('co3_paper', 'configs/sweeps/co3_paper.py'),
)


class Entry(NamedTuple):
  """One point of a sweep and what its workdir holds now.

  Attributes:
    spec: the sweep's RunSpec (name, workdir, overrides, command).
    config: the resolved config (nested dict): the run's own when it has
      one, else the config file with the overrides applied.
    status: ``'done'`` (summary.json), ``'partial'`` (workdir without
      summary.json) or ``'pending'`` (no workdir).
    run: the loaded workdir (None when pending or unreadable).
    row: one-run table row (:class:`hfl.report.tables.GroupRow`, done only).
    label: short human label.
  """
  spec: sweep_lib.RunSpec
  config: dict
  status: str
  run: tables.RunRecord | None
  row: tables.GroupRow | None
  label: str

  @property
  def done(self) -> bool:
    return self.status == 'done' and self.row is not None


class SweepData(NamedTuple):
  """A sweep's points, loaded from ``ROOT/<name>``.

  Attributes:
    sweep: the sweep definition.
    root: the sweep's root directory as given (``ROOT/<name>``).
    base: the sweep's base config path (relative, as in the sweep file).
    entries: one per grid point, in grid order.
    extra: workdirs under the root that are not points of the sweep.
    target: target accuracy (fraction) of the runs.
  """
  sweep: SweepDef
  root: str
  base: str
  entries: list
  extra: list
  target: float


# --------------------------------------------------------------------------
# Loading.


def _ensure_repo_on_path():
  """Sweep and config files import ``configs.*``; make that importable."""
  if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)


def load_config_file(config_arg: str) -> Any:
  """Loads ``get_config(arg)`` from ``'path'`` or ``'path:arg'``.

  Args:
    config_arg: config path, relative to the current directory or the
      repository root.

  Returns:
    The ``ml_collections.ConfigDict``.
  """
  # Imported here: hfl.config imports JAX, which a page of finished runs never needs.
  from hfl import config as config_lib  # pylint: disable=g-import-not-at-top
  return config_lib.load_file(config_arg)


def resolve_config(config_arg: str, overrides: Mapping[str, Any]) -> dict:
  """The config a sweep point trains with, as its ``config.json`` stores it.

  Args:
    config_arg: base config path.
    overrides: dotted key -> value.

  Returns:
    Nested dict (JSON round trip, so tuples are lists as in the workdir).
  """
  cfg = load_config_file(config_arg)
  cfg.update_from_flattened_dict(dict(overrides))
  return json.loads(cfg.to_json())


def _get(config: Mapping[str, Any], key: str, default: Any = None) -> Any:
  v = tables.get_path(config, key)
  return default if v is None else v


def load_sweep_data(sweep: SweepDef, root: str,
                    label_fn: Callable[[Mapping[str, Any]], str]) -> SweepData:
  """Lists a sweep's points and loads the ones that have a workdir.

  Args:
    sweep: which sweep.
    root: the results root; the sweep lives in ``root/<sweep.name>``.
    label_fn: resolved config -> label.

  Returns:
    A :class:`SweepData`.
  """
  _ensure_repo_on_path()
  base, grid = sweep_lib.load_sweep(os.path.join(REPO_ROOT, sweep.path))
  sweep_root = os.path.join(root, sweep.name)
  config_arg = sweep_lib.resolve_base(base, sweep_root, write=False)
  specs = sweep_lib.make_runs(config_arg, grid, sweep_root)
  entries = []
  for spec in specs:
    status = sweep_lib.run_status(spec.workdir)
    run = None
    if status != 'pending':
      try:
        run = tables.load_run(spec.workdir)
      except (FileNotFoundError, ValueError, OSError) as e:
        logging.warning('%s: %s', spec.workdir, e)
    config = (run.config if run is not None and run.config
              else resolve_config(config_arg, spec.overrides))
    entries.append(Entry(spec, config, status, run, None, label_fn(config)))
  targets = {float(_get(e.config, 'train.target_accuracy', 0.88))
             for e in entries}
  target = min(targets) if targets else 0.88
  if len(targets) > 1:
    logging.warning('%s: runs disagree on the target accuracy %s; using %s',
                    sweep.name, sorted(targets), target)
  out = []
  for e in entries:
    row = None
    if e.status == 'done' and e.run is not None:
      row = tables.summarise_group([e.run], e.label, target)
    out.append(e._replace(row=row))
  known = {os.path.normpath(s.workdir) for s in specs}
  extra = []
  if os.path.isdir(sweep_root):
    for name in sorted(os.listdir(sweep_root)):
      path = os.path.abspath(os.path.join(sweep_root, name))
      if (os.path.isdir(path) and name != sweep_lib.REPORT_DIR
          and os.path.normpath(path) not in known):
        extra.append(name)
  return SweepData(sweep, sweep_root, base if isinstance(base, str)
                   else config_arg, out, extra, target)


# --------------------------------------------------------------------------
# Labels.


def semisync_label(config: Mapping[str, Any]) -> str:
  """``'sync (baseline, K=1)'``, ``'periodic (K=4)'``, ... from a config."""
  strategy = _get(config, 'sync.strategy', '?')
  k = _get(config, 'sync.k')
  label = {
      'sync': 'sync (baseline, K=1)',
      'periodic': f'periodic (K={k})',
      'semi_sync': f'semi_sync (K_base={k}, K_d optimised)',
      'adacomm': f'adacomm (K_0={k})',
  }.get(strategy, str(strategy))
  if _get(config, 'sync.progress_aware', False):
    label += ' + progress-aware'
  return label


def compression_label(config: Mapping[str, Any]) -> str:
  """``'uncompressed'`` or ``'top-k ρ=2% up/down, bf16 small'``."""
  up = _get(config, 'compression.uplink.name', 'identity')
  down = _get(config, 'compression.downlink.name', 'identity')
  if up == 'identity' and down == 'identity':
    return 'uncompressed'
  parts = []
  for link, name in (('up', up), ('down', down)):
    if name in ('topk', 'randomk'):
      rho = float(_get(config, f'compression.{link}link.density'))
      parts.append((link, f'{"top-k" if name == "topk" else name} '
                    f'ρ={_pct_str(rho)}'))
    else:
      parts.append((link, name))
  if parts[0][1] == parts[1][1]:
    label = f'{parts[0][1]} up/down'
  else:
    label = ', '.join(f'{link}: {v}' for link, v in parts)
  small = _get(config, 'compression.small', 'float32')
  if small != 'float32' and _get(config, 'compression.small_threshold', 0):
    short = {'bfloat16': 'bf16', 'float16': 'fp16'}.get(small, small)
    label += f', {short} small'
  return label


def co3_label(config: Mapping[str, Any]) -> str:
  """``'co3 fp4 γ=0.9'``, or ``'uncompressed'``."""
  if _get(config, 'compression.uplink.name') != 'co3':
    return compression_label(config)
  fmt = _get(config, 'compression.uplink.fmt', '?')
  gamma = float(_get(config, 'compression.uplink.gamma', 0.0))
  return f'co3 {fmt} γ={gamma:g}'


# --------------------------------------------------------------------------
# Formatting helpers.


def _pct_str(x: float) -> str:
  """0.02 -> '2%', 0.003 -> '0.3%'."""
  return f'{100 * x:.3g}%'


def fmt_acc(x: float | None) -> str:
  """Accuracy fraction as percent with 2 decimals."""
  return '–' if x is None else f'{100 * x:.2f}%'


def fmt_points(x: float | None) -> str:
  """Accuracy difference in points, signed."""
  return '–' if x is None else f'{x:+.2f} pts'.replace('-', '−')


def fmt_reduction(x: float | None) -> str:
  """A reduction fraction as percent (negative = more / slower)."""
  if x is None:
    return '–'
  return f'{100 * x:.1f}%'.replace('-', '−')


def fmt_factor(x: float | None) -> str:
  """A factor as ``'20.0×'`` (``'∞×'`` for infinity)."""
  if x is None:
    return '–'
  if math.isinf(x):
    return '∞×'
  return f'{x:.1f}×' if x < 1000 else f'{x:.0f}×'


def fmt_to_target(x: float | None, fmt: Callable[[float], str]) -> str:
  """A to-target value, ``'never'`` when None."""
  return NEVER if x is None else fmt(x)


def _rounds(x: float) -> str:
  return f'{x:.1f}'


def reduction(ours: float | None, base: float | None) -> float | None:
  """1 − ours / base, None if either is missing or base is not positive."""
  if ours is None or base is None or base <= 0:
    return None
  return 1.0 - ours / base


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]
              ) -> list[str]:
  esc = lambda s: str(s).replace('|', '\\|')
  out = ['| ' + ' | '.join(esc(h) for h in header) + ' |',
         '|' + '|'.join('---' for _ in header) + '|']
  out += ['| ' + ' | '.join(esc(c) for c in r) + ' |' for r in rows]
  return out


# --------------------------------------------------------------------------
# Quantities of one run.


def _bytes(e: Entry, link: str) -> float | None:
  return e.row.bytes[link].mean if e.done else None


def _final(e: Entry) -> float | None:
  return e.row.final_acc.mean if e.done else None


def _delta_points(e: Entry, base: Entry | None) -> float | None:
  if base is None or _final(e) is None or _final(base) is None:
    return None
  return 100.0 * (_final(e) - _final(base))


def _progress(e: Entry) -> str:
  """'not started' or 'running/interrupted: step 120/600, last acc 80.1%'."""
  if e.status == 'pending':
    return 'not started'
  if e.status == 'done':
    return 'done (unreadable summary)' if e.row is None else 'done'
  steps = _get(e.config, 'train.num_steps')
  m = e.run.metrics if e.run is not None else []
  if not m:
    return f'running or interrupted: no evaluation yet (of {steps} steps)'
  last = m[-1]
  acc = last.get('test_accuracy')
  return (f'running or interrupted: step {last.get("step")}/{steps}, round '
          f'{last.get("round")}, last test accuracy {fmt_acc(acc)}')


# --------------------------------------------------------------------------
# Sections.


class Section(NamedTuple):
  """A rendered section plus the numbers behind it (for tests and CSV).

  Attributes:
    key: section key (``'semisync'``, ``'compression'``, ``'co3'``).
    title: heading.
    records: one dict per table row with raw numbers (fractions, bytes,
      seconds, points; None when not available) and ``'cells'``, the rendered
      Markdown cells.
    claims: rows of the claims-vs-ours table: dicts with ``anchor``,
      ``ours`` (text), ``verdict`` (text) and ``met`` (True/False/None).
    missing: one dict per unfinished run (``label``, ``workdir``, ``status``).
    markdown: the section's Markdown (without plots).
    rows: GroupRows of the finished runs, for the plots.
    target: target accuracy (fraction).
    extra: extra facts (e.g. ``best_lossless``) for tests.
  """
  key: str
  title: str
  records: list
  claims: list
  missing: list
  markdown: str
  rows: list
  target: float
  extra: dict


def _settings_lines(data: SweepData, root_display: str,
                    entries: Sequence[Entry] | None = None) -> list[str]:
  """The exact settings and commands of a sweep, as Markdown bullets."""
  entries = list(entries if entries is not None else data.entries)
  c = entries[0].config
  flats = [tables.flatten_config(e.config) for e in entries]
  # Fields absent from some runs' configs (added to hfl after those runs started)
  # are schema differences, not per-run settings.
  varying = sorted(k for k in set().union(*flats)
                   if k not in ('seed', 'workdir') and all(k in f for f in flats)
                   and len({repr(f.get(k)) for f in flats}) > 1)
  sweep_root = f'{root_display.rstrip("/")}/{data.sweep.name}'
  # Overrides every run has, with the same value (a seed set on some runs only
  # is per run, not common).
  common = {k: v for k, v in entries[0].spec.overrides.items()
            if k not in varying and all(
                k in e.spec.overrides and repr(e.spec.overrides[k]) == repr(v)
                for e in entries)}
  common_s = ', '.join(f'`{k}={sweep_lib.flag_value(v)}`'
                       for k, v in sorted(common.items())) or 'none'
  seeds = _unique(_get(e.config, 'seed') for e in entries)
  per_run = varying + (['seed'] if len(seeds) > 1 else [])
  lans = _unique(_get(e.config, 'network.lan_bandwidth_gbps') for e in entries)
  speeds = _get(c, 'network.dc_speed', [])
  lines = [
      f'- **Config**: `{data.base}` (sweep file `{data.sweep.path}`); '
      f'overrides common to all runs: {common_s}; per run: '
      + (', '.join(f'`{k}`' for k in per_run) or 'none')
      + ' (see the table and the commands below).',
      f'- **Steps**: `train.num_steps` = {_get(c, "train.num_steps")} intra-DC '
      f'iterations (of the fastest DC), batch {_get(c, "train.batch_size")} '
      f'per worker, evaluation every `train.eval_every` inter-DC rounds; '
      f'target accuracy {fmt_acc(data.target)} (`train.target_accuracy`).',
      f'- **Mesh**: {_get(c, "mesh.num_dcs")} DCs × '
      f'{_get(c, "mesh.workers_per_dc")} workers per DC; data '
      f'`{_get(c, "dataset.name")}`, partition `{_get(c, "dataset.partition")}`'
      + (f' (Dirichlet α = {_get(c, "dataset.dirichlet_alpha")})'
         if _get(c, 'dataset.partition') == 'dirichlet' else '')
      + f'; model `{_get(c, "model.name")}`; optimizer '
      f'`{_get(c, "optimizer.name")}` '
      f'(lr {_get(c, "optimizer.learning_rate")}); '
      + (f'seeds {", ".join(map(str, seeds))} (per run)' if len(seeds) > 1
         else f'seed {_get(c, "seed")}') + '; sync '
      + ('strategy per run' if 'sync.strategy' in varying
         else f'`{_get(c, "sync.strategy")}`')
      + f', K = {_get(c, "sync.k")}, K_max = {_get(c, "sync.k_max")}, '
      f'aggregation `{_get(c, "sync.aggregation")}`, outer '
      f'`{_get(c, "sync.outer.name")}`.',
      f'- **Network**: compute {_get(c, "network.compute_time_s")} s per '
      f'iteration at speed 1, DC speeds '
      f'{", ".join(f"{float(s):g}" for s in speeds)} (relative); LAN (PS NIC) '
      f'{_get(c, "network.lan_bandwidth_gbps")} Gbit/s'
      + (' (' + ', '.join(_lan_str(x) for x in lans
                          if repr(x) != repr(lans[0]))
         + ' for the runs labelled so)'
         if len(lans) > 1 else '') + ', latency '
      f'{_get(c, "network.lan_latency_s")} s; WAN '
      f'{_get(c, "network.wan_bandwidth_mbps")} Mbit/s per DC, latency '
      f'{_get(c, "network.wan_latency_s")} s.',
      f'- **Command**: `python -m hfl.sweep --sweep={data.sweep.path} '
      f'--root={sweep_root}` (run by `python -m hfl.report.results '
      f'--root={root_display}`); one run per point:',
      '',
      '  <details><summary>per-run commands</summary>',
      '',
  ]
  for e in entries:
    cmd = (f'python main.py --config={data.base} --workdir={sweep_root}/'
           f'{e.spec.name} ' + ' '.join(
               f'--config.{k}={sweep_lib.flag_value(v)}'
               for k, v in e.spec.overrides.items()))
    lines.append(f'  - {e.label}: `{cmd.strip()}`')
  lines += ['', '  </details>', '']
  return lines


def _unique(values) -> list:
  """The distinct values, in first-seen order (None left out)."""
  out = []
  for v in values:
    if v is not None and all(repr(v) != repr(x) for x in out):
      out.append(v)
  return out


def _lan_str(gbps: float | None) -> str:
  """1.0 -> '1 Gbit/s', 0.1 -> '100 Mbit/s'."""
  if gbps is None:
    return '?'
  gbps = float(gbps)
  return f'{gbps:g} Gbit/s' if gbps >= 1 else f'{1000 * gbps:g} Mbit/s'


def _config_drift(data: SweepData,
                  entries: Sequence[Entry] | None = None) -> list[str]:
  """Notes for finished runs whose config differs from the sweep file's.

  Fields the sweep's config has but a run's ``config.json`` lacks (added to
  hfl after the run started) are gathered in one note per set of fields;
  fields whose value differs get a note per run.

  Args:
    data: the sweep.
    entries: the points to check, with the labels to print (default:
      ``data.entries``).
  """
  entries = data.entries if entries is None else entries
  notes, absent = [], {}
  for e in entries:
    if not e.done:
      continue
    want = tables.flatten_config(
        resolve_config(_config_arg(data), e.spec.overrides))
    have = tables.flatten_config(e.config)
    added = tuple(sorted(k for k in set(want) - set(have) if k != 'workdir'))
    diff = sorted(k for k in set(want) | set(have) if k != 'workdir'
                  and k not in added and repr(want.get(k)) != repr(have.get(k)))
    if diff:
      notes.append(f'- ⚠ `{e.spec.name}` ({e.label}) was trained with a '
                   'config that differs from what the sweep file gives now at '
                   + ', '.join(f'`{k}` (ran {have.get(k)!r}, now '
                               f'{want.get(k)!r})' for k in diff[:8])
                   + (' …' if len(diff) > 8 else '')
                   + '; its numbers are for the config it ran with.')
    if added:
      absent.setdefault(added, []).append(e.label)
  for keys, labels in absent.items():
    many = len(labels) > 1
    notes.append(f'- {len(labels)} run{"s" if many else ""} '
                 f'{"predate" if many else "predates"} config fields added to '
                 f'hfl later (absent from {"their" if many else "its"} '
                 '`config.json`; trained by the code of that time): '
                 + ', '.join(f'`{k}`' for k in keys) + ' — '
                 + '; '.join(labels) + '.')
  return notes


def _steps_mismatch(entries: Sequence[Entry], base: Entry | None
                    ) -> list[str]:
  """Notes for finished runs with another number of intra-DC iterations."""
  if base is None or not base.done:
    return []
  steps = lambda e: e.run.summary.get('intra_dc_iterations')
  return [f'- ⚠ `{e.label}` ran {steps(e)} intra-DC iterations, the baseline '
          f'{steps(base)}: its byte ratios and Δ compare unequal amounts of '
          'training.' for e in entries
          if e.done and e is not base and steps(e) != steps(base)]


def _config_arg(data: SweepData) -> str:
  return data.base


def _workdirs(entries: Sequence[Entry]) -> list[tuple[str, bool]]:
  return [(e.spec.workdir, e.done) for e in entries]


def _missing(entries: Sequence[Entry], root_display: str,
             sweep_name: str) -> list[dict]:
  return [dict(label=e.label, status=_progress(e),
               workdir=f'{root_display.rstrip("/")}/{sweep_name}/'
               f'{e.spec.name}')
          for e in entries if not e.done]


def _missing_lines(missing: Sequence[dict], extra: Sequence[str] = ()
                   ) -> list[str]:
  lines = []
  if missing:
    lines += ['', f'**Missing runs ({len(missing)})** — not finished (no '
              '`summary.json`), so not in the numbers above:', '']
    lines += [f'- {m["label"]}: {m["status"]} (`{m["workdir"]}`)'
              for m in missing]
  if extra:
    lines += ['', 'Workdirs under the sweep root that are not points of the '
              'sweep (ignored): ' + ', '.join(f'`{x}`' for x in extra)]
  return lines


def _verdict_up_to(ours: float | None, anchor: anchors.Anchor, what: str,
                   compared: bool = True) -> tuple[str, bool | None]:
  """Verdict on an 'up to' reduction claim.

  Args:
    ours: our best reduction (fraction), None if not computable.
    anchor: the claim.
    what: name of the quantity in the verdict.
    compared: whether any run could be compared with the baseline at all.
  """
  if ours is None:
    return ('not measured (the baseline and a compared run must both finish '
            'and reach the target)' if not compared else
            'not measured (no compared run reached the target, or the '
            'baseline did not)'), None
  if ours >= anchor.value:
    return f'met: {fmt_reduction(ours)} ≥ {fmt_reduction(anchor.value)}', True
  return (f'not met: best {what} {fmt_reduction(ours)} < '
          f'{fmt_reduction(anchor.value)}'), False


def _verdict_no_loss(delta: float | None, what: str = 'Δ'
                     ) -> tuple[str, bool | None]:
  """Verdict on a "no accuracy loss" claim: ``delta`` ≥ −``TOL`` points.

  Args:
    delta: ours − baseline in points (None if not measured).
    what: name of the quantity in the verdict (e.g. ``'paired Δ'``).

  Returns:
    (verdict text, met: True / False / None when not measured).
  """
  if delta is None:
    return 'not measured', None
  if delta >= -TOL:
    return f'met: {what} {fmt_points(delta)} ≥ −{TOL:g} pts', True
  return f'not met: {what} {fmt_points(delta)} < −{TOL:g} pts', False


def _claims_lines(claims: Sequence[dict]) -> list[str]:
  rows = [[c['anchor'].citation.short, c['anchor'].quantity,
           c['anchor'].text(), c['ours'], c['verdict']] for c in claims]
  return _md_table(('source', 'claim', 'published', 'ours', 'verdict'), rows)


def semisync_section(data: SweepData, root_display: str) -> Section:
  """Optimised HPS vs synchronous HPS (thesis comparisons 1 and 2).

  Args:
    data: the semisync sweep.
    root_display: the results root as the reader should see it.

  Returns:
    The :class:`Section`.
  """
  entries = data.entries
  base = next((e for e in entries
               if _get(e.config, 'sync.strategy') == 'sync'), None)
  a_rounds = anchors.get('thesis.semisync.rounds_reduction')
  a_time = anchors.get('thesis.semisync.time_reduction')
  a_acc = anchors.get('thesis.semisync.accuracy_delta')
  num_dcs = int(_get(entries[0].config, 'mesh.num_dcs', 0)) if entries else 0
  base_done = base is not None and base.done
  records = []
  for e in entries:
    rec = dict(label=e.label, done=e.done, baseline=e is base)
    if e.done:
      r = e.row
      rounds_t = r.rounds_to_target.mean
      time_t = r.time_to_target_s.mean
      idle = e.run.summary.get('idle_s')
      rec.update(
          final_acc=r.final_acc.mean, best_acc=r.best_acc.mean,
          delta_points=_delta_points(e, base) if base_done else None,
          rounds_to_target=rounds_t, time_to_target_s=time_t,
          rounds_reduction=(reduction(rounds_t, base.row.rounds_to_target.mean)
                            if base_done and e is not base else None),
          time_reduction=(reduction(time_t, base.row.time_to_target_s.mean)
                          if base_done and e is not base else None),
          wan_bytes=_bytes(e, 'inter_dc'),
          inter_dc_rounds=r.inter_dc_rounds.mean, sim_time_s=r.sim_time_s.mean,
          idle_s=(list(idle) if isinstance(idle, (list, tuple)) else None))
      rec['cells'] = [
          e.label, fmt_acc(rec['final_acc']), fmt_acc(rec['best_acc']),
          'baseline' if e is base else fmt_points(rec['delta_points']),
          fmt_to_target(rounds_t, _rounds),
          'baseline' if e is base else fmt_reduction(rec['rounds_reduction']),
          fmt_to_target(time_t, tables.human_seconds),
          'baseline' if e is base else fmt_reduction(rec['time_reduction']),
          tables.human_bytes(rec['wan_bytes']),
          f'{rec["inter_dc_rounds"]:.0f}' if rec['inter_dc_rounds'] is not None
          else '–',
          tables.human_seconds(rec['sim_time_s']),
          (' / '.join(f'{x:.1f}' for x in rec['idle_s'])
           if rec['idle_s'] is not None else '–'),
      ]
    else:
      rec['cells'] = [e.label, '*not finished*'] + ['–'] * 10
    records.append(rec)
  header = ('strategy', 'final acc', 'best acc', 'Δ final vs sync',
            'inter-DC rounds to target',
            f'rounds reduction (thesis: {a_rounds.text()})',
            'sim time to target',
            f'time reduction (thesis: {a_time.text()})', 'WAN bytes',
            'inter-DC rounds', 'sim time (total)',
            f'idle per DC (s, DC 0..{max(num_dcs - 1, 0)})')

  # Claims vs ours: the best strategy for each quantity.
  others = [r for r in records if r['done'] and not r['baseline']]
  best_rounds = max((r for r in others if r['rounds_reduction'] is not None),
                    key=lambda r: r['rounds_reduction'], default=None)
  best_time = max((r for r in others if r['time_reduction'] is not None),
                  key=lambda r: r['time_reduction'], default=None)
  claims = []
  compared = base_done and bool(others)
  v, met = _verdict_up_to(best_rounds and best_rounds['rounds_reduction'],
                          a_rounds, 'reduction', compared)
  claims.append(dict(anchor=a_rounds, met=met, verdict=v, ours=(
      f'{fmt_reduction(best_rounds["rounds_reduction"])} '
      f'({best_rounds["label"]})' if best_rounds else '–')))
  v, met = _verdict_up_to(best_time and best_time['time_reduction'], a_time,
                          'reduction', compared)
  claims.append(dict(anchor=a_time, met=met, verdict=v, ours=(
      f'{fmt_reduction(best_time["time_reduction"])} ({best_time["label"]})'
      if best_time else '–')))
  ref = best_time or best_rounds
  v, met = _verdict_no_loss(ref['delta_points'] if ref else None)
  claims.append(dict(anchor=a_acc, met=met, verdict=v, ours=(
      f'{fmt_points(ref["delta_points"])} ({ref["label"]}, the fastest)'
      if ref else '–')))

  missing = _missing(entries, root_display, data.sweep.name)
  md = ['## Optimised HPS vs synchronous HPS (thesis comparisons 1 and 2)', '',
        'Heterogeneous DCs (compute speeds spread 3×) on a WAN: how many '
        'inter-DC rounds and how much simulated time each strategy needs to '
        'reach the target accuracy, against the synchronous hierarchical PS '
        '(`sync`, K = 1, one inter-DC round per intra-DC iteration). '
        'Baseline: **' + (base.label if base else 'missing') + '**.', '']
  md += _settings_lines(data, root_display)
  md += _md_table(header, [r['cells'] for r in records])
  md += _missing_lines(missing, data.extra)
  md += ['', '**Published vs ours** (thesis: best case over its settings; '
         'ours: the best strategy here):', '']
  md += _claims_lines(claims)
  notes = ['', 'Notes:', '',
           '- Reductions are 1 − ours / sync baseline: positive = fewer rounds '
           '/ less simulated time than `sync`. `never`: the target was not '
           'reached within the steps, so no reduction is computed.',
           '- Evaluations are spaced by about 40 intra-DC iterations for '
           'every strategy (`train.eval_every` differs per strategy because '
           'a round holds a different number of iterations), so rounds and '
           'time to target are interpolated from equally coarse curves.',
           '- Idle per DC: simulated seconds each DC waited for the slowest '
           'one at the inter-DC barriers (`idle_s` of summary.json).',
           f'- "No accuracy loss" is read as Δ ≥ −{TOL:g} pts vs the baseline '
           'at the same number of intra-DC iterations.']
  if base is not None and not base.done:
    notes.append('- ⚠ The sync baseline has not finished: no reductions or '
                 'Δ can be computed yet.')
  elif base_done and base.row.rounds_to_target.mean is None:
    notes.append('- ⚠ The sync baseline never reached the target: '
                 'reductions to target are undefined (`–`).')
  return _finish_section('semisync', md, notes, claims, records, missing, entries, base,
                         data)


def _run_checks(data: SweepData, entries: Sequence[Entry],
                base: Entry | None) -> list[str]:
  """Step-count mismatches against ``base`` and config drift, as notes.

  Args:
    data: the sweep the entries belong to.
    entries: its points, labelled as the notes should name them.
    base: the run whose intra-DC iteration count the others must match.
  """
  return _steps_mismatch(entries, base) + _config_drift(data, entries)


def _finish_section(key, md, notes, claims, records, missing, entries, base,
                    data, rows=None, extra=None, checks=None) -> Section:
  """Appends the shared notes (unmet claims, step mismatches, config drift) and builds it.

  Args:
    key, md, notes, claims, records, missing: as in :class:`Section` (``md``
      and ``notes`` are lists of lines; ``notes`` go after ``md``).
    entries: the section's runs (every sweep it reads).
    base: the baseline run (an Entry) or None.
    data: the sweep of ``entries`` (for the checks).
    rows: GroupRows for the plots (default: one per finished entry).
    extra: more :attr:`Section.extra` facts.
    checks: the step/config notes (default: :func:`_run_checks` over
      ``data``, ``entries`` and ``base``).
  """
  for c in claims:
    if c['met'] is False:
      notes.append(f'- Not met: {c["anchor"].quantity} — {c["verdict"]}.')
  notes += _run_checks(data, entries, base) if checks is None else checks
  md += notes
  rows = [e.row for e in entries if e.done] if rows is None else rows
  return Section(key, md[0][3:], records, claims, missing,
                 '\n'.join(md) + '\n', rows, data.target,
                 dict(dict(baseline=base.label if base else None,
                           workdirs=_workdirs(entries)), **(extra or {})))


# --------------------------------------------------------------------------
# Compression: seed groups, paired differences.


class SeedGroup(NamedTuple):
  """Points of a sweep that differ only in ``seed``.

  Points are grouped by their sweep overrides without ``seed`` (not by the
  whole config, so a run trained before a config field was added still joins
  the seeds of its point).

  Attributes:
    label: the points' label (without seed or LAN).
    entries: one per seed, in sweep order.
    row: :class:`hfl.report.tables.GroupRow` over the finished seeds (mean ±
      sample std), None when no seed has finished.
  """
  label: str
  entries: list
  row: tables.GroupRow | None

  @property
  def done(self) -> list:
    return [e for e in self.entries if e.done]

  @property
  def config(self) -> dict:
    return self.entries[0].config

  @property
  def lan(self) -> float | None:
    v = _get(self.config, 'network.lan_bandwidth_gbps')
    return None if v is None else float(v)


def _seed(e: Entry) -> int | None:
  v = _get(e.config, 'seed')
  return None if v is None else int(v)


def _key_without(e: Entry, drop: Sequence[str]) -> tuple:
  return tuple(sorted((k, repr(v)) for k, v in e.spec.overrides.items()
                      if k not in drop))


def group_seeds(entries: Sequence[Entry], target: float) -> list[SeedGroup]:
  """Groups sweep points that differ only in ``seed`` (first-seen order).

  Args:
    entries: the sweep's points.
    target: target accuracy for the group rows.

  Returns:
    The :class:`SeedGroup` list.
  """
  by_key: dict[tuple, list] = {}
  for e in entries:
    by_key.setdefault(_key_without(e, ('seed',)), []).append(e)
  out = []
  for es in by_key.values():
    done = [e for e in es if e.done]
    row = (tables.summarise_group([e.run for e in done], es[0].label, target)
           if done else None)
    out.append(SeedGroup(es[0].label, es, row))
  return out


def paired_deltas(group: SeedGroup, base: SeedGroup | None
                  ) -> dict[int | None, float]:
  """Per seed: 100 × (final accuracy of ``group`` − that of ``base``).

  Only seeds finished in both count. Runs with the same seed share the data
  order and the initialisation, so this difference removes most seed noise.

  Args:
    group: compressed runs.
    base: uncompressed runs (same LAN).

  Returns:
    seed -> difference in points.
  """
  if base is None:
    return {}
  b = {_seed(e): _final(e) for e in base.entries if e.done}
  out = {}
  for e in group.entries:
    s = _seed(e)
    if e.done and s in b and _final(e) is not None and b[s] is not None:
      out[s] = 100.0 * (_final(e) - b[s])
  return out


def _same_lan(a: float | None, b: float | None) -> bool:
  return a is not None and b is not None and math.isclose(a, b)


def _acc_pm(mean: float | None, std: float | None) -> str:
  """'89.37 ± 0.79%' (or '89.41%' without a std)."""
  if mean is None:
    return '–'
  return (f'{100 * mean:.2f} ± {100 * std:.2f}%' if std is not None
          else fmt_acc(mean))


def fmt_points_pm(mean: float | None, std: float | None,
                  n: int | None = None) -> str:
  """'−0.45 ± 0.21 pts (n=2)' (std left out when None)."""
  if mean is None:
    return '–'
  s = f'{mean:+.2f}'.replace('-', '−')
  if std is not None:
    s += f' ± {std:.2f}'
  s += ' pts'
  if n is not None:
    s += f' (n={n})'
  return s


def _seeds_cell(rec: Mapping[str, Any]) -> str:
  """'0, 1, 2', or '0, 1 (2 of 3)' while seeds are missing."""
  s = ', '.join('?' if x is None else str(x) for x in rec['seeds'])
  if rec['n_seeds'] < rec['n_total']:
    s += f' ({rec["n_seeds"]} of {rec["n_total"]})'
  return s


def _compression_record(g: SeedGroup, base: SeedGroup | None) -> dict:
  """Raw numbers of one seed group against the uncompressed group.

  Serves the compression and the CO3 tables: each reads the keys it shows.

  Args:
    g: the group (one point of a sweep, its seeds).
    base: the uncompressed group it is compared with (may be ``g`` itself).

  Returns:
    Dict with ``label``, ``lan_gbps``, ``done`` (some seed finished),
    ``baseline``, ``density`` (top-k / random-k uplink density, else None),
    ``seeds`` / ``n_seeds`` (finished), ``n_total`` (points); when done also
    bytes (``intra_up``, ``intra_down``, ``intra_bytes``: means over seeds,
    bytes), ``ratio`` / ``factor`` (up + down vs ``base``), ``up_factor``
    (uplink bytes of ``base`` / ours) and ``bits_per_entry`` (32 × ours /
    ``base``, uplink), ``final_acc`` / ``final_acc_std`` (fractions),
    ``delta_points`` (Δ of the seed means, pts), ``paired`` (seed -> Δ, pts),
    ``paired_delta`` / ``paired_std`` / ``paired_n`` (over ``paired``), time
    to target (s) and ``time_cell``. Comparisons are None for the baseline
    itself and when ``base`` has not finished.
  """
  is_base = g is base
  sparse = _get(g.config, 'compression.uplink.name') in ('topk', 'randomk')
  rec = dict(label=g.label, lan_gbps=g.lan, done=g.row is not None,
             baseline=is_base,
             density=(_get(g.config, 'compression.uplink.density')
                      if sparse else None),
             seeds=[_seed(e) for e in g.done], n_seeds=len(g.done),
             n_total=len(g.entries))
  if g.row is None:
    return rec
  r = g.row
  b = base.row if base is not None else None
  up, down = r.bytes['intra_up'].mean, r.bytes['intra_down'].mean
  intra = None if up is None or down is None else up + down
  b_intra = None
  if b is not None and None not in (b.bytes['intra_up'].mean,
                                    b.bytes['intra_down'].mean):
    b_intra = b.bytes['intra_up'].mean + b.bytes['intra_down'].mean
  ratio = None if is_base else reduction(intra, b_intra)
  factor = (None if ratio is None else
            (b_intra / intra if intra > 0 else math.inf))
  b_up = b.bytes['intra_up'].mean if b is not None else None
  has_up = up is not None and b_up is not None and b_up > 0
  up_factor = (None if is_base or not has_up else
               (b_up / up if up > 0 else math.inf))
  bits = 32.0 * up / b_up if has_up else None
  acc = r.final_acc
  delta = (100.0 * (acc.mean - b.final_acc.mean)
           if not is_base and b is not None and acc.mean is not None
           and b.final_acc.mean is not None else None)
  pairs = {} if is_base else paired_deltas(g, base)
  pst = tables.stat(pairs.values())
  t = r.time_to_target_s
  rec.update(
      intra_up=up, intra_down=down, intra_bytes=intra, ratio=ratio,
      factor=factor, up_factor=up_factor, bits_per_entry=bits,
      final_acc=acc.mean, final_acc_std=acc.std,
      delta_points=delta, paired=pairs, paired_delta=pst.mean,
      paired_std=pst.std, paired_n=pst.n, time_to_target_s=t.mean,
      time_to_target_std=t.std, n_reached=t.n,
      time_reduction=(None if is_base or b is None
                      else reduction(t.mean, b.time_to_target_s.mean)),
      sim_time_s=r.sim_time_s.mean)
  rec['time_cell'] = tables._fmt_stat(  # pylint: disable=protected-access
      t, tables.human_seconds, rec['n_seeds'], never=True,
      unit_of=tables._time_unit)  # pylint: disable=protected-access
  return rec


def _run_label(e: Entry, main_lan: float | None) -> str:
  """'top-k ρ=2% up/down, bf16 small, 100 Mbit/s LAN, seed 1'."""
  lan = _get(e.config, 'network.lan_bandwidth_gbps')
  label = e.label
  if lan is not None and not _same_lan(float(lan), main_lan):
    label += f', {_lan_str(lan)} LAN'
  return label + f', seed {_seed(e)}'


def compression_section(data: SweepData, root_display: str) -> Section:
  """Bidirectional sparse + mixed precision (thesis comparison 3).

  Points that differ only in ``seed`` are one row (mean ± sample std over the
  finished seeds). The main table holds the points at the sweep's first LAN
  bandwidth (1 Gbit/s); points at another LAN bandwidth get their own table of
  time to target against the uncompressed run at that bandwidth.

  Args:
    data: the compression sweep.
    root_display: the results root as the reader should see it.

  Returns:
    The :class:`Section`; ``records`` are the main table's rows;
    ``extra['best_lossless']`` is the record with the highest compression
    factor whose paired Δ (mean over seeds) is ≥ −0.5 pts (or None);
    ``extra['other_lan']`` the records of the other-LAN tables.
  """
  entries = data.entries
  main_lan = (None if not entries else
              float(_get(entries[0].config, 'network.lan_bandwidth_gbps', 0)))
  groups = group_seeds(entries, data.target)
  main = [g for g in groups if _same_lan(g.lan, main_lan)]
  other = [g for g in groups if not _same_lan(g.lan, main_lan)]

  def baseline_of(gs):
    return next((g for g in gs if tables.is_uncompressed(g.config)), None)

  base = baseline_of(main)
  base_done = base is not None and base.row is not None
  # The seed-0 (first) uncompressed run: the reference for step mismatches.
  base_entry = base.entries[0] if base is not None else None
  a_ratio = anchors.get('thesis.compression.ratio')
  a_time = anchors.get('thesis.compression.time_reduction')
  a_dgc = anchors.get('dgc.compression_factor')
  a_dgc_acc = anchors.get('dgc.accuracy_delta')

  records = []
  for g in main:
    rec = _compression_record(g, base)
    rho = '–' if rec['density'] is None else _pct_str(float(rec['density']))
    if rec['done']:
      is_b = rec['baseline']
      rec['cells'] = [
          g.label, rho, _seeds_cell(rec),
          tables.human_bytes(rec['intra_up']),
          tables.human_bytes(rec['intra_down']),
          'baseline' if is_b else (
              '–' if rec['ratio'] is None else
              f'{100 * rec["ratio"]:.2f}% ({fmt_factor(rec["factor"])})'),
          _acc_pm(rec['final_acc'], rec['final_acc_std']),
          'baseline' if is_b else fmt_points(rec['delta_points']),
          'baseline' if is_b else fmt_points_pm(
              rec['paired_delta'], rec['paired_std'],
              rec['paired_n'] or None),
          rec['time_cell'],
          'baseline' if is_b else fmt_reduction(rec['time_reduction']),
          tables.human_seconds(rec['sim_time_s']),
      ]
    else:
      rec['cells'] = [g.label, rho, '*not finished*'] + ['–'] * 9
    records.append(rec)
  target_s = fmt_acc(data.target)
  header = ('run', 'density ρ (up = down)', 'seeds',
            'intra-DC up (mean)', 'intra-DC down (mean)',
            f'intra-DC bytes saved, up + down (thesis: {a_ratio.text()}; '
            f'DGC: {a_dgc.text()})', 'final acc (mean ± std)',
            'Δ of the seed means', 'paired Δ, same seed (mean ± std)',
            f'sim time to {target_s}',
            f'less time than uncompressed (thesis: {a_time.text()})',
            'sim time (total)')

  # Other LAN bandwidths: time to target against the uncompressed run there.
  other_records, other_md = [], []
  for lan in _unique(g.lan for g in other):
    gs = [g for g in other if _same_lan(g.lan, lan)]
    lb = baseline_of(gs)
    recs = []
    for g in gs:
      rec = _compression_record(g, lb)
      rec['label'] = f'{g.label}, {_lan_str(lan)} LAN'
      if rec['done']:
        is_b = rec['baseline']
        rec['cells'] = [
            g.label, _seeds_cell(rec),
            _acc_pm(rec['final_acc'], rec['final_acc_std']),
            rec['time_cell'],
            'baseline' if is_b else fmt_reduction(rec['time_reduction']),
            tables.human_seconds(rec['sim_time_s']),
            tables.human_bytes(rec['intra_bytes']),
        ]
      else:
        rec['cells'] = [g.label, '*not finished*'] + ['–'] * 5
      recs.append(rec)
    other_records += recs
    other_md += [
        '', f'**{_lan_str(lan)} LAN** (same training, PS NIC at '
        f'{_lan_str(lan)}: the network model changes only the simulated '
        'clock, so this isolates the time saving):', '']
    other_md += _md_table(
        ('run', 'seeds', 'final acc', f'sim time to {target_s}',
         f'less time than uncompressed at {_lan_str(lan)} (thesis: '
         f'{a_time.text()})', 'sim time (total)', 'intra-DC up + down'),
        [r['cells'] for r in recs])
    other_md += _other_lan_notes(gs, main, lan, main_lan, target_s)

  comp = [r for r in records if r['done'] and not r['baseline']
          and r.get('ratio') is not None]
  judged = [r for r in comp if r['paired_delta'] is not None]
  lossless = [r for r in judged if r['paired_delta'] >= -TOL]
  best_lossless = max(lossless, key=lambda r: r['factor'], default=None)
  at95 = [r for r in lossless if r['ratio'] >= a_ratio.value]
  timed = [r for r in comp + other_records if r['done'] and not r['baseline']
           and r.get('time_reduction') is not None]
  best_time = max(timed, key=lambda r: r['time_reduction'], default=None)

  def with_lan(r):
    return (r['label'] if r['label'].endswith(' LAN')
            else f'{r["label"]}, {_lan_str(main_lan)} LAN')

  claims = []
  if at95:
    r = max(at95, key=lambda r: r['ratio'])
    claims.append(dict(anchor=a_ratio, met=True, ours=(
        f'{100 * r["ratio"]:.2f}% at paired Δ '
        f'{fmt_points_pm(r["paired_delta"], r["paired_std"], r["paired_n"])} '
        f'({r["label"]})'), verdict=(
            f'met: ≥ {fmt_reduction(a_ratio.value)} with paired Δ ≥ '
            f'−{TOL:g} pts')))
  else:
    best = max(judged, key=lambda r: r['ratio'], default=None)
    claims.append(dict(anchor=a_ratio, met=None if not judged else False,
                       ours=(f'{100 * best["ratio"]:.2f}% at paired Δ '
                             f'{fmt_points_pm(best["paired_delta"], best["paired_std"], best["paired_n"])} '
                             f'({best["label"]})' if best else '–'),
                       verdict=('not measured' if not judged else
                                f'not met: no density reaches '
                                f'{fmt_reduction(a_ratio.value)} within '
                                f'{TOL:g} pts (paired Δ)')))
  v, met = _verdict_up_to(best_time and best_time['time_reduction'], a_time,
                          'reduction', bool(comp or other_records))
  claims.append(dict(anchor=a_time, met=met, verdict=v, ours=(
      f'{fmt_reduction(best_time["time_reduction"])} ({with_lan(best_time)})'
      if best_time else '–')))
  if best_lossless is None:
    claims.append(dict(anchor=a_dgc, met=None if not judged else False,
                       ours=('–' if not judged else
                             f'no density within {TOL:g} pts'),
                       verdict='not measured' if not judged else 'not met'))
  else:
    f = best_lossless['factor']
    claims.append(dict(anchor=a_dgc, met=f >= a_dgc.value, ours=(
        f'{fmt_factor(f)} at paired Δ '
        f'{fmt_points_pm(best_lossless["paired_delta"], best_lossless["paired_std"], best_lossless["paired_n"])} '
        f'({best_lossless["label"]})'), verdict=(
            f'met: {fmt_factor(f)} ≥ {a_dgc.value:g}×' if f >= a_dgc.value
            else f'not met: {fmt_factor(f)} < {a_dgc.value:g}× (highest '
            f'within {TOL:g} pts)')))

  run_entries = [e._replace(label=_run_label(e, main_lan)) for e in entries]
  missing = _missing(run_entries, root_display, data.sweep.name)
  seeds = _unique(_seed(e) for e in entries)
  md = ['## Bidirectional sparse + mixed precision (thesis comparison 3)', '',
        'Top-k with error feedback on the uplink (worker → PS) and the '
        'downlink (PS → workers) at the same density, small leaves in '
        f'bf16, against the uncompressed hierarchical PS, on a '
        f'{_lan_str(main_lan)} LAN so that intra-DC communication matters'
        + (', and the time saving again under a '
           + ' and a '.join(_lan_str(x) for x in _unique(g.lan for g in other))
           + ' LAN' if other else '') + '. Baseline: **'
        + (base.label if base else 'missing') + '** (same LAN). Seeds '
        + ', '.join(map(str, seeds)) + ' where the sweep has them: one row per '
        'point, mean ± sample std over its finished seeds.', '']
  md += _settings_lines(data, root_display, run_entries)
  md += [f'**{_lan_str(main_lan)} LAN**:', '']
  md += _md_table(header, [r['cells'] for r in records])
  md += other_md
  md += _missing_lines(missing, data.extra)
  md += [''] + _lossless_lines(records, best_lossless, base_done)
  md += ['', '**Published vs ours**:', '']
  md += _claims_lines(claims)
  notes = ['', 'Notes:', '',
           '- Bytes saved = 1 − (intra-DC up + down bytes) / (those of the '
           'uncompressed run), over the whole run (means over seeds; the '
           'byte counts do not depend on the seed); both runs do the same '
           'number of intra-DC iterations, so this is also the per-iteration '
           'ratio. Bytes are what the payloads (values + indices, bf16 small '
           'leaves) hold; the inter-DC (WAN) link is not compressed here and '
           'not counted in this ratio.',
           '- Paired Δ: for every seed finished both compressed and '
           'uncompressed, final accuracy compressed − uncompressed (same '
           'seed: same initialisation and data order), then mean ± sample '
           'std over those seeds (n). It removes the seed-to-seed spread that '
           'the Δ of the seed means carries, so the "loses ≤ '
           f'{TOL:g} pts" test uses it. With n ≤ 3 this is an estimate, not a '
           'significance test: the standard error of the mean is std / √n.',
           '- Time to target: mean ± std over the seeds that reached it '
           '(count shown when not all did); less time = 1 − compressed mean / '
           'uncompressed mean.',
           '- DGC\'s factors are per gradient on the uplink of flat data '
           'parallelism (ResNet/LSTM-scale models); ours include the downlink '
           'and the bf16 small leaves, so they are not the same quantity. '
           + a_dgc_acc.citation.short + ' claims no accuracy loss at those '
           'factors.']
  if base is not None and not base_done:
    notes.append('- ⚠ The uncompressed baseline has not finished: ratios, Δ '
                 'and time reductions cannot be computed yet.')
  for c in claims:
    if c['met'] is False:
      notes.append(f'- Not met: {c["anchor"].citation.short}, '
                   f'{c["anchor"].quantity} — {c["verdict"]}.')
  notes += _steps_mismatch(
      run_entries, None if base_entry is None else
      run_entries[entries.index(base_entry)]) + _config_drift(data,
                                                              run_entries)
  md += notes
  rows = [g.row for g in main if g.row is not None] + [
      g.row._replace(label=f'{g.label}, {_lan_str(g.lan)} LAN')
      for g in other if g.row is not None]
  return Section('compression', md[0][3:], records, claims, missing,
                 '\n'.join(md) + '\n', rows, data.target,
                 dict(baseline=base.label if base else None,
                      best_lossless=best_lossless, other_lan=other_records,
                      workdirs=_workdirs(entries)))


def _lossless_lines(records: Sequence[dict], best: dict | None,
                    base_done: bool) -> list[str]:
  """The verdict on "loses ≤ 0.5 pts", with the paired Δ of every density."""
  head = f'**Highest compression that loses ≤ {TOL:g} pts** (by the paired Δ): '
  comp = [r for r in records if not r['baseline']]
  judged = [r for r in comp if r['done'] and r.get('paired_delta') is not None]
  if not judged:
    return [head + 'not measured yet (no compressed density with a finished '
            'seed whose uncompressed run with the same seed has finished).']
  if best is not None:
    n = best['paired_n']
    line = (head + f'**ρ={_pct_str(float(best["density"]))}** '
            f'({best["label"]}): {100 * best["ratio"]:.2f}% fewer intra-DC '
            f'bytes ({fmt_factor(best["factor"])}), paired Δ '
            f'{fmt_points_pm(best["paired_delta"], best["paired_std"], n)}'
            + _se_text(best)
            + f'; Δ of the seed means {fmt_points(best["delta_points"])}.')
    if n < best['n_total']:
      line += (f' Provisional: {n} of {best["n_total"]} seeds compared so '
               'far.')
  else:
    least = max(judged, key=lambda r: r['paired_delta'])
    line = (head + f'**none** of the finished densities: the smallest loss is '
            f'ρ={_pct_str(float(least["density"]))}, paired Δ '
            f'{fmt_points_pm(least["paired_delta"], least["paired_std"], least["paired_n"])}.')
  lines = [line, '', 'Per density (paired Δ, mean ± std over n seeds; ✓ = '
           f'loses ≤ {TOL:g} pts):', '']
  for r in comp:
    rho = ('?' if r['density'] is None else _pct_str(float(r['density'])))
    lines.append(_paired_item(r, f'ρ={rho}'))
  if best is not None:
    lines += _monotonicity_note(judged, best)
  if not base_done:
    lines.append('- ⚠ the uncompressed baseline has not finished')
  return lines


def _se_text(r: Mapping[str, Any]) -> str:
  """', standard error 0.15 pts' (std / √n of the paired Δ), '' without a std."""
  if r.get('paired_std') is None:
    return ''
  return f', standard error {r["paired_std"] / math.sqrt(r["paired_n"]):.2f} pts'


def _paired_item(r: Mapping[str, Any], name: str) -> str:
  """One bullet of a per-point paired Δ list.

  Args:
    r: a :func:`_compression_record` record.
    name: how the point is named (``'ρ=2%'``, ``'γ=0.9'``).

  Returns:
    ``'- ✓ ρ=2%: −0.45 ± 0.21 pts (n=2), 2 of 3 seeds — per seed: 0: −0.30
    pts, 1: −0.60 pts'`` (✓ = loses ≤ ``TOL`` pts, ✗ = more), or ``'- ρ=0.1%:
    not measured yet'``.
  """
  if not r['done'] or r.get('paired_delta') is None:
    return f'- {name}: not measured yet'
  ok = r['paired_delta'] >= -TOL
  s = ('✓' if ok else '✗') + f' {name}: ' + fmt_points_pm(
      r['paired_delta'], r['paired_std'], r['paired_n'])
  if r['paired_n'] < r['n_total']:
    s += f', {r["paired_n"]} of {r["n_total"]} seeds'
  if len(r['paired']) > 1:
    s += ' — per seed: ' + ', '.join(
        f'{seed}: {fmt_points(d)}' for seed, d in sorted(
            r['paired'].items(), key=lambda kv: (kv[0] is None, kv[0])))
  return '- ' + s


def _se(r: dict) -> float:
  """Standard error of a record's paired Δ (0 with one seed: unknown spread)."""
  n, std = r['paired_n'], r['paired_std']
  return 0.0 if std is None or n < 2 else std / math.sqrt(n)


def _monotonicity_note(judged: Sequence[dict], best: dict) -> list[str]:
  """A note when a denser (less compressed) density fails the bar the best one passes."""
  denser = [r for r in judged if r['density'] is not None and best['density'] is not None
            and float(r['density']) > float(best['density']) and r['paired_delta'] < -TOL]
  if not denser:
    return []
  parts = []
  for r in denser:
    gap = abs(r['paired_delta'] - best['paired_delta'])
    within = gap < max(_se(r), _se(best))
    parts.append(f'ρ={_pct_str(float(r["density"]))} fails while the sparser '
                 f'ρ={_pct_str(float(best["density"]))} passes; their paired Δs differ by '
                 f'{gap:.2f} pts, ' + ('less than the larger standard error '
                                        f'({max(_se(r), _se(best)):.2f} pts)' if within else
                                        'more than their standard errors'))
  return ['', '- Not monotone in density: ' + '; '.join(parts) + '. At this number of seeds '
          'the verdicts near the bar are within the noise: these densities lose about '
          'the same, close to the 0.5-pt bar.']


def _other_lan_notes(groups: Sequence[SeedGroup], main: Sequence[SeedGroup],
                     lan: float, main_lan: float | None,
                     target_s: str) -> list[str]:
  """Under the other-LAN table: the same seeds at the main LAN, and a check
  that only the clock changed (same final accuracy)."""
  lines = []
  same_acc, diff_acc = [], []
  t_main = {}
  for g in groups:
    twin = next((m for m in main if m.entries and g.entries and
                 _key_without(m.entries[0], ('seed', 'network.lan_bandwidth_gbps'))
                 == _key_without(g.entries[0],
                                 ('seed', 'network.lan_bandwidth_gbps'))), None)
    if twin is None:
      continue
    by_seed = {_seed(e): e for e in twin.done}
    for e in g.done:
      m = by_seed.get(_seed(e))
      if m is None:
        continue
      a, b = _final(e), _final(m)
      if a is not None and b is not None:
        (same_acc if abs(a - b) < 1e-9 else diff_acc).append(
            (g.label, _seed(e), 100 * (a - b)))
      t_main.setdefault(g.label, []).append(m.row.time_to_target_s.mean)
  lines += ['']
  if same_acc and not diff_acc:
    lines.append(f'- Final accuracy equals that of the same seed at '
                 f'{_lan_str(main_lan)} for every run here: only the clock '
                 'changed, as it should.')
  elif diff_acc:
    lines.append(f'- ⚠ Final accuracy differs from the same seed at '
                 f'{_lan_str(main_lan)}: ' + ', '.join(
                     f'{lab}, seed {s}: {fmt_points(d)}'
                     for lab, s, d in diff_acc)
                 + ' (the LAN should only move the simulated clock; a '
                 'difference means the runs were not trained identically, '
                 'e.g. by different code versions).')
  base_lab = next((g.label for g in groups
                   if tables.is_uncompressed(g.config)), None)
  for g in groups:
    if g.label == base_lab or g.label not in t_main or base_lab not in t_main:
      continue
    tm, bm = t_main[g.label], t_main[base_lab]
    if None in tm or None in bm:
      continue
    red = reduction(sum(tm) / len(tm), sum(bm) / len(bm))
    lines.append(f'- For comparison, at {_lan_str(main_lan)} with the same '
                 f'seed(s), {g.label} needs '
                 f'{tables.human_seconds(sum(tm) / len(tm))} to {target_s} vs '
                 f'{tables.human_seconds(sum(bm) / len(bm))} uncompressed '
                 f'({fmt_reduction(red)} less time).')
  return lines if len(lines) > 1 else []


# --------------------------------------------------------------------------
# CO3: two sweeps, each paired seed by seed with its own uncompressed runs.


CO3_GAMMA = 0.9  # the CO3 paper's error-feedback memory decay (its claim)


class Co3Table(NamedTuple):
  """One CO3 sweep as seed groups against its own uncompressed group.

  Attributes:
    data: the sweep.
    base: the uncompressed group (None when the sweep has none).
    records: one per group, uncompressed first, then by γ:
      :func:`_compression_record` plus ``gamma`` (None when not CO3) and
      ``cells`` (the rendered table row).
    run_entries: the sweep's points, labelled per run (``'co3 fp4 γ=0.9,
      seed 1'``).
    base_entry: the uncompressed run of ``run_entries`` that step counts are
      checked against (the group's first), or None.
    missing: its unfinished runs (:func:`_missing`).
    rows: GroupRows of the finished groups, in table order (plots).
  """
  data: SweepData
  base: SeedGroup | None
  records: list
  run_entries: list
  base_entry: Entry | None
  missing: list
  rows: list


def _partition_str(config: Mapping[str, Any]) -> str:
  """'IID' or 'non-IID (Dirichlet α = 0.5)': the data partition of a config."""
  part = _get(config, 'dataset.partition', '?')
  if part == 'iid':
    return 'IID'
  if part == 'dirichlet':
    return f'non-IID (Dirichlet α = {_get(config, "dataset.dirichlet_alpha")})'
  return f'`{part}`'


def _gamma(config: Mapping[str, Any]) -> float | None:
  """The CO3 uplink's γ, None when the uplink is not CO3."""
  if _get(config, 'compression.uplink.name') != 'co3':
    return None
  return float(_get(config, 'compression.uplink.gamma', 0.0))


def _co3_cells(rec: Mapping[str, Any]) -> list[str]:
  """A CO3 table row (see :func:`_co3_header`) from its record."""
  if not rec['done']:
    return [rec['label'], '*not finished*'] + ['–'] * 6
  is_b = rec['baseline']
  bits = rec['bits_per_entry']
  return [
      rec['label'], _seeds_cell(rec),
      _acc_pm(rec['final_acc'], rec['final_acc_std']),
      'baseline' if is_b else fmt_points_pm(
          rec['paired_delta'], rec['paired_std'], rec['paired_n'] or None),
      tables.human_bytes(rec['intra_up']),
      'baseline' if is_b else fmt_factor(rec['up_factor']),
      '–' if bits is None else f'{bits:.2f}',
      rec['time_cell'],
  ]


def _co3_header(target: float) -> tuple[str, ...]:
  a_acc = anchors.get('co3.accuracy_delta')
  return ('run', 'seeds', 'final acc (mean ± std)',
          'paired Δ vs uncompressed, same seed (mean ± std; CO3 paper at '
          f'γ={CO3_GAMMA:g}: {a_acc.text()})', 'uplink bytes (mean)',
          'uplink reduction (uncompressed / ours)', 'bits per uplink entry',
          f'sim time to {fmt_acc(target)}')


def co3_table(data: SweepData, root_display: str) -> Co3Table:
  """Groups a CO3 sweep by seed; every group against the uncompressed one.

  Args:
    data: a sweep holding uncompressed (``identity``) and CO3 points that
      differ only in ``compression.*`` and ``seed``.
    root_display: the results root as the reader should see it.

  Returns:
    The :class:`Co3Table`.
  """
  entries = data.entries
  lan = (None if not entries else
         float(_get(entries[0].config, 'network.lan_bandwidth_gbps', 0)))
  groups = group_seeds(entries, data.target)
  base = next((g for g in groups if tables.is_uncompressed(g.config)), None)
  groups.sort(key=lambda g: (g is not base, _gamma(g.config) is None,
                             _gamma(g.config) or 0.0))
  records = []
  for g in groups:
    rec = _compression_record(g, base)
    rec['gamma'] = _gamma(g.config)
    rec['cells'] = _co3_cells(rec)
    records.append(rec)
  run_entries = [e._replace(label=_run_label(e, lan)) for e in entries]
  base_entry = (None if base is None else next(
      r for e, r in zip(entries, run_entries) if e is base.entries[0]))
  return Co3Table(data, base, records, run_entries, base_entry,
                  _missing(run_entries, root_display, data.sweep.name),
                  [g.row for g in groups if g.row is not None])


def _headline(records: Sequence[dict]) -> dict | None:
  """The γ = 0.9 record (the CO3 paper's setting), or None."""
  return next((r for r in records if r.get('gamma') is not None
               and math.isclose(r['gamma'], CO3_GAMMA)), None)


def _co3_reading(records: Sequence[dict], context: bool) -> list[str]:
  """The γ = 0.9 paired Δ against the no-loss bar, then every γ's paired Δ.

  Args:
    records: a :class:`Co3Table`'s records.
    context: True for a table that does not carry the claim's verdict (its
      reading is labelled as context).
  """
  head = (f'**γ={CO3_GAMMA:g} in this setting** (context, not the verdict on '
          "the CO3 paper's claim): " if context else
          f"**The CO3 paper's claim, γ={CO3_GAMMA:g} ≈ uncompressed "
          'accuracy** (by the paired Δ): ')
  h = _headline(records)
  if h is None or not h['done'] or h.get('paired_delta') is None:
    line = (head + f'not measured yet (no γ={CO3_GAMMA:g} seed has finished '
            'together with the uncompressed run of the same seed).')
  else:
    n = h['paired_n']
    ok = h['paired_delta'] >= -TOL
    line = (head + 'paired Δ '
            f'{fmt_points_pm(h["paired_delta"], h["paired_std"], n)}'
            + _se_text(h) + ' — ' + ('within' if ok else 'beyond')
            + f' the {TOL:g}-pt no-loss bar, at '
            f'{fmt_factor(h["up_factor"])} fewer uplink bytes '
            + ('' if h['bits_per_entry'] is None else
               f'({h["bits_per_entry"]:.2f} bits per entry)')
            + f'; Δ of the seed means {fmt_points(h["delta_points"])}.')
    if n < h['n_total']:
      line += f' Provisional: {n} of {h["n_total"]} seeds compared so far.'
  lines = [line, '', 'Per γ (paired Δ, mean ± std over n seeds; ✓ = loses ≤ '
           f'{TOL:g} pts):', '']
  lines += [_paired_item(r, r['label'] if r['gamma'] is None
                         else f'γ={r["gamma"]:g}')
            for r in records if not r['baseline']]
  return lines


def _co3_claim(records: Sequence[dict]) -> dict:
  """The claims-table row of ``co3.accuracy_delta`` from a table's records.

  The verdict is :func:`_verdict_no_loss` on the mean paired Δ at γ = 0.9;
  the text gives its std, n and standard error and the uplink reduction.
  """
  a_acc = anchors.get('co3.accuracy_delta')
  h = _headline(records)
  if h is None or not h['done'] or h.get('paired_delta') is None:
    return dict(anchor=a_acc, met=None, ours='–', verdict=(
        f'not measured (no γ={CO3_GAMMA:g} seed finished together with the '
        'uncompressed run of the same seed)'))
  v, met = _verdict_no_loss(h['paired_delta'], 'paired Δ (mean)')
  n = h['paired_n']
  ours = (f'paired Δ {fmt_points_pm(h["paired_delta"], h["paired_std"], n)}'
          + _se_text(h) + f' at {fmt_factor(h["up_factor"])} fewer uplink '
          'bytes' + ('' if h['bits_per_entry'] is None else
                     f' ({h["bits_per_entry"]:.2f} bits/entry)'))
  if n < h['n_total']:
    v += f' (provisional: {n} of {h["n_total"]} seeds compared)'
  return dict(anchor=a_acc, met=met, verdict=v, ours=ours)


def _co3_table_lines(t: Co3Table, root_display: str, context: bool
                     ) -> list[str]:
  """Settings, table, paired-Δ reading and missing runs of one CO3 sweep."""
  lines = _settings_lines(t.data, root_display, t.run_entries)
  lines += _md_table(_co3_header(t.data.target),
                     [r['cells'] for r in t.records])
  lines += [''] + _co3_reading(t.records, context)
  if t.base is None or t.base.row is None:
    lines.append('- ⚠ the uncompressed runs of this sweep have not finished: '
                 'no paired Δ, uplink reduction or bits per entry yet')
  lines += _missing_lines(t.missing, t.data.extra)
  return lines


def co3_section(data: SweepData, hfl_data: SweepData,
                root_display: str) -> Section:
  """CO3 fp4 at several γ, each seed paired with the uncompressed same seed.

  Two tables, each against the uncompressed runs of its own sweep (same
  config except ``compression.*``), grouped by seed as in the compression
  section (:func:`group_seeds`, :func:`paired_deltas`):

  * ``data`` (``co3_iid``): the CO3 paper's own training setup — one
    synchronous PS (``sync.k = 1``) over IID shards, SGD lr 0.01. The paper's
    claim (γ = 0.9 ≈ uncompressed accuracy) is judged here: mean paired Δ ≥
    −``TOL`` pts.
  * ``hfl_data`` (``co3_paper``): hfl's hierarchical non-IID setting
    (Dirichlet shards, periodic K = 4), with the same columns and the same
    γ = 0.9 reading, but no row in the claims table: the claim was made for
    the paper's setting, and this one adds non-IID data and periodic
    averaging (whose round-to-round accuracy swings three seeds cannot
    resolve), so a second verdict on the same anchor would mix the claim
    with hfl's setting. Its reading is printed as context, labelled so.

  Args:
    data: the ``co3_iid`` sweep (the claim's table).
    hfl_data: the ``co3_paper`` sweep (hfl's setting).
    root_display: the results root as the reader should see it.

  Returns:
    The :class:`Section`: ``records`` are the main table's rows, ``claims``
    the one ``co3.accuracy_delta`` row, ``missing`` the unfinished runs of
    both sweeps, ``rows`` (plots) the main table's groups;
    ``extra['hfl_setting']`` holds the second table's records and
    ``extra['headline']`` the main table's γ = 0.9 record (or None).
  """
  main = co3_table(data, root_display)
  second = co3_table(hfl_data, root_display)
  claims = [_co3_claim(main.records)]

  c = data.entries[0].config if data.entries else {}
  hc = hfl_data.entries[0].config if hfl_data.entries else {}
  md = ['## CO3: convert, compress, correct', '',
        'CO3 on the uplink (worker → PS): per-layer GenNorm scaling, fp4 '
        '[1,2,1] round-to-nearest, GenNorm-designed Huffman code, error '
        'feedback with memory decay γ (p = g + γe); 1-D leaves stay float32; '
        'downlink and WAN uncompressed. Each table compares every γ with the '
        '**uncompressed runs of its own sweep** (same config except '
        '`compression.*`), seed by seed: one row per point, mean ± sample std '
        'over its finished seeds; paired Δ = CO3 − uncompressed with the same '
        'seed, then mean ± std over seeds. The first table is the CO3 '
        "paper's own training setup and carries the verdict on its claim; the "
        "second is hfl's hierarchical non-IID setting, for context.", '',
        "### The CO3 paper's setting: synchronous PS over "
        f'{_partition_str(c)} shards', '',
        f'`sync.k = {_get(c, "sync.k")}`: every intra-DC iteration ends with '
        'an inter-DC round, so all workers train as one synchronous parameter '
        f'server, on {_partition_str(c)} shards, with '
        f'`{_get(c, "optimizer.name")}` at lr '
        f'{_get(c, "optimizer.learning_rate")}, as the paper trains. '
        'Baseline: **' + (main.base.label if main.base else 'missing')
        + '** (this sweep).', '']
  md += _co3_table_lines(main, root_display, context=False)
  md += ['', "### hfl's setting: hierarchical PS, "
         f'{_partition_str(hc)} shards, {_get(hc, "sync.strategy")} K = '
         f'{_get(hc, "sync.k")}', '',
         "hfl's default experiment with the paper's optimizer "
         f'(`{_get(hc, "optimizer.name")}` at lr '
         f'{_get(hc, "optimizer.learning_rate")}): {_partition_str(hc)} '
         f'shards, DC models averaged every K = {_get(hc, "sync.k")} intra-DC '
         "iterations. Shown so readers see CO3 in hfl's own setting too; it "
         "carries no verdict on the paper's claim (made for the setting "
         'above). Baseline: **'
         + (second.base.label if second.base else 'missing')
         + '** (this sweep).', '']
  md += _co3_table_lines(second, root_display, context=True)
  md += ['', "**Published vs ours** (the paper's setting, first table):", '']
  md += _claims_lines(claims)
  notes = ['', 'Notes:', '',
           '- Uplink reduction = uplink bytes of the uncompressed runs / ours '
           '(×); bits per uplink entry = 32 × ours / uncompressed, i.e. the '
           'mean over all entries including the 1-D leaves sent as float32 '
           'and the per-layer scales (issue 5 asks for ≥ 8×, i.e. ≤ 4 bits '
           'per entry). Bytes are means over seeds (they do not depend on '
           'the seed).',
           '- Paired Δ: for every seed finished both with CO3 and '
           'uncompressed, final accuracy CO3 − uncompressed (same seed: same '
           'initialisation and data order), then mean ± sample std over those '
           f'seeds (n). "≈ uncompressed accuracy" is read as a mean paired Δ '
           f'≥ −{TOL:g} pts, the bar of the compression section. With n ≤ 3 '
           'this is an estimate, not a significance test: the standard error '
           'of the mean is std / √n.',
           '- The paper measured CIFAR-10 with DenseNet121/ResNet50V2/'
           'NASNetMobile (SGD lr 0.01, batch 64); ours is the default '
           'Fashion-MNIST CNN.',
           '- The earlier one-seed γ grid with momentum 0.9 '
           '(`configs/sweeps/co3.py`, baseline from the compression sweep) is '
           'no longer on this page; it and the other CO3 sweeps are described '
           'in `docs/co3.md`.']
  hfl_runs = [e._replace(label=f'{e.label} [hfl setting]')
              for e in second.run_entries]
  hfl_base = next((r for r, e in zip(hfl_runs, second.run_entries)
                   if e is second.base_entry), None)
  checks = (_run_checks(data, main.run_entries, main.base_entry)
            + _run_checks(hfl_data, hfl_runs, hfl_base))
  return _finish_section(
      'co3', md, notes, claims, main.records, main.missing + second.missing,
      main.run_entries + second.run_entries, main.base_entry, data,
      rows=main.rows, checks=checks,
      extra=dict(baseline=main.base.label if main.base else None,
                 hfl_setting=second.records,
                 headline=_headline(main.records)))


# --------------------------------------------------------------------------
# Plots.


def plot_accuracy_vs_compression(section: Section, path: str) -> str | None:
  """Final accuracy and paired Δ vs intra-DC compression factor (log x).

  Top: one point per density of the main LAN, mean final accuracy over its
  finished seeds (error bar ±1 sample std where there are several), with the
  published anchors. Bottom: the paired Δ (same seed, compressed −
  uncompressed; mean ± std over seeds), the quantity "loses ≤ 0.5 pts" is
  judged on.

  Args:
    section: the compression section.
    path: PNG path.

  Returns:
    ``path``, or None when there is nothing to plot (no finished baseline).
  """
  pts = [r for r in section.records if r['done'] and r.get('factor')
         is not None and not math.isinf(r['factor'])]
  base = next((r for r in section.records if r['baseline'] and r['done']),
              None)
  if base is None or not pts:
    return None
  pts = sorted([dict(base, factor=1.0)] + pts, key=lambda r: r['factor'])
  fig = Figure(figsize=(7.2, 7.2), dpi=120, layout='constrained')
  FigureCanvasAgg(fig)
  ax, ax2 = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
  a_dgc = anchors.get('dgc.compression_factor')
  a_ratio = anchors.get('thesis.compression.ratio')
  thesis_x = 1.0 / (1.0 - a_ratio.value)
  for i, a in enumerate((ax, ax2)):
    a.axvspan(a_dgc.value, a_dgc.value_high, color='tab:orange', alpha=0.15,
              label=f'DGC claim: {a_dgc.text()}, no loss' if i == 0 else None)
    a.axvline(thesis_x, color='tab:green', linestyle=':', linewidth=1.2,
              label=(f'thesis: {a_ratio.text()} ({thesis_x:.0f}×)' if i == 0
                     else None))
  b = 100 * base['final_acc']
  nb = base['n_seeds']
  ax.axhline(b, color='0.3', linestyle='--', linewidth=1,
             label=f'uncompressed {b:.2f}%'
             + (f' (mean of {nb} seeds)' if nb > 1 else ''))
  ax.axhline(b - TOL, color='0.5', linestyle='-.', linewidth=1,
             label=f'uncompressed − {TOL:g} pts')
  xs = [r['factor'] for r in pts]
  ys = [100 * r['final_acc'] for r in pts]
  errs = [100 * (r.get('final_acc_std') or 0.0) for r in pts]
  several = any(r['n_seeds'] > 1 for r in pts)
  ax.errorbar(xs, ys, yerr=errs if several else None, color='tab:blue',
              marker='o', linewidth=1.5, capsize=4, zorder=3,
              label='ours: final test accuracy'
              + (', mean ± std over seeds' if several else ''))
  x_lo, x_hi = 0.7, max(max(xs) * 1.5, a_dgc.value_high * 1.3)

  def label(a, r, x, y, text):
    # The rightmost label goes to the left of its point if it would run out
    # of the axes.
    right = x == xs[-1] and math.log(x / x_lo) / math.log(x_hi / x_lo) > 0.65
    a.annotate(text, (x, y), textcoords='offset points',
               xytext=(-8, 5) if right else (8, 5),
               ha='right' if right else 'left', va='bottom',
               fontsize='small', zorder=2.5,
               bbox=dict(boxstyle='round,pad=0.1', fc='white', ec='none',
                         alpha=0.7))

  for r, x, y in zip(pts, xs, ys):
    text = ('uncompressed' if r['baseline'] else
            f'ρ={_pct_str(float(r["density"]))} ({100 * r["ratio"]:.1f}%)')
    label(ax, r, x, y, text + f', n={r["n_seeds"]}')
  ax.set_xscale('log')
  ax.set_xlim(x_lo, x_hi)
  lo = min(min(y - e for y, e in zip(ys, errs)), b - TOL)
  hi = max(max(y + e for y, e in zip(ys, errs)), b)
  pad = max(0.5, 0.15 * (hi - lo))
  ax.set_ylim(lo - pad, hi + 2 * pad)
  ax.set_ylabel('final test accuracy (%)')
  lan = section.records[0].get('lan_gbps') if section.records else None
  ax.set_title('Accuracy vs compression: bidirectional top-k + bf16 small'
               + (f' ({_lan_str(lan)} LAN)' if lan else ''))
  ax.grid(True, which='major', alpha=0.3)
  ax.legend(loc='lower left', fontsize='small')

  paired = [r for r in pts if not r['baseline']
            and r.get('paired_delta') is not None]
  ax2.axhline(0.0, color='0.3', linestyle='--', linewidth=1)
  ax2.axhline(-TOL, color='0.5', linestyle='-.', linewidth=1,
              label=f'−{TOL:g} pts: the "no loss" bound')
  if paired:
    px = [r['factor'] for r in paired]
    py = [r['paired_delta'] for r in paired]
    pe = [r['paired_std'] or 0.0 for r in paired]
    ax2.errorbar(px, py, yerr=pe, color='tab:red', marker='s', linewidth=1.5,
                 capsize=4, zorder=3,
                 label='paired Δ (same seed), mean ± std over seeds')
    for r, x, y in zip(paired, px, py):
      label(ax2, r, x, y, f'{y:+.2f}, n={r["paired_n"]}'.replace('-', '−'))
    lo2 = min(min(y - e for y, e in zip(py, pe)), -TOL)
    hi2 = max(max(y + e for y, e in zip(py, pe)), 0.0)
    pad2 = max(0.3, 0.15 * (hi2 - lo2))
    ax2.set_ylim(lo2 - pad2, hi2 + 2 * pad2)
  else:
    ax2.text(0.5, 0.5, 'no paired seeds yet', transform=ax2.transAxes,
             ha='center', va='center')
  ax2.set_ylabel('accuracy Δ vs uncompressed (pts)')
  ax2.set_xlabel('intra-DC compression factor (uncompressed / ours, up + down '
                 'bytes; log scale)')
  ax2.grid(True, which='major', alpha=0.3)
  ax2.legend(loc='lower left', fontsize='small')
  fig.savefig(path)
  return path


_SECTION_TITLES = {
    'semisync': 'sync strategies',
    'compression': 'bidirectional top-k',
    'co3': 'CO3 fp4, sync PS over IID shards',
}


def write_section_plots(section: Section, plot_dir: str) -> list[str]:
  """The three accuracy plots of a section (plus accuracy vs compression).

  Args:
    section: a section with finished rows.
    plot_dir: output directory.

  Returns:
    The PNG paths written (none when the section has no finished run).
  """
  if not section.rows:
    return []
  written = []
  for axis in plots.AXES:
    path = os.path.join(plot_dir, f'{section.key}_{axis.filename}')
    quantity = axis.label.split(' (')[0]
    plots.plot_accuracy(section.rows, axis, path, section.target,
                        title=f'{_SECTION_TITLES[section.key]}: test accuracy '
                        f'vs {quantity}')
    written.append(path)
  if section.key == 'compression':
    p = plot_accuracy_vs_compression(
        section, os.path.join(plot_dir, 'compression_accuracy_vs_ratio.png'))
    if p:
      written.append(p)
  return written


# --------------------------------------------------------------------------
# The page.


HOW_TO_READ = """\
## How to read this page

- **Accuracy** is test accuracy on the full test set, in percent; **Δ** is ours
  − baseline in percentage points (pts), at the same number of intra-DC
  iterations.
- **Simulated time** (`sim_time_s`, seconds) is the wall-clock time of the
  network model (DESIGN 4.5), not the time this machine took: each intra-DC
  iteration costs the DC's compute time (`network.compute_time_s` / DC speed)
  plus the time its parameter server's NIC needs to receive every worker's
  uplink payload and send the downlink to every worker (LAN bandwidth +
  latency); an inter-DC round costs the WAN transfer of the actual payload
  (bytes / WAN bandwidth + latency); DCs that finish a round early idle. Bytes
  are counted from the payloads that cross the collectives.
- **Inter-DC rounds** are WAN synchronisations; **intra-DC iterations** are
  optimizer steps inside a DC.
- **To target**: the first crossing of the runs' `train.target_accuracy`,
  linearly interpolated between evaluations; `never` = not reached in the
  run. **Reduction** = 1 − ours / baseline (positive = better).
- Bytes use decimal units (1 MB = 10^6 bytes). One seed per configuration,
  except in the compression and CO3 comparisons: there, points run with several
  seeds are one row, mean ± sample std over the finished seeds, and the accuracy
  cost is also given as a **paired Δ** (compressed − uncompressed with the
  same seed, then mean ± std over seeds).
- **Published** numbers come from `hfl/report/anchors.py` (DESIGN §6 with
  citations); they were measured on other models, data and hardware, so they
  are context, not a pass/fail bar. "Not met" below says so where ours fall
  short.
"""


def _sources_lines(sections: Sequence[Section]) -> list[str]:
  cites = {}
  for s in sections:
    for c in s.claims:
      cites.setdefault(c['anchor'].citation.short, c['anchor'].citation)
  lines = ['## Sources', '']
  for short, c in cites.items():
    lines.append(f'- **{short}**: {c.reference}'
                 + (f' <{c.url}>' if c.url else '') + '.')
  return lines


def build_sections(root: str, root_display: str | None = None
                   ) -> list[Section]:
  """Loads the four sweeps under ``root`` and builds the sections.

  Args:
    root: results root (``ROOT/compression``, ``ROOT/semisync``,
      ``ROOT/co3_iid``, ``ROOT/co3_paper``).
    root_display: how ``root`` is printed on the page (default: as given).

  Returns:
    Sections in page order: semisync, compression, co3 (both CO3 sweeps).
  """
  shown = root if root_display is None else root_display
  by_name = {s.name: s for s in SWEEPS}
  semi = load_sweep_data(by_name['semisync'], root, semisync_label)
  comp = load_sweep_data(by_name['compression'], root, compression_label)
  co3 = load_sweep_data(by_name['co3_iid'], root, co3_label)
  co3_hfl = load_sweep_data(by_name['co3_paper'], root, co3_label)
  return [semisync_section(semi, shown), compression_section(comp, shown),
          co3_section(co3, co3_hfl, shown)]


def render_page(sections: Sequence[Section], plot_files: Mapping[str, list],
                root_display: str, out_display: str,
                now: datetime.datetime | None = None) -> str:
  """The Markdown of ``results.md``.

  Args:
    sections: from :func:`build_sections`.
    plot_files: section key -> PNG paths relative to the page.
    root_display: the results root as printed.
    out_display: the output directory as printed.
    now: generation time (default: now, UTC).

  Returns:
    Markdown text.
  """
  now = now or datetime.datetime.now(datetime.timezone.utc)
  status = {}
  for s in sections:
    for workdir, done in s.extra.get('workdirs', ()):
      status[os.path.normpath(workdir)] = done
  n_total = len(status)
  n_missing = sum(1 for done in status.values() if not done)
  lines = [
      '# Results: hierarchical FL across datacenters vs the published numbers',
      '',
      f'Generated {now.strftime("%Y-%m-%d %H:%M UTC")} by',
      '',
      '```',
      f'python -m hfl.report.results --root {root_display} --out {out_display}',
      '```',
      '',
      '(which first runs the four sweeps — finished runs are skipped, '
      'interrupted ones resume; add `--no-run` to only rebuild this page from '
      'the workdirs). Sections: [optimised HPS vs synchronous HPS]'
      '(#optimised-hps-vs-synchronous-hps-thesis-comparisons-1-and-2), '
      '[bidirectional sparse + mixed precision]'
      '(#bidirectional-sparse--mixed-precision-thesis-comparison-3), '
      '[CO3](#co3-convert-compress-correct).',
      '',
  ]
  if n_missing:
    lines += [f'> **Incomplete: {n_total - n_missing} of {n_total} runs have '
              f'finished.** The {n_missing} missing runs are listed in each '
              'section; tables show them as *not finished* and leave them out '
              'of every number and plot. Re-run the command when they are '
              'done.', '']
  else:
    lines += [f'All {n_total} runs have finished.', '']
  lines += [HOW_TO_READ]
  for s in sections:
    lines.append(s.markdown)
    files = plot_files.get(s.key, [])
    if files:
      seeds = any(len(r.runs) > 1 for r in s.rows)
      lines += ['**Plots** (one line per finished '
                + ('point: mean over its finished seeds, shaded ±1 std, '
                   '(n=…) seeds' if seeds else 'run')
                + f'; dashed line: target {fmt_acc(s.target)}):', '']
      lines += [f'![{os.path.splitext(os.path.basename(f))[0]}]({f})'
                for f in files]
      lines.append('')
    else:
      lines += ['*No plots yet: no finished run in this section.*', '']
  lines += _sources_lines(sections)
  return '\n'.join(lines) + '\n'


def write_results(root: str, out: str, root_display: str | None = None,
                  out_display: str | None = None,
                  now: datetime.datetime | None = None) -> dict[str, Any]:
  """Regenerates ``OUT/results.md`` and ``OUT/results/*.png`` from scratch.

  PNG files left in ``OUT/results/`` by an earlier invocation are deleted
  first (nothing else there is touched), so the page never shows a stale plot.

  Args:
    root: results root holding the four sweeps.
    out: output directory.
    root_display: ``root`` as printed on the page (default: as given).
    out_display: ``out`` as printed (default: as given).
    now: generation time for the page header.

  Returns:
    Dict with ``'results.md'`` (path), ``'plots'`` (list of PNG paths) and
    ``'sections'`` (the :class:`Section` list).
  """
  sections = build_sections(root, root_display)
  plot_dir = os.path.join(out, PLOTS_DIR)
  os.makedirs(plot_dir, exist_ok=True)
  for name in os.listdir(plot_dir):
    if name.endswith('.png'):
      os.remove(os.path.join(plot_dir, name))
  plot_files, all_plots = {}, []
  for s in sections:
    files = write_section_plots(s, plot_dir)
    all_plots += files
    plot_files[s.key] = [f'{PLOTS_DIR}/{os.path.basename(f)}' for f in files]
  text = render_page(sections, plot_files,
                     root if root_display is None else root_display,
                     out if out_display is None else out_display, now)
  md_path = os.path.join(out, RESULTS_MD)
  tmp = md_path + '.tmp'
  with open(tmp, 'w', encoding='utf-8') as f:
    f.write(text)
  os.replace(tmp, md_path)
  return {'results.md': md_path, 'plots': all_plots, 'sections': sections}


def run_sweeps(root: str, parallel: int = 1) -> list[sweep_lib.SweepResult]:
  """Runs the four sweeps (:data:`SWEEPS`) as ``python -m hfl.sweep`` would.

  Finished runs are skipped; interrupted ones resume from their checkpoints.
  The configs of the runs to launch, in all four sweeps, are checked first
  (:func:`hfl.sweep.check_runs`), then one line says how many runs are missing
  and where.

  Args:
    root: results root; sweep NAME goes to ``root/NAME``.
    parallel: runs executed at the same time within a sweep.

  Returns:
    One :class:`hfl.sweep.SweepResult` per sweep.
  """
  _ensure_repo_on_path()
  sweeps, missing = [], {}
  for s in SWEEPS:
    base, grid = sweep_lib.load_sweep(os.path.join(REPO_ROOT, s.path))
    sweep_root = os.path.join(root, s.name)
    config_arg = sweep_lib.resolve_base(base, sweep_root, write=False)
    todo = [r for r in sweep_lib.make_runs(config_arg, grid, sweep_root)
            if sweep_lib.run_status(r.workdir) != 'done']
    sweep_lib.check_runs(base, config_arg, todo)  # every sweep, before any launches
    sweeps.append((s, base, grid, sweep_root))
    if todo:
      missing[s.name] = len(todo)
  if missing:
    logging.info(
        '%d runs missing (%s) under %s: launching them now (each one trains); '
        'pass --no-run to render the page from the runs that exist.',
        sum(missing.values()), ', '.join(f'{k}: {v}' for k, v in missing.items()), root)
  return [sweep_lib.run_sweep(base, grid, sweep_root, parallel=parallel)
          for _, base, grid, sweep_root in sweeps]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  """Parses the command line."""
  p = argparse.ArgumentParser(
      prog='python -m hfl.report.results',
      description='Run the thesis/CO3 sweeps and regenerate the results page.')
  p.add_argument('--root', default='workdirs',
                 help='results root: ROOT/compression, ROOT/semisync, '
                 'ROOT/co3_iid, ROOT/co3_paper (default: workdirs)')
  p.add_argument('--out', default='docs',
                 help='writes OUT/results.md and OUT/results/*.png '
                 '(default: docs)')
  p.add_argument('--no-run', '--no_run', dest='run', action='store_false',
                 help='do not run the sweeps; only rebuild the page')
  p.add_argument('--parallel', type=int, default=1,
                 help='training runs at the same time within a sweep')
  return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
  """CLI entry point; exit status 1 on failed runs, 2 on a bad run config, 130 on Ctrl-C."""
  args = parse_args(argv)
  logging.basicConfig(level=logging.INFO, format='%(levelname)s %(message)s')
  failed = False
  if args.run:
    try:
      failed = any(r.failed for r in run_sweeps(args.root, args.parallel))
    except (FileNotFoundError, ValueError) as e:
      print(f'error: {e}', file=sys.stderr)
      return 2
    except KeyboardInterrupt:
      return sweep_lib.interrupted()
  written = write_results(args.root, args.out)
  print(written['results.md'])
  for p in written['plots']:
    print(p)
  status = {os.path.normpath(w): done for s in written['sections']
            for w, done in s.extra.get('workdirs', ())}
  missing = sum(1 for done in status.values() if not done)
  if missing:
    print(f'{missing} runs not finished; listed as missing on the page',
          file=sys.stderr)
  return 1 if failed else 0


if __name__ == '__main__':
  sys.exit(main())
