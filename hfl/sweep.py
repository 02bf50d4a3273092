"""Sweep launcher: a grid of config overrides (:data:`FORMAT`), one training job per point.

Point -> workdir ``ROOT/<name>`` from its overrides (e.g. ``seed=0__sync.k=4``);
one with ``summary.json`` is skipped, any other (re)run and resumed from its own
checkpoints. Jobs (``main.py --config=BASE --workdir=ROOT/<name> --config.K=V``,
``--parallel N`` at a time, output in ``ROOT/<name>/train.log``) start only after
every point's config passed main.py's checks; a failed run is reported with its
log's last error line; at the end :func:`hfl.report.write_report` writes ``ROOT/report``.
"""

import argparse
import ast
import concurrent.futures
import copy
import errno
import hashlib
import importlib.util
import itertools
import json
import logging
import os
import shlex
import re
import reprlib
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import ml_collections

from hfl import metrics as metrics_lib
from hfl import runtime
from hfl import workdir as workdir_lib

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAIN_PY = os.path.join(REPO_ROOT, 'main.py')
SUMMARY = 'summary.json'
LOG_FILE = 'train.log'
REPORT_DIR = 'report'
MANIFEST = metrics_lib.SWEEP_MANIFEST  # 'sweep.json'
BASE_CONFIG_FILE = 'base_config.py'
# A directory holding one of these is a training workdir (hfl.workdir.WORKDIR_ENTRIES).
RUN_ENTRIES = ('config.json', 'metrics.jsonl', 'summary.json', 'checkpoints')
_MAX_NAME = 200
_UNSAFE = re.compile(r'[^A-Za-z0-9._=,+-]')

FORMAT = """\
sweep file: a Python file defining get_sweep() -> (base, grid)
  base  a config file ('configs/default.py' or 'path:arg'; relative to the sweep file's
        directory, else to hfl's repository) or an ml_collections.ConfigDict
  grid  {dotted.key: [options...]}: their cartesian product, in key order (a value that
        is not a list, e.g. a tuple for network.dc_speed, is one fixed value; an option
        listed twice is an error); or a list of such dicts, whose points are
        concatenated (a point two of them share runs once)

  def get_sweep():  # 2 strategies x 2 uplink compressors x 3 seeds = 12 runs
    return 'configs/default.py', {
        'sync.strategy': ['sync', 'periodic'],
        'compression.uplink.name': ['identity', 'topk'],
        'train.num_steps': 400, 'seed': [0, 1, 2]}  # 400: one fixed value

--grid KEY=V1,V2,...  a grid axis on the command line (Python literals, else strings;
  tuples in parentheses); several --grid flags: their cartesian product, with --sweep
  times the file's points, replacing the values of a KEY the file has (a line says so;
  --grid seed=1 runs seed 1 alone, on a new root). Relative paths (--sweep, --config,
  --root) are the caller's; jobs run in the caller's directory and write only under ROOT.

A sweep root holds one sweep (ROOT/sweep.json lists its runs): there, a grid lacking one
is refused; the same grid resumes it, more values for its keys add runs (a new key,
seed included, renames every run: use a new root). A root that is a training workdir, or
holds others than the grid's points and sweep.json's (e.g. single runs), is refused.

examples:
  python -m hfl.sweep --sweep=my_sweep.py --root=workdirs/mine --dry_run
  python -m hfl.sweep --config=configs/smoke.py --grid sync.k=1,2,4 --grid seed=0,1 \\
      --root=/tmp/k_sweep --parallel=2
  python -m hfl.report /tmp/k_sweep   # rebuild ROOT/report (tables, plots); prints the table
"""


class RunSpec(NamedTuple):
  """One point: workdir ``name`` (from the overrides), absolute ``workdir``,
  ``overrides`` (dotted key -> value, sorted by key) and the job's ``command`` (argv)."""
  name: str
  workdir: str
  overrides: dict
  command: list


# A runner executes one run and returns its exit status (None counts as 0).
# A run succeeded iff it left ``summary.json`` in its workdir.
Runner = Callable[[RunSpec], Any]


class SweepResult(NamedTuple):
  """What a sweep invocation did: every point (``runs``); the names ``skipped``
  (done before), ``ran`` (finished now), ``failed`` (ran, no summary.json) and
  ``not_run`` (left by ``max_runs`` or ``dry_run``); ``report``: files written
  (name -> path) or None."""
  runs: list
  skipped: list
  ran: list
  failed: list
  not_run: list
  report: dict | None


# ------------------------------------------------------------------------------
# The grid.

