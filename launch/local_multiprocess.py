#!/usr/bin/env python3
"""Runs one hfl experiment as N processes on this machine (CPU devices, gloo).

Usage (from the repository root):

  python launch/local_multiprocess.py --num_processes=2 --log_dir=/tmp/hfl_mp/logs -- \\
      --config=configs/smoke.py --workdir=/tmp/hfl_mp

Everything after ``--`` goes to ``main.py`` in every process. Each process gets
``HFL_COORDINATOR=127.0.0.1:<free port>``, ``HFL_NUM_PROCESSES`` and its own
``HFL_PROCESS_ID`` (read by ``hfl.distributed.maybe_initialize``) and
``JAX_PLATFORMS=cpu``; ``main.py`` then splits the mesh's
``mesh.num_dcs * mesh.workers_per_dc`` simulated CPU devices evenly between the
processes (2 processes x 4 devices for the default 2 DCs x 4 workers: DC d runs
in process d). Cross-process collectives go over gloo (TCP on 127.0.0.1).

Process i writes its stdout and stderr to ``LOG_DIR/process_<i>.log`` (and, for
process 0, also echoes it here unless ``--quiet``). The launcher exits with 0 when
every process does; otherwise it stops the remaining processes after
``--grace_s`` seconds, prints which process failed with the tail of its log,
and exits with the first failing status (or 124 after ``--timeout_s``).
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
  """A TCP port that is free on 127.0.0.1 right now."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def tail(path: str, lines: int = 15) -> str:
  try:
    with open(path, errors='replace') as f:
      return ''.join(f.readlines()[-lines:])
  except OSError:
    return '(no log)'


def parse_args(argv):
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--num_processes', type=int, default=2, help='processes to start (>= 1)')
  p.add_argument('--port', type=int, default=0, help='coordinator port (0: pick a free one)')
  p.add_argument('--log_dir', default='', help='per-process logs (default WORKDIR/logs)')
  p.add_argument('--timeout_s', type=float, default=0,
                 help='stop everything after this many seconds (0: no limit)')
  p.add_argument('--init_timeout_s', type=int, default=60,
                 help='bound on distributed start-up, seconds (HFL_INIT_TIMEOUT_S)')
  p.add_argument('--grace_s', type=float, default=10,
                 help='after a failure, seconds the others get to exit on their own')
  p.add_argument('--skip_process', type=int, action='append', default=[],
                 help='(testing) do not start this process id')
  p.add_argument('--python', default=sys.executable, help='python interpreter')
  p.add_argument('--quiet', action='store_true', help="don't echo process 0's output")
  p.add_argument('main_args', nargs=argparse.REMAINDER, help='-- then main.py flags')
  args = p.parse_args(argv)
  if args.main_args and args.main_args[0] == '--':
    args.main_args = args.main_args[1:]
  if args.num_processes < 1:
    p.error(f'--num_processes={args.num_processes} must be >= 1')
  return args


def workdir_of(main_args):
  for i, a in enumerate(main_args):
    if a.startswith('--workdir='):
      return a.split('=', 1)[1]
    if a == '--workdir' and i + 1 < len(main_args):
      return main_args[i + 1]
  return None


def main(argv=None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  workdir = workdir_of(args.main_args)
  log_dir = args.log_dir or (os.path.join(workdir, 'logs') if workdir else 'hfl_logs')
  os.makedirs(log_dir, exist_ok=True)
  port = args.port or free_port()
  coordinator = f'127.0.0.1:{port}'
  print(f'[launch] {args.num_processes} processes, coordinator {coordinator}, logs {log_dir}',
        flush=True)

  procs = {}  # process id -> (Popen, log path, log file)
  for i in range(args.num_processes):
    if i in args.skip_process:
      continue
    env = dict(os.environ)
    env.update(HFL_COORDINATOR=coordinator, HFL_NUM_PROCESSES=str(args.num_processes),
               HFL_PROCESS_ID=str(i), HFL_INIT_TIMEOUT_S=str(args.init_timeout_s),
               PYTHONUNBUFFERED='1')
    env.setdefault('JAX_PLATFORMS', 'cpu')
    path = os.path.join(log_dir, f'process_{i}.log')
    log = open(path, 'w')  # pylint: disable=consider-using-with
    cmd = [args.python, os.path.join(REPO, 'main.py')] + args.main_args
    procs[i] = (subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True), path, log)

  echo = None if args.quiet or 0 not in procs else open(procs[0][1], errors='replace')
  t0 = time.monotonic()
  failed = None  # (process id, status)
  fail_time = None
  status = {}
  while len(status) < len(procs):
    for i, (p, _, _) in procs.items():
      if i not in status and p.poll() is not None:
        status[i] = p.returncode
        if p.returncode != 0 and failed is None:
          failed, fail_time = (i, p.returncode), time.monotonic()
    if echo is not None:
      sys.stdout.write(echo.read())
      sys.stdout.flush()
    now = time.monotonic()
    timed_out = args.timeout_s and now - t0 > args.timeout_s
    if timed_out or (failed is not None and now - fail_time > args.grace_s):
      for i, (p, _, _) in procs.items():
        if i not in status and p.poll() is None:
          os.killpg(p.pid, signal.SIGTERM)
      deadline = time.monotonic() + 5
      for i, (p, _, _) in procs.items():
        if i not in status:
          try:
            p.wait(max(deadline - time.monotonic(), 0.1))
          except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
          status[i] = p.returncode
      if timed_out and failed is None:
        failed = (-1, 124)
      break
    time.sleep(0.1)
  if echo is not None:
    sys.stdout.write(echo.read())
    echo.close()
  for _, _, log in procs.values():
    log.close()

  if failed is None:
    print(f'[launch] all {len(procs)} processes finished OK in '
          f'{time.monotonic() - t0:.1f} s', flush=True)
    return 0
  pid, code = failed
  if pid < 0:
    print(f'[launch] timed out after {args.timeout_s:.0f} s; stopped all processes.',
          file=sys.stderr)
  else:
    print(f'[launch] process {pid} failed with status {code}; statuses: '
          f'{dict(sorted(status.items()))}. Tail of {procs[pid][1]}:\n'
          f'{tail(procs[pid][1])}', file=sys.stderr, flush=True)
  return code if code > 0 else 1


if __name__ == '__main__':
  sys.exit(main())
