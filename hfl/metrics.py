"""Run outputs: metrics.jsonl, summary.json, config.json and TensorBoard events.

Files in the workdir:
  config.json     the resolved config, written once when the run starts.
  metrics.jsonl   one JSON object per evaluation: step, round, test_accuracy,
                  test_loss, train_loss, cumulative bytes by link, sim_time_s,
                  wall_time_s (+ k, the current K_base, and k_d).
  summary.json    final numbers, written atomically at the end.
  tb/             TensorBoard event files (tensorboardX; no TensorFlow needed).
Only process 0 writes. What a workdir holds and may be used for (its entries,
its lock, resuming) is :mod:`hfl.workdir`'s.

Also the helpers every reader of these files shares (the training loop's
progress line and summary, and :mod:`hfl.report`): :func:`format_bytes` (the
one byte formatter) and :func:`crossing` / :func:`time_to_target` /
:func:`to_target` (the one time-to-target rule), :func:`summary_problem` (the one check of a finished run's
summary.json) and :func:`manifest_runs` (a sweep root's sweep.json). They need no
JAX, so this module imports JAX only where it writes.

Every JSON file hfl writes (these, the launchers' ``wan_info.json``, the
schedule state in checkpoints) goes through :func:`dumps`: strict JSON (RFC
8259), which has no NaN or Infinity. A non-finite number is never written as
the non-standard ``NaN``/``Infinity`` tokens that Python's ``json`` emits by
default: the caller either refuses it (``nonfinite='error'``, the default: a
``ValueError`` naming where it is) or maps it to ``null`` (``nonfinite='null'``).
"""

import contextlib
import errno
import json
import logging
import math
import os
from typing import Any, Mapping, Sequence

import numpy as np

# The links every byte count is keyed by (metrics.jsonl, summary.json, reports).
LINKS = ('intra_up', 'intra_down', 'inter_dc')
NONFINITE_POLICIES = ('error', 'null')


def is_writer() -> bool:
  """True on the process that writes files (process 0)."""
  import jax  # lazy: jax  pylint: disable=g-import-not-at-top
  return jax.process_index() == 0


def to_json_value(obj: Any, nonfinite: str = 'error', where: str = '') -> Any:
  """``obj`` as plain JSON values, with every non-finite float handled by ``nonfinite``.

  Args:
    obj: dicts (string keys), lists, tuples, str, bool, None, int and float,
      also numpy scalars and arrays (converted to Python numbers and lists).
    nonfinite: ``'error'`` (raise) or ``'null'`` (write ``null``) for NaN and
      +-Infinity.
    where: prefix of the reported location (e.g. the file name).

  Returns:
    The same structure built from dict, list, str, bool, None, int and finite float.

  Raises:
    ValueError: ``nonfinite='error'`` and ``obj`` holds a NaN or infinite number
      (the message names every location, e.g. ``summary.json: sim_time_s = inf``),
      or ``nonfinite`` is not one of NONFINITE_POLICIES.
    TypeError: a value JSON cannot hold (e.g. a set or an object).
  """
  if nonfinite not in NONFINITE_POLICIES:
    raise ValueError(f'nonfinite={nonfinite!r} must be one of {NONFINITE_POLICIES}')
  bad = []
  out = _convert(obj, nonfinite, where, bad)
  if bad:
    raise ValueError(f'refusing to write non-finite number(s) as JSON (it has no NaN or '
                     f'Infinity): {", ".join(bad)}')
  return out