def load_sweep(path: str) -> tuple[Any, Any]:
  """Imports a sweep file (:data:`FORMAT`) and returns ``get_sweep()``: (base, grid).

  A relative config path as base is taken from the sweep file's directory if
  the file is there, else from hfl's repository; sweep files may import
  ``configs.*``.

  Raises:
    FileNotFoundError: no such file. AttributeError: it defines no ``get_sweep``.
    ValueError: importing it or ``get_sweep()`` raised or exited, or it returned no (base, grid).
  """
  if not os.path.isfile(path):
    raise FileNotFoundError(f'sweep file not found: {path}')
  if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)
  spec = importlib.util.spec_from_file_location('_hfl_sweep_file', path)
  module, step = importlib.util.module_from_spec(spec), 'importing it'
  try:
    spec.loader.exec_module(module)
    step, get_sweep = 'get_sweep()', getattr(module, 'get_sweep', None)
    got = get_sweep() if get_sweep else None
  except (Exception, SystemExit) as e:  # pylint: disable=broad-except  (the file's own error)
    did = f'called sys.exit({e.code!r})' if isinstance(e, SystemExit) else (
        f'raised {type(e).__name__}: {" ".join(str(e).split())}')
    raise ValueError(f'sweep file {path}: {step} {did}') from None
  if not get_sweep:
    raise AttributeError(f'{path} defines no get_sweep()')
  base, grid = _check_sweep(path, got)
  if isinstance(base, str) and not os.path.isabs(file := base.partition(':')[0]):
    here = os.path.dirname(os.path.abspath(path))
    root = here if os.path.isfile(os.path.join(here, file)) else REPO_ROOT
    base = os.path.join(root, base)
  return base, grid


def _check_sweep(path: str, got: Any) -> tuple[Any, Any]:
  """``got`` (``path``'s get_sweep()) if a (base, grid) of :data:`FORMAT`, else ValueError."""
  try:
    if isinstance(got, (tuple, list)) and len(got) == 2 and (isinstance(
        got[0], (str, Mapping)) or hasattr(got[0], 'to_dict')) and expand_grid(got[1]):
      return tuple(got)
    why = ''
  except TypeError as e:  # the grid's problem
    why = f' ({e})'
  raise ValueError(f'sweep file {path}: get_sweep() returned {type(got).__name__} '
                   f"{reprlib.repr(got)}{why}; expected (base, grid): base a config path "
                   "('configs/x.py' or 'path:arg') or an ml_collections.ConfigDict, grid "
                   '{dotted.key: [options...]}, a list of such dicts, or None')


def _literal(text: str) -> Any:
  """A --grid value as ``--config.KEY=VALUE`` reads it (``inf``/``nan``: a float)."""
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return float(text) if text.strip().lower().lstrip('+-') in ('inf', 'nan') else text


def parse_grid(flags: Sequence[str]) -> dict[str, list]:
  """``['sync.k=1,2,4', 'seed=0,1']`` -> ``{'sync.k': [1, 2, 4], 'seed': [0, 1]}``.

  Raises:
    ValueError: a flag without ``KEY=`` or without values, a key given twice, or a
      value given twice for one key (e.g. ``seed=1,1,2``).
  """
  grid = {}
  for flag in flags:
    key, sep, values = flag.partition('=')
    key = key.strip()
    if not sep or not key or not values.strip():
      raise ValueError(f'--grid {flag!r}: expected KEY=V1,V2,... e.g. --grid sync.k=1,2,4')
    if key in grid:
      raise ValueError(f'--grid: {key!r} given twice; list all its values in one flag')
    # Commas inside brackets belong to a value: '(1.0,2.0),(1.0,1.0)' is two tuples.
    grid[key] = [_literal(v.strip()) for v in re.split(r',(?![^()\[\]]*[)\]])', values)]
    _no_repeats(key, grid[key], f'--grid {flag!r}: key')
  return grid


def _no_repeats(key: str, options: Sequence[Any], where: str = 'grid key') -> None:
  """ValueError naming ``key`` if it has no options, or the value if an option equals an
  earlier one (as run names compare them: 1 and 1.0 differ, a tuple equals its list)."""
  if not options:
    raise ValueError(f'{where} {key!r} has no values ([]): a grid axis needs at least one value')
  seen = set()
  for v in options:
    if (c := json.dumps(v, sort_keys=True, default=repr)) in seen:
      raise ValueError(f'{where} {key!r} lists the value {v!r} twice (each point runs '
                       'once); list each value once')
    seen.add(c)


def combine_grids(grid: Any, extra: Mapping[str, list] | None, out=print) -> Any:
  """File points x ``--grid`` points; a ``--grid`` key replaces the file's (``out`` says so)."""
  if not extra:
    return grid
  for key, new in extra.items():
    if old := {json.dumps(p[key], default=repr): p[key] for p in expand_grid(grid) if key in p}:
      out(f"--grid {key} replaces the sweep file's values: {list(old.values())} -> {new}")
  return [dict(p, **q) for p in expand_grid(grid) for q in expand_grid(dict(extra))]


