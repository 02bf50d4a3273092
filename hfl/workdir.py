"""The workdir: what a run's directory is, and what may be done with it.

A workdir (``--workdir``) holds one run: the entries of :data:`WORKDIR_ENTRIES`
(config.json, metrics.jsonl, summary.json, checkpoints/, ...; formats in the
README). Before a run uses one, this module decides from its files alone what it
holds for the run's config:

- **fresh**: nothing (missing, empty, or a run stopped before its first
  checkpoint, which kept nothing: any config starts it over);
- **resumed**: a run with checkpoints, continued from the newest one that restores
  (hfl.checkpoint), with the same config but for :data:`RESUMABLE_FIELDS`, whose
  changes are returned (:attr:`Resume.changed`) and recorded in the summary;
- **finished**: a summary.json of a run the config's stopping rule has stopped:
  only reported again (:func:`reported_summary`, :func:`finished_without_checkpoint`),
  also from a read-only workdir or one whose checkpoints are gone;
- **refused** (a ValueError naming the file and the remedy): an entry of the wrong
  type, another run holding the lock (:func:`workdir_lock`), a different config,
  more iterations done than asked for, a damaged config.json or summary.json, a
  metrics.jsonl that lost evaluations (:func:`check_metrics_log`), a sample budget
  the run went past (:func:`check_resumed_samples`), faults numbered as before
  (:func:`check_fault_rounds`).

:func:`prepare` is the entry point of the loop (hfl.train) and the sweep
(hfl.sweep.check_done); main.py asks :func:`problem` before JAX starts and
:func:`resume_point` after a stop. Workdirs of older versions: config.json lacks
fields added since (:data:`ADDED_SECTIONS`, :func:`upgrade_config`), checkpoints
count faults from round 0 (:data:`FAULT_ROUNDS_FROM`) or no samples
(:func:`samples_from_log`). Checkpoint I/O is hfl.checkpoint's, the loop state
in a checkpoint hfl.cost's (``to_host`` / ``from_host``).

Imports no JAX at module level (main.py asks before JAX starts), and nothing of
the training (hfl.train, hfl.step) or of the report.
"""

import contextlib
import copy
import fcntl
import json
import os
import socket
import time
from typing import Any, Mapping, NamedTuple

from absl import logging

from hfl import budget as budget_lib
from hfl import metrics as metrics_lib

# What a workdir holds, by name: (a directory?, what for). checkpoints/ and
# checkpoints_skipped/ are hfl.checkpoint's (CHECKPOINT_DIR, SKIPPED_DIR), logs/
# the multi-process launchers', the rest hfl.metrics' and this module's.
WORKDIR_ENTRIES = {
    'checkpoints': (True, "the run's checkpoints"),
    'checkpoints_skipped': (True, 'unusable checkpoint directories moved aside'),
    'tb': (True, 'TensorBoard event files'),
    'logs': (True, 'per-process logs of a multi-process run'),
    'config.json': (False, "the run's config"),
    'metrics.jsonl': (False, 'the evaluation records'),
    'summary.json': (False, "the finished run's summary"),
    '.lock': (False, 'held by the run using the workdir (workdir_lock)'),
}

LOCK_FILE = '.lock'

# Fields that may change between a run and its resumption (they do not change what
# is computed up to the restored step).
# ``train.sample_budget``: rounds run whole, so a run extended to a larger budget trains
# bitwise as the fresh run of it (check_resumed_samples refuses one the run went past).
RESUMABLE_FIELDS = ('train.num_steps', 'train.sample_budget', 'train.eval_every',
                    'train.checkpoint_every', 'train.log_every', 'train.target_accuracy',
                    'train.target_loss', 'dataset.cache_dir')
# Path fields: two spellings of one path (a trailing slash, '~', 'a/../b') are the same.
PATH_FIELDS = ('dataset.data_dir',)

# How ``sync.faults`` numbers rounds in checkpoints written since it counts them from 1
# (older checkpoints lack the key: from 0; :func:`check_fault_rounds`).
FAULT_ROUNDS_FROM = 1

# What to do about a damaged summary.json of a finished run (config.json intact):
# without it, the run is resumed at its last checkpoint, which finishes at once.
_SUMMARY_ADVICE = ('delete it and rerun the same command to rewrite it from metrics.jsonl '
                   'and the last checkpoint')


