"""Figures from runs (PNG; ``matplotlib.figure.Figure`` on an Agg canvas, so the global
backend is never changed).

Curves (:func:`write_plots`): a metric of the evaluations (:data:`ACCURACY`, test
accuracy in %, or :data:`LOSS`, validation loss in nats per character) vs simulated
time (s), total bytes over all links (log x), inter-DC rounds or WAN bytes (log x),
one line per group of seeds: the mean of its seeds' curves (interpolated onto the
union of their x values within the range all cover) with a ±1 sample-std band.
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


class YAxis(NamedTuple):
  """A y axis: key in a metrics.jsonl record, axis label, scale of the plotted value,
  name in the PNG's name and title, and the range its ±std band is clipped to."""
  key: str
  label: str
  scale: float
  name: str
  clip: tuple = (-math.inf, math.inf)


ACCURACY = YAxis('test_accuracy', 'test accuracy (%)', 100.0, 'accuracy', (0.0, 100.0))
LOSS = YAxis('test_loss', 'validation loss (nats/char)', 1.0, 'loss', (0.0, math.inf))


def y_axis(metric: str) -> YAxis:
  """:data:`LOSS` for ``'test_loss'`` (a run's headline metric), else :data:`ACCURACY`."""
  return LOSS if metric == LOSS.key else ACCURACY


AXES = (  # filename: <y name>_vs_<filename>.png
    Axis('sim_time_s', 'simulated time (s)', 'sim_time'),
    Axis('bytes.total', 'total bytes, all links (bytes, log scale)', 'bytes', log=True),
    Axis('round', 'inter-DC rounds', 'inter_dc_rounds'),
)
WAN_BYTES = Axis('bytes.inter_dc', 'WAN bytes (inter-DC, log scale)', 'wan_bytes', log=True)
AXIS_BY_KEY = {a.key: a for a in AXES + (WAN_BYTES,)}
_LEGEND_INSIDE_MAX = 4  # above this many lines the legend goes outside the axes
_MARKERS = ('o', 's', '^', 'v', 'D', 'P', 'X', '*', '<', '>')


def curve(metrics: Sequence[dict], x_key: str, positive_x: bool = False,
          y_key: str = 'test_accuracy') -> tuple[np.ndarray, np.ndarray]:
  """(x, y) float arrays of one run, sorted by x; non-finite points (and x ≤ 0 with
  ``positive_x``, for a log axis) dropped. ``x_key``: see :func:`hfl.metrics.value`."""
  num = lambda v: float(v) if isinstance(v, (int, float)) else math.nan
  xy = np.array([(num(metrics_lib.value(m, x_key)), num(m.get(y_key)))
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


def _draw_lines(ax, rows: Sequence[Curves], axis: Axis, y: YAxis) -> tuple[int, bool]:
  """One mean line (±1 std band) per row; (lines drawn, any band)."""
  cmap = matplotlib.colormaps['tab10' if len(rows) <= 10 else 'tab20']
  drawn, banded = 0, False
  for i, row in enumerate(rows):
    x, mean, sd = mean_curve([curve(m, axis.key, axis.log, y.key) for m in row.runs])
    if not len(x):
      continue
    n = len(row.runs)
    ax.plot(x, y.scale * mean, color=cmap(i % cmap.N), marker=_MARKERS[i % len(_MARKERS)],
            markersize=3.5, markevery=max(1, len(x) // 12), linewidth=1.5,
            label=row.label if n == 1 else f'{row.label} (n={n})')
    if sd is not None:
      ax.fill_between(x, np.clip(y.scale * (mean - sd), *y.clip),
                      np.clip(y.scale * (mean + sd), *y.clip),
                      color=cmap(i % cmap.N), linewidth=0,
                      alpha=0.2 if len(rows) <= _LEGEND_INSIDE_MAX else 0.1)
      banded = True
    drawn += 1
  return drawn, banded


def plot_curves(rows: Sequence[Curves], axis: Axis, path: str, target: float | None = None,
                title: str | None = None, y: YAxis = ACCURACY) -> str:
  """Writes one figure of ``y`` vs ``axis`` (PNG) to ``path`` and returns it.

  Args:
    rows: the lines to draw.
    axis: which x axis.
    path: output PNG path.
    target: a dashed line at this value of the metric (accuracy fraction, loss
      nats), if given.
    title: figure title; default ``'<y label> vs <x quantity>'``.
    y: which metric.
  """
  return plot_panels([('', rows)], axis, path, target, title, y)


def plot_panels(panels: Sequence[tuple[str, Sequence[Curves]]], axis: Axis, path: str,
                target: float | None = None, title: str | None = None,
                y: YAxis = ACCURACY) -> str:
  """Like :func:`plot_curves`, one panel (axes, side by side, the y axis shared) per
  ``(panel title, rows)``: one comparison per panel, each with its own baseline."""
  outside = max(len(rows) for _, rows in panels) > _LEGEND_INSIDE_MAX
  width = (6.4 + (3.2 if outside else 0.0)) * (1 if len(panels) == 1 else 0.8 * len(panels))
  fig = Figure(figsize=(width, 4.4 + (0.8 if len(panels) > 1 else 0.0)), dpi=120,
               layout='constrained')
  FigureCanvasAgg(fig)
  axs = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
  default = f'{y.label.split(" (")[0].capitalize()} vs {axis.label.split(" (")[0]}'
  for ax, (name, rows) in zip(axs, panels):
    _draw_panel(ax, rows, axis, y, target, outside and len(panels) == 1)
    if len(panels) > 1:
      ax.set_title(name, fontsize='medium')
  axs[0].set_ylabel(y.label)
  if len(panels) == 1:
    axs[0].set_title(title or default)
  else:
    fig.suptitle(title or default)
  fig.savefig(path)
  return path


def _draw_panel(ax, rows: Sequence[Curves], axis: Axis, y: YAxis, target: float | None,
                outside: bool) -> None:
  """One panel's lines, target line, scale, labels and legend."""
  drawn, banded = _draw_lines(ax, rows, axis, y)
  if target is not None:
    ax.axhline(y.scale * target, color='0.4', linestyle='--', linewidth=1, label='target '
               + (f'{100 * target:.1f}%' if y is ACCURACY else f'{target:.3g} nats/char'))
  ax.set_xscale('log' if axis.log else 'linear')
  ax.set(xlabel=axis.label)
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


def plot_name(y: YAxis, axis: Axis, prefix: str = '') -> str:
  """A figure's file name: ``<prefix><y.name>_vs_<axis.filename>.png``."""
  return f'{prefix}{y.name}_vs_{axis.filename}.png'


def write_plots(rows: Sequence[Curves], out_dir: str, target: float | None = None,
                prefix: str = '', title: str | None = None, y: YAxis = ACCURACY,
                axes: Sequence[Axis] = AXES,
                panels: Sequence[tuple[str, Sequence[Curves]]] | None = None) -> list[str]:
  """Writes ``y`` vs each of ``axes`` as ``out_dir/``:func:`plot_name` (titles
  ``'<title>: <y> vs ...'`` when ``title`` is given); returns their paths. With
  ``panels`` (``(panel title, rows)`` pairs; ``rows`` is then ignored) each figure has
  one panel per comparison (:func:`plot_panels`)."""
  os.makedirs(out_dir, exist_ok=True)
  name = lambda a: f'{title}: {y.label.split(" (")[0]} vs {a.label.split(" (")[0]}'
  return [plot_panels(panels or [('', rows)], a, os.path.join(out_dir, plot_name(y, a, prefix)),
                      target, title=title and name(a), y=y) for a in axes]