def expand_grid(grid: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None) -> list[dict]:
  """The points of a grid (:data:`FORMAT`; None/empty: the base run alone), as override
  dicts in grid order (a point two dicts of a list share comes once); TypeError for another
  type of grid or of key, ValueError for a key with no options or one twice (``'seed': [1, 1]``)."""
  if grid is None or isinstance(grid, (list, tuple)) and not grid:
    return [{}]
  if isinstance(grid, Mapping):
    if bad := [k for k in grid if not isinstance(k, str)]:
      raise TypeError(f'grid key {bad[0]!r} is not a string')
    keys = list(grid)
    options = [v if isinstance(v, list) else [v] for v in grid.values()]
    for key, opts in zip(keys, options):
      _no_repeats(key, opts)
    points = [dict(zip(keys, combo)) for combo in itertools.product(*options)]
  elif isinstance(grid, (list, tuple)):
    points = [p for sub in grid for p in expand_grid(sub)]
  else:
    raise TypeError(f'grid must be a dict or a list of dicts, got {type(grid).__name__}')
  first = {}
  for p in points:
    first.setdefault(_canonical(p), p)
  return list(first.values())


def _canonical(overrides: Mapping[str, Any]) -> str:
  return json.dumps({k: overrides[k] for k in sorted(overrides)}, sort_keys=True, default=repr)


def _name_value(v: Any) -> str:
  if isinstance(v, (list, tuple)):
    return ','.join(_name_value(x) for x in v)
  return repr(v) if isinstance(v, float) else str(v)


def run_name(overrides: Mapping[str, Any]) -> str:
  """Deterministic, filesystem-safe workdir name of a set of overrides.

  Keys are sorted (the grid's key order does not matter); when the readable form
  had to be altered (unsafe characters, over 200 characters) an 8-hex-digit hash
  of the overrides is appended, so distinct overrides never share a name. E.g.
  ``'seed=0__sync.strategy=periodic'``; ``'base'`` for no overrides.
  """
  if not overrides:
    return 'base'
  raw = '__'.join(f'{k}={_name_value(overrides[k])}' for k in sorted(overrides))
  safe = _UNSAFE.sub('-', raw)
  if safe == raw and len(raw) <= _MAX_NAME:
    return raw
  digest = hashlib.sha1(_canonical(overrides).encode()).hexdigest()[:8]
  return f'{safe[:_MAX_NAME]}-{digest}'


def flag_value(v: Any) -> str:
  """A value as ml_collections' ``--config.KEY=VALUE`` parses it."""
  if isinstance(v, (list, tuple)):
    return repr(tuple(v))
  if isinstance(v, str):
    return v
  return repr(v) if isinstance(v, float) else str(v)


def run_status(workdir: str) -> str:
  """``'done'`` (a finished run's summary.json: :func:`not_done` None), ``'partial'`` (the
  workdir exists: rerunning resumes it, or :func:`_execute` names a damaged summary.json)
  or ``'pending'``."""
  return 'done' if not_done(workdir) is None else 'partial' if os.path.isdir(workdir) else 'pending'


def not_done(workdir: str) -> str | None:
  """Why ``workdir`` holds no finished run's summary.json as the report reads it
  (:func:`hfl.report.runs.read_summary`: e.g. ``{}`` is none), or None."""
  from hfl.report import runs as runs_lib  # lazy: pandas  pylint: disable=g-import-not-at-top
  if not os.path.isfile(os.path.join(workdir, SUMMARY)):
    return f'no {SUMMARY}'
  try:
    runs_lib.read_summary(workdir)
  except (OSError, ValueError) as e:
    return str(e)
  return None


def resolve_base(base: Any, root: str, write: bool = True) -> str:
  """The ``--config=`` value (absolute path, plus ``:arg``) of a base config.

  Args:
    base: config path (``'path'`` or ``'path:arg'``; relative: the caller's) or a
      ConfigDict, written to ``ROOT/base_config.py`` (only with ``write``).
    root: sweep root.
    write: write ``base_config.py`` (False for dry runs: only its path).

  Raises:
    FileNotFoundError: the config path does not exist or is a directory.
  """
  if not isinstance(base, str):
    path = os.path.join(os.path.abspath(root), BASE_CONFIG_FILE)
    if write:
      os.makedirs(root, exist_ok=True)
      metrics_lib.replace_file(path, _config_module_text(base))
    return path
  path, sep, arg = base.partition(':')
  if not os.path.isfile(path):
    what = 'is a directory, not a config file' if os.path.isdir(path) else 'not found'
    raise FileNotFoundError(f'base config {what}: {path} (relative paths are taken from '
                            f'{os.getcwd()})')
  return os.path.abspath(path) + sep + arg


