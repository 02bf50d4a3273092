"""Orbax checkpoints of the TrainState plus the host-side loop state (JSON).

A checkpoint is saved at the end of a round: ``state`` (the sharded TrainState
pytree) and ``host`` (JSON: round, clock, byte totals, schedule state, ...). Orbax
writes each step to a temporary directory (``<step>.orbax-checkpoint-tmp``), writes
``commit_success.txt`` into it and renames it when complete, so a run that fails
mid-save leaves the previous checkpoints intact.

A workdir can still hold a step directory that is not a complete checkpoint (a
copy or sync that stopped half-way, a filesystem without atomic rename, a disk
that filled up, a corrupted file) or a temporary directory of an interrupted save.
:func:`restore_latest` therefore restores the newest checkpoint that restores, and
moves every newer step directory and every temporary directory out of the way, to
``WORKDIR/checkpoints_skipped/`` (nothing is deleted), logging which and why; the
run then saves its next steps as usual. A save that fails writing (e.g. a full disk)
removes its own partial files and raises :class:`hfl.metrics.WriteError`
(:func:`save`).
"""

import ast
import contextlib
import errno
import json
import logging as py_logging
import os
import re
import shutil
import signal
import sys
import threading
import time
from typing import NamedTuple

import jax
from absl import logging
from etils import epath
import orbax.checkpoint as ocp
# The default jax.Array handler's metadata store and the global registry (to replace
# that handler without orbax's override warning in every run's log).
from orbax.checkpoint._src.metadata import array_metadata_store
from orbax.checkpoint._src.serialization import type_handler_registry


def _register_array_handler() -> None:
  """Saves each jax.Array shard from one replica instead of slicing it among replicas.

  Orbax's default (replica-parallel on CPU) splits every replicated shard into one
  slice per replica with ``jax.lax.slice_in_dim``, run op by op: each distinct
  slice shape compiles a program, about a hundred for hfl's TrainState, which made
  a process's first save take ~27 s on a busy 2-core machine (0.9 s without;
  docs/benchmarks.md). The bytes on disk and what is restored are the same.
  """
  type_handler_registry.GLOBAL_TYPE_HANDLER_REGISTRY.add(
      jax.Array, ocp.type_handlers.ArrayHandler(
          use_replica_parallel=False, array_metadata_store=array_metadata_store.Store()),
      override=True, ignore_warnings=True)


_register_array_handler()

ITEMS = ('state', 'host')
COMMIT_FILE = 'commit_success.txt'  # Written by orbax when it commits a step.
TMP_MARK = '.orbax-checkpoint-tmp'  # Orbax's temporary (uncommitted) step directories.
SKIPPED_DIR = 'checkpoints_skipped'  # WORKDIR/<this>: where unusable directories go.
CHECKPOINT_DIR = 'checkpoints'  # WORKDIR/<this>: the step directories.

from hfl import metrics


def manager(workdir: str, max_to_keep: int = 2) -> ocp.CheckpointManager:
  """The run's CheckpointManager, rooted at WORKDIR/checkpoints."""
  return ocp.CheckpointManager(
      os.path.join(os.path.abspath(workdir), CHECKPOINT_DIR),
      options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True))


def save(mngr: ocp.CheckpointManager, step: int, state, host: dict) -> None:
  """Saves ``state`` and ``host`` under ``step`` and waits until it is on disk.

  Raises:
    ValueError: ``host`` holds a NaN or infinite number (strict JSON has none;
      see hfl.metrics.to_json_value); nothing is saved.
    hfl.metrics.WriteError (an OSError): the save failed writing a file (e.g. no
      space left on device; TensorStore reports that as a ValueError with an
      ``os_error_code``); the step's partial files are removed (process 0), the
      checkpoints saved before are intact. Orbax's error logs of the save are
      dropped, and so are the reports its writes still in flight make later
      (:func:`_orbax_errors_held`): the process is expected to end.
  """
  host = metrics.to_json_value(host, where='checkpoint host state')
  running = set(threading.enumerate())
  with _orbax_errors_held() as held:
    try:
      with _signals_deferred():
        mngr.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), host=ocp.args.JsonSave(host)))
        mngr.wait_until_finished()
    except Exception as err:  # pylint: disable=broad-except
      os_error = _os_error(err)
      if os_error is None:
        raise
      # A save that failed in this thread leaves orbax's writer threads running.
      _join_new_threads(running, 'orbax.', timeout_s=60)
      held.clear()  # their tracebacks say what the one line below says
      left = _remove_partial_step(mngr, step)
      raise metrics.WriteError(os.path.join(mngr.directory, str(step)), os_error,
                               'the checkpoints saved before it are intact; ' +
                               (f'its partial files {", ".join(left)} could not be removed '
                                '(a rerun moves them aside)' if left else
                                'its partial files were removed')) from err