# ------------------------------------------------------------------------------
# The workdir's entries and its lock.
# ------------------------------------------------------------------------------

class WorkdirInUseError(ValueError):
  """Another run holds the workdir's lock (:func:`workdir_lock`)."""


@contextlib.contextmanager
def workdir_lock(workdir: str):
  """Creates ``workdir`` if needed and holds WORKDIR/.lock exclusively
  (``fcntl.flock``) for the ``with`` block, so that a second run started in the same
  workdir stops before it reads or writes anything there.

  Process 0 only (it writes the files; other processes of a multi-process run use
  the workdir it holds). The file names the holder (pid, host, start time) and is
  removed at the end, and so is the workdir if this created it and it is still
  empty. Where the lock file cannot be created (a read-only workdir, in which a
  finished run is only reported; a non-local path) or the filesystem has no
  ``flock``, the block runs unlocked.

  Raises:
    WorkdirInUseError (a ValueError): another open file holds the lock; the message
      names its holder.
    ValueError: the workdir does not exist and cannot be created.
    hfl.metrics.WriteError (an OSError): the lock file's holder line cannot be
      written (e.g. no space left on device).
  """
  if not metrics_lib.is_writer():
    yield
    return
  path = os.path.join(workdir, LOCK_FILE)
  created = not os.path.lexists(workdir)
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as e:
    if created:  # nothing could ever be written there
      raise ValueError(f'--workdir={workdir!r} cannot be created: {e.strerror or e}') from e
  try:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  except OSError:
    fd = None
  locked = False
  try:
    if fd is not None:
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        locked = True
      except BlockingIOError:
        holder = os.pread(fd, 300, 0).decode(errors='replace').strip() or 'another process'
        raise WorkdirInUseError(
            f'{workdir} is in use by another run ({holder}; {path} is locked): wait for '
            'it to end or stop it, or use another --workdir') from None
      except OSError:  # no flock on this filesystem
        pass
    if locked:
      try:
        same = os.fstat(fd).st_ino == os.stat(path).st_ino
      except FileNotFoundError:
        same = False
      if not same:  # removed by a run ending just now
        raise WorkdirInUseError(f'{workdir}: another run just ended or started there; '
                                'run the command again')
      try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f'pid {os.getpid()} on {socket.gethostname()}, since '
                      f'{time.strftime("%Y-%m-%d %H:%M:%S")}\n'.encode(), 0)
      except OSError as e:  # e.g. a full disk
        raise metrics_lib.WriteError(path, e, 'nothing else in the workdir was touched') from e
    yield
  finally:
    if fd is not None:
      if locked:
        with contextlib.suppress(OSError):
          os.unlink(path)
      os.close(fd)
      if created:  # e.g. a config refused before the run wrote anything
        with contextlib.suppress(OSError):
          os.rmdir(workdir)


def _kind(path: str) -> str:
  if os.path.isdir(path):
    return 'a directory'
  if os.path.isfile(path):
    return 'a file'
  return 'a broken symbolic link' if os.path.islink(path) else 'neither a file nor a directory'


def workdir_entries_problem(workdir: str) -> str | None:
  """Why an entry already in ``workdir`` keeps a run from using it; None if none does.

  Only reads: the first of :data:`WORKDIR_ENTRIES` that exists with the wrong
  type (a file where the run keeps a directory, a directory where it keeps a
  file, a broken symbolic link), e.g. ``"cannot be used: W/tb is a file, but
  must be a directory (TensorBoard event files); move it out of the way, or use
  a new --workdir"``. A missing ``workdir`` or entry is no problem.
  """
  for name, (is_dir, what) in WORKDIR_ENTRIES.items():
    path = os.path.join(workdir, name)
    if not os.path.lexists(path) or (os.path.isdir(path) if is_dir else os.path.isfile(path)):
      continue
    return (f'cannot be used: {path} is {_kind(path)}, but must be '
            f'{"a directory" if is_dir else "a file"} ({what}); move it out of the way, '
            'or use a new --workdir')
  return None