def _config_module_text(config: Any) -> str:
  """Source of a config file that rebuilds ``config`` (a Python literal: tuples kept).

  Raises:
    ValueError: a value has no literal form (e.g. inf, or an object).
  """
  d = config.to_dict() if hasattr(config, 'to_dict') else dict(config)
  try:
    if ast.literal_eval(repr(d)) != d:
      raise ValueError
  except (ValueError, SyntaxError):
    raise ValueError('the base ConfigDict holds a value without a Python literal form; '
                     'give the sweep a config file instead') from None
  return ('"""Base config of this sweep, written by hfl.sweep (do not edit)."""\n\n'
          'import ml_collections\n\n\ndef get_config(arg=None):\n  del arg\n'
          f'  return ml_collections.ConfigDict({d!r})\n')


def make_runs(config_arg: str, grid: Any, root: str, python: str = sys.executable,
              main_py: str = MAIN_PY) -> list[RunSpec]:
  """The RunSpecs of a grid in grid order: ``[python, main_py, --config=config_arg,
  --workdir=ROOT/<name>, --config.KEY=VALUE...]``.

  Raises:
    ValueError: two grid points map to the same workdir name.
  """
  runs, names = [], set()
  for overrides in expand_grid(grid):
    name = run_name(overrides)
    if name in names:
      raise ValueError(f'two grid points share the workdir name {name!r}')
    names.add(name)
    ordered = {k: overrides[k] for k in sorted(overrides)}
    workdir = os.path.join(os.path.abspath(root), name)
    command = [python, main_py, f'--config={config_arg}', f'--workdir={workdir}']
    command += [f'--config.{k}={flag_value(v)}' for k, v in ordered.items()]
    runs.append(RunSpec(name, workdir, ordered, command))
  return runs


def _run_configs(base: Any, config_arg: str, runs: Sequence[RunSpec], paths: bool = True):
  """Yields (run, its config as main.py builds it: base + overrides, validated with paths).

  Raises:
    ValueError: a config is invalid (the run named; nothing was launched).
  """
  from hfl import config as config_lib  # lazy: jax  pylint: disable=g-import-not-at-top
  base_config = config_lib.load_file(config_arg) if isinstance(base, str) else (
      ml_collections.ConfigDict(copy.deepcopy(base.to_dict() if hasattr(base, 'to_dict')
                                              else dict(base))))
  for r in runs:
    try:
      yield r, config_lib.validate(config_lib.apply_overrides(
          copy.deepcopy(base_config), r.overrides), paths=paths)
    except ValueError as e:
      raise ValueError(f'run {r.name!r} (nothing was launched): {e}') from None


def check_runs(base: Any, config_arg: str, runs: Sequence[RunSpec]) -> None:
  """Checks each run's config as main.py will (base + overrides as ``--config.KEY=VALUE``
  applies them, then :func:`hfl.config.validate`) before any is launched; those that need
  the data's contents, the model's shapes or the devices run in each job (hfl.config).

  Raises:
    ValueError: the first bad run with its problem, e.g. ``run 'seed=0' ...: unknown
      config field 'optimizer.learnin_rate'; did you mean 'optimizer.learning_rate'?``.
  """
  from hfl import config as config_lib  # lazy: jax  pylint: disable=g-import-not-at-top
  seen = {}  # hfl.config.experiment_key -> the first run training it
  for r, config in _run_configs(base, config_arg, runs):
    if (same := seen.setdefault(config_lib.experiment_key(config), r)) is not r:
      why = '; '.join(f'{k}: {v}' for k, v in config_lib.ignored_fields(config).items()
                      if same.overrides.get(k) != r.overrides.get(k))
      logging.warning('runs %r and %r train the same experiment: they differ only in fields '
                      'the run ignores (%s)', same.name, r.name, why)


def check_done(base: Any, config_arg: str, runs: Sequence[RunSpec]) -> list[str]:
  """Checks every finished run (summary.json) against the config the sweep gives it
  now, as main.py checks a workdir before resuming; returns the names of those
  that differ only in ``hfl.workdir.RESUMABLE_FIELDS`` (e.g. a longer
  ``train.num_steps``): to run again, main.py extends them.

  Raises:
    ValueError: a finished run was made with another config (names run and fields).
  """
  done = [r for r in runs if run_status(r.workdir) == 'done']
  if not done:
    return []
  again = []
  for r, config in _run_configs(base, config_arg, done, paths=False):  # only compared
    try:
      again += [r.name] if workdir_lib.prepare(r.workdir, config).changed else []
    except ValueError as e:
      raise ValueError(f'run {r.name!r} (nothing was launched): {str(e).rstrip(".")}. A sweep '
                       'root holds one sweep: give this one another --root.') from None
  return again


# ------------------------------------------------------------------------------
# Running the jobs.

# The jobs running now, stopped on Ctrl-C (see stop_children).
_CHILDREN: set = set()
_CHILDREN_LOCK = threading.Lock()
_STOPPING = threading.Event()


