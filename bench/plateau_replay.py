"""Replays the progress-aware plateau tests on a finished run's round losses (issue 15).

Reads ``dc_rounds[*].train_loss`` (the loss each round handed to the K schedule)
from WORKDIR/metrics.jsonl, estimates the round-to-round noise of that loss
(residual of a centred 5-round moving average, rounds 6 onwards), and reports,
for ``sync.progress_test`` = ``endpoints`` and ``window_means`` (same window and
threshold), the first round at which each would raise K — with the relative
improvement of the smoothed curve over the same window at that round, i.e.
whether the loss had really plateaued. Host-side numpy only; the losses are those
of the run's own K (a replay, not a rerun: after a raise the real run's losses
would differ).

  python3 bench/plateau_replay.py WORKDIR [--window 3] [--threshold 0.01]
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from hfl.sync import schedule as schedule_lib  # noqa: E402  pylint: disable=wrong-import-position


def round_losses(workdir: str) -> np.ndarray:
  """float64 [R]: the train loss of every round, in round order."""
  rows = []
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    for line in f:
      rows += [(d['round'], d['train_loss']) for d in json.loads(line).get('dc_rounds', [])
               if 'train_loss' in d]
  return np.array([loss for _, loss in sorted(rows)], np.float64)


def first_raise(losses, test: str, window: int, threshold: float) -> int | None:
  """The 1-based round after which ``test`` first raises K_base (None: never)."""
  sched = schedule_lib.make_schedule('periodic', 1, 1, 2, progress_aware=True,
                                     progress_window=window, progress_threshold=threshold,
                                     progress_test=test)
  state = sched.init()
  for r, loss in enumerate(losses, start=1):
    _, state = sched.next_round(state, float(loss))
    if state.k_base > 1:
      return r
  return None


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument('workdir')
  ap.add_argument('--window', type=int, default=3)
  ap.add_argument('--threshold', type=float, default=0.01)
  a = ap.parse_args(argv)
  try:  # the schedule's own checks of the window and threshold
    for test in schedule_lib.PROGRESS_TESTS:
      first_raise([], test, a.window, a.threshold)
  except ValueError as e:
    ap.error(f'--window={a.window} --threshold={a.threshold}: {e}')
  path = os.path.join(a.workdir, 'metrics.jsonl')
  if not os.path.isfile(path):
    ap.error(f'no {path}: pass the workdir of a finished run')
  try:
    losses = round_losses(a.workdir)
  except (ValueError, KeyError, TypeError, OSError) as e:  # a line that is not a record
    ap.error(f'{path} is not an hfl metrics file: {type(e).__name__}: {e}')
  if len(losses) < 8:
    ap.error(f'{a.workdir}: {len(losses)} rounds with dc_rounds[*].train_loss in '
             'metrics.jsonl; need >= 8 (runs written before issue 15 do not log it)')
  smooth = np.convolve(losses, np.ones(5) / 5, mode='same')
  resid = (losses - smooth)[5:-2]
  print(f'{len(losses)} rounds; round-loss noise (std of the residual from a 5-round '
        f'moving average, rounds 6-{len(losses) - 2}): {resid.std(ddof=1):.4f} '
        f'({100 * np.mean(np.abs(resid) / smooth[5:-2]):.2f}% of the loss on average)')
  for test in schedule_lib.PROGRESS_TESTS:
    r = first_raise(losses, test, a.window, a.threshold)
    if r is None:
      print(f'{test:>12}: never raises K in {len(losses)} rounds')
      continue
    lo = max(r - (a.window + 1 if test == 'endpoints' else 2 * a.window), 0)  # first round - 1
    rel = (smooth[lo] - smooth[r - 1]) / smooth[lo]
    print(f'{test:>12}: raises K after round {r}; the smoothed loss fell '
          f'{100 * rel:.1f}% over rounds {lo + 1}-{r} (threshold {100 * a.threshold:g}%)')
  return 0


if __name__ == '__main__':
  sys.exit(main())
