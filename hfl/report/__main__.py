"""CLI: ``python -m hfl.report RUN_DIR... --out DIR``.

Writes ``DIR/results.md``, ``DIR/results.csv`` and accuracy plots (PNG) for the
given training workdirs; runs that differ only in ``seed`` are grouped.
"""

import argparse
import logging
import os
import sys
from typing import Sequence

from hfl import report


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  """Parses the command line."""
  p = argparse.ArgumentParser(
      prog='python -m hfl.report',
      description='Tables and plots from hfl training workdirs.')
  p.add_argument('run_dirs', nargs='+', metavar='RUN_DIR',
                 help='training workdirs (with summary.json / metrics.jsonl)')
  p.add_argument('--out', required=True, help='output directory')
  p.add_argument('--target', type=float, default=None,
                 help='target test accuracy (fraction); default: the runs\' '
                 'train.target_accuracy, else 0.88')
  p.add_argument('--label-by', '--label_by', dest='label_by', default=None,
                 help='comma-separated config keys for labels, e.g. '
                 'sync.strategy,compression.uplink.name')
  p.add_argument('--baseline', default=None,
                 help='label of the compression baseline (default: closest '
                 'run with identity compression)')
  p.add_argument('--no-plots', '--no_plots', dest='plots',
                 action='store_false', help='skip the PNG plots')
  return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
  """Runs the CLI; returns the exit status."""
  args = parse_args(argv)
  logging.basicConfig(level=logging.INFO, format='%(levelname)s %(message)s')
  label_by = ([k.strip() for k in args.label_by.split(',') if k.strip()]
              if args.label_by else None)
  out = os.path.abspath(args.out)
  run_dirs = []
  for d in args.run_dirs:
    is_run = any(os.path.exists(os.path.join(d, f)) for f in ('summary.json', 'metrics.jsonl'))
    if os.path.abspath(d) == out or (len(args.run_dirs) > 1 and not is_run):
      print(f'skipping {d}: not a workdir', file=sys.stderr)
      continue
    run_dirs.append(d)
  try:
    written = report.write_report(run_dirs, args.out, target=args.target,
                                  label_by=label_by, baseline=args.baseline,
                                  plots=args.plots)
  except (FileNotFoundError, ValueError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  for path in written.values():
    print(path)
  return 0


if __name__ == '__main__':
  sys.exit(main())
