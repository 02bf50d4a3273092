"""What both launchers check before they start or write anything.

The launchers pass everything after ``--`` to ``main.py`` unchanged and run it
in the caller's working directory, so every relative path (``--workdir``,
``--config``, ``--config.dataset.data_dir``) means what it means to the caller.
The checks here turn the start-up mistakes a user makes first (no workdir or
one that is a file, a missing config file, a mesh the process count does not
split, a taken port, a non-finite number) into one line on stderr and exit
status 2, before any process is started or any file written.
"""

import importlib.util
import math
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:  # hfl, and config files that import configs.*
  sys.path.insert(0, REPO)
MAIN = os.path.join(REPO, 'main.py')
USAGE_EXIT_CODE = 2


class LaunchError(ValueError):
  """Bad launcher input; the message is one line for the user."""


def fail(prefix: str, error: Exception) -> int:
  """Prints ``error`` as one line on stderr; returns the usage exit status."""
  print(f'{prefix} error: {error}', file=sys.stderr, flush=True)
  return USAGE_EXIT_CODE


def flag_value(args, name: str):
  """The value of ``--name=V`` or ``--name V`` in ``args`` (the last one), else None."""
  value = None
  for i, a in enumerate(args):
    if a == '--':
      break
    if a.startswith(f'--{name}='):
      value = a.split('=', 1)[1]
    elif a == f'--{name}' and i + 1 < len(args):
      value = args[i + 1]
  return value


def finite(value: float, flag: str, lo: float = 0.0, allow_equal: bool = True) -> float:
  """``value`` if it is finite and >= lo (> lo unless allow_equal), else LaunchError."""
  ok = math.isfinite(value) and (value >= lo if allow_equal else value > lo)
  if not ok:
    raise LaunchError(f'{flag}={value} must be a finite number {">=" if allow_equal else ">"} '
                      f'{lo:g}.')
  return value


def workdir(main_args) -> str:
  """The run's ``--workdir`` as an absolute path (relative to the caller's directory).

  Raises:
    LaunchError: no ``--workdir`` after ``--``, or one that cannot be a
      directory (a file, or under one).
  """
  w = flag_value(main_args, 'workdir')
  if not w:
    raise LaunchError('pass the run\'s workdir to main.py after --, e.g. '
                      '-- --config=configs/smoke.py --workdir=/tmp/hfl_run')
  from hfl import metrics  # pylint: disable=g-import-not-at-top
  problem = metrics.dir_problem(w, writable=False)  # main.py judges the rest (a finished run)
  if problem:
    raise LaunchError(f'--workdir={w} {problem}; pass a directory (created if missing).')
  return os.path.abspath(w)


def config_path(main_args) -> str:
  """The ``--config`` file (its path part, before any ``:arg``), checked to exist.

  Raises:
    LaunchError: no ``--config``, or the file does not exist relative to the
      caller's directory.
  """
  c = flag_value(main_args, 'config')
  if not c:
    raise LaunchError('pass a config file to main.py after --, e.g. --config=configs/smoke.py')
  path = c.partition(':')[0]
  if not os.path.isfile(path):
    raise LaunchError(f'--config={c}: no file {os.path.abspath(path)} (a relative path is '
                      f'read from the current directory, {os.getcwd()}).')
  return path


def config_value(main_args, field: str, default):
  """Config ``field`` (dotted) from ``--config.<field>`` overrides, else the config file.

  Both ``--config.F=V`` and ``--config.F V`` are read; the file is loaded like
  ``main.py`` loads it (``get_config(arg)``), relative to the caller's directory.

  Raises:
    LaunchError: the file cannot be loaded, lacks the field, or the value does
      not convert to ``type(default)``.
  """
  raw = flag_value(main_args, f'config.{field}')
  try:
    if raw is not None:
      return type(default)(raw)
    spec_arg = flag_value(main_args, 'config')
    if not spec_arg:
      return default
    path, _, arg = spec_arg.partition(':')
    spec = importlib.util.spec_from_file_location('_hfl_launch_config', os.path.abspath(path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    v = mod.get_config(arg or None)
    for p in field.split('.'):
      v = v[p]
    return type(default)(v)
  except Exception as e:  # pylint: disable=broad-except
    raise LaunchError(f'could not read config field {field} from {main_args}: '
                      f'{type(e).__name__}: {" ".join(str(e).split())}') from None


def mesh_devices_per_process(main_args, num_processes: int) -> int:
  """The CPU devices each of ``num_processes`` processes gets for the run's mesh.

  The mesh is ``mesh.num_dcs * mesh.workers_per_dc`` from the ``--config`` file
  and its ``--config.mesh.*`` overrides (:func:`config_value`), split as
  ``main.py`` splits it (``hfl.distributed.cpu_devices_per_process``).

  Raises:
    LaunchError: the config cannot be read, or the device count is not a
      multiple of ``num_processes``.
  """
  from hfl import distributed  # pylint: disable=g-import-not-at-top
  dcs = config_value(main_args, 'mesh.num_dcs', 2)
  workers = config_value(main_args, 'mesh.workers_per_dc', 4)
  try:
    return distributed.cpu_devices_per_process(
        dcs * workers, distributed.ProcessInfo(num_processes, 0, None, 'launcher'))
  except ValueError as e:
    raise LaunchError(f'--num_processes={num_processes} with mesh.num_dcs={dcs}, '
                      f'mesh.workers_per_dc={workers}: {" ".join(str(e).split())}') from None


def check_port(port: int) -> None:
  """Raises LaunchError when ``port`` is not a valid, free TCP port on this machine."""
  from hfl import distributed  # pylint: disable=g-import-not-at-top
  if not 1 <= port <= 65535:
    raise LaunchError(f'--port={port} must be in [1, 65535] (or 0 for a free port).')
  if distributed.port_in_use(port):
    raise LaunchError(f'port {port} is already in use on this machine (--port); choose '
                      'another, or --port=0 for a free one.')


def tail(path: str, lines: int = 15, start: int = 0, max_bytes: int = 65536) -> str:
  """The last ``lines`` lines of a text file from byte offset ``start`` on (e.g. where this
  session's output begins in a log that sessions append to), read from at most its last
  ``max_bytes``; '(no output)' when there is none, '(no log)' when it cannot be read."""
  try:
    with open(path, 'rb') as f:
      f.seek(max(start, os.fstat(f.fileno()).st_size - max_bytes))
      text = f.read().decode('utf-8', 'replace')
  except OSError:
    return '(no log)'
  return ''.join(text.splitlines(keepends=True)[-lines:]) or '(no output)'
