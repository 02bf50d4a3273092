"""Reports from training workdirs: tables (Markdown, CSV) and plots.

Any directory with workdirs below it works (a workdir, a sweep root)::

  python -m hfl.report DIR... [--out OUT] [--target 0.88] [--label-by KEYS] [--baseline LABEL]

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

from hfl.report import runs
from hfl.report import stats
from hfl.report import tables

__all__ = ('load', 'runs', 'stats', 'tables', 'write_report')


def load(paths: Sequence[str], target: float | None = None,
         exclude: Sequence[str] = ()) -> pd.DataFrame:
  """:func:`hfl.report.runs.run_frame` of the workdirs among and below ``paths``.

  ``target``: the value of the runs' headline metric to reach (accuracy fraction,
  or validation loss in nats); default the runs' common one
  (:func:`hfl.report.runs.default_target`); the :class:`~hfl.report.runs.Target`
  used is kept in ``frame.attrs['target']``. ``exclude``: directories not searched.

  Raises:
    FileNotFoundError: a path is missing or holds no workdir. ValueError: runs of
      different ``dataset.name``, or a ``target`` outside the headline metric's range
      (accuracy: (0, 1]; loss: > 0).
  """
  loaded = [runs.load_run(d) for d in runs.find_runs(paths, exclude)]
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
  frame.attrs['target'] = t
  return frame


def write_report(paths: Sequence[str], out_dir: str, target: float | None = None,
                 label_by: Sequence[str] | None = None, baseline: str | None = None,
                 plots: bool = True) -> dict[str, str]:
  """Writes ``results.md``, ``results.csv`` and the PNG plots of the runs below ``paths``
  (:func:`load`; ``out_dir`` is not searched) and returns {file name: path}.

  ``label_by`` and ``baseline``: see :func:`hfl.report.tables.build_table`.

  Raises:
    FileNotFoundError: no workdir found. ValueError: ``baseline`` is not a label.
  """
  frame = load(paths, target, exclude=[out_dir])
  target = frame.attrs['target']
  table = tables.build_table(frame, label_by, baseline,
                             metric='final_acc' if target.higher_is_better else 'final_loss')
  os.makedirs(out_dir, exist_ok=True)
  written = {}
  for name, text in (('results.md', tables.to_markdown(table, target)),
                     ('results.csv', tables.to_csv(table, target))):
    written[name] = os.path.join(out_dir, name)
    with open(written[name], 'w', encoding='utf-8') as f:
      f.write(text)
  if plots:
    from hfl.report import plots as plots_lib  # pylint: disable=g-import-not-at-top
    curves = [plots_lib.Curves(r['label'], [frame.at[i, 'run'].metrics for i in r['runs']])
              for _, r in table.iterrows()]
    written.update({os.path.basename(p): p for p in plots_lib.write_plots(
        curves, out_dir, target.value, y=plots_lib.y_axis(target.metric))})
  return written