@contextlib.contextmanager
def _orbax_errors_held():
  """For a save: holds orbax's error log records (each with a traceback) in the list
  it yields, logged at the end unless :func:`save` empties it (it reports a failed
  write in one line instead), and drops what TensorStore writes still in flight
  report once orbax gave up on a failed write: ``RuntimeError('Event loop is
  closed')`` (through ``sys.unraisablehook``) and asyncio's "Task exception was
  never retrieved" (logged when the task is collected). Those can come after the
  block, so when it raises, their two filters stay in place."""
  held = []

  def hold(record) -> bool:
    if record.levelno >= logging.converter.STANDARD_ERROR and '/orbax/' in record.pathname:
      held.append(record)
      return False
    return True

  def unraisable(u):
    if not (isinstance(u.exc_value, RuntimeError) and
            str(u.exc_value) == 'Event loop is closed'):
      previous(u)

  def unretrieved(record) -> bool:
    return 'exception was never retrieved' not in record.getMessage()

  absl_logger, asyncio_logger = logging.get_absl_logger(), py_logging.getLogger('asyncio')
  previous = sys.unraisablehook
  absl_logger.addFilter(hold)
  asyncio_logger.addFilter(unretrieved)
  sys.unraisablehook = unraisable
  try:
    yield held
  finally:
    absl_logger.removeFilter(hold)
    for record in held:
      absl_logger.handle(record)
  asyncio_logger.removeFilter(unretrieved)  # reached only when the block did not raise
  sys.unraisablehook = previous


def _join_new_threads(running: set, module: str, timeout_s: float) -> None:
  """Waits, at most ``timeout_s`` in all, for the threads not in ``running`` whose
  class is defined in a module starting with ``module`` to end (orbax's threads
  re-raise their error from ``join``: ignored)."""
  deadline = time.monotonic() + timeout_s
  for t in threading.enumerate():
    if t not in running and type(t).__module__.startswith(module):
      with contextlib.suppress(Exception):
        t.join(max(0.0, deadline - time.monotonic()))


_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)")  # TensorStore's wording


def _os_error(err: BaseException) -> OSError | None:
  """The OSError behind a failed save, None when it was not one: ``err`` or an
  exception it was raised from, or TensorStore's ValueError that names an
  ``os_error_code`` (as an OSError with that errno and its message)."""
  while err is not None:
    if isinstance(err, OSError):
      return err
    found = _OS_ERROR_CODE.search(str(err))
    if found:
      code = int(found[1])
      return OSError(code, os.strerror(code))
    err = err.__cause__
  return None


def _remove_partial_step(mngr: ocp.CheckpointManager, step: int, tries: int = 10,
                         wait_s: float = 0.5) -> list[str]:
  """Removes (process 0) what a failed save of ``step`` left: orbax's temporary
  directories of it, and the step directory itself when it is not complete; returns
  the names of those it could not remove (a resume moves them aside). TensorStore's
  writes still in flight may recreate files after a removal (seen on a loaded
  machine), so it tries up to ``tries`` times, ``wait_s`` seconds apart."""
  if jax.process_index() != 0:
    return []
  partial = lambda p: (p.name.startswith(f'{step}{TMP_MARK}') or
                       (p.name == str(step) and incomplete_reason(p) is not None))
  root = epath.Path(mngr.directory)
  try:
    for attempt in range(tries):
      left = [p for p in root.iterdir() if partial(p)]
      if not left:
        return []
      if attempt:
        time.sleep(wait_s)
      for p in left:
        shutil.rmtree(p, ignore_errors=True)
    return [p.name for p in root.iterdir() if partial(p)]
  except OSError:
    return ['(unknown: the checkpoint directory cannot be read)']


