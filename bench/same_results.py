"""Checks that two runs computed the same thing: summary.json and metrics.jsonl equal
field by field (floats bitwise, through their exact JSON text), wall-clock fields
(wall_time_s, step_wall_s) and the record of where and when the run started
(provenance: commit, versions, machine, start time) left out.

  python3 bench/same_results.py WORKDIR_A WORKDIR_B

Exit status 0 when they agree, 1 with the differing fields listed otherwise, 2
when a workdir cannot be read (no finished run there, or a file that is not JSON).
"""

import json
import os
import sys

WALL_CLOCK = ('wall_time_s', 'step_wall_s')
NOT_COMPUTED = WALL_CLOCK + ('provenance',)


def load(workdir: str) -> dict:
  """summary.json and metrics.jsonl of a workdir, the :data:`NOT_COMPUTED` fields removed."""
  with open(os.path.join(workdir, 'summary.json')) as f:
    summary = json.load(f)
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    records = [json.loads(line) for line in f if line.strip()]
  for rec in [summary] + records:
    for key in NOT_COMPUTED:
      rec.pop(key, None)
  return {'summary.json': summary, **{f'metrics.jsonl[{i}]': r for i, r in enumerate(records)}}


def differences(a, b, path='') -> list[str]:
  """Paths where two JSON values differ (exact equality, floats included)."""
  if isinstance(a, dict) and isinstance(b, dict):
    out = []
    for key in sorted(set(a) | set(b)):
      out += differences(a.get(key), b.get(key), f'{path}.{key}' if path else key)
    return out
  if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
    return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f'{path}[{i}]')]
  return [] if a == b and type(a) is type(b) else [f'{path}: {a!r} != {b!r}']


def main(argv):
  if len(argv) == 2 and argv[1] in ('-h', '--help'):
    print(__doc__)
    return 0
  if len(argv) != 3:
    print(__doc__, file=sys.stderr)
    return 2
  try:
    runs = [load(w) for w in argv[1:]]
  except (OSError, ValueError) as e:  # json.JSONDecodeError is a ValueError
    print(f'error: cannot read a finished run: {e}', file=sys.stderr)
    return 2
  diff = differences(*runs)
  if diff:
    print('\n'.join(diff))
    return 1
  print(f'{argv[1]} and {argv[2]}: summary.json and metrics.jsonl identical apart from '
        f'wall-clock and provenance fields ({", ".join(NOT_COMPUTED)}).')
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
