"""One command under each memory allocator: wall, user and system CPU time, page faults.

Runs COMMAND once per variant (in rounds, variants alternating, when --rounds > 1)
as a child process and reads its resource usage with ``os.wait4``:

  glibc     glibc malloc as it is (HFL_ALLOCATOR=system: no re-exec)
  tunables  glibc malloc with hfl.runtime.GLIBC_MALLOC_TUNABLES (hfl's fallback)
  tunables32m  the same with mmap_threshold=33554432 (32 MiB, the ceiling of
            glibc's dynamic threshold)
  tcmalloc  LD_PRELOAD=libtcmalloc_minimal.so.4 (what hfl.runtime picks)
  both      tcmalloc and the tunables

The last --tail lines of the child's stdout (e.g. bench/step_throughput.py's
table row) are printed under each variant.

  python3 bench/allocator.py [--variants=glibc,tunables,tcmalloc,both] [--rounds=1] \
      -- python3 bench/step_throughput.py --steps 30 --blocks 3
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hfl import runtime  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from arg_types import int_at_least, names_in  # noqa: E402

VARIANTS = ('glibc', 'tunables', 'tunables32m', 'tcmalloc', 'both')

_CLEAR = ('LD_PRELOAD', 'GLIBC_TUNABLES', runtime.MARKER, runtime.CHOICE)


def variant_env(name: str, tcmalloc: str) -> dict:
  """The child's environment for allocator variant ``name``."""
  env = {k: v for k, v in os.environ.items() if k not in _CLEAR}
  env[runtime.CHOICE] = 'system'  # the child's own hook must not re-exec
  if name in ('tunables', 'both'):
    env['GLIBC_TUNABLES'] = runtime.GLIBC_MALLOC_TUNABLES
  elif name == 'tunables32m':
    env['GLIBC_TUNABLES'] = runtime.GLIBC_MALLOC_TUNABLES.replace(
        'mmap_threshold=4294967295', 'mmap_threshold=33554432')
  elif name not in VARIANTS:
    raise ValueError(f'unknown variant {name!r}')
  if name in ('tcmalloc', 'both'):
    if not tcmalloc:
      raise SystemExit(f'{runtime.TCMALLOC} is not installed (launch/setup.sh installs it)')
    env['LD_PRELOAD'] = tcmalloc
  return env


def run(cmd: list[str], env: dict) -> tuple[float, object, int, str]:
  """Runs ``cmd``; returns (wall s, rusage, exit status, stdout)."""
  with tempfile.TemporaryFile('w+') as out:
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    out.seek(0)
    return wall, usage, proc.returncode, out.read()


def main():
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--variants', type=names_in(VARIANTS, 'variant'),
                  default='glibc,tunables,tcmalloc,both')
  ap.add_argument('--rounds', type=int_at_least(1), default=1)
  ap.add_argument('--tail', type=int_at_least(0), default=1,
                  help="lines of the child's stdout shown")
  ap.add_argument('command', nargs=argparse.REMAINDER)
  args = ap.parse_args()
  cmd = args.command[1:] if args.command[:1] == ['--'] else args.command
  if not cmd:
    ap.error('give the command after --')
  tcmalloc = runtime.find_tcmalloc()
  names = args.variants
  if not tcmalloc and {'tcmalloc', 'both'} & set(names):
    ap.error(f'--variants: {runtime.TCMALLOC} is not installed (launch/setup.sh installs '
             'it); leave out tcmalloc and both')
  print(f'command: {" ".join(cmd)}')
  print('| variant | round | wall (s) | user CPU (s) | sys CPU (s) | minor page faults | '
        'max RSS (MB) | exit |')
  print('|---|---|---:|---:|---:|---:|---:|---|')
  tails = []
  for r in range(args.rounds):
    for name in names:
      wall, ru, rc, out = run(cmd, variant_env(name, tcmalloc))
      print(f'| {name} | {r} | {wall:.1f} | {ru.ru_utime:.1f} | {ru.ru_stime:.1f} | '
            f'{ru.ru_minflt / 1e6:.2f} M | {ru.ru_maxrss / 1024:.0f} | {rc} |', flush=True)
      tails.append((name, r, out.strip().splitlines()[-args.tail:] if args.tail else []))
  for name, r, lines in tails:
    for line in lines:
      print(f'{name} (round {r}): {line}')


if __name__ == '__main__':
  main()