def problem(workdir: str) -> str | None:
  """Why ``workdir`` cannot hold a run (None if it can), checked before anything
  starts (main.py, before JAX): empty, not a directory, not writable (unless it
  holds a finished run, which may be only reported: :func:`check_workdir_config`
  decides), or :func:`workdir_entries_problem`."""
  if not workdir or not workdir.strip():
    return 'is empty; pass a directory (created if missing), e.g. --workdir=workdirs/run'
  path = os.path.abspath(workdir)
  finished = os.path.isfile(os.path.join(path, 'summary.json'))
  problem_ = metrics_lib.dir_problem(path, writable=not finished)
  if problem_ == 'exists and is not a directory':
    return problem_ + '; pass a directory (created if missing)'
  return problem_ or workdir_entries_problem(path)


def resume_point(workdir: str) -> str:
  """Where a rerun resumes ``workdir``: its newest complete checkpoint, else the start."""
  from hfl import checkpoint  # lazy: jax  pylint: disable=g-import-not-at-top
  step = checkpoint.newest_complete_step(workdir)
  return (f'from its checkpoint of iteration {step}' if step is not None else
          'from the start (no checkpoint was written yet)')


# ------------------------------------------------------------------------------
# The run a workdir holds: its config, and whether this config may go on with it.
# ------------------------------------------------------------------------------

class Resume(NamedTuple):
  """What :func:`prepare` found in a workdir for a run of a config.

  Attributes:
    changed: the :data:`RESUMABLE_FIELDS` that changed since the run started, as
      ``'field: old -> new'`` strings (empty for a fresh or an unchanged run); a
      resumed run records them in its summary (``changed_on_resume``).
    has_config: the workdir holds config.json (else a resumed run's config comes
      from summary.json and is written again).
    has_summary: the workdir holds summary.json: a finished run, only reported
      again if its stopping rule has stopped it (:func:`reported_summary`,
      :func:`finished_without_checkpoint`).
  """
  changed: tuple[str, ...] = ()
  has_config: bool = False
  has_summary: bool = False


def prepare(workdir: str, config) -> Resume:
  """The workdir's answer to a run of ``config``, before anything is compiled or
  written: :func:`check_workdir_config`, then what the workdir holds.

  Raises:
    ValueError: as :func:`check_workdir_config`.
  """
  changed = check_workdir_config(workdir, config)
  return Resume(tuple(changed), os.path.exists(os.path.join(workdir, 'config.json')),
                os.path.exists(os.path.join(workdir, 'summary.json')))


def read_json_object(path: str, advice: str) -> dict:
  """The JSON object in the file ``path``.

  Raises:
    ValueError: the file is not valid JSON or holds no object: names ``path``,
      then says ``advice`` (what to do about it).
  """
  try:
    with open(path) as f:
      obj = json.load(f)
  except ValueError as e:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
    raise ValueError(f'{path} is not valid JSON ({e}); {advice}') from None
  if not isinstance(obj, dict):
    raise ValueError(f'{path} holds no JSON object; {advice}')
  return obj


def stored_config(workdir: str) -> dict | None:
  """The config a workdir's run was started with: ``config.json``, else the one in
  ``summary.json`` (a finished run); None for a workdir without a run.

  Raises:
    ValueError: the file is not a JSON object (names the file), or the workdir
      holds checkpoints but neither file, so the run's config cannot be checked.
  """
  for name, key in (('config.json', None), ('summary.json', 'config')):
    path = os.path.join(workdir, name)
    if not os.path.exists(path):
      continue
    stored = read_json_object(path, 'restore it, or use a new --workdir')
    stored = stored.get(key) if key else stored
    if not isinstance(stored, dict):
      raise ValueError(f'{path} holds no config object; restore it, or use a new --workdir')
    return stored
  ckpt = os.path.join(workdir, 'checkpoints')
  if os.path.isdir(ckpt) and os.listdir(ckpt):
    raise ValueError(
        f'--workdir={workdir} holds checkpoints but no config.json (nor a summary.json '
        'with the config), so the config they were trained with cannot be checked; '
        'restore config.json, or use a new --workdir')
  return None


def _same_path(a, b) -> bool:
  norm = lambda p: os.path.normpath(os.path.expanduser(p))
  return isinstance(a, str) and isinstance(b, str) and bool(a) and bool(b) and norm(a) == norm(b)