@contextlib.contextmanager
def _signals_deferred(signums=(signal.SIGINT, signal.SIGTERM)):
  """Holds Ctrl-C and SIGTERM until the block ends, then acts on the first one.

  An interrupt raised inside orbax's save leaves its background commit running
  while the interpreter shuts down: the step is left uncommitted and the log ends
  in tracebacks. Deferred, the save completes and the run stops right after it.
  Only the main thread can set handlers; elsewhere the block runs as it is.
  """
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  held = []
  previous = {s: signal.signal(s, lambda signum, frame: held.append(signum))
              for s in signums}
  try:
    yield
  finally:
    for s, handler in previous.items():
      signal.signal(s, signal.SIG_DFL if handler is None else handler)
    if held:
      signal.raise_signal(held[0])  # to the handler that was in place


def incomplete_reason(path) -> str | None:
  """Why the step directory ``path`` is not a complete checkpoint, from its files.

  Args:
    path: a step directory (str or epath.Path).

  Returns:
    None when it has both items and orbax's commit marker (it may still fail to
    restore: a truncated or corrupt file is only found by reading it), else a
    short reason.
  """
  path = epath.Path(path)
  if not path.is_dir():
    return 'not a directory'
  names = {p.name for p in path.iterdir()}
  if not names:
    return 'empty directory (the save never wrote into it)'
  missing = [n for n in ITEMS if n not in names]
  if missing:
    return f'item {missing[0]!r} missing (has {sorted(names)})'
  if COMMIT_FILE not in names:
    return f'no {COMMIT_FILE}: orbax never committed this step'
  return None


def newest_complete_step(workdir: str) -> int | None:
  """The newest step of WORKDIR/checkpoints whose files look complete
  (:func:`incomplete_reason` is None), found without restoring or moving anything;
  None when there is none. :func:`restore_latest` restores this step or an older one.
  """
  root = os.path.join(workdir, CHECKPOINT_DIR)
  if not os.path.isdir(root):
    return None
  steps = sorted((int(n) for n in os.listdir(root) if n.isdigit()), reverse=True)
  return next((step for step in steps
               if incomplete_reason(os.path.join(root, str(step))) is None), None)


class UnrestorableError(ValueError):
  """No checkpoint of the workdir restores and one of them looks committed (a
  ValueError: the workdir given is unusable as it is; main.py exits with status 2)."""


class MoveAsideError(ValueError):
  """Skipped checkpoint directories could not be moved out of the way (e.g. a
  read-only workdir: a run that resumes must be able to write there; a
  ValueError: main.py exits with status 2)."""


class Skipped(NamedTuple):
  """A directory under WORKDIR/checkpoints that is not restored from.

  Attributes:
    path: the directory.
    reason: why (:func:`incomplete_reason` or the restore error).
    incomplete: True when its files show the save did not finish (as opposed to
      a committed step that failed to restore).
  """
  path: epath.Path
  reason: str
  incomplete: bool


# Where an exception's text turns into an object's repr or a spec dump, cut from a
# one-line reason: orbax's "See full TensorStore details: <bound method ...spec of
# TensorStore({...", TensorStore's " [tensorstore_spec='{...}']" payloads.
_REPR_START = re.compile(r'\s*(?:See full \w+ details:|<bound method |<[\w.]+ object at 0x'
                         r'|\[tensorstore_spec|\[source locations)')


def short_error(err: BaseException, limit: int = 200) -> str:
  """``'Type: message'`` of ``err`` in one short line, then its cause the same way.

  The message is the first line of ``str(err)``, cut where an object's repr
  starts (:data:`_REPR_START`), and to about ``limit`` characters by its middle
  (``' [...] '``: nested errors say what failed first, why last); orbax wraps
  a failed read in a bare ``Exception`` whose ``__cause__`` says what was wrong.
  """
  lines = str(err).strip().splitlines()
  text = _REPR_START.split(lines[0] if lines else '', maxsplit=1)[0].strip()
  if len(text) > limit:
    half = (limit - 7) // 2  # the start says what failed, the end why (nested errors)
    text = f'{text[:half].rstrip()} [...] {text[-half:].lstrip()}'
  out = f'{type(err).__name__}: {text}' if text else type(err).__name__
  cause = err.__cause__
  return f'{out} (caused by {short_error(cause, limit)})' if cause is not None else out