def subprocess_runner(spec: RunSpec) -> int:
  """Runs the job in the current directory, appending its output to ``WORKDIR/train.log``;
  returns its exit status (130, not started, once :func:`stop_children` was called)."""
  os.makedirs(spec.workdir, exist_ok=True)
  with open(os.path.join(spec.workdir, LOG_FILE), 'ab') as log:
    log.write(('$ ' + shlex.join(spec.command) + '\n').encode())
    log.flush()
    with _CHILDREN_LOCK:
      if _STOPPING.is_set():
        return 130
      proc = subprocess.Popen(spec.command, stdout=log, stderr=subprocess.STDOUT)
      _CHILDREN.add(proc)
    try:
      return proc.wait()
    except BaseException:  # Ctrl-C in a sequential sweep: stop the job, then re-raise.
      stop_children()
      raise
    finally:
      with _CHILDREN_LOCK:
        _CHILDREN.discard(proc)


def stop_children(grace_s: float = 2.0, timeout_s: float = 10.0) -> None:
  """Stops the running jobs after a Ctrl-C; no job starts after this. The jobs get
  ``grace_s`` to exit on the terminal's own Ctrl-C, then SIGTERM (main.py stops as on
  Ctrl-C, keeping its checkpoints; a job started from a script with ``&`` ignores
  SIGINT), then after ``timeout_s`` are killed."""
  with _CHILDREN_LOCK:
    _STOPPING.set()
    procs = list(_CHILDREN)

  def running_after(procs, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
      time.sleep(0.05)
    return [p for p in procs if p.poll() is None]
  for p in (procs := running_after(procs, grace_s)):
    p.send_signal(signal.SIGTERM)
  for p in running_after(procs, timeout_s):
    p.kill()
    p.wait()


def last_error_line(log_path: str, max_bytes: int = 65536) -> str | None:
  """The last ``error: ...``, ``interrupted: ...`` or ``SomeError: ...`` line after the
  last ``$ command`` line of a ``train.log`` (else its last non-empty line), at most
  500 characters; None for a missing or empty log."""
  try:
    with open(log_path, 'rb') as f:
      f.seek(max(0, os.path.getsize(log_path) - max_bytes))
      text = f.read().decode('utf-8', 'replace')
  except OSError:
    return None
  lines = [l.strip() for l in text.splitlines()]
  starts = [i for i, l in enumerate(lines) if l.startswith('$ ')]
  lines = [l for l in lines[starts[-1] + 1 if starts else 0:] if l]
  if not lines:
    return None
  pattern = re.compile(r'^(error:|interrupted:|[\w.]*(Error|Exception|Interrupt)\b)')
  found = [l for l in lines if pattern.match(l)]
  line = (found or lines)[-1]
  return line if len(line) <= 500 else line[:497] + '...'


def _execute(spec: RunSpec, runner: Runner) -> bool:
  """Runs one spec; True iff it left a finished run's summary.json (:func:`not_done`).
  Never raises (but on Ctrl-C)."""
  logging.info('running %s', spec.name)
  try:
    rc = runner(spec)
  except Exception:  # pylint: disable=broad-except
    logging.exception('run %s raised', spec.name)
    return False
  why = not_done(spec.workdir)
  if _STOPPING.is_set():  # stopped by Ctrl-C: the sweep says so once
    return why is None
  if why:
    log = os.path.join(spec.workdir, LOG_FILE)
    last = last_error_line(log)
    if why != f'no {SUMMARY}' and 'rerun main.py' not in why:  # main.py keeps a damaged one
      why += f' (main.py rewrites a deleted {SUMMARY} from metrics.jsonl and the last checkpoint)'
    logging.error('run %s did not finish (exit status %s, %s%s)%s', spec.name, rc, why,
                  f'; log: {log}' if os.path.isfile(log) else '', f': {last}' if last else '')
  elif rc not in (None, 0):
    logging.warning('run %s wrote %s but exited with %s', spec.name, SUMMARY, rc)
  return why is None


def _execute_all(todo: Sequence[RunSpec], runner: Runner, parallel: int
                 ) -> tuple[list[str], list[str]]:
  """Runs the specs (``parallel`` at a time); (names finished, names failed)."""
  if parallel <= 1:
    results = [_execute(r, runner) for r in todo]
  else:
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=parallel)
    try:
      results = list(pool.map(lambda r: _execute(r, runner), todo))
    except KeyboardInterrupt:
      pool.shutdown(wait=False, cancel_futures=True)
      stop_children()
      raise
    pool.shutdown()
  return ([r.name for r, ok in zip(todo, results) if ok],
          [r.name for r, ok in zip(todo, results) if not ok])


def _label_keys(grid: Any) -> list[str] | None:
  """Grid keys that vary (not ``seed``): strategy/compressors first, then grid order."""
  from hfl.report import tables  # lazy: pandas  pylint: disable=g-import-not-at-top
  points = expand_grid(grid)
  keys = list(dict.fromkeys(k for p in points for k in p))
  keys = [k for k in keys if k != 'seed' and len({repr(p.get(k)) for p in points}) > 1]
  preferred = [k for k in tables.DEFAULT_LABEL_KEYS if k in keys]
  return (preferred + [k for k in keys if k not in preferred]) or None


