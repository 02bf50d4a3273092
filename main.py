"""Runs one hfl experiment.

  python main.py --config=configs/default.py --workdir=/tmp/hfl_default \
      [--config.sync.k=8 ...]

Rerunning the same command on an existing workdir resumes from its last checkpoint.
"""

import errno
import os
import sys

from hfl import runtime

# First: re-executes once with tcmalloc (docs/benchmarks.md), before JAX starts.
runtime.use_fast_allocator()

from absl import app  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
from absl import logging  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
from ml_collections import config_flags  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

from hfl import distributed  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
from hfl import metrics  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
from hfl import workdir as workdir_lib  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

# The hfl modules that import JAX are imported inside the functions that use them
# (``# lazy: jax``): --help and a bad flag, config or workdir answer without loading
# JAX, and the CPU device count is set (mesh.configure_cpu_devices) before anything
# can start JAX's backend.

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Experiment config file.',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for checkpoints, metrics and summary.')
flags.mark_flags_as_required(['config', 'workdir'])
# Multi-process runs (docs/multihost.md); unset: $HFL_COORDINATOR etc., else a
# cluster JAX detects (SLURM, TPU pod), else one process.
_COORDINATOR = flags.DEFINE_string('coordinator_address', None,
                                   'host:port of process 0 for a multi-process run.')
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', None, 'Processes in the run.')
_PROCESS_ID = flags.DEFINE_integer('process_id', None, "This process's id in [0, num_processes).")
_INIT_TIMEOUT = flags.DEFINE_integer('init_timeout_s', None,
                                     'Bound on distributed start-up, seconds (default 120).')


class _LibraryInfoFilter:
  """Drops INFO/DEBUG records of chatty libraries (orbax saves, JAX backend probing)."""

  def filter(self, record) -> bool:
    if record.levelno >= logging.converter.STANDARD_WARNING:
      return True
    return not any(s in record.pathname for s in self._QUIET)

  # orbax's per-save chatter; jax's "Unable to initialize backend 'tpu'" probe.
  _QUIET = ('/orbax/', '/jax/_src/xla_bridge.py')


def main(argv):
  runtime.stop_on_sigterm()
  if len(argv) > 1:
    print(f'error: unexpected arguments {argv[1:]}; main.py takes only flags: --config=FILE, '
          '--workdir=DIR, --config.FIELD=VALUE (e.g. --config.sync.k=8).', file=sys.stderr)
    sys.exit(2)
  try:
    config = _CONFIG.value
    num_devices = config.mesh.num_dcs * config.mesh.workers_per_dc
  except (OSError, AttributeError, KeyError) as e:
    _config_load_failed(config_flags.get_config_filename(flags.FLAGS['config']), e)
  problem = workdir_lib.problem(_WORKDIR.value)
  if problem:
    print(f'error: --workdir={_WORKDIR.value!r} {problem}', file=sys.stderr)
    sys.exit(2)
  # Distributed start-up and the CPU device count come before anything touches
  # the JAX backend.
  from hfl import config as config_lib  # lazy: jax  pylint: disable=g-import-not-at-top
  from hfl import mesh  # lazy: jax  pylint: disable=g-import-not-at-top
  try:
    config_lib.validate(config)  # every check that needs only the config, e.g. the mesh
    info = distributed.maybe_initialize(_COORDINATOR.value, _NUM_PROCESSES.value,
                                        _PROCESS_ID.value, timeout_s=_INIT_TIMEOUT.value)
    if mesh.wants_cpu_devices(config):  # mesh.simulate='vmap' runs on one device
      mesh.configure_cpu_devices(distributed.cpu_devices_per_process(
          num_devices, info))
    _check_dc_placement(config, info)
  except (ValueError, distributed.DistributedInitError) as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)
  from hfl import train  # lazy: jax  pylint: disable=g-import-not-at-top
  # Progress lines from process 0 only; warnings and errors from every process.
  logging.set_verbosity(logging.INFO if info.process_id == 0 else logging.WARNING)
  logging.get_absl_handler().addFilter(_LibraryInfoFilter())
  if info.process_id == 0:  # every process has the same config: one warning suffices
    _warn_ignored(config, sys.argv)
  try:
    train.train_and_evaluate(config, _WORKDIR.value)
  except metrics.WriteError as e:  # e.g. the disk filled while saving
    fix = 'Free space there' if e.errno in (errno.ENOSPC, errno.EDQUOT) else 'Fix that'
    print(f'error: {e}. {fix}, then rerun the same command to resume '
          f'{_WORKDIR.value} {workdir_lib.resume_point(_WORKDIR.value)}.', file=sys.stderr)
    # A save that failed creating its directory leaves orbax threads waiting 300 s for
    # a signal that never comes; the normal exit would join them. Everything is
    # written and the workdir lock released by now, so end the process at once.
    logging.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(2)  # pylint: disable=protected-access
  except (ValueError, FileNotFoundError) as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)
  except FloatingPointError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(3)
  except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (runtime.Terminated)
    print(f'interrupted{" by SIGTERM" if isinstance(e, runtime.Terminated) else ""}: rerun the '
          f'same command to resume {_WORKDIR.value} {workdir_lib.resume_point(_WORKDIR.value)}.',
          file=sys.stderr)
    sys.exit(runtime.interrupt_status(e))


