"""Run outputs: metrics.jsonl, summary.json, config.json and TensorBoard events.

Files (DESIGN 3) in the workdir:
  config.json     the resolved config, written once when the run starts.
  metrics.jsonl   one JSON object per evaluation: step, round, test_accuracy,
                  test_loss, train_loss, cumulative bytes by link, sim_time_s,
                  wall_time_s (+ k, the current K_base, and k_d).
  summary.json    final numbers, written atomically at the end.
  tb/             TensorBoard event files (tensorboardX; no TensorFlow needed).
Only process 0 writes.

Every JSON file hfl writes (these, the launchers' ``wan_info.json``, the
schedule state in checkpoints) goes through :func:`dumps`: strict JSON (RFC
8259), which has no NaN or Infinity. A non-finite number is never written as
the non-standard ``NaN``/``Infinity`` tokens that Python's ``json`` emits by
default: the caller either refuses it (``nonfinite='error'``, the default: a
``ValueError`` naming where it is) or maps it to ``null`` (``nonfinite='null'``).
This module imports JAX only when :func:`is_writer` is called, so the launchers
can use it.
"""

import json
import math
import os
from typing import Any

import numpy as np

NONFINITE_POLICIES = ('error', 'null')


def is_writer() -> bool:
  """True on the process that writes files (process 0)."""
  import jax  # pylint: disable=g-import-not-at-top
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


def write_json(path: str, obj: Any, nonfinite: str = 'error') -> None:
  """Writes ``obj`` as strict JSON atomically (temp file + rename).

  The text is built before the file is opened, so a refused value (or a crash)
  leaves the old file as it was.

  Raises:
    ValueError / TypeError: as :func:`to_json_value` (nothing is written).
  """
  text = dumps(obj, nonfinite, where=os.path.basename(path), indent=2, sort_keys=True)
  tmp = path + '.tmp'
  with open(tmp, 'w') as f:
    f.write(text + '\n')
  os.replace(tmp, path)


def read_jsonl(path: str) -> list:
  """Reads a metrics.jsonl file; a missing file reads as [].

  A last line cut short by a crash mid-write is skipped; a bad line elsewhere
  raises ``json.JSONDecodeError``.
  """
  if not os.path.exists(path):
    return []
  with open(path) as f:
    lines = [line for line in f if line.strip()]
  out = []
  for i, line in enumerate(lines):
    try:
      out.append(json.loads(line))
    except json.JSONDecodeError:
      if i != len(lines) - 1:
        raise
  return out


class MetricsWriter:
  """Appends evaluation records to metrics.jsonl and TensorBoard.

  On resume, records past the restored step (written after the last checkpoint)
  are dropped first, so the file holds each evaluation exactly once.
  """

  def __init__(self, workdir: str, resume_step: int = 0):
    self._enabled = is_writer()
    self.path = os.path.join(workdir, 'metrics.jsonl')
    self._tb = None
    if not self._enabled:
      return
    kept = [r for r in read_jsonl(self.path) if r['step'] <= resume_step]
    with open(self.path + '.tmp', 'w') as f:
      # Written by this or an older hfl: a non-finite value there becomes null.
      f.writelines(dumps(r, 'null', where='metrics.jsonl') + '\n' for r in kept)
    os.replace(self.path + '.tmp', self.path)
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
    self._tb = SummaryWriter(os.path.join(workdir, 'tb'), purge_step=resume_step + 1)

  def write(self, record: dict) -> None:
    if not self._enabled:
      return
    line = dumps(record, where='metrics.jsonl')  # refused before the file is touched
    with open(self.path, 'a') as f:
      f.write(line + '\n')
    step = record['step']
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
      self._tb.close()
