"""Figures from runs (PNG, matplotlib without pyplot).

* Accuracy curves: test accuracy vs simulated time (s), total bytes over all
  links (log x) or inter-DC rounds, one line per group of seeds. A group of
  several seeds is drawn as the mean curve with a ±1 sample-std band; the
  seeds' curves are linearly interpolated onto the union of their x values,
  restricted to the x range all seeds cover.
* Accuracy vs compression factor (:func:`plot_accuracy_vs_factor`): final
  accuracy and paired Δ per point, with a published range and an accuracy bar.

Figures are built with ``matplotlib.figure.Figure`` (Agg canvas), so importing
this module never changes the global matplotlib backend.
"""

import math
import os
from typing import NamedTuple, Sequence

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
import numpy as np

from hfl import metrics as metrics_lib


class Curves(NamedTuple):
  """One line of an accuracy figure: a label and the metrics.jsonl records of its runs."""
  label: str
  runs: list


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
    x_key: dotted key of x (see :func:`hfl.metrics.value`).
    positive_x: drop points with x <= 0 (for a log axis).

  Returns:
    Two float arrays of equal length.
  """
  pts = []
  for m in metrics:
    x, y = metrics_lib.value(m, x_key), m.get('test_accuracy')
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


def plot_accuracy(rows: Sequence[Curves], axis: Axis, path: str,
                  target: float | None = None, title: str | None = None) -> str:
  """Writes one accuracy figure.

  Args:
    rows: the lines to draw.
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
    curves = [curve(m, axis.key, positive_x=axis.log) for m in row.runs]
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


def write_plots(rows: Sequence[Curves], out_dir: str, target: float | None = None,
                prefix: str = '', title: str | None = None) -> list[str]:
  """Writes the three accuracy figures into ``out_dir``.

  Args:
    rows: the lines to draw.
    out_dir: output directory (created if missing).
    target: target accuracy line, or None.
    prefix: prepended to the file names.
    title: figure titles start with ``'<title>: '``.

  Returns:
    Paths of the PNG files written.
  """
  os.makedirs(out_dir, exist_ok=True)
  return [plot_accuracy(rows, a, os.path.join(out_dir, prefix + a.filename), target,
                        title=title and f'{title}: test accuracy vs {a.label.split(" (")[0]}')
          for a in AXES]


class FactorPoint(NamedTuple):
  """One point of :func:`plot_accuracy_vs_factor`.

  Attributes:
    label: its annotation.
    factor: x, baseline bytes / ours (1 for the baseline).
    acc, acc_std: final test accuracy (fraction), mean and sample std over seeds.
    n: seeds.
    paired, paired_std, paired_n: paired Δ vs the baseline (pts); None for the
      baseline or without a common seed.
  """
  label: str
  factor: float
  acc: float
  acc_std: float | None
  n: int
  paired: float | None = None
  paired_std: float | None = None
  paired_n: int = 0


def _annotate(ax, x, y, text, right):
  ax.annotate(text, (x, y), textcoords='offset points', xytext=(-8, 5) if right else (8, 5),
              ha='right' if right else 'left', va='bottom', fontsize='small', zorder=2.5,
              bbox=dict(boxstyle='round,pad=0.1', fc='white', ec='none', alpha=0.7))


def _ylim(ax, values, errors, also, pad_min):
  lo = min(min(v - e for v, e in zip(values, errors)), *also)
  hi = max(max(v + e for v, e in zip(values, errors)), *also)
  pad = max(pad_min, 0.15 * (hi - lo))
  ax.set_ylim(lo - pad, hi + 2 * pad)


