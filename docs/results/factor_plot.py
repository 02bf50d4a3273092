"""The results page's quality-vs-compression figure (PNG, matplotlib on an Agg canvas).

:func:`plot_accuracy_vs_factor`: the final metric (top: test accuracy, or the LM's
validation loss) and its paired Δ vs the baseline (bottom) against the compression
factor of a table's rows, with the bar, the published range (DGC) and the thesis'
ratio drawn in. Used by make_results.py.
"""

import math
from typing import NamedTuple, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


class Metric(NamedTuple):
  """The plotted metric: its name, the factor from stored to shown units (100 for an
  accuracy fraction in %), the shown unit, the unit of a Δ, and +1 when higher is better."""
  name: str
  scale: float
  unit: str
  delta_unit: str
  higher_is_better: int


ACCURACY = Metric('final test accuracy', 100.0, '%', 'pts', 1)
LOSS = Metric('final validation loss', 1.0, ' nats/char', 'nats', -1)


class FactorPoint(NamedTuple):
  """A point of :func:`plot_accuracy_vs_factor`: annotation, x = baseline bytes / ours
  (1 for the baseline), the final metric (stored units, e.g. accuracy as a fraction)
  mean and sample std over n seeds, and the paired Δ vs the baseline (shown units, e.g.
  pts; None for the baseline itself)."""
  label: str
  factor: float
  value: float
  value_std: float | None
  n: int
  paired: float | None = None
  paired_std: float | None = None
  paired_n: int = 0


def _annotate(ax, x, y, text, right):
  a = ax.annotate(text, (x, y), textcoords='offset points', xytext=(-8, 5) if right else (8, 5),
                  ha='right' if right else 'left', va='bottom', fontsize='small', zorder=2.5,
                  bbox=dict(boxstyle='round,pad=0.1', fc='white', ec='none', alpha=0.7))
  a.set_in_layout(False)  # a long label must not squeeze the axes


def _ylim(ax, values, errors, also, pad_min):
  lo = min(min(v - e for v, e in zip(values, errors)), *also)
  hi = max(max(v + e for v, e in zip(values, errors)), *also)
  pad = max(pad_min, 0.15 * (hi - lo))
  ax.set_ylim(lo - pad, hi + 2 * pad)


def log_slope(points: Sequence[FactorPoint]) -> float | None:
  """b of the least-squares fit paired Δ ≈ b · ln(factor) through the origin (the
  baseline: factor 1, Δ 0) over the points with a paired Δ: Σ ln(x) Δ / Σ ln(x)²,
  in Δ units per e-fold of the factor (× ln 2: per doubling). None below two points
  or when every factor is 1."""
  pts = [(math.log(p.factor), p.paired) for p in points
         if p.paired is not None and math.isfinite(p.factor) and p.factor > 0]
  den = sum(x * x for x, _ in pts)
  return sum(x * d for x, d in pts) / den if len(pts) >= 2 and den > 0 else None


def _paired_panel(ax, points, bar, is_right, metric, log_fit=False):
  worst = -metric.higher_is_better * bar
  ax.axhline(0.0, color='0.3', linestyle='--', linewidth=1)
  ax.axhline(worst, color='0.5', linestyle='-.', linewidth=1,
             label=f'{worst:+.3g} {metric.delta_unit}: the bar'.replace('-', '−'))
  pts = [p for p in points if p.paired is not None]
  if not pts:
    ax.text(0.5, 0.5, 'no paired seeds yet', transform=ax.transAxes, ha='center', va='center')
    return
  xs, ys = [p.factor for p in pts], [p.paired for p in pts]
  es = [p.paired_std or 0.0 for p in pts]
  ax.errorbar(xs, ys, yerr=es, color='tab:red', marker='s', linewidth=1.5, capsize=4,
              zorder=3, label='paired Δ (same seed), mean ± std over seeds')
  for p in pts:
    _annotate(ax, p.factor, p.paired, f'{p.paired:+.3g}, n={p.paired_n}'.replace('-', '−'),
              is_right(p.factor))
  b = log_slope(pts) if log_fit else None
  if b is not None:
    grid = [math.exp(i / 50 * math.log(max(xs))) for i in range(51)]
    ax.plot(grid, [b * math.log(x) for x in grid], color='tab:purple', linestyle='--',
            linewidth=1, label=f'least squares Δ = b ln x through 0: '
            f'{b * math.log(2):+.2f} {metric.delta_unit} per doubling of x'.replace('-', '−'))
  _ylim(ax, ys, es, (worst, 0.0), 0.3 if metric is ACCURACY else 0.1 * bar)


def plot_accuracy_vs_factor(points: Sequence[FactorPoint], path: str, title: str,
                            xlabel: str, bar: float,
                            shade: tuple[float, float, str] | None = None,
                            line: tuple[float, str] | None = None,
                            metric: Metric = ACCURACY, log_fit: bool = False) -> str | None:
  """Writes the final ``metric`` (top) and its paired Δ (bottom) vs compression factor
  (log x) of the baseline (factor 1) and compressed ``points`` to ``path``, with lines at
  the ``bar`` (the largest allowed loss of quality, Δ units: pts, nats), a ``shade``d
  published range of factors (low, high, legend), a published ``line`` (x, legend) and,
  with ``log_fit``, the paired Δs' :func:`log_slope` fit.
  Returns ``path`` (None below two points)."""
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
  m = metric
  base, worst = m.scale * points[0].value, -m.higher_is_better * bar
  ax.axhline(base, color='0.3', linestyle='--', linewidth=1,
             label=f'baseline {base:.4g}{m.unit}'
             + (f' (mean of {points[0].n} seeds)' if points[0].n > 1 else ''))
  ax.axhline(base + worst, color='0.5', linestyle='-.',
             label=f'baseline {"−" if worst < 0 else "+"} {bar:.3g} {m.delta_unit}')
  xs, ys = [p.factor for p in points], [m.scale * p.value for p in points]
  errs = [m.scale * (p.value_std or 0.0) for p in points]
  several = any(p.n > 1 for p in points)
  ax.errorbar(xs, ys, yerr=errs if several else None, color='tab:blue', marker='o',
              linewidth=1.5, capsize=4, zorder=3, label=m.name
              + (', mean ± std over seeds' if several else ''))
  x_lo, x_hi = 0.7, max(max(xs) * 1.5, (shade[1] if shade else 1.0) * 1.3)
  is_right = lambda x: math.log(x / x_lo) / math.log(x_hi / x_lo) > 0.6  # label to the left
  for p, y in zip(points, ys):
    _annotate(ax, p.factor, y, f'{p.label}, n={p.n}', is_right(p.factor))
  ax.set(xscale='log', xlim=(x_lo, x_hi), ylabel=f'{m.name} ({m.unit.strip()})', title=title)
  _ylim(ax, ys, errs, (base + worst, base), 0.5 if m is ACCURACY else 0.1 * bar)
  _paired_panel(ax2, points[1:], bar, is_right, m, log_fit)
  ax2.set(ylabel=f'{m.name.split()[-1]} Δ vs baseline ({m.delta_unit})', xlabel=xlabel)
  for a in (ax, ax2):
    a.grid(True, which='major', alpha=0.3)
    a.legend(loc='lower left' if m.higher_is_better > 0 else 'upper left', fontsize='small')
  fig.savefig(path)
  return path
