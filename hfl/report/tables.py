"""Result tables from runs: one row per seed group, as Markdown and CSV.

Accuracies are fractions in CSV, percent in Markdown; accuracy differences (Δ)
are percentage points (pts), loss differences nats, ours − baseline. Bytes are raw in CSV and decimal
units in Markdown (:func:`hfl.metrics.format_bytes`); times are seconds
(``sim_time_s``: the network model's clock; ``wall_time_s``: the job's real
time). A row is a seed group (:mod:`hfl.report.stats`), mean ± sample std over
its runs; time and rounds to target average the runs that reached it. Each row
is compared with a baseline row (default: the uncompressed group closest to it
in config): compression = 1 − B / B_base (factor B_base / B), B the mean total
bytes over all links, and the paired Δ of the headline metric (final accuracy, or
final validation loss for a language model; lower is better for a loss); both are
marked † when they compare runs stopped at other iterations, unfinished or of
another length (:func:`compared_iterations`); a row whose own runs stopped at
different iterations is named under the table.
"""

import math
from typing import Any, Mapping, Sequence

import pandas as pd

from hfl import metrics as metrics_lib
from hfl.report import runs as runs_lib
from hfl.report import stats

NEVER = 'never'
# Keys that never change what is trained: not used in automatic labels.
LABEL_IGNORED_KEYS = frozenset(stats.IGNORED) | {
    'train.eval_every', 'train.log_every', 'train.checkpoint_every', 'train.eval_batch_size'}
COMPRESSOR_KEYS = ('compression.uplink.name', 'compression.downlink.name', 'compression.wan.name')
DEFAULT_LABEL_KEYS = ('sync.strategy',) + COMPRESSOR_KEYS
_SHORT_NAMES = {'sync.strategy': '', 'compression.uplink.name': 'up',
                'compression.downlink.name': 'down', 'compression.wan.name': 'wan'}
_UNCOMPRESSED = ('identity', 'float32', 'bf16', 'bfloat16', 'fp16', 'float16')
_TIME_UNITS = (('h', 3600.0, 7200.0), ('min', 60.0, 120.0), ('s', 1.0, 0.0))


# ------------------------------------------------------------------------------
# Formatting.

def time_unit(s: float) -> tuple[str, float]:
  """The unit :func:`format_seconds` picks for ``s`` seconds: (name, seconds per unit)."""
  return next((u, scale) for u, scale, at in _TIME_UNITS if abs(s) >= at or u == 's')


def format_seconds(s: float | None, unit: tuple[str, float] | None = None) -> str:
  """``'12.3 s'``, ``'4.5 min'`` (from 120 s), ``'1.20 h'`` (from 2 h); ``'–'`` for None."""
  if s is None:
    return '–'
  name, scale = unit or time_unit(s)
  v = s / scale
  return (f'{v:.2f} h' if name == 'h' else f'{v:.3g} s' if name == 's' and abs(v) < 1
          else f'{v:.1f} {name}')


def fmt_acc(x: float | None, std: float | None = None) -> str:
  """Accuracy fraction in percent: ``'89.25%'`` or ``'89.38 ± 0.80%'``."""
  std_text = '' if std is None else f' ± {100 * std:.2f}'
  return '–' if x is None else f'{100 * x:.2f}{std_text}%'


_DELTA_UNITS = {'fraction': ('pts', 2), 'nats': ('nats', 3), 'bits': ('bits', 3)}


def fmt_points(x: float | None, std: float | None = None, n: int | None = None,
               unit: str = 'fraction') -> str:
  """A Δ of a metric of ``unit`` (:data:`hfl.report.runs.METRICS`): accuracy points
  ``'−0.45 pts'``, ``'−0.45 ± 0.21 pts (n=2)'``; losses ``'+0.012 nats'``."""
  if x is None:
    return '–'
  name, d = _DELTA_UNITS.get(unit, (unit, 3))
  return (f'{x:+.{d}f}'.replace('-', '−') + ('' if std is None else f' ± {std:.{d}f}')
          + f' {name}' + ('' if n is None else f' (n={n})'))


