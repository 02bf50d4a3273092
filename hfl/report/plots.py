"""Figures from runs (PNG; ``matplotlib.figure.Figure`` on an Agg canvas, so the global
backend is never changed).

Accuracy curves (:func:`write_plots`): test accuracy vs simulated time (s), total
bytes over all links (log x) or inter-DC rounds, one line per group of seeds: the
mean of its seeds' curves (interpolated onto the union of their x values within
the range all cover) with a ±1 sample-std band. :func:`plot_accuracy_vs_factor`:
final accuracy and paired Δ vs compression factor, with published numbers.
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
  """An x axis: dotted key in a metrics.jsonl record, axis label (units), PNG name, log x."""
  key: str
  label: str
  filename: str
  log: bool = False


AXES = (
    Axis('sim_time_s', 'simulated time (s)', 'accuracy_vs_sim_time.png'),
    Axis('bytes.total', 'total bytes, all links (bytes, log scale)', 'accuracy_vs_bytes.png',
         log=True),
    Axis('round', 'inter-DC rounds', 'accuracy_vs_inter_dc_rounds.png'),
)
_LEGEND_INSIDE_MAX = 4  # above this many lines the legend goes outside the axes
_MARKERS = ('o', 's', '^', 'v', 'D', 'P', 'X', '*', '<', '>')


def curve(metrics: Sequence[dict], x_key: str,
          positive_x: bool = False) -> tuple[np.ndarray, np.ndarray]:
  """(x, test accuracy) float arrays of one run, sorted by x; non-finite points (and
  x ≤ 0 with ``positive_x``, for a log axis) dropped. ``x_key``: see :func:`hfl.metrics.value`."""
  num = lambda v: float(v) if isinstance(v, (int, float)) else math.nan
  xy = np.array([(num(metrics_lib.value(m, x_key)), num(m.get('test_accuracy')))
                 for m in metrics], float).reshape(-1, 2)
  xy = xy[np.isfinite(xy).all(1) & ((xy[:, 0] > 0) if positive_x else True)]
  xy = xy[np.argsort(xy[:, 0], kind='stable')]
  return xy[:, 0], xy[:, 1]


def mean_curve(curves: Sequence[tuple[np.ndarray, np.ndarray]]
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
  """Mean and sample std of (x, y) curves (each sorted by x) on the union of their x
  values within the range all cover: (x, mean, std); std None for one curve; empty
  arrays when they share no range."""
  curves = [c for c in curves if len(c[0])]
  if len(curves) <= 1:
    return (*curves[0], None) if curves else (np.zeros(0), np.zeros(0), None)
  grid = np.unique(np.concatenate([c[0] for c in curves]))
  grid = grid[(grid >= max(c[0][0] for c in curves)) & (grid <= min(c[0][-1] for c in curves))]
  if not len(grid):
    return np.zeros(0), np.zeros(0), None
  ys = np.stack([np.interp(grid, x, y) for x, y in curves])
  return grid, ys.mean(0), ys.std(0, ddof=1)


def _draw_lines(ax, rows: Sequence[Curves], axis: Axis) -> tuple[int, bool]:
  """One mean line (±1 std band) per row; (lines drawn, any band)."""
  cmap = matplotlib.colormaps['tab10' if len(rows) <= 10 else 'tab20']
  drawn, banded = 0, False
  for i, row in enumerate(rows):
    x, y, sd = mean_curve([curve(m, axis.key, positive_x=axis.log) for m in row.runs])
    if not len(x):
      continue
    n = len(row.runs)
    ax.plot(x, 100 * y, color=cmap(i % cmap.N), marker=_MARKERS[i % len(_MARKERS)],
            markersize=3.5, markevery=max(1, len(x) // 12), linewidth=1.5,
            label=row.label if n == 1 else f'{row.label} (n={n})')
    if sd is not None:
      ax.fill_between(x, np.clip(100 * (y - sd), 0, 100), np.clip(100 * (y + sd), 0, 100),
                      color=cmap(i % cmap.N), linewidth=0,
                      alpha=0.2 if len(rows) <= _LEGEND_INSIDE_MAX else 0.1)
      banded = True
    drawn += 1
  return drawn, banded


def plot_accuracy(rows: Sequence[Curves], axis: Axis, path: str,
                  target: float | None = None, title: str | None = None) -> str:
  """Writes one accuracy figure (PNG) to ``path`` and returns it.

  Args:
    rows: the lines to draw.
    axis: which x axis.
    path: output PNG path.
    target: a dashed line at this accuracy (fraction), if given.
    title: figure title; default ``'Test accuracy vs <x quantity>'``.
  """
  outside = len(rows) > _LEGEND_INSIDE_MAX
  fig = Figure(figsize=(6.4 + (3.2 if outside else 0.0), 4.4), dpi=120, layout='constrained')
  FigureCanvasAgg(fig)
  ax = fig.add_subplot()
  drawn, banded = _draw_lines(ax, rows, axis)
  if target is not None:
    ax.axhline(100 * target, color='0.4', linestyle='--', linewidth=1,
               label=f'target {100 * target:.1f}%')
  if axis.log:
    ax.set_xscale('log')
  ax.set(xlabel=axis.label, ylabel='test accuracy (%)',
         title=title or f'Test accuracy vs {axis.label.split(" (")[0]}')
  ax.grid(True, which='major', alpha=0.3)
  if drawn == 0:
    ax.text(0.5, 0.5, 'no evaluations', transform=ax.transAxes, ha='center', va='center')
  longest = max((len(h.get_label()) for h in ax.get_legend_handles_labels()[0]), default=0)
  where = (dict(loc='upper center', bbox_to_anchor=(0.5, -0.15), frameon=False)
           if outside and longest > 40 else  # long labels: below, keeping the plot wide
           dict(loc='upper left', bbox_to_anchor=(1.02, 1.0), frameon=False) if outside
           else dict(loc='best'))
  ax.legend(fontsize='small', title_fontsize='small',
            title='shaded: ±1 std over seeds' if banded else None, **where)
  fig.savefig(path)
  return path


def write_plots(rows: Sequence[Curves], out_dir: str, target: float | None = None,
                prefix: str = '', title: str | None = None) -> list[str]:
  """Writes the figures of :data:`AXES` as ``out_dir/<prefix><filename>`` (titles
  ``'<title>: test accuracy vs ...'`` when ``title`` is given); returns their paths."""
  os.makedirs(out_dir, exist_ok=True)
  return [plot_accuracy(rows, a, os.path.join(out_dir, prefix + a.filename), target,
                        title=title and f'{title}: test accuracy vs {a.label.split(" (")[0]}')
          for a in AXES]


class FactorPoint(NamedTuple):
  """A point of :func:`plot_accuracy_vs_factor`: annotation, x = baseline bytes / ours
  (1 for the baseline), final accuracy (fraction) mean and sample std over n seeds,
  and the paired Δ vs the baseline (pts; None for the baseline itself)."""
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
  """Writes final accuracy (top) and paired Δ (bottom) vs compression factor (log x) of
  the baseline (factor 1) and compressed ``points`` to ``path``, with lines at the
  accuracy ``bar`` (pts), a ``shade``d published range of factors (low, high, legend)
  and a published ``line`` (x, legend). Returns ``path`` (None below two points)."""
  points = sorted((p for p in points if math.isfinite(p.factor)), key=lambda p: p.factor)
  if len(points) < 2:
    return None
  fig = Figure(figsize=(7.2, 7.2), dpi=120, layout='constrained')
  FigureCanvasAgg(fig)
  ax, ax2 = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
  for a, legend in ((ax, True), (ax2, False)):
    if shade:
      a.axvspan(*shade[:2], color='tab:orange', alpha=0.15, label=shade[2] if legend else None)
    if line:
      a.axvline(line[0], color='tab:green', linestyle=':', label=line[1] if legend else None)
  base = 100 * points[0].acc
  ax.axhline(base, color='0.3', linestyle='--', linewidth=1, label=f'baseline {base:.2f}%'
             + (f' (mean of {points[0].n} seeds)' if points[0].n > 1 else ''))
  ax.axhline(base - bar, color='0.5', linestyle='-.', label=f'baseline − {bar:g} pts')
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
  ax.set(xscale='log', xlim=(x_lo, x_hi), ylabel='final test accuracy (%)', title=title)
  _ylim(ax, ys, errs, (base - bar, base), 0.5)
  _paired_panel(ax2, points[1:], bar, is_right)
  ax2.set(ylabel='accuracy Δ vs baseline (pts)', xlabel=xlabel)
  for a in (ax, ax2):
    a.grid(True, which='major', alpha=0.3)
    a.legend(loc='lower left', fontsize='small')
  fig.savefig(path)
  return path
