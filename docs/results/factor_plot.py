"""The results page's accuracy-vs-compression figure (PNG, matplotlib on an Agg canvas).

:func:`plot_accuracy_vs_factor`: final accuracy (top) and paired Δ vs the
baseline (bottom) against the compression factor of a table's rows, with the
published range (DGC) and the thesis' ratio drawn in. Used by make_results.py.
"""

import math
from typing import NamedTuple, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


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