_BARRIERS = []  # Barrier names must not repeat within a process.


def _barrier(what: str) -> None:
  """All processes wait here (orbax's barrier; nothing with one process)."""
  if jax.process_count() > 1:
    _BARRIERS.append(what)
    ocp.multihost.sync_global_processes(f'hfl_checkpoint_{what}_{len(_BARRIERS)}')


def _move_aside(mngr: ocp.CheckpointManager, skipped: list) -> None:
  """Moves the skipped directories to WORKDIR/checkpoints_skipped.

  Process 0 moves, after every process has finished looking at them (the first
  barrier) and before any of them goes on (the second); every process then
  re-reads the step list. Every process calls this once per restore, skipped or
  not, so the barriers match.

  Raises:
    MoveAsideError: process 0 could not create the destination or rename a
      directory (an OSError, e.g. a read-only workdir); the message names what
      was moved before that.
  """
  _barrier('scanned')
  dest_root = epath.Path(mngr.directory).parent / SKIPPED_DIR
  if skipped and jax.process_index() == 0:
    moved = []
    try:
      if dest_root.exists() and not dest_root.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(dest_root))
      dest_root.mkdir(parents=True, exist_ok=True)
      for s in skipped:
        dest, n = dest_root / s.path.name, 1
        while dest.exists():
          dest, n = dest_root / f'{s.path.name}.{n}', n + 1
        s.path.rename(dest)
        moved.append(f'{s.path} -> {dest}')
        logging.warning('Checkpoint directory %s skipped (%s); moved to %s.', s.path,
                        s.reason, dest)
    except OSError as err:
      raise MoveAsideError(
          f'Cannot move the skipped checkpoint directories of {mngr.directory} to '
          f'{dest_root} ({err.strerror or err}: {err.filename or dest_root}); '
          + ('moved before that: ' + ', '.join(moved) if moved else 'nothing was moved')
          + '. Skipped: ' + '; '.join(f'{s.path.name} ({s.reason})' for s in skipped)
          + '. A run resumes only in a writable workdir: make it writable, or copy it '
          'to one that is.') from None
  _barrier('moved')
  if skipped:
    mngr.reload()


# Backwards compatibility, in this one place: checkpoints written before the
# per-link hfl.links.LinkState kept each link's residual and compressor states as
# two TrainState fields. Old field -> (new field, LinkState attribute).
LEGACY_LINK_FIELDS = {
    'up_residual': ('up', 'residual'), 'up_state': ('up', 'compressor_state'),
    'down_residual': ('down', 'residual'), 'down_state': ('down', 'compressor_state'),
    'wan_residual': ('wan', 'residual'), 'wan_state': ('wan', 'compressor_state')}


def saved_fields(step_dir) -> set:
  """Top-level field names of the ``state`` item saved in ``step_dir`` (from orbax's
  ``_METADATA``; empty when it cannot be read)."""
  try:
    tree = json.loads((epath.Path(step_dir) / 'state' / '_METADATA').read_text())
    return {ast.literal_eval(k)[0] for k in tree['tree_metadata']}
  except (OSError, ValueError, KeyError, TypeError, SyntaxError, IndexError):
    return set()


def to_legacy(state):
  """A TrainState-like NamedTuple (per-link ``LinkState`` fields) as the old layout's
  dict (``LEGACY_LINK_FIELDS``); the other fields unchanged."""
  out = {k: v for k, v in state._asdict().items()
         if k not in {link for link, _ in LEGACY_LINK_FIELDS.values()}}
  for old, (link, attr) in LEGACY_LINK_FIELDS.items():
    out[old] = getattr(getattr(state, link), attr)
  return out