def check_workdir_config(workdir: str, config) -> list[str]:
  """Refuses a workdir the run cannot use, before anything is compiled or written:
  an entry of the wrong type (:func:`workdir_entries_problem`), an
  existing workdir that cannot be written unless it holds a finished run (which is
  only reported again), a run started with a different config (compared with
  :func:`stored_config`; one stopped before its first checkpoint is none: any config
  starts it over), or more iterations done (its newest complete
  checkpoint, hfl.checkpoint.newest_complete_step) than ``train.num_steps`` when
  that governs (a ``train.sample_budget`` the run went past is refused once its
  checkpoint is read, :func:`check_resumed_samples`).

  Returns:
    The RESUMABLE_FIELDS that changed, as 'field: old -> new' strings.

  Raises:
    ValueError: any of those (naming the path or the fields), or
      :func:`stored_config`'s errors.
  """
  entries = workdir_entries_problem(workdir)
  if entries:
    raise ValueError(f'--workdir={workdir!r} {entries}')
  stop = budget_lib.from_config(config.train)
  if (os.path.isdir(workdir) and not os.access(workdir, os.W_OK)
      and not _only_reported(workdir, stop)):
    raise ValueError(
        f'--workdir={workdir!r} cannot be written (read-only?); from there a finished run '
        'can only be reported again: copy the workdir somewhere writable to continue it.')
  stored = stored_config(workdir)
  if stored is None:
    return []
  from hfl import checkpoint as ckpt_lib  # lazy: jax  pylint: disable=g-import-not-at-top
  done = ckpt_lib.newest_complete_step(workdir)
  ckpts = os.path.join(workdir, ckpt_lib.CHECKPOINT_DIR)
  if not (os.path.exists(os.path.join(workdir, 'summary.json'))
          or any(n.isdigit() for n in (os.listdir(ckpts) if os.path.isdir(ckpts) else ()))):
    # Stopped before its first checkpoint: nothing trained is kept, any config starts over.
    return []
  old = upgrade_config(stored)
  diffs, resumable = [], []

  def walk(a, b, prefix):
    for key in sorted(set(a) | set(b)):
      name = f'{prefix}{key}'
      va, vb = a.get(key), b.get(key)
      if isinstance(va, dict) and isinstance(vb, dict):
        walk(va, vb, name + '.')
      elif va != vb and not (name in PATH_FIELDS and _same_path(va, vb)):
        (resumable if name in RESUMABLE_FIELDS else diffs).append(f'{name}: {va!r} -> {vb!r}')
  walk(old, json.loads(config.to_json()), '')
  if diffs:
    raise ValueError(
        f'--workdir={workdir} holds a run with a different config ({"; ".join(diffs)}); '
        'use a new workdir, or the same config to resume.')
  if stop.governed_by == 'num_steps' and done is not None and done > stop.num_steps:
    raise ValueError(
        f'train.num_steps={stop.num_steps} is below the {done} iterations '
        f'--workdir={workdir} has already done; use a new workdir for a shorter run.')
  return resumable


def _only_reported(workdir: str, stop: budget_lib.Stop) -> bool:
  """Whether rerunning on ``workdir`` only reports its finished run again, which
  writes nothing (a changed target is then printed, not saved): it holds
  config.json, and a summary.json of a run that ``stop`` has stopped.

  Raises:
    ValueError: summary.json is not a JSON object (names it).
  """
  path = os.path.join(workdir, 'summary.json')
  if not (os.path.exists(path) and os.path.exists(os.path.join(workdir, 'config.json'))):
    return False
  return _stopped(read_json_object(path, _SUMMARY_ADVICE), stop)


def _stopped(summary: Mapping[str, Any], stop: budget_lib.Stop) -> bool:
  """Whether the run of ``summary`` (its iterations, simulated time and samples) is
  one ``stop`` has stopped (a summary without ``samples``, older than the field, has
  not stopped under ``train.sample_budget``)."""
  step, now, samples = (summary.get(k) for k in ('intra_dc_iterations', 'sim_time_s',
                                                  'samples'))
  if stop.governed_by == 'sample_budget' and not metrics_lib.finite(samples):
    return False
  return (metrics_lib.finite(step) and metrics_lib.finite(now)
          and stop.finished(int(step), float(now), None if samples is None else int(samples)))


# ------------------------------------------------------------------------------
# Workdirs of older versions.
# ------------------------------------------------------------------------------

def _old_target_loss(old: dict) -> float:
  """``train.target_loss`` of a config older than the field: the task's default."""
  del old
  from hfl import tasks  # lazy: jax  pylint: disable=g-import-not-at-top
  return tasks.TARGET_FIELDS['language_model'][1]