def fmt_target(target: runs_lib.Target) -> str:
  """``'test accuracy ≥ 88.00%'`` or ``'validation loss ≤ 1.700 nats/char'``."""
  if target.higher_is_better:
    return f'test accuracy ≥ {fmt_acc(target.value)}'
  return f'validation loss ≤ {target.value:.3f} nats/char'


def fmt_pct(x: float | None, digits: int = 1) -> str:
  """A fraction in percent: ``'65.4%'``."""
  return '–' if x is None else f'{100 * x:.{digits}f}%'.replace('-', '−')


def fmt_factor(x: float | None) -> str:
  """``'24.1×'``, ``'1234×'``, ``'∞×'``."""
  return '–' if x is None else '∞×' if math.isinf(x) else f'{x:.{1 if x < 1000 else 0}f}×'


_UNIT_FORMAT = {  # unit -> (format(value, unit of the mean), unit of a mean or None)
    'fraction': (lambda v, u: f'{100 * v:.2f}', None),
    'bytes': (metrics_lib.format_bytes, metrics_lib.byte_unit),
    's': (format_seconds, time_unit),
    'rounds': (lambda v, u: f'{v:.0f}', None),
    'iterations': (lambda v, u: f'{v:.0f}', None), 'samples': (lambda v, u: f'{v:,.0f}', None),
    'nats': (lambda v, u: f'{v:.3f}', None), 'bits': (lambda v, u: f'{v:.3f}', None),
    'Mbit/s': (lambda v, u: f'{v:.3g}', None),
}
_SUFFIX = {'fraction': '%', 'nats': ' nats', 'bits': ' bits', 'Mbit/s': ' Mbit/s'}


def fmt_stat(st: stats.Stat, unit: str, n_runs: int | None = None,
             to_target: bool = False) -> str:
  """``mean ± std`` in the metric's unit (:data:`hfl.report.runs.METRICS`; the std in
  the mean's unit, left out when 0 or unknown). A to-target quantity prints ``never``
  when no run reached it and ``(k/n reached)`` when only k of ``n_runs`` did."""
  if st.mean is None:
    return NEVER if to_target else '–'
  fmt, unit_of = _UNIT_FORMAT[unit]
  if unit == 'rounds' and to_target:  # interpolated: a fraction of a round
    fmt = lambda v, u: f'{v:.1f}'
  u = unit_of(st.mean) if unit_of else None
  s = fmt(st.mean, u) + (f' ± {fmt(st.std, u)}' if st.std else '') + _SUFFIX.get(unit, '')
  return s + (f' ({st.n}/{n_runs} reached)' if to_target and n_runs and st.n < n_runs else '')


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
  """Lines of a Markdown table (``|`` in cells escaped)."""
  esc = lambda s: str(s).replace('|', '\\|')
  return (['| ' + ' | '.join(map(esc, header)) + ' |', '|' + '---|' * len(header)]
          + ['| ' + ' | '.join(map(esc, r)) + ' |' for r in rows])


# ------------------------------------------------------------------------------
# Labels and baselines.

def short_key(key: str) -> str:
  """How a config key is named in a label: ``'up'``, ``'k'``, ``''`` (the strategy)."""
  parts = key.split('.')
  return _SHORT_NAMES.get(key, parts[-2] if parts[-1] == 'name' and len(parts) >= 2 else parts[-1])


def unused_hyper(flat: Mapping[str, Any], key: str) -> bool:
  """A compressor field of a link whose compressor ignores it (density of identity)."""
  parts = key.split('.')
  if len(parts) != 3 or parts[0] != 'compression' or parts[2] == 'name':
    return False
  return flat.get(f'compression.{parts[1]}.name') in _UNCOMPRESSED


def label_keys(flats: Sequence[Mapping[str, Any]]) -> list[str]:
  """The keys that tell groups apart: strategy and compressors first, then the rest
  (keys some configs lack are schema differences, not settings)."""
  shared = set.intersection(*(set(f) for f in flats)) if flats else set()
  varying = [k for k in sorted(shared) if k not in LABEL_IGNORED_KEYS
             and len({repr(f[k]) for f in flats}) > 1]
  keys = [k for k in DEFAULT_LABEL_KEYS if k in varying]
  return keys + [k for k in varying if k not in keys] or list(DEFAULT_LABEL_KEYS[:2])