def _few(names: Sequence[str], max_names: int = 5) -> str:
  """``'a, b, c, d, e and 3 more'``: the first ``max_names`` names, and how many more."""
  more = len(names) - max_names
  return ', '.join(names[:max_names]) + (f' and {more} more' if more > 0 else '')


# The run names ROOT/sweep.json lists, or None without one (shared with the report's CLI).
manifest_runs = metrics_lib.manifest_runs


def check_manifest(root: str, runs: Sequence[RunSpec], max_names: int = 5) -> None:
  """Checks that ROOT holds this sweep's runs alone: it is no workdir (:data:`RUN_ENTRIES`
  in it), every workdir below it is a point of ``runs`` (e.g. records copied there) or
  listed in ``ROOT/sweep.json`` (the sweep run on this root before, if any), and ``runs``
  keep every run listed: the same grid (a resume) or a larger one pass, as do an empty or
  new root.

  Raises:
    ValueError: the manifest cannot be read (its path, why), ROOT is a workdir or holds
      runs of no sweep, or the manifest lists runs that ``runs`` lack: another sweep (the
      root, those runs, the first ``max_names`` named, what to do).
  """
  root, names = os.path.abspath(root), {r.name for r in runs}
  path = os.path.join(root, MANIFEST)
  listed = manifest_runs(root, advice='give this sweep a new --root, or move that file away '
                         'if the runs under this root are this sweep\'s') or []
  up = os.path.dirname(root)
  while up != os.path.dirname(up):  # an ancestor that is a sweep root or a workdir
    if inside := [e for e in (MANIFEST, 'metrics.jsonl') if os.path.lexists(os.path.join(up, e))]:
      raise ValueError(f'--root={root} is inside {up}, which holds {inside[0]} (a '
                       f'{"sweep root" if inside[0] == MANIFEST else "training workdir"}): its '
                       'runs and these would mix; nothing was written or launched. Give the '
                       'sweep a --root outside it.')
    up = os.path.dirname(up)
  if held := [e for e in RUN_ENTRIES if os.path.lexists(os.path.join(root, e))]:
    raise ValueError(f'--root={root} is a training run\'s workdir (it holds {", ".join(held)}), '
                     'not a sweep root; nothing was written or launched. Give the sweep an '
                     'empty or new --root (it makes one workdir per run below it).')
  strays = []  # workdirs below the root neither points nor listed, in sorted-walk order
  for top, dirs, _ in os.walk(root):
    dirs.sort()
    if (rel := os.path.relpath(top, root)) in names or rel in listed or rel == REPORT_DIR:
      dirs.clear()
    elif any(os.path.lexists(os.path.join(top, e)) for e in RUN_ENTRIES):
      strays.append(rel)
      dirs.clear()
  if strays:
    raise ValueError(
        f'the sweep root {root} holds {len(strays)} training workdir(s) ({_few(strays, max_names)})'
        f' that are no point of this grid' + (f' nor listed in its {MANIFEST}' if os.path.isfile(
            path) else '') + ": runs not launched by a sweep on this root, which a report of it "
        "would mix with this sweep's; nothing was written or launched. Give the sweep an empty "
        'or new --root.')
  if dropped := [n for n in listed if n not in names]:
    raise ValueError(
        f'the sweep root {root} holds another sweep: its {MANIFEST} lists '
        f'{len(dropped)} run(s) this grid does not have ({_few(dropped, max_names)}); nothing '
        'was written or launched. A sweep root holds one sweep: give this one a new --root, or '
        'rerun the recorded grid (adding values to its keys is fine; a new key, seed included, '
        'renames every run, so it needs a new --root).')


def _write_error(e: OSError, where: str, intact: str) -> metrics_lib.WriteError:
  """``e``, raised writing the sweep's files (e.g. a full disk), as one line: the file (else
  ``where``), what is intact (a WriteError's own words, then ``intact``) and what to do."""
  fix = 'free space there' if e.errno in (errno.ENOSPC, errno.EDQUOT) else 'fix that'
  return metrics_lib.WriteError(e.filename or where, e, '; '.join(filter(None, (
      getattr(e, 'intact', None), intact, f'{fix}, then rerun the same command'))))


def _write_manifest(root: str, config_arg: str, runs: Sequence[RunSpec]):
  """Writes ``ROOT/sweep.json`` (through a temporary file: a crash leaves the old one)."""
  metrics_lib.replace_file(os.path.join(root, MANIFEST), json.dumps(
      {'config': config_arg, 'runs': [r._asdict() for r in runs]}, indent=1, default=repr))