def from_legacy(old: dict, like):
  """Inverse of :func:`to_legacy`: ``like`` (a TrainState) gives the types."""
  fields = {k: v for k, v in old.items() if k not in LEGACY_LINK_FIELDS}
  for link in {link for link, _ in LEGACY_LINK_FIELDS.values()}:
    parts = {attr: old[o] for o, (l, attr) in LEGACY_LINK_FIELDS.items() if l == link}
    fields[link] = type(getattr(like, link))(**parts)
  return type(like)(**fields)


def added_fields(saved: set, abstract_state) -> list:
  """Fields of ``abstract_state`` absent from a checkpoint that saved ``saved``
  and empty in the target (no leaves: e.g. ``TrainState.eager`` when Streaming
  DiLoCo's eager updates are off), i.e. fields added to TrainState since the
  checkpoint was written; they restore as their (empty) defaults."""
  if not saved or not hasattr(abstract_state, '_fields'):
    return []
  return [f for f in abstract_state._fields
          if f not in saved and not jax.tree.leaves(getattr(abstract_state, f))]


def _restore(mngr: ocp.CheckpointManager, step: int, abstract_state):
  saved = saved_fields(epath.Path(mngr.directory) / str(step))
  legacy = bool(set(LEGACY_LINK_FIELDS) & saved)
  added = added_fields(saved, abstract_state)
  target = to_legacy(abstract_state) if legacy else abstract_state
  if added:
    target = {k: v for k, v in (target if legacy else target._asdict()).items()
              if k not in added}
  out = mngr.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(target), host=ocp.args.JsonRestore()))
  state = (from_legacy(out['state'], abstract_state) if legacy
           else type(abstract_state)(**out['state']) if added else out['state'])
  if legacy:
    logging.info('Checkpoint %d has the layout before per-link LinkState; converted.', step)
  return step, state, out['host']


def restore_latest(mngr: ocp.CheckpointManager, abstract_state):
  """Restores the newest checkpoint that restores, or returns None when there is none.

  Steps are tried newest first. A step directory that is incomplete
  (:func:`incomplete_reason`) or fails to restore is skipped; once one restores,
  the skipped ones and orbax's temporary directories are moved to
  WORKDIR/checkpoints_skipped (logged with the reason) so that the run can save
  those steps again. When no step restores and every step directory is
  incomplete, they are moved aside the same way and the run starts afresh (None).

  Args:
    mngr: the manager.
    abstract_state: pytree of jax.ShapeDtypeStruct with shardings (the target).

  Returns:
    (step, state, host) or None.

  Raises:
    UnrestorableError: no step restores and at least one of them looks committed (its
      restore error may be the program's, not the files'): nothing is moved; the
      message lists every step directory and its error (:func:`short_error`).
    MoveAsideError: the skipped directories cannot be moved (:func:`_move_aside`).
  """
  root = epath.Path(mngr.directory)
  skipped = [Skipped(p, 'temporary directory of an interrupted save', True)
             for p in sorted(root.iterdir()) if TMP_MARK in p.name] if root.exists() else []
  for step in sorted(mngr.all_steps(), reverse=True):
    path = root / str(step)
    reason = incomplete_reason(path)
    if reason is None:
      try:
        restored = _restore(mngr, step, abstract_state)
      except Exception as err:  # pylint: disable=broad-except
        skipped.append(Skipped(path, f'restore failed: {short_error(err)}', False))
        continue
      _move_aside(mngr, skipped)
      if any(s.path.name.isdigit() for s in skipped):
        logging.warning('Resuming from checkpoint %d, the newest complete one.', step)
      return restored
    skipped.append(Skipped(path, reason, True))
  if not all(s.incomplete for s in skipped):
    _barrier('scanned')  # Every process raises; none moves anything.
    raise UnrestorableError(
        f'No checkpoint in {root} can be restored: '
        + '; '.join(f'{s.path}: {s.reason}' for s in skipped)
        + f'. Nothing was moved or deleted. If these checkpoints are damaged, move them out '
        f'of {root} (the run then starts from step 0), or use a new --workdir.')
  _move_aside(mngr, skipped)
  return None


def abstract(tree, shardings):
  """ShapeDtypeStructs of ``tree`` carrying ``shardings`` (same structure)."""
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      tree, shardings)
