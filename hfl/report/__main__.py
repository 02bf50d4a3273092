"""CLI: ``python -m hfl.report DIR... [--out OUT]`` (see :mod:`hfl.report`)."""

import argparse
import logging
import os
import sys
from typing import Sequence

from hfl import metrics as metrics_lib
from hfl import report


def config_keys(text: str) -> list[str]:
  """``--label-by``'s comma-separated config keys; ArgumentTypeError if one is empty or
  given twice."""
  keys = [k.strip() for k in text.split(',')]
  if not all(keys) or len(set(keys)) < len(keys):
    raise argparse.ArgumentTypeError(
        ('must not be empty' if not text.strip() else f'{text!r} has an empty key'
         if not all(keys) else f'{text!r} names a key twice')
        + ': give comma-separated config keys, e.g. sync.strategy,compression.uplink.name or '
        'seed (leave the flag out for automatic labels)')
  return keys


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  """Parses the command line."""
  p = argparse.ArgumentParser(
      prog='python -m hfl.report',
      description='Tables and plots from hfl training workdirs: every directory with '
      'summary.json or metrics.jsonl among and below DIR... (relative paths are the '
      "caller's). Runs whose configs differ only in seed are one row (mean ± std); with "
      '--label-by, runs equal in its keys (--label-by seed: a row per seed). Prints the '
      'table and the files written.',
      epilog='example: python -m hfl.report workdirs/semisync  (writes workdirs/semisync/'
      'report). Exit status: 0, a complete report; 1, a report without the runs that could '
      'not be read (named on stderr and in results.md); 2, bad input (nothing written).')
  p.add_argument('dirs', nargs='+', metavar='DIR', help='workdirs, or directories above them')
  p.add_argument('--out', help='output directory (default with one DIR: DIR/report)')
  p.add_argument('--target', type=float, help="target of the runs' headline metric: test "
                 "accuracy (fraction) or validation loss (nats); default: the runs' own")
  p.add_argument('--label-by', '--label_by', dest='label_by', type=config_keys,
                 help='comma-separated config keys for labels and rows (runs equal in them are '
                 'one row, paired with the baseline on the other keys), e.g. '
                 'sync.strategy,compression.uplink.name or seed')
  p.add_argument('--baseline', help='label of the row to compare with (default: the closest '
                 'uncompressed one; with none compressed, the one sending the most bytes)')
  p.add_argument('--no-plots', '--no_plots', dest='plots', action='store_false',
                 help='skip the PNG plots (removing those of an earlier report in OUT)')
  return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
  """Runs the CLI; returns the exit status: 0, 1 (the report leaves out unreadable
  runs, or a sweep root's sweep.json lists runs it has none of: named on stderr and in
  results.md) or 2 (bad input; nothing written)."""
  args = parse_args(argv)
  logging.basicConfig(level=logging.INFO, format='%(levelname)s %(message)s')
  if args.out is None and len(args.dirs) > 1:
    print('error: --out is required with several DIRs', file=sys.stderr)
    return 2
  out = args.out or os.path.join(args.dirs[0], 'report')
  try:
    if problem := metrics_lib.dir_problem(out):
      raise ValueError(f'--out={out!r} {problem}')
    # A sweep root's runs that failed or never started are named, as the sweep's report does.
    expected = [os.path.join(d, n) for d in args.dirs for n in metrics_lib.manifest_runs(
        d, advice='move it away to report the runs alone') or []]
    written = report.write_report(args.dirs, out, target=args.target, label_by=args.label_by,
                                  baseline=args.baseline, plots=args.plots, expected=expected)
  except (OSError, ValueError) as e:  # OSError: e.g. a full disk, a directory named like a file
    partly = isinstance(e, OSError) and not isinstance(e, FileNotFoundError)
    print(f'error: {e}' + ('; the report in --out may be partly written' if partly else ''),
          file=sys.stderr)
    return 2
  with open(written['results.md'], encoding='utf-8') as f:  # its table, without the notes
    print(f.read().partition('\n## ')[0].rstrip('\n'), end='\n\n')
  print('\n'.join(written.values()))
  if written.missing:
    print(f'incomplete report: {len(written.missing)} run(s) of the sweep missing, failed or '
          'not started (named in results.md)', file=sys.stderr)
  if written.unreadable:
    print(f'incomplete report: {len(written.unreadable)} run(s) left out, unreadable (named '
          f'above and in {written["results.md"]}): '
          + ', '.join(d for d, _ in written.unreadable), file=sys.stderr)
  return 1 if written.missing or written.unreadable else 0


if __name__ == '__main__':
  sys.exit(main())