def _dry_run(runs, status, todo, rest, root, max_runs, out) -> SweepResult:
  done = [r.name for r in runs if status[r.name] == 'done']
  limited = f', {len(todo)} with --max_runs' if max_runs is not None else ''
  ov = [r.overrides for r in runs]
  varying = ', '.join(sorted(k for k in set().union(*ov) if len({repr(o.get(k)) for o in ov}) > 1))
  out(f'{len(runs)} runs ({len(done)} done, {len(todo) + len(rest)} to run{limited}) under '
      f'{os.path.abspath(root)}\nvarying: {varying or "nothing"} (a long run name ends in a hash)')
  for r in runs:
    out(f'[{status[r.name]:7s}] {r.name}\n    {shlex.join(r.command)}')
  return SweepResult(runs, done, [], [], [r.name for r in todo + rest], None)


def run_sweep(base: Any, grid: Any, root: str, *, runner: Runner | None = None,
              dry_run: bool = False, max_runs: int | None = None, parallel: int = 1,
              report: bool = True, python: str = sys.executable, main_py: str = MAIN_PY,
              out: Callable[[str], None] = print, check: bool = True) -> SweepResult:
  """Runs the unfinished points of a sweep, then writes the report.

  Args:
    base: base config path or ConfigDict (:func:`resolve_base`).
    grid: overrides grid (:func:`expand_grid`).
    root: sweep root; run ``NAME`` uses ``ROOT/NAME``.
    runner: runs one RunSpec (default :func:`subprocess_runner`); a run finished
      iff its workdir then holds summary.json; an exception counts as a failure.
    dry_run: only print the grid (status, name, command); write nothing.
    max_runs: run at most this many unfinished points now (grid order).
    parallel: runs executed at the same time.
    report: write :func:`hfl.report.write_report` for the finished runs to ``ROOT/report``.
    python, main_py: interpreter and entry point of the jobs.
    out: where the dry-run listing and the summary line go.
    check: check every config to launch (:func:`check_runs`) before anything.

  Raises:
    ValueError: a run's config is invalid, or a finished run was made with another
      config (``check``, :func:`check_done`), or ROOT is no sweep root of this grid
      (:func:`check_manifest`); nothing was written.
    hfl.metrics.WriteError (an OSError): sweep.json, base_config.py (nothing launched)
      or the report could not be written, e.g. a full disk; one line, the file named.
    KeyboardInterrupt: Ctrl-C; the running jobs were stopped (:func:`stop_children`).
  """
  runner = runner or subprocess_runner
  _STOPPING.clear()  # a new sweep in this process (an earlier one was interrupted)
  config_arg = resolve_base(base, root, write=False)
  runs = make_runs(config_arg, grid, root, python=python, main_py=main_py)
  check_manifest(root, runs)
  status = {r.name: run_status(r.workdir) for r in runs}
  if check:
    status.update({name: 'partial' for name in check_done(base, config_arg, runs)})
  todo = [r for r in runs if status[r.name] != 'done']
  todo, rest = (todo, []) if max_runs is None else (todo[:max_runs], todo[max_runs:])
  if check:
    check_runs(base, config_arg, todo + (rest if dry_run else []))
  if dry_run:
    return _dry_run(runs, status, todo, rest, root, max_runs, out)
  try:
    os.makedirs(root, exist_ok=True)
    resolve_base(base, root, write=True)
    _write_manifest(root, config_arg, runs)
  except OSError as e:  # e.g. a full disk
    raise _write_error(e, root, 'nothing was launched') from e
  ran, failed = _execute_all(todo, runner, parallel)
  written, report_dir = None, os.path.join(root, REPORT_DIR)
  finished = [r.workdir for r in runs if run_status(r.workdir) == 'done']
  if report and finished:
    from hfl import report as report_lib  # lazy: pandas  pylint: disable=g-import-not-at-top
    try:
      written = report_lib.write_report(finished, report_dir, label_by=_label_keys(grid),
                                        expected=[r.workdir for r in runs])
    except OSError as e:
      raise _write_error(e, report_dir, f'the runs are intact ({len(finished)} of {len(runs)} '
                         f'finished); {report_dir} may be partly written') from e
  elif report:
    logging.warning('no finished runs; no report written')
  skipped = [r.name for r in runs if status[r.name] == 'done']
  named = lambda names: f' ({_few(names)})' if names else ''
  gaps = [f'{len(g)} run(s) {why}' for g, why in ((written.missing, 'failed or not started'),
          (written.unreadable, 'unreadable')) if g] if written else []
  out(f'sweep {os.path.abspath(root)}: {len(runs)} runs, {len(skipped)} skipped (done), '
      f'{len(ran)} finished now, {len(failed)} failed{named(failed)}, {len(rest)} left by '
      f'--max_runs{named([r.name for r in rest])}' + (f'; report in {report_dir}' if written
      else '') + (f' (incomplete: {", ".join(gaps)}, named there)' if gaps else ''))
  return SweepResult(runs, skipped, ran, failed, [r.name for r in rest], written)