def _convert(obj, nonfinite, where, bad):
  if isinstance(obj, np.ndarray):
    obj = obj.tolist()
  elif isinstance(obj, np.generic):
    obj = obj.item()
  if isinstance(obj, bool) or obj is None or isinstance(obj, (str, int)):
    return obj
  if isinstance(obj, float):
    if math.isfinite(obj):
      return obj
    if nonfinite == 'error':
      bad.append(f'{where or "value"} = {obj}')
    return None
  if isinstance(obj, dict):
    return {k: _convert(v, nonfinite, f'{where}.{k}' if where else str(k), bad)
            for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [_convert(v, nonfinite, f'{where}[{i}]', bad) for i, v in enumerate(obj)]
  raise TypeError(f'{where or "value"}: {type(obj).__name__} is not JSON-serialisable')


def dumps(obj: Any, nonfinite: str = 'error', where: str = '', **kwargs) -> str:
  """Strict JSON text of ``obj`` (see :func:`to_json_value`; kwargs go to ``json.dumps``).

  Raises:
    ValueError / TypeError: as :func:`to_json_value`.
  """
  return json.dumps(to_json_value(obj, nonfinite, where), allow_nan=False, **kwargs)


class WriteError(OSError):
  """A file of the run could not be written (e.g. no space left on device).

  ``errno``, ``strerror`` and ``filename`` (the path being written) are the
  OSError's; ``intact`` says what is left whole. ``str()`` is one line:
  ``"no space left on device (ENOSPC) while writing PATH; INTACT"``.
  """

  def __init__(self, path: str, err: OSError, intact: str):
    super().__init__(err.errno, err.strerror or str(err), path)
    self.intact = intact

  def __str__(self):
    name = errno.errorcode.get(self.errno) if self.errno else None
    what = self.strerror[:1].lower() + self.strerror[1:]
    return f'{what}{f" ({name})" if name else ""} while writing {self.filename}; {self.intact}'


def replace_file(path: str, text: str) -> None:
  """Writes ``text`` (UTF-8) to ``path`` whole: to ``path + '.tmp'``, flushed to disk
  (fsync), then renamed over ``path``, so a crash, a power loss or a full disk leaves
  the old file or the new one, never a part.

  Raises:
    WriteError (an OSError): writing or renaming failed (e.g. no space left on
      device); the temporary file is removed and ``path`` is as it was.
  """
  tmp = path + '.tmp'
  existed = os.path.exists(path)
  try:
    with open(tmp, 'w', encoding='utf-8') as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())  # the data is on disk before the rename makes it current
    os.replace(tmp, path)
  except OSError as e:
    with contextlib.suppress(OSError):
      os.unlink(tmp)
    name = os.path.basename(path)
    raise WriteError(path, e, f'{name} is as it was before' if existed else
                     f'no {name} was written') from e


def write_json(path: str, obj: Any, nonfinite: str = 'error') -> None:
  """Writes ``obj`` as strict JSON atomically (temp file + rename).

  The text is built before the file is opened, so a refused value (or a crash)
  leaves the old file as it was.

  Raises:
    ValueError / TypeError: as :func:`to_json_value` (nothing is written).
    WriteError (an OSError): as :func:`replace_file` (the old file is left).
  """
  replace_file(path, dumps(obj, nonfinite, where=os.path.basename(path), indent=2,
                           sort_keys=True) + '\n')


def dir_problem(path: str, writable: bool = True) -> str | None:
  """Why directory ``path`` could not be created (or written) (None if it can).

  Only reads: ``path`` exists and is not a directory, an existing ancestor of it
  is a file, or (``writable``) the nearest existing one is not writable.
  """
  path = os.path.abspath(path)
  if os.path.exists(path) and not os.path.isdir(path):
    return 'exists and is not a directory'
  parent = path
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    return f'cannot be created: {parent} is a file'
  if writable and not os.access(parent, os.W_OK):
    return f'cannot be written: {parent} is not writable'
  return None


def read_jsonl(path: str, strict: bool = True) -> list:
  """Reads a metrics.jsonl file; a missing file reads as [].

  A last line cut short by a crash mid-write is skipped with a warning naming
  the file and line; a bad line elsewhere raises a ``ValueError`` naming them
  (``strict``) or is skipped (not ``strict``: for readers such as reports,
  which log the skip).
  """
  if not os.path.exists(path):
    return []
  with open(path) as f:
    lines = [(n, line) for n, line in enumerate(f, 1) if line.strip()]
  out = []
  for i, (n, line) in enumerate(lines):
    try:
      out.append(json.loads(line))
    except json.JSONDecodeError as e:
      if strict and i != len(lines) - 1:
        raise ValueError(f'{path}:{n} is not JSON ({e}); fix or delete that line') from None
      if strict:  # the last line
        logging.warning('%s:%d: skipping the last line, which is not JSON (cut short by a '
                        'crash mid-write?)', path, n)
      else:
        logging.warning('%s:%d: skipping a line that is not JSON', path, n)
  return out