def make_labels(flats: Sequence[Mapping[str, Any]], names: Sequence[str],
                label_by: Sequence[str] | None = None) -> list[str]:
  """A unique label per group (flattened config of its first run), e.g.
  ``'periodic, up=topk'`` or ``'seed=1'``, from ``label_by`` (default
  :func:`label_keys`); duplicates get the fallback ``names`` appended."""
  keys = list(label_by) if label_by else label_keys([f for f in flats if f])
  if label_by and (unknown := [k for k in keys if not any(k in f for f in flats)]):
    raise ValueError(f'--label-by {",".join(unknown)}: no run has this config key (e.g. seed, '
                     f'{", ".join(label_keys([f for f in flats if f]))})')
  shorts = {k: short_key(k) for k in keys}  # clashing ones (up/down density) keep two parts
  shorts.update({k: '.'.join(k.split('.')[-2:]) for k in keys
                 if shorts[k] and list(shorts.values()).count(shorts[k]) > 1})
  labels = []
  for flat, name in zip(flats, names):
    parts = []
    for k in (k for k in keys if k in flat and not unused_hyper(flat, k)):
      v = ','.join(map(str, flat[k])) if isinstance(flat[k], tuple) else str(flat[k])
      parts.append(f'{shorts[k]}={v}' if shorts[k] else v)
    labels.append(', '.join(parts) or name)
  dup = pd.Series(labels).duplicated(keep=False)
  return [f'{l} [{n}]' if d else l for l, n, d in zip(labels, names, dup)]


def is_uncompressed(flat: Mapping[str, Any]) -> bool:
  """True when every compressor of a flattened config is ``identity``."""
  names = [flat[k] for k in COMPRESSOR_KEYS if k in flat]
  return bool(names) and all(n == 'identity' for n in names)


def closest_baselines(flats: Sequence[Mapping[str, Any]],
                      ignore: Sequence[str] = stats.IGNORED) -> list[int | None]:
  """Per group, the uncompressed group with the fewest differing keys outside
  ``compression.*`` and ``ignore`` (ties: the earlier); None without one."""
  candidates = [i for i, f in enumerate(flats) if f and is_uncompressed(f)]

  def distance(a, b):
    keys = (set(a) | set(b)) - set(ignore)
    return sum(not k.startswith('compression.') and repr(a.get(k)) != repr(b.get(k))
               for k in keys)
  return [min(candidates, key=lambda j: (distance(f, flats[j]), j))
          if candidates and f else None for f in flats]


def stopped_at(frame: pd.DataFrame, table: pd.DataFrame, group: str) -> list[float | None]:
  """The intra-DC iterations where the runs of row ``group`` stopped, each once, in
  ascending order (None, unknown, last)."""
  its = frame.loc[table.at[group, 'runs'], 'intra_dc_iterations']
  return sorted({float(v) if metrics_lib.finite(v) else None for v in its},
                key=lambda v: (v is None, v or 0))


def iterations_text(its: Sequence[float | None]) -> str:
  """``'4;40'`` for :func:`stopped_at`'s ``[4.0, 40.0]`` ('?' for None)."""
  return ';'.join('?' if v is None else f'{v:.0f}' for v in its)


def compared_iterations(frame: pd.DataFrame, table: pd.DataFrame, group: str,
                        base: str | None) -> str | None:
  """``'400 vs 2000'``: where the runs of row ``group`` and of its baseline row ``base``
  stopped (:func:`iterations_text`), when they did at different iterations, finished
  or not (or the runs of one row did); else None."""
  if base in (None, group):
    return None
  ours, theirs = stopped_at(frame, table, group), stopped_at(frame, table, base)
  return (None if len({*ours, *theirs} - {None}) < 2
          else f'{iterations_text(ours)} vs {iterations_text(theirs)}')


# ------------------------------------------------------------------------------
# The table of a set of runs.