def _paired_panel(ax, points, bar, is_right):
  ax.axhline(0.0, color='0.3', linestyle='--', linewidth=1)
  ax.axhline(-bar, color='0.5', linestyle='-.', linewidth=1, label=f'−{bar:g} pts: the bar')
  pts = [p for p in points if p.paired is not None]
  if not pts:
    ax.text(0.5, 0.5, 'no paired seeds yet', transform=ax.transAxes, ha='center', va='center')
    return
  xs, ys = [p.factor for p in pts], [p.paired for p in pts]
  es = [p.paired_std or 0.0 for p in pts]
  ax.errorbar(xs, ys, yerr=es, color='tab:red', marker='s', linewidth=1.5, capsize=4,
              zorder=3, label='paired Δ (same seed), mean ± std over seeds')
  for p in pts:
    _annotate(ax, p.factor, p.paired, f'{p.paired:+.2f}, n={p.paired_n}'.replace('-', '−'),
              is_right(p.factor))
  _ylim(ax, ys, es, (-bar, 0.0), 0.3)


def plot_accuracy_vs_factor(points: Sequence[FactorPoint], path: str, title: str,
                            xlabel: str, bar: float,
                            shade: tuple[float, float, str] | None = None,
                            line: tuple[float, str] | None = None) -> str | None:
  """Final accuracy (top) and paired Δ (bottom) vs compression factor (log x).

  Args:
    points: the baseline (factor 1, first) and the compressed points.
    path: PNG path.
    title, xlabel: figure title and x-axis label.
    bar: accuracy bar in pts (a line at baseline − bar, and at −bar below).
    shade: a published range of factors (low, high, legend label).
    line: a published factor (x, legend label).

  Returns:
    ``path``, or None with fewer than two points.
  """
  points = sorted((p for p in points if math.isfinite(p.factor)), key=lambda p: p.factor)
  if len(points) < 2:
    return None
  fig = Figure(figsize=(7.2, 7.2), dpi=120, layout='constrained')
  FigureCanvasAgg(fig)
  ax, ax2 = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
  for i, a in enumerate((ax, ax2)):
    if shade:
      a.axvspan(shade[0], shade[1], color='tab:orange', alpha=0.15, label=shade[2] if i == 0 else None)
    if line:
      a.axvline(line[0], color='tab:green', linestyle=':', linewidth=1.2,
                label=line[1] if i == 0 else None)
  base = 100 * points[0].acc
  ax.axhline(base, color='0.3', linestyle='--', linewidth=1, label=f'baseline {base:.2f}%'
             + (f' (mean of {points[0].n} seeds)' if points[0].n > 1 else ''))
  ax.axhline(base - bar, color='0.5', linestyle='-.', linewidth=1, label=f'baseline − {bar:g} pts')
  xs, ys = [p.factor for p in points], [100 * p.acc for p in points]
  errs = [100 * (p.acc_std or 0.0) for p in points]
  several = any(p.n > 1 for p in points)
  ax.errorbar(xs, ys, yerr=errs if several else None, color='tab:blue', marker='o',
              linewidth=1.5, capsize=4, zorder=3, label='final test accuracy'
              + (', mean ± std over seeds' if several else ''))
  x_lo, x_hi = 0.7, max(max(xs) * 1.5, (shade[1] if shade else 1.0) * 1.3)
  is_right = lambda x: x == xs[-1] and math.log(x / x_lo) / math.log(x_hi / x_lo) > 0.65
  for p, y in zip(points, ys):
    _annotate(ax, p.factor, y, f'{p.label}, n={p.n}', is_right(p.factor))
  ax.set_xscale('log')
  ax.set_xlim(x_lo, x_hi)
  _ylim(ax, ys, errs, (base - bar, base), 0.5)
  ax.set_ylabel('final test accuracy (%)')
  ax.set_title(title)
  _paired_panel(ax2, points[1:], bar, is_right)
  ax2.set_ylabel('accuracy Δ vs baseline (pts)')
  ax2.set_xlabel(xlabel)
  for a in (ax, ax2):
    a.grid(True, which='major', alpha=0.3)
    a.legend(loc='lower left', fontsize='small')
  fig.savefig(path)
  return path