# ------------------------------------------------------------------------------
# Command line.

def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  """Parses the command line (``--help`` shows :data:`FORMAT`)."""
  p = argparse.ArgumentParser(
      prog='python -m hfl.sweep', formatter_class=argparse.RawDescriptionHelpFormatter,
      description='Run a grid of hfl experiments: one training job per point, finished '
      'points skipped, interrupted ones resumed.', epilog=FORMAT)
  p.add_argument('--sweep', help='sweep file with get_sweep() -> (base, grid)')
  p.add_argument('--config', help='base config file (PATH or PATH:ARG); with --sweep it '
                 "replaces the sweep file's base")
  p.add_argument('--grid', action='append', default=[], metavar='KEY=V1,V2,...',
                 help='a grid axis, e.g. sync.k=1,2,4; repeat for a cartesian product')
  p.add_argument('--root', required=True, help='sweep root directory (workdir per point)')
  p.add_argument('--dry_run', '--dry-run', action='store_true',
                 help='list the grid and commands; run nothing')
  p.add_argument('--max_runs', '--max-runs', type=int, default=None,
                 help='run at most N unfinished points')
  p.add_argument('--parallel', type=int, default=1, help='runs at the same time (>= 1)')
  p.add_argument('--no_report', '--no-report', dest='report', action='store_false',
                 help='skip the final report')
  p.add_argument('--python', default=sys.executable, help='interpreter for the training jobs')
  args = p.parse_args(argv)
  for flag, value in (('parallel', args.parallel), ('max_runs', 1 if args.max_runs is None else args.max_runs)):
    if value < 1:
      p.error(f'--{flag}={value} must be >= 1')
  if problem := (metrics_lib.dir_problem(args.root) if args.root else
                 'is empty; give the sweep root directory (created if missing)'):
    p.error(f'--root={args.root!r} {problem}')
  if shutil.which(args.python) is None:  # else every run fails to start
    p.error(f'--python={args.python!r} is not an executable file (nor a command on PATH)')
  return args


def sweep_from_args(args: argparse.Namespace) -> tuple[Any, Any]:
  """(base, grid) from ``--sweep``, ``--config`` and ``--grid``; ValueError without
  ``--sweep`` or ``--config``, or for a bad ``--grid``."""
  if not args.sweep and not args.config:
    raise ValueError('give --sweep=FILE, or --config=FILE with --grid KEY=V1,V2,... '
                     '(python -m hfl.sweep --help shows the format)')
  base, grid = load_sweep(args.sweep) if args.sweep else (args.config, None)
  return (args.config or base), combine_grids(grid, parse_grid(args.grid))


def main(argv: Sequence[str] | None = None) -> int:
  """CLI entry point; exit status 1 if a run failed, 2 on a bad sweep, 130 on Ctrl-C,
  143 on SIGTERM (the running jobs are stopped either way)."""
  args = parse_args(argv)
  logging.basicConfig(level=logging.INFO, format='%(levelname)s %(message)s')
  previous, base = runtime.stop_on_sigterm(), None
  try:
    base, grid = sweep_from_args(args)
    result = run_sweep(base, grid, args.root, dry_run=args.dry_run,
                       max_runs=args.max_runs, parallel=args.parallel,
                       report=args.report, python=args.python)
  except (OSError, AttributeError, TypeError, ValueError) as e:  # OSError: e.g. a full disk
    print(f'error: {e}', file=sys.stderr)
    return 2
  except KeyboardInterrupt as e:
    return interrupted(e, launched=base is not None, root=args.root)  # None: still loading
  finally:
    signal.signal(signal.SIGTERM, previous)
  return 1 if result.failed else 0


def interrupted(e: BaseException | None = None, launched: bool = True,
                root: str | None = None) -> int:
  """Ctrl-C or SIGTERM (``e``): stops the running jobs, prints one line (``launched``
  False: that nothing was launched; else the runs of ``root``'s sweep.json not finished,
  and that its report predates them), returns exit status 130 (143 for SIGTERM)."""
  stop_children()
  try:
    left = [n for n in manifest_runs(root) or [] if run_status(os.path.join(root, n)) != 'done']
  except (OSError, ValueError, TypeError):  # no root, or an unreadable manifest: not named
    left = []
  stale = root and os.path.isdir(os.path.join(root, REPORT_DIR))
  print(f'interrupted{" by SIGTERM" if isinstance(e, runtime.Terminated) else ""}: ' + (
        'the running training jobs were stopped' + (f'; {len(left)} run(s) not finished '
        f'({_few(left)})' if left else '') + (f'; {os.path.join(root, REPORT_DIR)} is from '
        'before' if stale else '') + '. Rerun the same command to continue (finished runs are '
        'skipped, the others resume from their checkpoints).' if launched else
        'nothing was launched.'), file=sys.stderr)
  return runtime.interrupt_status(e)


if __name__ == '__main__':
  sys.exit(main())