def build_table(frame: pd.DataFrame, label_by: Sequence[str] | None = None,
                baseline: str | None = None, metric: str = 'final_acc') -> pd.DataFrame:
  """One row per seed group of ``frame`` (:func:`hfl.report.runs.run_frame`), or per
  value of the ``label_by`` keys.

  Args:
    frame: the runs.
    label_by: config keys for the labels and rows: runs with equal values of these
      keys are one row (e.g. ``['seed']``: one row per seed), whose paired Δ pairs
      each run with the baseline run equal to it in every other key.
    baseline: label of the row every row is compared with; default
      :func:`closest_baselines`, or, when every row is uncompressed (a K or
      strategy sweep), the row that sends the most bytes (e.g. K = 1).
    metric: the metric of the paired Δ (a fraction's Δ is in pts).

  Returns:
    :func:`hfl.report.stats.summarize` plus ``label``, ``baseline``,
    ``compression_ratio``, ``compression_factor``, the paired Δ of ``metric``
    (``paired_delta``, ``paired_std``, ``paired_n``, ``paired_sem``) and
    ``iterations`` (:func:`compared_iterations`: set when those compare runs that
    stopped at different iterations), ``mixed_iterations`` (``'4;40'`` when the
    row's own runs did, else None), ``repeats``: the row's runs left out as
    repeats, as (workdir, the one it repeats) (:func:`hfl.report.stats.drop_repeats`:
    n and std would be wrong), ``pooled`` ({key: its values} of the config keys the
    row's runs differ in besides ``seed``: with ``label_by``) and ``changed``: its runs
    resumed with a changed config, as (workdir, the changes: :func:`hfl.report.runs.
    run_frame`'s ``changed``).

  Raises:
    ValueError: ``baseline`` is not a label.
  """
  label_by = list(label_by or ())
  groups = stats.group_ids(frame, label_by)
  pairs = stats.group_ids(frame, but=[*label_by, 'workdir']) if label_by else None  # the rest
  frame, groups, pairs, repeats = stats.drop_repeats(frame, groups, pairs)
  table = stats.summarize(frame, groups)
  table['repeats'] = [repeats.get(g, []) for g in table.index]
  table['changed'] = [[(w, c) for w, c in zip(frame['workdir'][groups == g],
                                              frame['changed'][groups == g]) if c]
                      for g in table.index]
  table['pooled'] = [  # with --label-by: the other keys a row's runs differ in, and their values
      {k: sorted({repr(c.get(k)) for c in cs}) for k in sorted(set().union(*cs))
       if k not in stats.IGNORED and len({repr(c.get(k)) for c in cs}) > 1}
      for cs in ([frame.at[r, 'config'] or {} for r in rs] for rs in table['runs'])]
  first = [frame.loc[r[0]] for r in table['runs']]
  flats = [f['config'] for f in first]
  labels = make_labels(flats, [f['name'] for f in first], label_by)
  if baseline is not None and baseline not in labels:
    raise ValueError(f'--baseline {baseline!r} is not a label; labels: {labels}')
  if baseline is None and len(flats) > 1 and all(f and is_uncompressed(f) for f in flats):
    baseline = labels[int(pd.to_numeric(table['bytes.total']).fillna(-1).to_numpy().argmax())]
  bases = ([labels.index(baseline)] * len(labels) if baseline is not None
           else closest_baselines(flats, [k for k in stats.IGNORED if k not in label_by]))
  ids, rows = list(table.index), []
  for gid, b in zip(ids, bases):
    base = None if b is None else ids[b]
    its = [v for v in stopped_at(frame, table, gid) if v is not None]
    ours, theirs = table.at[gid, 'bytes.total'], base and table.at[base, 'bytes.total']
    scale = 100.0 if runs_lib.METRICS[metric] == 'fraction' else 1.0
    p = (stats.paired(frame, groups, gid, base, metric, scale, pairs)[0]
         if base not in (None, gid) else stats.Stat(None, None, 0))
    rows.append(dict(label=labels[ids.index(gid)], baseline=base and labels[b],
                     unfinished=int((~frame.loc[table.at[gid, 'runs'], 'finished']).sum()),
                     compression_ratio=stats.reduction(ours, theirs),
                     compression_factor=stats.factor(ours, theirs), paired_delta=p.mean,
                     paired_std=p.std, paired_n=p.n or None, paired_sem=p.sem,
                     iterations=compared_iterations(frame, table, gid, base),
                     mixed_iterations=iterations_text(its) if len(its) > 1 else None))
  return table.join(pd.DataFrame(rows, index=table.index, dtype=object))


