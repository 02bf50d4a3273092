"""Accuracy curves from training workdirs (PNG, matplotlib without pyplot).

Three figures, one line per group of seeds (see :mod:`hfl.report.tables`):

* test accuracy vs simulated time (seconds),
* test accuracy vs total bytes over all links (bytes, log x),
* test accuracy vs inter-DC rounds.

A group of several seeds is drawn as the mean curve with a ±1 std band; the
seeds' curves are linearly interpolated onto the union of their x values,
restricted to the x range all seeds cover. Figures are built with
``matplotlib.figure.Figure`` (Agg canvas), so importing this module never
changes the global matplotlib backend.
"""

import os
from typing import NamedTuple, Sequence

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
import numpy as np

from hfl.report import tables


class Axis(NamedTuple):
  """One x axis of the accuracy plots.

  Attributes:
    key: dotted key of the x value in a metrics.jsonl record.
    label: axis label with units.
    filename: PNG file name.
    log: log-scaled x axis.
  """
  key: str
  label: str
  filename: str
  log: bool = False


AXES = (
    Axis('sim_time_s', 'simulated time (s)', 'accuracy_vs_sim_time.png'),
    Axis('bytes.total', 'total bytes, all links (bytes, log scale)',
         'accuracy_vs_bytes.png', log=True),
    Axis('round', 'inter-DC rounds', 'accuracy_vs_inter_dc_rounds.png'),
)
# Above this many lines the legend goes to the right of the axes.
_LEGEND_INSIDE_MAX = 4
_MARKERS = ('o', 's', '^', 'v', 'D', 'P', 'X', '*', '<', '>')


def curve(metrics: Sequence[dict], x_key: str,
          positive_x: bool = False) -> tuple[np.ndarray, np.ndarray]:
  """(x, test accuracy) arrays of one run, sorted by x.

  Args:
    metrics: evaluations of one run.
    x_key: dotted key of x (see :func:`hfl.report.tables.get_path`).
    positive_x: drop points with x <= 0 (for a log axis).

  Returns:
    Two float arrays of equal length.
  """
  pts = []
  for m in metrics:
    x, y = tables.get_path(m, x_key), m.get('test_accuracy')
    if x is None or y is None:
      continue
    x, y = float(x), float(y)
    if not (np.isfinite(x) and np.isfinite(y)) or (positive_x and x <= 0):
      continue
    pts.append((x, y))
  pts.sort(key=lambda p: p[0])
  if not pts:
    return np.zeros(0), np.zeros(0)
  xs, ys = zip(*pts)
  return np.asarray(xs), np.asarray(ys)


def mean_curve(curves: Sequence[tuple[np.ndarray, np.ndarray]]
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
  """Mean and std of several (x, y) curves on a common x grid.

  Args:
    curves: per-seed (x, y) arrays, each sorted by x.

  Returns:
    (x, mean, std); std is None for a single curve. Empty arrays if the curves
    share no x range.
  """
  curves = [c for c in curves if len(c[0])]
  if not curves:
    return np.zeros(0), np.zeros(0), None
  if len(curves) == 1:
    return curves[0][0], curves[0][1], None
  lo = max(c[0][0] for c in curves)
  hi = min(c[0][-1] for c in curves)
  grid = np.unique(np.concatenate([c[0] for c in curves]))
  grid = grid[(grid >= lo) & (grid <= hi)]
  if not len(grid):
    return np.zeros(0), np.zeros(0), None
  ys = np.stack([np.interp(grid, x, y) for x, y in curves])
  return grid, ys.mean(0), ys.std(0, ddof=1)


def plot_accuracy(rows: Sequence[tables.GroupRow], axis: Axis, path: str,
                  target: float | None = None, title: str | None = None) -> str:
  """Writes one accuracy figure.

  Args:
    rows: table rows (their runs and labels are plotted).
    axis: which x axis.
    path: output PNG path.
    target: draws a dashed horizontal line at this accuracy if given.
    title: figure title; default ``'Test accuracy vs <x quantity>'``.

  Returns:
    ``path``.
  """
  n = len(rows)
  outside = n > _LEGEND_INSIDE_MAX
  width = 6.4 + (3.2 if outside else 0.0)
  fig = Figure(figsize=(width, 4.4), dpi=120, layout='constrained')
  FigureCanvasAgg(fig)
  ax = fig.add_subplot()
  colors = _colors(n)
  drawn, banded = 0, False
  for i, row in enumerate(rows):
    curves = [curve(r.metrics, axis.key, positive_x=axis.log) for r in row.runs]
    x, y, sd = mean_curve(curves)
    if not len(x):
      continue
    label = row.label if len(row.runs) == 1 else f'{row.label} (n={len(row.runs)})'
    ax.plot(x, 100 * y, color=colors[i], marker=_MARKERS[i % len(_MARKERS)],
            markersize=3.5, markevery=max(1, len(x) // 12), linewidth=1.5,
            label=label)
    if sd is not None:
      ax.fill_between(x, np.clip(100 * (y - sd), 0, 100),
                      np.clip(100 * (y + sd), 0, 100), color=colors[i],
                      alpha=0.2 if n <= _LEGEND_INSIDE_MAX else 0.1,
                      linewidth=0)
      banded = True
    drawn += 1
  if target is not None:
    ax.axhline(100 * target, color='0.4', linestyle='--', linewidth=1,
               label=f'target {100 * target:.1f}%')
  if axis.log:
    ax.set_xscale('log')
  ax.set_xlabel(axis.label)
  ax.set_ylabel('test accuracy (%)')
  ax.set_title(title or f'Test accuracy vs {axis.label.split(" (")[0]}')
  ax.grid(True, which='major', alpha=0.3)
  if drawn == 0:
    ax.text(0.5, 0.5, 'no evaluations', transform=ax.transAxes,
            ha='center', va='center')
  title = 'shaded: ±1 std over seeds' if banded else None
  longest = max((len(h.get_label()) for h in ax.get_legend_handles_labels()[0]), default=0)
  if outside and longest > 40:  # long labels: below the axes, keeping the plot wide
    ax.legend(loc='upper center', bbox_to_anchor=(0.5, -0.15), fontsize='small',
              title=title, title_fontsize='small', frameon=False, ncol=1)
  elif outside:
    ax.legend(loc='upper left', bbox_to_anchor=(1.02, 1.0), fontsize='small',
              title=title, title_fontsize='small', frameon=False)
  else:
    ax.legend(loc='best', fontsize='small', title=title,
              title_fontsize='small')
  fig.savefig(path)
  return path


def _colors(n: int) -> list:
  """n distinguishable colours (tab10, or tab20 above 10 lines)."""
  cmap = matplotlib.colormaps['tab10' if n <= 10 else 'tab20']
  return [cmap(i % cmap.N) for i in range(max(n, 1))]


def write_plots(rows: Sequence[tables.GroupRow], out_dir: str,
                target: float | None = None) -> list[str]:
  """Writes the three accuracy figures into ``out_dir``.

  Args:
    rows: table rows from :func:`hfl.report.tables.build_rows`.
    out_dir: output directory (created if missing).
    target: target accuracy line, or None.

  Returns:
    Paths of the PNG files written.
  """
  os.makedirs(out_dir, exist_ok=True)
  return [plot_accuracy(rows, a, os.path.join(out_dir, a.filename), target)
          for a in AXES]