class MetricsWriter:
  """Appends evaluation records to metrics.jsonl and TensorBoard.

  On resume, records past the restored step (written after the last checkpoint)
  are dropped first, so the file holds each evaluation exactly once.

  Raises (the constructor, :meth:`write` and :meth:`close`):
    WriteError (an OSError): metrics.jsonl or the TensorBoard events could not be
      written (e.g. no space left on device); metrics.jsonl is left as it was
      before the record (a line cut short is removed).
  """

  def __init__(self, workdir: str, resume_step: int = 0):
    self._enabled = is_writer()
    self.path = os.path.join(workdir, 'metrics.jsonl')
    self._tb, self._tb_dir = None, os.path.join(workdir, 'tb')
    if not self._enabled:
      return
    kept = [r for r in read_jsonl(self.path) if r['step'] <= resume_step]
    # Written by this or an older hfl: a non-finite value there becomes null.
    replace_file(self.path, ''.join(dumps(r, 'null', where='metrics.jsonl') + '\n'
                                    for r in kept))
    from tensorboardX import SummaryWriter  # lazy: tensorboardX  pylint: disable=g-import-not-at-top
    with self._writing_tb():
      self._tb = SummaryWriter(self._tb_dir, purge_step=resume_step + 1)

  def write(self, record: dict) -> None:
    if not self._enabled:
      return
    line = dumps(record, where='metrics.jsonl')  # refused before the file is touched
    size = None
    try:
      size = os.path.getsize(self.path)
      with open(self.path, 'a') as f:
        f.write(line + '\n')
    except OSError as e:
      if size is not None:  # no line cut short
        with contextlib.suppress(OSError):
          os.truncate(self.path, size)
      raise WriteError(self.path, e, 'metrics.jsonl is as it was before the record of '
                       f'step {record["step"]}') from e
    step = record['step']
    with self._writing_tb():
      for key, value in record.items():
        if key in ('step',) or value is None:
          continue
        if isinstance(value, dict):
          for sub, v in value.items():
            self._tb.add_scalar(f'{key}/{sub}', v, step)
        elif isinstance(value, (int, float)):
          self._tb.add_scalar(key, value, step)
      self._tb.flush()

  def close(self) -> None:
    if self._tb is not None:
      with self._writing_tb():
        self._tb.close()

  @contextlib.contextmanager
  def _writing_tb(self):
    try:
      yield
    except OSError as e:
      raise WriteError(self._tb_dir, e, 'metrics.jsonl holds every record') from e


# ------------------------------------------------------------------------------
# Reading records: one byte formatter, one time-to-target rule.
# ------------------------------------------------------------------------------

_BYTE_UNITS = (('TB', 1e12), ('GB', 1e9), ('MB', 1e6), ('kB', 1e3))


def byte_unit(n: float) -> tuple[str, float]:
  """The decimal unit ``format_bytes`` picks for ``n`` bytes: (name, bytes per unit)."""
  return next(((u, s) for u, s in _BYTE_UNITS if abs(n) >= s), ('B', 1.0))


def format_bytes(n: float | None, unit: tuple[str, float] | None = None,
                 digits: int = 2) -> str:
  """Bytes in decimal units: ``'1.50 MB'`` (1 kB = 1000 B, 1 MB = 10^6 B).

  Args:
    n: a byte count (None prints ``'–'``).
    unit: (name, scale) from :func:`byte_unit` to use instead of ``n``'s own
      (e.g. a std in its mean's unit).
    digits: decimals (whole bytes are printed without).

  Returns:
    E.g. ``'999 B'``, ``'1.00 kB'``, ``'12.14 GB'``.
  """
  if n is None:
    return '–'
  name, scale = unit or byte_unit(n)
  return f'{n:.0f} B' if name == 'B' else f'{n / scale:.{digits}f} {name}'