def _check_dc_placement(config, info) -> None:
  """Warns (process 0) when a DC straddles processes; under the emulated WAN, refuses.

  Raises:
    ValueError: see hfl.distributed.check_dc_placement.
  """
  if not info.multi_process:
    return
  from hfl import mesh  # lazy: jax  pylint: disable=g-import-not-at-top
  problem = distributed.check_dc_placement(
      mesh.make_mesh(config.mesh.num_dcs, config.mesh.workers_per_dc))
  if problem and info.process_id == 0:
    print(f'warning: {problem}', file=sys.stderr, flush=True)


def _parse_flags(argv):
  """absl flag parsing with one clear line (no traceback) for a bad --config.* override."""
  args = argv[1:argv.index('--')] if '--' in argv else argv[1:]
  for name in ('--config', '--workdir'):  # absl would keep the last, or fail obscurely
    given = [a for a in args if a.partition('=')[0] == name]
    if len(given) > 1:
      print(f'error: {name} given {len(given)} times ({", ".join(given)}); give it once',
            file=sys.stderr)
      sys.exit(2)
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    msg = ' '.join(str(e).split()).rstrip('.')
    if 'Error whilst parsing config file' in msg:  # get_config raised: keep its message
      msg = msg.split(':', 1)[0] + ': ' + msg.rsplit('Error: ', 1)[-1].rstrip('.')
    elif 'Non-boolean argument' in msg:
      msg = msg.split(':', 1)[0] + ': not a boolean (a boolean field takes true or false)'
    elif 'invalid literal for int()' in msg:
      msg += ' (an integer field)'
    elif 'could not convert string to float' in msg:
      msg += ' (a number field)'
    if "Unknown command line flag 'config." in msg and _config_args(argv)[0] is None:
      print('error: --config.FIELD overrides need a --config file to override, e.g. '
            'python3 main.py --config=configs/default.py --workdir=workdirs/run '
            '--config.train.num_steps=80', file=sys.stderr)
      sys.exit(2)
    config_arg = _config_args(argv)[0]
    if 'Flag --config must have a value other than None' in msg and config_arg:
      print(f'error: could not load --config ({config_arg.partition(":")[0]}: get_config() '
            'returned None, not an ml_collections.ConfigDict); pass a config file such as '
            'configs/default.py.', file=sys.stderr)
      sys.exit(2)
    for name in ('config', 'workdir'):
      if f'Flag --{name} must have a value other than None' in msg:  # a required flag missing
        print(f'error: --{name} is required, e.g. python3 main.py --config=configs/default.py '
              '--workdir=workdirs/run', file=sys.stderr)
        sys.exit(2)
    from hfl import config as config_lib  # lazy: jax  pylint: disable=g-import-not-at-top
    print(f'error: {msg}. {config_lib.FIELDS_HELP}', file=sys.stderr)
    sys.exit(2)
  except (KeyError, AttributeError, OSError, ImportError, SyntaxError) as e:
    config_arg = _config_args(argv)[0]
    if config_arg and (not os.path.isfile(config_arg.partition(':')[0]) or (
        isinstance(e, AttributeError) and 'get_config' in str(e)) or (
            isinstance(e, SyntaxError) and e.filename and os.path.isfile(e.filename))):
      _config_load_failed(config_arg, e)
    from hfl import config as config_lib  # lazy: jax  pylint: disable=g-import-not-at-top
    problem = (_unknown_override(argv, config_lib)
               if isinstance(e, (KeyError, AttributeError)) else None)
    if problem is None:
      # ml_collections' messages are reprs (quotes, literal \n): keep their words.
      msg = ' '.join(str(e.args[0] if e.args else e).replace('\\n', ' ').split())
      problem = f'bad --config or --config.* override: {type(e).__name__}: {msg.strip(chr(39))}.'
    elif not problem.endswith('?'):
      problem += '.'
    print(f'error: {problem} {config_lib.FIELDS_HELP}', file=sys.stderr)
    sys.exit(2)
  except Exception as e:  # pylint: disable=broad-except  (get_config raised, e.g. a NameError)
    config_arg = _config_args(argv)[0]
    if not config_arg:
      raise
    _config_load_failed(config_arg, e)


