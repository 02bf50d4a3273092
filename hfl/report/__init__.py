"""Experiment reports from training workdirs: tables (Markdown, CSV) and plots.

Usage from the command line::

  python -m hfl.report RUN_DIR... --out DIR [--target 0.88] \
      [--label-by sync.strategy,compression.uplink.name] [--baseline LABEL]

From Python::

  from hfl import report
  run = report.load_run('/tmp/hfl_default')
  t = report.time_to_target(run.metrics, 0.88, 'sim_time_s')  # s, or None
  report.write_report(['/tmp/a', '/tmp/b'], '/tmp/report')
"""

import logging
import os
from typing import Sequence

from hfl.report.tables import build_rows
from hfl.report.tables import default_target
from hfl.report.tables import GroupRow
from hfl.report.tables import load_run
from hfl.report.tables import RunRecord
from hfl.report.tables import Stat
from hfl.report.tables import time_to_target
from hfl.report.tables import to_csv
from hfl.report.tables import to_markdown

__all__ = ('GroupRow', 'RunRecord', 'Stat', 'build_rows', 'load_run',
           'time_to_target', 'write_report')


def write_report(run_dirs: Sequence[str], out_dir: str,
                 target: float | None = None,
                 label_by: Sequence[str] | None = None,
                 baseline: str | None = None,
                 plots: bool = True) -> dict[str, str]:
  """Reads workdirs and writes ``results.md``, ``results.csv`` and PNG plots.

  Args:
    run_dirs: training workdirs (DESIGN 3).
    out_dir: output directory (created if missing).
    target: target test accuracy (fraction); default: the runs' common
      ``train.target_accuracy``, else 0.88.
    label_by: dotted config keys for labels; default: the strategy,
      compressors and whatever else varies across runs.
    baseline: label of the compression baseline; default: per run, the
      closest uncompressed run.
    plots: also write the PNG figures.

  Returns:
    Dict name -> path of every file written ('results.md', 'results.csv',
    and the PNG file names).

  Raises:
    ValueError: if ``run_dirs`` is empty or ``baseline`` is unknown.
  """
  if not run_dirs:
    raise ValueError('no run directories given')
  runs = [load_run(d) for d in run_dirs]
  for r in runs:
    if not r.finished:
      logging.warning('%s has no summary.json (unfinished run); using its '
                      'metrics.jsonl', r.workdir)
  if target is None:
    target = default_target(runs)
  rows = build_rows(runs, target, label_by=label_by, baseline=baseline)
  os.makedirs(out_dir, exist_ok=True)
  written = {}
  for name, text in (('results.md', to_markdown(rows, target)),
                     ('results.csv', to_csv(rows, target))):
    path = os.path.join(out_dir, name)
    with open(path, 'w', encoding='utf-8') as f:
      f.write(text)
    written[name] = path
  if plots:
    from hfl.report import plots as plots_lib  # pylint: disable=g-import-not-at-top
    for path in plots_lib.write_plots(rows, out_dir, target):
      written[os.path.basename(path)] = path
  return written
