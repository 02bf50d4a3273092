"""Is what a compressed run loses at a fixed budget a delay or a plateau? (issue 48)

For each compressed point of a compression sweep's finished runs, paired seed by seed with
the uncompressed run of the same seed and training length (same LAN, iterations and
schedule):

- the paired Δ of the evaluation metric at the middle evaluation and at the last one
  (a gap that narrows as training goes on is a delay, one that stays is a plateau);
- the delay: the fraction of its iterations the uncompressed run needs to first reach the
  compressed run's final value, both smoothed by a trailing mean of 3 evaluations (1.00:
  only at the end; > 1: never, shown as "–").

Reads the archive's layout (``ROOT/<run>/{config,summary}.json, metrics.jsonl``); trains
nothing. Usage:

  python3 bench/compression_delay.py docs/results/runs/compression
  python3 bench/compression_delay.py docs/results/runs/cifar10_compression --metric=test_accuracy
"""

import argparse
import collections
import os
import sys

import numpy as np
import pandas as pd

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from hfl.report import runs as runs_lib  # noqa: E402  pylint: disable=g-import-not-at-top

# What must match for two runs to be paired (besides the seed): the training and the LAN.
_SAME_TRAINING = ('train.num_steps', 'optimizer.schedule', 'network.lan_bandwidth_gbps')
# What tells the compressed points apart, with the value a run that predates the field ran.
_POINT = {'compression.uplink.name': None, 'compression.uplink.density': None,
          'compression.downlink.density': None, 'compression.broadcast': 'gather',
          'compression.broadcast_density': 0.0, 'compression.correction.name': ''}


def trailing_mean(x: np.ndarray, window: int = 3) -> np.ndarray:
  """[n] -> [n] float64: entry i is the mean of x[max(0, i - window + 1) : i + 1]."""
  return pd.Series(x, dtype=float).rolling(window, min_periods=1).mean().to_numpy()


def delay_fraction(steps: np.ndarray, base: np.ndarray, final: float, higher: bool) -> float:
  """The first step at which ``base`` (smoothed, [n]) reaches ``final``, over the last
  step; NaN when it never does."""
  reached = base >= final if higher else base <= final
  return float(steps[np.argmax(reached)] / steps[-1]) if reached.any() else float('nan')


def point_key(flat: dict) -> tuple:
  return tuple((k, flat.get(k, default)) for k, default in _POINT.items())


def analyse(root: str, metric: str) -> list[tuple]:
  """Rows (point, training, n, mid Δ, final Δ, delays) for the finished runs under
  ``root``; Δ in the metric's units, compressed − uncompressed, mean over seeds."""
  higher = metric.endswith('accuracy')
  runs = collections.defaultdict(dict)  # (training, point) -> seed -> (steps, values)
  for path in runs_lib.find_runs([root]):
    run = runs_lib.load_run(path)
    if not run.summary:
      continue
    flat = runs_lib.flatten(run.config)
    evals = [r for r in run.metrics if metric in r]
    training = tuple(flat.get(k) for k in _SAME_TRAINING)
    point = ('identity',) if flat.get('compression.uplink.name') == 'identity' else point_key(flat)
    runs[training, point][flat.get('seed', 0)] = (
        np.array([r['step'] for r in evals], float), np.array([r[metric] for r in evals], float))
  rows = []
  for (training, point), seeds in sorted(runs.items(), key=str):
    base = runs.get((training, ('identity',)))
    if point == ('identity',) or not base:
      continue
    mid, final, delays = [], [], []
    for seed, (steps, vals) in sorted(seeds.items()):
      if seed not in base or len(base[seed][1]) != len(vals):
        continue
      b_steps, b_vals = base[seed]
      mid.append(vals[len(vals) // 2] - b_vals[len(vals) // 2])
      final.append(vals[-1] - b_vals[-1])
      delays.append(delay_fraction(b_steps, trailing_mean(b_vals),
                                   trailing_mean(vals)[-1], higher))
    if mid:
      label = ', '.join(f'{k.removeprefix("compression.")}={v}' for k, v in point
                        if v and k != 'compression.uplink.name')
      rows.append((label, training, len(mid), np.mean(mid), np.mean(final), delays))
  return rows


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('root', help='a sweep root in the archive layout')
  ap.add_argument('--metric', default='test_accuracy', help='a metrics.jsonl field')
  args = ap.parse_args(argv)
  scale = 100.0 if args.metric == 'test_accuracy' else 1.0
  unit = 'pts' if scale == 100.0 else args.metric
  print(f'| point | {", ".join(_SAME_TRAINING)} | n | Δ at mid-run ({unit}) | final Δ ({unit}) '
        '| delay per seed |')
  print('|---|---|---:|---:|---:|---|')
  for label, training, n, mid, final, delays in analyse(args.root, args.metric):
    d = ' '.join('–' if np.isnan(x) else f'{x:.2f}' for x in delays)
    print(f'| {label} | {", ".join(map(str, training))} | {n} | {scale * mid:+.2f} '
          f'| {scale * final:+.2f} | {d} |')
  return 0


if __name__ == '__main__':
  sys.exit(main())