def _warn_ignored(config, argv) -> None:
  """Warns about each --config.FIELD of ``argv`` that the run does not use
  (hfl.config.ignored_fields, e.g. a density for the identity compressor)."""
  from hfl import config as config_lib  # lazy: jax  pylint: disable=g-import-not-at-top
  try:
    ignored = config_lib.ignored_fields(config)
  except (KeyError, AttributeError):  # an invalid config: validation reports it
    return
  for field in dict.fromkeys(_config_args(argv)[1]):
    if field in ignored:
      logging.warning('--config.%s is ignored: %s', field, ignored[field])


def _config_load_failed(config_arg: str, e: Exception):
  """Exits (status 2) with one line saying why the --config file did not load."""
  path = config_arg.partition(':')[0]
  if os.path.isdir(path):
    detail = f'{path} is a directory, not a config file'
  elif not os.path.isfile(path):
    detail = f'{path} not found from {os.getcwd()}'
  elif isinstance(e, AttributeError) and 'get_config' in str(e):
    detail = f'{path} defines no get_config()'
  elif isinstance(e, SyntaxError) and e.filename:  # the config file or a module it imports
    detail = f'{type(e).__name__} in {e.filename}, line {e.lineno}: {e.msg}'
  elif isinstance(e, (OSError, KeyError, AttributeError, ImportError)):
    detail = ' '.join(str(e).split())
  else:  # the file's own error, e.g. a NameError or an assert in get_config
    detail = f'{path} raised {type(e).__name__}: {" ".join(str(e).split())}'
  print(f'error: could not load --config ({detail}); pass a config file such as '
        'configs/default.py.', file=sys.stderr)
  sys.exit(2)


def _config_args(argv) -> tuple:
  """(the --config value or None, the FIELDs of every --config.FIELD) of ``argv``."""
  config_arg, fields = None, []
  args = list(argv[1:])
  for i, arg in enumerate(args):
    if arg == '--':
      break
    name, eq, value = arg.partition('=')
    if name == '--config':
      config_arg = value if eq else (args[i + 1] if i + 1 < len(args) else None)
    elif name.startswith(('--config.', '--noconfig.')):
      fields.append(name.split('config.', 1)[1])
  return config_arg, fields


def _unknown_override(argv, config_lib) -> str | None:
  """The first --config.FIELD of ``argv`` that the --config file lacks, as a message.

  Returns:
    E.g. "unknown config field 'sync.kk'; did you mean 'sync.k'?", or None when
    the config file cannot be loaded or every overridden field exists.
  """
  config_arg, fields = _config_args(argv)
  if not config_arg:
    return None
  try:
    config = config_lib.load_file(config_arg)
  except Exception:  # pylint: disable=broad-except
    return None
  for field in fields:
    problem = config_lib.unknown_field(config, field)
    if problem:
      return problem
  return None


if __name__ == '__main__':
  app.run(main, flags_parser=_parse_flags)