def _old_broadcast(old: dict) -> str:
  """``compression.broadcast`` of a config older than the field (issue 48): runs
  before it re-gathered the round's global model, so 'gather' where the downlink
  is lossy; where it is lossless both modes are bitwise the same run, so the
  default."""
  from hfl.compress import policy  # lazy: jax  pylint: disable=g-import-not-at-top
  return 'gather' if policy.lossy_downlink(old['compression']) else 'downlink'


# Config fields added after runs may have started: absent from an older run's
# config.json, they count as these values (their "off" defaults), so such runs
# still resume.
ADDED_SECTIONS = {('compression', 'dgc'): dict(momentum=0.0, clip_norm=0.0, warmup_steps=0,
                                               initial_density=0.25, num_stages=4),
                  ('optimizer', 'shard_state'): False,
                  ('optimizer', 'freeze_second_moment_after'): 0,
                  ('optimizer', 'muon_adam_learning_rate'): 0.0,
                  ('optimizer', 'muon_leaves'): 'matrices', ('optimizer', 'muon_exclude'): '',
                  ('compression', 'dense_leaves'): '', ('compression', 'send'): 'gradient',
                  ('compression', 'broadcast_density'): 0.0,
                  # Before compression.correction the correction went through the downlink's
                  # compressor (name ''); the other entries are configs/default.py's.
                  ('compression', 'correction'): dict(
                      name='', density=0.01, levels=16, bucket_size=512, rank=2,
                      threshold_variant=False, fmt='fp4', gamma=0.9, coder='huffman',
                      refit_every=1, chunk_size=4096, value_bits=2),
                  # Runs before issue 52 ran on a device per DC and worker, which
                  # 'auto' still picks wherever those devices exist (main.py simulates
                  # them on CPU); elsewhere such a run could not resume before.
                  ('mesh', 'simulate'): 'auto',
                  ('network', 'wan_latencies_per_round'): 2.0,
                  ('dataset', 'cache_dir'): '', ('dataset', 'augment'): 'none',
                  ('optimizer', 'schedule'): 'constant', ('optimizer', 'warmup_steps'): 0,
                  ('optimizer', 'decay_steps'): 0, ('optimizer', 'final_lr_ratio'): 0.0,
                  ('train', 'target_loss'): _old_target_loss,
                  ('train', 'sim_time_budget_s'): 0.0, ('train', 'sample_budget'): 0,
                  ('sync', 'k_min_ratio'): 0.0,
                  ('sync', 'lr_scaling'): 'none', ('sync', 'prox_mu'): 0.0,
                  ('sync', 'control_variates'): 'none',
                  ('sync', 'progress_test'): 'endpoints', ('sync', 'k_max_scope'): 'every_dc',
                  ('sync', 'fragments'): 1, ('sync', 'overlap_steps'): 0,
                  ('sync', 'mixing_alpha'): 0.0, ('sync', 'eager'): False,
                  ('compression', 'broadcast'): _old_broadcast,
                  **{('compression', link, field): value
                     for link in ('uplink', 'downlink', 'wan')
                     for field, value in (('chunk_size', 4096), ('value_bits', 2))}}


def upgrade_config(old: dict) -> dict:
  """An older run's config.json with the :data:`ADDED_SECTIONS` it lacks filled in
  (a callable default is called with the older config), and every sync strategy's
  own fields at their defaults (``hfl.sync.strategies``' ``Strategy.hyper``: a run
  started before a strategy was added did not have them)."""
  from hfl.sync import strategies  # lazy: jax (the hfl.sync package imports it)
  old = copy.deepcopy(old)
  added = {**ADDED_SECTIONS, **{('sync', f): v for f, v in strategies.hyper_defaults().items()}}
  for (*parents, leaf), default in added.items():
    sub = old
    for p in parents:
      sub = sub.get(p) if isinstance(sub, dict) else None
    # A section the config lacks gets nothing (a callable default may read it).
    if isinstance(sub, dict) and parents and leaf not in sub:
      sub[leaf] = default(old) if callable(default) else copy.deepcopy(default)
  return old


