#!/usr/bin/env python3
"""Runs one hfl experiment as N processes on this machine (CPU devices, gloo).

Usage (from any directory; paths are the caller's):

  python launch/local_multiprocess.py --num_processes=2 -- \\
      --config=configs/smoke.py --workdir=/tmp/hfl_mp

Everything after ``--`` goes to ``main.py`` in every process, which runs in the
caller's working directory: a relative ``--workdir`` or ``--config`` means the
same to the launcher and to every process. ``--workdir`` is required (the logs
go to WORKDIR/logs unless ``--log_dir``); a missing one or one (or a
``--log_dir``) that cannot be a directory, a missing config file, a mesh
(``mesh.num_dcs * mesh.workers_per_dc`` of the config and its overrides) that
``--num_processes`` does not divide, a ``--python`` that is not an executable,
a ``--port`` already in use, a non-finite number, a ``--skip_process`` that
is not a process id (or skips them all), or main.py flags not placed after ``--`` is reported
in one line (exit status 2) before anything is started or written. Each process gets
``HFL_COORDINATOR=127.0.0.1:<free port>``, ``HFL_NUM_PROCESSES`` and its own
``HFL_PROCESS_ID`` (read by ``hfl.distributed.maybe_initialize``) and
``JAX_PLATFORMS=cpu``; ``main.py`` then splits the mesh's
``mesh.num_dcs * mesh.workers_per_dc`` simulated CPU devices evenly between the
processes (2 processes x 4 devices for the default 2 DCs x 4 workers: DC d runs
in process d). Cross-process collectives go over gloo (TCP on 127.0.0.1).

Process i appends its stdout and stderr to ``LOG_DIR/process_<i>.log`` after a
line naming the session's start (and, for process 0, also echoes this session's
output here unless ``--quiet``). The launcher exits with 0 when every process
does; otherwise it stops the remaining processes after ``--grace_s`` seconds,
prints which process failed with the tail of this session's part of its log, and
exits with the first failing status (or 124 after ``--timeout_s``). Ctrl-C or
SIGTERM sends SIGTERM to every process, which lets a checkpoint save in progress
finish and stops (main.py), and SIGKILL after ``STOP_GRACE_S`` seconds; the
launcher then exits with 130 or 143 and one line.
"""

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # launch/common.py (puts the repository on sys.path)  # pylint: disable=g-bad-import-order,wrong-import-position
from hfl import runtime  # noqa: E402  pylint: disable=wrong-import-position

tail = common.tail