def value(record: Mapping[str, Any], key: str) -> Any:
  """``record['a']['b']`` for ``key='a.b'``, None when missing.

  ``'bytes.total'`` is the sum over :data:`LINKS` of ``record['bytes']``.
  """
  if key == 'bytes.total':
    b = record.get('bytes')
    return (float(sum(float(b.get(link) or 0) for link in LINKS))
            if isinstance(b, Mapping) else None)
  node: Any = record
  for part in key.split('.'):
    if not isinstance(node, Mapping) or part not in node:
      return None
    node = node[part]
  return node


def finite(x: Any) -> bool:
  """True for an int or float (not a bool) that is finite."""
  return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def crossing(prev: Mapping[str, Any] | None, cur: Mapping[str, Any], target: float,
             key: str, metric: str = 'test_accuracy', higher_is_better: bool = True) -> float:
  """Where ``metric`` reaches ``target`` between two evaluations, by linear interpolation.

  ``cur`` is the first evaluation that reached ``target`` (at or above it for
  accuracy, at or below for a loss), ``prev`` the one before it (None if ``cur``
  is the first): x = x_prev + (target − m_prev) / (m_cur − m_prev) · (x_cur − x_prev),
  the fraction clipped to [0, 1]; ``x_cur`` when there is no ``prev``, ``prev``
  lacks ``metric`` (records of runs older than the metric), or the metric did not
  improve between them.

  Args:
    prev, cur: evaluation records (``metric`` and ``key``).
    target: the metric's target, e.g. accuracy (fraction) or loss (nats).
    key: dotted key of x (see :func:`value`), e.g. ``'sim_time_s'`` (seconds)
      or ``'round'``.
    metric: the record's key of the metric, e.g. ``'test_accuracy'`` or
      ``'test_loss'``.
    higher_is_better: True for an accuracy, False for a loss.

  Returns:
    The interpolated x (float).
  """
  x1, m1 = float(value(cur, key)), float(cur[metric])
  if prev is None or metric not in prev:
    return x1
  m0 = float(prev[metric])
  if (m1 <= m0) if higher_is_better else (m1 >= m0):
    return x1
  x0 = float(value(prev, key))
  frac = min(max((target - m0) / (m1 - m0), 0.0), 1.0)
  return x0 + frac * (x1 - x0)


def time_to_target(records: Sequence[Mapping[str, Any]], target: float,
                   key: str = 'sim_time_s', metric: str = 'test_accuracy',
                   higher_is_better: bool = True) -> float | None:
  """The x at which ``metric`` first reaches ``target`` (see :func:`crossing`).

  Args:
    records: evaluations in step order, as in metrics.jsonl; those whose
      metric or x is missing or not finite are skipped.
    target: the metric's target: accuracy (fraction) or loss (nats).
    key: dotted key of x: ``'sim_time_s'`` (s), ``'round'``, ``'step'``,
      ``'bytes.inter_dc'`` or ``'bytes.total'`` (bytes).
    metric: the records' key of the metric (``'test_accuracy'``, ``'test_loss'``).
    higher_is_better: True for an accuracy (reached at or above ``target``),
      False for a loss (at or below).

  Returns:
    The interpolated x, or None if the target is never reached.
  """
  prev = None
  for r in records:
    if not (finite(r.get(metric)) and finite(value(r, key))):
      continue
    if r[metric] >= target if higher_is_better else r[metric] <= target:
      return crossing(prev, r, target, key, metric, higher_is_better)
    prev = r
  return None


def to_target(task, records) -> dict:
  """summary.json's ``time_to_target_s`` (simulated s) and ``rounds_to_target``:
  where ``records`` (evaluations in step order: metrics.jsonl or ``eval_history``)
  first reach the task's current target, interpolated (:func:`time_to_target`);
  None when never. Computed from the whole history, so a target changed on rerun
  is applied to the evaluations already made.

  Args:
    task: the run's task (hfl.tasks.Task: ``target``, ``metric``,
      ``higher_is_better``).
    records: the evaluations.
  """
  return {name: time_to_target(records, task.target, key, task.metric,
                               task.higher_is_better)
          for name, key in (('time_to_target_s', 'sim_time_s'), ('rounds_to_target', 'round'))}


# ------------------------------------------------------------------- summary.json
# The one check of a finished run's summary.json, shared by hfl.train (before it
# reports a finished run again) and hfl.report (before it reads one).

