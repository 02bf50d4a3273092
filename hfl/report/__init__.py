"""Reports from training workdirs: tables (Markdown, CSV) and plots.

Any directory with workdirs below it works (a workdir, a sweep root)::

  python -m hfl.report DIR... [--out OUT] [--target 0.88] [--label-by KEYS] [--baseline LABEL]

Exit status 0: a complete report; 1: one without the runs it could not read (named
with the reason on stderr and under the table); 2: bad input (e.g. a DIR that is no
run: metrics.jsonl alone; one found below a DIR is skipped, named under the table),
nothing written. † marks a comparison with runs stopped at other iterations (unfinished,
or of another length). ``--out`` must hold no run below a DIR (it is not searched).

From Python::

  frame = report.load(['workdirs/semisync'])   # pandas, one row per run
  table = report.tables.build_table(frame)     # one row per seed group
  report.write_report(['workdirs/semisync'], '/tmp/report')

Modules: :mod:`~hfl.report.runs` (find and load workdirs), :mod:`~hfl.report.stats`
(seed groups, paired statistics), :mod:`~hfl.report.tables` (labels, baselines,
Markdown/CSV), :mod:`~hfl.report.plots` (figures). The byte formatter and time to
target are :func:`hfl.metrics.format_bytes` and :func:`hfl.metrics.time_to_target`.
"""

import logging
import math
import os
from typing import Sequence

import pandas as pd

from hfl import metrics as metrics_lib
from hfl.report import runs
from hfl.report import stats
from hfl.report import tables

__all__ = ('Written', 'load', 'runs', 'stats', 'tables', 'write_report')


def load(paths: Sequence[str], target: float | None = None,
         exclude: Sequence[str] = ()) -> pd.DataFrame:
  """:func:`hfl.report.runs.run_frame` of the workdirs among and below ``paths``.

  ``target``: the value of the runs' headline metric to reach (accuracy fraction,
  or validation loss in nats); default the runs' common one
  (:func:`hfl.report.runs.default_target`); the :class:`~hfl.report.runs.Target`
  used is kept in ``frame.attrs['target']``. ``exclude``: directories not searched.
  Left out, with a warning each: ``frame.attrs['unreadable']``, [(workdir, reason)] of
  runs that cannot be read (:func:`~hfl.report.runs.load_run` fails), and
  ``frame.attrs['not_runs']``, directories found below ``paths`` that are
  :data:`~hfl.report.runs.NOT_A_RUN`.

  Raises:
    FileNotFoundError: a path is missing or holds no workdir. ValueError: no readable
      run; a directory of ``paths`` is not a run; runs of different ``dataset.name``;
      a ``target`` outside the headline metric's range (accuracy: (0, 1]; loss: > 0).
  """
  loaded, unreadable, not_runs = [], [], []
  for d in runs.find_runs(paths, exclude):
    try:
      r = runs.load_run(d)
    except (ValueError, OSError) as e:
      logging.warning('%s: left out of the report, unreadable: %s', d, e)
      unreadable.append((d, str(e)))
      continue
    if r.config or r.summary:
      loaded.append(r)
    elif os.path.abspath(d) in map(os.path.abspath, paths):  # named: refused
      raise ValueError(f'{d}: {runs.NOT_A_RUN}')
    else:
      logging.warning('%s: skipped, %s', d, runs.NOT_A_RUN)
      not_runs.append(d)
  if not loaded:
    raise ValueError('no readable training run: ' + '; '.join(
        [f'{d}: {why}' for d, why in unreadable] + [f'{d}: {runs.NOT_A_RUN}' for d in not_runs]))
  data = {}  # dataset.name -> its runs' workdirs
  for r in loaded:
    data.setdefault(runs.flatten(r.config).get('dataset.name'), []).append(r.workdir)
  data.pop(None, None)
  if len(data) > 1:
    raise ValueError('the runs train on different data sets, which one table cannot compare ('
                     + '; '.join(f'{k}: {len(v)} runs, e.g. {v[0]}' for k, v in data.items())
                     + '); report each data set\'s workdirs separately')
  for r in loaded:
    if not r.finished:
      logging.warning('%s has no summary.json (unfinished run); using its metrics.jsonl',
                      r.workdir)
  t = runs.default_target(loaded)
  if target is not None and not (0 < target <= 1 if t.higher_is_better else 0 < target < math.inf):
    raise ValueError(f'--target={target} must be ' + ('an accuracy fraction in (0, 1], e.g. 0.88'
                     if t.higher_is_better else f'a finite loss > 0 (nats; metric {t.metric})'))
  t = t if target is None else t._replace(value=float(target))
  frame = runs.run_frame(loaded, t.value)
  frame.attrs.update(target=t, unreadable=unreadable, not_runs=not_runs)
  return frame