def free_port() -> int:
  """A TCP port that is free on 127.0.0.1 right now."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def parse_args(argv):
  """The launcher's arguments (argparse's own usage errors exit with status 2).

  Raises:
    common.LaunchError: --num_processes < 1, a --skip_process that is not a process
      id (0 .. --num_processes - 1) or skips every one, or flags for main.py not
      after ``--``.
  """
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--num_processes', type=int, default=2, help='processes to start (>= 1)')
  p.add_argument('--port', type=int, default=0, help='coordinator port (0: pick a free one)')
  p.add_argument('--log_dir', default='', help='per-process logs (default WORKDIR/logs)')
  p.add_argument('--timeout_s', type=float, default=0,
                 help='stop everything after this many seconds (0: no limit; finite)')
  p.add_argument('--init_timeout_s', type=int, default=60,
                 help='bound on distributed start-up, seconds (HFL_INIT_TIMEOUT_S)')
  p.add_argument('--grace_s', type=float, default=10,
                 help='after a failure, seconds the others get to exit on their own')
  p.add_argument('--skip_process', type=int, action='append', default=[],
                 help='(testing) do not start this process id')
  p.add_argument('--python', default=sys.executable, help='python interpreter')
  p.add_argument('--quiet', action='store_true', help="don't echo process 0's output")
  p.add_argument('main_args', nargs=argparse.REMAINDER, help='-- then main.py flags')
  args, unknown = p.parse_known_args(argv)
  stray = unknown + (args.main_args if args.main_args[:1] not in ([], ['--']) else [])
  if stray:
    raise common.LaunchError(
        f'unrecognized arguments {" ".join(stray)}: main.py\'s flags go after --, e.g. '
        'local_multiprocess.py --num_processes=2 -- --config=configs/smoke.py '
        '--workdir=/tmp/hfl_mp')
  args.main_args = args.main_args[1:]
  if args.num_processes < 1:
    raise common.LaunchError(f'--num_processes={args.num_processes} must be >= 1.')
  for i in args.skip_process:
    if not 0 <= i < args.num_processes:
      raise common.LaunchError(
          f'--skip_process={i} is not a process id: with --num_processes='
          f'{args.num_processes} it must be in 0..{args.num_processes - 1}.')
  if set(args.skip_process) == set(range(args.num_processes)):
    raise common.LaunchError(
        f'--skip_process skips all {args.num_processes} process(es): nothing would run '
        '(skip some, to start the rest yourself).')
  return args


def check(args) -> str:
  """Checks the launch before anything starts; returns the log directory (absolute).

  Raises:
    common.LaunchError: no --workdir or --config for main.py, a missing config
      file, a --workdir that cannot be a directory, a log directory that cannot
      be created or written, a mesh that --num_processes does not divide, a
      --python that is not an executable, a non-finite or negative time, or a
      --port that is taken.
  """
  common.finite(args.timeout_s, '--timeout_s')
  common.finite(args.grace_s, '--grace_s')
  if args.init_timeout_s < 1:
    raise common.LaunchError(f'--init_timeout_s={args.init_timeout_s} must be >= 1.')
  workdir = common.workdir(args.main_args)
  common.config_path(args.main_args)
  common.mesh_devices_per_process(args.main_args, args.num_processes)
  log_dir = os.path.abspath(args.log_dir) if args.log_dir else os.path.join(workdir, 'logs')
  from hfl import metrics  # pylint: disable=g-import-not-at-top
  problem = metrics.dir_problem(log_dir)
  if problem:
    what = f'--log_dir={args.log_dir}' if args.log_dir else f'the log directory {log_dir}'
    raise common.LaunchError(f'{what} {problem}; pass a writable --log_dir (created if '
                             'missing).')
  if shutil.which(args.python) is None:
    raise common.LaunchError(f'--python={args.python} is not an executable file (nor a '
                             'command on PATH); pass a python interpreter.')
  if args.port:
    common.check_port(args.port)
  return log_dir


# Seconds the processes get after SIGTERM to finish a checkpoint save and exit.
STOP_GRACE_S = 30.0


def _stop(procs: dict, grace_s: float) -> None:
  """SIGTERM to each running process's group, then SIGKILL to those still running
  after ``grace_s`` seconds; waits for all of them."""
  for p in procs.values():
    if p.poll() is None:
      os.killpg(p.pid, signal.SIGTERM)
  deadline = time.monotonic() + grace_s
  for p in procs.values():
    try:
      p.wait(max(deadline - time.monotonic(), 0.1))
    except subprocess.TimeoutExpired:
      os.killpg(p.pid, signal.SIGKILL)
      p.wait()


def main(argv=None) -> int:
  try:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    log_dir = check(args)
  except common.LaunchError as e:
    return common.fail('[launch]', e)
  try:
    os.makedirs(log_dir, exist_ok=True)
  except OSError as e:  # e.g. created as a file since check()
    return common.fail('[launch]', common.LaunchError(f'cannot create {log_dir}: {e}'))
  port = args.port or free_port()
  coordinator = f'127.0.0.1:{port}'
  print(f'[launch] {args.num_processes} processes, coordinator {coordinator}, logs {log_dir}',
        flush=True)

  # Ctrl-C or SIGTERM (e.g. a job's timeout) stops the processes through the
  # cleanup below: each gets SIGTERM, which main.py handles like Ctrl-C after any
  # checkpoint save in progress.
  runtime.stop_on_sigterm()
  procs = {}  # process id -> (Popen, log path, log file)
  starts = {}  # process id -> where this session's output begins in its log
  interrupted = None  # exit status: 130 (Ctrl-C) or 143 (SIGTERM)
  try:
    for i in range(args.num_processes):
      if i in args.skip_process:
        continue
      env = dict(os.environ)
      env.update(HFL_COORDINATOR=coordinator, HFL_NUM_PROCESSES=str(args.num_processes),
                 HFL_PROCESS_ID=str(i), HFL_INIT_TIMEOUT_S=str(args.init_timeout_s),
                 PYTHONUNBUFFERED='1')
      env.setdefault('JAX_PLATFORMS', 'cpu')
      path = os.path.join(log_dir, f'process_{i}.log')
      log = open(path, 'a')  # pylint: disable=consider-using-with  (a rerun appends)
      log.write(f'[launch] {time.strftime("%Y-%m-%d %H:%M:%S")}: process {i} of '
                f'{args.num_processes} starts\n')
      log.flush()
      starts[i] = log.tell()
      cmd = [args.python, common.MAIN] + args.main_args  # in the caller's directory
      procs[i] = (subprocess.Popen(cmd, env=env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True), path, log)

    echo = None if args.quiet or 0 not in procs else open(procs[0][1], errors='replace')
    if echo is not None:
      echo.seek(starts[0])  # this session's output only
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
        _stop({i: p for i, (p, _, _) in procs.items() if i not in status}, 5)
        status.update({i: p.returncode for i, (p, _, _) in procs.items()})
        if timed_out and failed is None:
          failed = (-1, 124)
        break
      time.sleep(0.1)
    if echo is not None:
      sys.stdout.write(echo.read())
      echo.close()
    for _, _, log in procs.values():
      log.close()
  except KeyboardInterrupt as e:
    interrupted = runtime.interrupt_status(e)
  finally:  # nothing outlives the launcher
    _stop({i: p for i, (p, _, _) in procs.items()}, STOP_GRACE_S)
  if interrupted is not None:
    print(f'[launch] interrupted: the processes were stopped (SIGTERM; SIGKILL after '
          f'{STOP_GRACE_S:.0f} s); rerun the same command to resume from the last '
          f'checkpoint (logs in {log_dir}).', file=sys.stderr, flush=True)
    return interrupted
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
          f'{dict(sorted(status.items()))}. Tail of this session\'s output in '
          f'{procs[pid][1]}:\n{tail(procs[pid][1], start=starts[pid])}', file=sys.stderr,
          flush=True)
  return code if code > 0 else 1


if __name__ == '__main__':
  sys.exit(main())