# hfl.cost.wan_summary's fields (summary.json only; Mbit/s: None where no bandwidth
# suffices) and their units.
WAN_FIELDS = {'exposed_wan_s': 's', 'compute_s': 's', 'compute_utilisation': 'fraction',
              'peak_wan_bytes_per_sync': 'bytes', 'wan_mbps_for_95pct_utilisation': 'Mbit/s',
              'wan_mbps_for_95pct_without_latency': 'Mbit/s'}
# The report's per-run metric (hfl.report.runs.METRICS) -> (summary.json key,
# metrics.jsonl key of an unfinished run's last evaluation).
SUMMARY_SOURCES = {'final_acc': ('final_test_accuracy', 'test_accuracy'),
                   'final_loss': ('final_test_loss', 'test_loss'),
                   'final_bpc': ('final_test_bits_per_char', 'test_bits_per_char'),
                   'inter_dc_rounds': ('inter_dc_rounds', 'round'),
                   'intra_dc_iterations': ('intra_dc_iterations', 'step'),
                   **{k: (k, k) for k in ('samples', 'sim_time_s', 'wall_time_s')},
                   **{k: (k, None) for k in WAN_FIELDS}}
# summary.json's numbers the report reads (besides ``bytes``).
SUMMARY_NUMBERS = frozenset({s for s, _ in SUMMARY_SOURCES.values()}
                            | {'best_test_accuracy', 'best_test_loss'})


def summary_problem(summary: Mapping[str, Any], metric: str = 'test_accuracy') -> str | None:
  """Why ``summary`` is no finished run's summary.json (hfl.train.summarize), or None: it
  lacks ``final_<metric>`` (its headline metric, a number), or a field the report reads
  (:data:`SUMMARY_NUMBERS`; missing ones fall back to the last evaluation) holds no
  number nor null, or ``bytes`` is no object of those per link. A number must be finite
  and in its range: [0, 1] for an accuracy (a fraction, not percent), ≥ 0 for the rest
  (counts, bytes, seconds, losses, bandwidths)."""
  need = f'final_{metric}'
  problems = [] if need in summary else [f'lacks {need} (a number every finished run writes)']
  fields = {}  # the numbers the report reads, in the summary's order
  for k, v in summary.items():
    if k == 'bytes' and isinstance(v, dict):
      fields.update({f'bytes.{link}': n for link, n in v.items()})
    elif k == 'bytes' and v is not None:
      problems.append(f'bytes is {json.dumps(v)[:40]} where an object of numbers per link '
                      'belongs')
    elif k in SUMMARY_NUMBERS:
      fields[k] = v
  for k, v in fields.items():
    top = 1 if k.endswith('_accuracy') else math.inf
    number = isinstance(v, (int, float)) and not isinstance(v, bool)
    if not (finite(v) and 0 <= v <= top or v is None and k != need):
      what = ('a number' if not number else 'a fraction in [0, 1]' if top == 1
              else 'a finite number ≥ 0')
      problems.append(f'{k} is {json.dumps(v)[:40]} where {what} '
                      f'{"" if k == need else "or null "}belongs')
  return '; '.join(problems) or None


# --------------------------------------------------------------------- sweep.json
# A sweep root's list of its runs (written by hfl.sweep; read there and by the
# report's command line, which names the runs a sweep root lacks).
SWEEP_MANIFEST = 'sweep.json'


def manifest_runs(root: str, advice: str = 'move that file away') -> list[str] | None:
  """The run names ``ROOT/sweep.json`` lists (workdirs ``ROOT/<name>``); None without one.

  Raises:
    ValueError: the manifest cannot be read (its path, why, then ``advice``).
  """
  path = os.path.join(os.path.abspath(root), SWEEP_MANIFEST)
  try:
    with open(path, encoding='utf-8') as f:
      return [r['name'] for r in json.load(f)['runs']]
  except (FileNotFoundError, NotADirectoryError):  # no manifest (or no root) yet
    return None
  except (OSError, ValueError, TypeError, KeyError) as e:
    raise ValueError(f'{path} is not a readable sweep manifest ({type(e).__name__}: {e}); '
                     f'{advice}') from None