class Written(dict):
  """:func:`write_report`'s {file name: path}; ``unreadable``: the (workdir, reason) of
  the runs it left out (:func:`load`), ``missing``: the expected workdirs it lacks; []
  when the report is complete."""
  unreadable: list = []
  missing: list = []


def write_report(paths: Sequence[str], out_dir: str, target: float | None = None,
                 label_by: Sequence[str] | None = None, baseline: str | None = None,
                 plots: bool = True, expected: Sequence[str] = ()) -> Written:
  """Writes ``results.md``, ``results.csv`` and the PNG plots of the runs below ``paths``
  (:func:`load`; ``out_dir`` is not searched; runs left out are named in results.md, and
  so are the workdirs of ``expected`` it has no run of, e.g. a sweep's failed runs)
  and returns :class:`Written`. A table file is replaced whole (written, then renamed).
  The report's plot files (:func:`hfl.report.plots.plot_name`) in ``out_dir`` that it
  does not write now (``plots=False``; the other metric's) are removed, and logged.

  ``label_by`` and ``baseline``: see :func:`hfl.report.tables.build_table`.

  Raises:
    FileNotFoundError: no workdir found. ValueError: see :func:`load`; ``baseline`` is
      not a label; ``out_dir`` holds a run reached through it. Nothing is written then.
  """
  within = lambda a, b: os.path.commonpath([os.path.abspath(a), os.path.abspath(b)]
                                           ) == os.path.abspath(b)  # a is b or below it
  # The search skips out_dir (an earlier report's): refused when runs lie in it that the
  # search would reach only through it (out_dir at or below their DIR).
  if hidden := [d for d in runs.find_runs(paths) if within(d, out_dir)
                and all(within(out_dir, p) for p in paths if within(d, p))]:
    raise ValueError(f'--out={out_dir} must not hold the runs reported (the report does not '
                     f'search its output directory; here {", ".join(hidden[:3])}); give another '
                     f'--out, e.g. {os.path.join(paths[0], "report")}'
                     + ' (the default)' * (len(paths) == 1))
  frame = load(paths, target, exclude=[out_dir])
  target = frame.attrs['target']
  table = tables.build_table(frame, label_by, baseline,
                             metric='final_acc' if target.higher_is_better else 'final_loss')
  os.makedirs(out_dir, exist_ok=True)
  written = Written()
  written.unreadable = frame.attrs['unreadable']
  seen = {os.path.abspath(d) for d in [*frame['workdir'], *frame.attrs['not_runs'],
                                       *(d for d, _ in written.unreadable)]}
  written.missing = [d for d in expected if os.path.abspath(d) not in seen]
  for name, text in (('results.md', tables.to_markdown(table, target, frame.attrs['unreadable'],
                                                       frame.attrs['not_runs'], written.missing)),
                     ('results.csv', tables.to_csv(table, target))):
    written[name] = os.path.join(out_dir, name)
    metrics_lib.replace_file(written[name], text)
  from hfl.report import plots as plots_lib  # lazy: matplotlib  pylint: disable=g-import-not-at-top
  if plots:
    curves = [plots_lib.Curves(r['label'], [frame.at[i, 'run'].metrics for i in r['runs']])
              for _, r in table.iterrows()]
    written.update({os.path.basename(p): p for p in plots_lib.write_plots(
        curves, out_dir, target.value, y=plots_lib.y_axis(target.metric))})
  stale = [p for y in (plots_lib.ACCURACY, plots_lib.LOSS) for a in plots_lib.AXES
           if (p := os.path.join(out_dir, plots_lib.plot_name(y, a))) not in written.values()
           and os.path.isfile(p)]
  for p in stale:
    os.remove(p)
  if stale:
    logging.info('removed the plots of an earlier report, stale next to results.md: %s',
                 ', '.join(stale))
  return written