MD_COLUMNS = ('label', 'runs', 'final acc (%)', 'best acc (%)', 'final loss (nats)',
              'rounds to target', 'sim time to target', 'intra-DC up', 'intra-DC down',
              'inter-DC', 'compression (vs baseline)', 'paired Δ {} (vs baseline)',
              'inter-DC rounds', 'sim time', 'wall time')
_MD_METRICS = ('final_acc', 'best_acc', 'final_loss', 'rounds_to_target', 'time_to_target_s',
               'bytes.intra_up', 'bytes.intra_down', 'bytes.inter_dc')


def _md_row(table: pd.DataFrame, gid: str, unit: str) -> list[str]:
  row, n = table.loc[gid], len(table.at[gid, 'runs'])
  cell = lambda m: fmt_stat(stats.group_stat(table, gid, m), runs_lib.METRICS[m], n,
                            to_target='to_target' in m)
  ratio, fac = row['compression_ratio'], row['compression_factor']
  comp = ('–' if ratio is None else '100% (∞×)' if math.isinf(fac)
          else f'{100 * ratio:.1f}% ({fac:.1f}×)')
  delta = fmt_points(row['paired_delta'], row['paired_std'], row['paired_n'], unit)
  mark = lambda c: c + ' †' if row['iterations'] and c != '–' else c
  runs = f'{n} ({row["unfinished"]} unfinished)' if row['unfinished'] else str(n)
  return [row['label'], runs, *(cell(m) for m in _MD_METRICS), mark(comp), mark(delta),
          *(cell(m) for m in ('inter_dc_rounds', 'sim_time_s', 'wall_time_s'))]


def to_markdown(table: pd.DataFrame, target: runs_lib.Target,
                unreadable: Sequence[tuple[str, str]] = (), not_runs: Sequence[str] = (),
                missing: Sequence[str] = ()) -> str:
  """The table as a Markdown document: table, caveats (a † comparison of runs stopped
  at different iterations, :func:`compared_iterations`; the rows whose own runs did;
  the ``unreadable`` runs left out, (workdir, reason); the ``not_runs`` skipped; the
  expected workdirs ``missing``), notes, and each row's workdirs;
  the paired Δ is of the final loss when the ``target`` is a loss, else of accuracy."""
  baselines = ', '.join(f'`{b}`' for b in sorted({b for b in table['baseline'] if b})) or 'none'
  loss = not target.higher_is_better
  header = [c.format('final loss' if loss else 'final acc') for c in MD_COLUMNS]
  rows = [_md_row(table, g, 'nats' if loss else 'fraction') for g in table.index]
  differ = [f'`{r["label"]}` {ours} vs `{r["baseline"]}` {theirs}' for _, r in table.iterrows()
            if r['iterations'] for ours, theirs in [r['iterations'].split(' vs ')]]
  mixed = [f'`{r["label"]}` {r["mixed_iterations"]}' for _, r in table.iterrows()
           if r['mixed_iterations']]
  caveats = [  # paragraphs under the table
      differ and "† Compares runs stopped at other iterations than their baseline's "
      '(intra-DC iterations; unfinished, or of another length): ' + '; '.join(differ) + '.'
      + ' Report again once the unfinished runs finish.' * bool(table['unfinished'].any()),
      mixed and 'Rows whose runs stopped at different iterations (intra-DC; their mean mixes '
      'run lengths): ' + '; '.join(mixed) + '.',
      unreadable and '\n'.join([f'**Incomplete report:** {len(unreadable)} run(s) left out, '
                                'unreadable (fix or remove them, then report again):']
                               + [f'- `{d}`: {why}' for d, why in unreadable]),
      table['repeats'].map(len).any() and 'Left out as repeats of a run of the same row with '
      'the same config and seed (a copy or a rerun adds no sample): ' + '; '.join(
          f'`{w}` (repeats `{f}`)' for r in table['repeats'] for w, f in r) + '.',
      table['pooled'].map(len).any() and 'Rows pooling runs of different configs (their mean '
      '± std is over these, not over seeds alone): ' + '; '.join(f'`{r["label"]}` (' + ', '.join(
          f'{k}: {", ".join(v)}' for k, v in r['pooled'].items()) + ')' for _, r in
          table.iterrows() if r['pooled']) + '.',
      table['changed'].map(len).any() and 'Runs resumed with a changed config (config.json '
      'holds the last; results may differ from a fresh run of it): ' + '; '.join(
          f'`{w}` ({c})' for r in table['changed'] for w, c in r) + '.',
      missing and f'**Incomplete report:** {len(missing)} expected run(s) missing, not finished '
      '(failed or not started): ' + ', '.join(f'`{d}`' for d in missing),
      not_runs and f'Skipped ({runs_lib.NOT_A_RUN}): ' + ', '.join(f'`{d}`' for d in not_runs)]
  lines = ['# Results', '', *markdown_table(header, rows), '',
           *(l for c in caveats if c for l in (c, '')), '## Notes', '',
           f'- Target: {fmt_target(target)}. Rounds (inter-DC) and simulated time to target: first crossing, linearly interpolated between evaluations '
           '(`hfl.metrics.time_to_target`); `never` = not reached; (k/n reached): the mean is '
           'over the k seeds that did.',
           '- `runs` > 1: configs differ only in `seed` (with `--label-by`: equal in its keys), '
           'each seed once; cells are mean ± sample std (ddof=1). '
           '(k unfinished): k runs have no summary.json; they count with their last evaluation.',
           '- Bytes: totals per link over the run, 1 MB = 10^6 bytes (raw in `results.csv`).',
           '- Compression = 1 − total bytes / baseline total bytes (all links), and the × '
           f'factor. Paired Δ: final {"loss (lower is better)" if loss else "accuracy"} minus '
           f'the baseline run with the same seed (with `--label-by`: the same other keys), mean ± '
           f'sample std over the seeds both have (n). Baseline: {baselines} (the closest '
           'uncompressed row; with none compressed, the one sending the most bytes; unless '
           '`--baseline` is given).', '', '## Runs', '']
  lines += [f'- {r["label"]}: ' + ', '.join(f'`{w}`' for w in r['workdirs'])
            for _, r in table.iterrows()]
  return '\n'.join(lines) + '\n'