def check_fault_rounds(spec: str, host: Mapping[str, Any], workdir: str) -> None:
  """Refuses to go on with a run whose ``sync.faults`` counted rounds from 0: its
  checkpoint (``host``, :func:`hfl.cost.to_host`) predates :data:`FAULT_ROUNDS_FROM`, so the
  same spec would now name rounds one later (hfl.sync.faults). A finished run is
  only reported again, so it is not checked.

  Raises:
    ValueError: naming the spec, the workdir and what to do.
  """
  if spec.strip() and host.get('fault_rounds_from') != FAULT_ROUNDS_FROM:
    raise ValueError(
        f'--workdir={workdir} holds a run started when sync.faults counted rounds from 0; '
        f'rounds are now numbered from 1, so sync.faults={spec!r} would name rounds one '
        'later than it did. Use a new --workdir (for the same outages, each round one '
        'higher).')


def samples_from_log(records, ls) -> int | None:
  """The samples a run processed up to ``ls`` (a checkpoint written before
  :attr:`hfl.cost.LoopState.samples` existed), summed from the per-round ``dc_rounds`` of
  its metrics.jsonl ``records`` (rounds up to ``ls.round``) and of ``ls`` (rounds
  since its last evaluation); None unless every round 1..``ls.round`` is there
  (older runs did not record them)."""
  per_round = {}
  for entry in [e for r in records if isinstance(r, dict)
                for e in (r.get('dc_rounds') or ())] + list(ls.since_eval.dc_rounds):
    if isinstance(entry, dict) and isinstance(entry.get('round'), int) and (
        1 <= entry['round'] <= ls.round) and isinstance(entry.get('samples'), list):
      per_round[entry['round']] = sum(int(x) for x in entry['samples'])
  if len(per_round) != ls.round:
    return None
  return sum(per_round.values())


def check_resumed_samples(stop: budget_lib.Stop, ls, old_budget: int,
                          workdir: str) -> None:
  """Refuses to resume under ``train.sample_budget`` a checkpoint (``ls``) whose
  samples are unknown, or that already processed the budget ``stop.sample_budget``
  unless it is the end of a run stopped by a budget ``old_budget`` <= it: its last
  round was then the first to reach the new budget too. (A budget lowered below
  what the checkpoint processed might have stopped the run rounds earlier; one
  raised, or lowered above it, is resumed: rounds run whole, so it trains bitwise
  as the fresh run of the new budget; only an evaluation at the old end, if not
  due anyway, stays in its history.)

  Args:
    stop: the run's stopping rule.
    ls: the restored loop state.
    old_budget: ``train.sample_budget`` of the config the run was trained with
      (0: another rule governed it).
    workdir: for the message.

  Raises:
    ValueError: naming ``train.sample_budget``, the checkpoint and what to do.
  """
  if stop.governed_by != 'sample_budget':
    return
  if ls.samples is None:
    raise ValueError(
        f'train.sample_budget={stop.sample_budget} governs this run, but the checkpoint of '
        f'iteration {ls.step} in --workdir={workdir} predates the sample count and its '
        "metrics.jsonl does not record every round's samples; use a new --workdir.")
  if ls.samples >= stop.sample_budget and not 0 < old_budget <= stop.sample_budget:
    raise ValueError(
        f'train.sample_budget={stop.sample_budget} is not above the {ls.samples} samples '
        f'--workdir={workdir} has already processed (checkpoint of iteration {ls.step}, '
        f'round {ls.round}), so the run might have stopped rounds earlier; use a new '
        'workdir for a smaller budget.')


# ------------------------------------------------------------------------------
# Damaged files, and a finished run reported again.
# ------------------------------------------------------------------------------

def check_metrics_log(workdir: str, ls) -> None:
  """Refuses to go on from a checkpoint whose evaluations metrics.jsonl has lost (cut
  short or truncated): the run's evaluation history, time to target and, when it is
  rebuilt, summary.json would be wrong without a word.

  Args:
    workdir: the run's workdir.
    ls: the restored loop state (hfl.cost.LoopState: ``step``, ``last_eval``).

  Raises:
    ValueError: the log's last record is of an earlier round than the checkpoint's
      last evaluation (both named); nothing is written.
  """
  if not ls.evals.last_eval or 'round' not in ls.evals.last_eval:
    return
  path = os.path.join(workdir, 'metrics.jsonl')
  rounds = [r.get('round') for r in metrics_lib.read_jsonl(path) if isinstance(r, dict)]
  last = max((r for r in rounds if metrics_lib.finite(r)), default=None)
  if last is None or last < ls.evals.last_eval['round']:
    raise ValueError(
        f'{path} ends {"with no record" if last is None else f"at round {last}"}, but the '
        f'checkpoint of iteration {ls.step} was evaluated at round {ls.evals.last_eval["round"]}: '
        "the log lost evaluations, so the run's history and summary would be wrong; nothing "
        'was written. Restore metrics.jsonl; or move the checkpoints newer than its last '
        'record out of checkpoints/ (the run then resumes from an older one); or use a new '
        '--workdir.')


def finished_without_checkpoint(workdir: str, metric: str, stop: budget_lib.Stop) -> dict:
  """The summary of a workdir holding a finished run's summary.json but no checkpoint
  that restores (deleted, as in docs/results/runs, or skipped as damaged), to be
  reported again when ``stop`` (this config's stopping rule) has stopped it, as
  :func:`reported_summary` does (a changed target is not recomputed: that needs
  the checkpoint). ``metric``: the task's headline metric.

  Raises:
    ValueError: the run would have to train more (a longer ``train.num_steps``):
      from step 0, overwriting its metrics.jsonl and summary.json; or summary.json is
      damaged. Nothing is written.
  """
  path = os.path.join(workdir, 'summary.json')
  summary = read_json_object(path, 'no checkpoint is left to rebuild it from: restore it '
                             'from a copy, or use a new --workdir')
  if metrics_lib.summary_problem(summary, metric) is None and _stopped(summary, stop):
    logging.info('%s already finished %d iterations (no checkpoint kept); nothing to do.',
                 workdir, int(summary['intra_dc_iterations']))
    return summary
  raise ValueError(
      f'--workdir={workdir} holds a finished run ({path}) but no checkpoint that '
      'restores, so this config could only train it again from step 0, overwriting its '
      'metrics.jsonl and summary.json; nothing was written. Use a new --workdir (or move '
      'summary.json and metrics.jsonl away to train here from the start).')


def reported_summary(workdir: str, task, config) -> dict:
  """The summary.json of a run that has finished (its checkpoint restored, its
  stopping rule met), reported again: with time and rounds to target recomputed
  from its ``eval_history`` when ``task``'s target (hfl.tasks.Task) differs from
  the stored one, which then also goes into the stored configs (config.json and
  the summary's), written unless the workdir is read-only (then only printed).

  Args:
    workdir: the run's workdir.
    task: the run's task (``metric``, ``target``, ``higher_is_better``).
    config: the run's config (its ``train`` target fields).

  Raises:
    ValueError: summary.json is not a JSON object, or not a finished run's
      (hfl.metrics.summary_problem, e.g. ``{}``); names it and what to do.
  """
  summary_path = os.path.join(workdir, 'summary.json')
  summary = read_json_object(summary_path, _SUMMARY_ADVICE)
  problem_ = metrics_lib.summary_problem(summary, task.metric)  # the check the report makes
  if problem_:
    raise ValueError(f'{summary_path} {problem_}; {_SUMMARY_ADVICE}')
  history = summary.get('eval_history')  # absent in summaries of older runs: kept as is
  retarget = dict(target=task.target, **metrics_lib.to_target(task, history or []))
  if 'target_accuracy' in summary:
    retarget['target_accuracy'] = task.target
  if history and any(summary.get(k) != v for k, v in retarget.items()):
    logging.info('Target %s=%g: time and rounds to target recomputed from the run\'s '
                 'evaluations.', task.metric, task.target)
    summary.update(retarget)
    from hfl import tasks  # lazy: jax  pylint: disable=g-import-not-at-top
    # The stored configs name the new target too; every other field stays as trained.
    targets = {k: config.train[k] for k, _ in tasks.TARGET_FIELDS.values()
               if k in config.train}
    stored = [stored_config(workdir)] + ([summary['config']] if 'config' in summary else [])
    for cfg in stored:
      if isinstance(cfg, dict):
        cfg.setdefault('train', {}).update(targets)
    if not os.access(workdir, os.W_OK):
      logging.warning('%s cannot be written: the recomputed time and rounds to target are '
                      'printed, not saved.', workdir)
    elif metrics_lib.is_writer():
      metrics_lib.write_json(summary_path, summary)
      if os.path.exists(os.path.join(workdir, 'config.json')):
        metrics_lib.write_json(os.path.join(workdir, 'config.json'), stored[0])
  return summary