_CSV_NAMES = {'final_acc': 'final_test_accuracy', 'best_acc': 'best_test_accuracy',
              'final_loss': 'final_test_loss', 'best_loss': 'best_test_loss'}


def to_csv(table: pd.DataFrame, target: runs_lib.Target) -> str:
  """The table as CSV: raw numbers (fractions, bytes, seconds, pts); '' when unknown
  (to target: when no run reached it; ``n_reached_target`` counts those that did);
  ``compared_iterations``: :func:`compared_iterations`, '' when the iterations match;
  ``mixed_iterations``: a row's own, when its runs stopped at different ones."""
  out = pd.DataFrame({'label': table['label'], 'n_runs': table['runs'].map(len),
                      'n_unfinished': table['unfinished'],
                      'seeds': table['seeds'].map(lambda s: ';'.join(map(str, s))),
                      'workdirs': table['workdirs'].map(';'.join)})
  for m in runs_lib.METRICS:
    name = _CSV_NAMES.get(m, m.replace('.', '_'))
    out[f'{name}_mean'], out[f'{name}_std'] = table[m], table[f'{m}_std']
  out['n_reached_target'] = table['time_to_target_s_n']
  out['target_metric'], out['target'] = target.metric, target.value
  for c in ('baseline', 'compression_ratio', 'compression_factor', 'paired_delta',
            'paired_std', 'paired_n', 'paired_sem'):
    out[c] = table[c]
  out['compared_iterations'] = table['iterations']
  out['mixed_iterations'] = table['mixed_iterations']
  out['changed_on_resume'] = table['changed'].map(lambda r: ';'.join(f'{w}={c}' for w, c in r))
  out['repeats_left_out'] = table['repeats'].map(lambda r: ';'.join(f'{w}={f}' for w, f in r))
  return out.to_csv(index=False, lineterminator='\n')
