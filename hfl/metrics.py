"""Run outputs: metrics.jsonl, summary.json, config.json and TensorBoard events.

Files (DESIGN 3) in the workdir:
  config.json     the resolved config, written once when the run starts.
  metrics.jsonl   one JSON object per evaluation: step, round, test_accuracy,
                  test_loss, train_loss, cumulative bytes by link, sim_time_s,
                  wall_time_s (+ k, the current K_base, and k_d).
  summary.json    final numbers, written atomically at the end.
  tb/             TensorBoard event files (tensorboardX; no TensorFlow needed).
Only process 0 writes.
"""

import json
import os
from typing import Any

import jax


def is_writer() -> bool:
  """True on the process that writes files (process 0)."""
  return jax.process_index() == 0


def write_json(path: str, obj: Any) -> None:
  """Writes ``obj`` as JSON atomically (temp file + rename): a crash leaves the old file."""
  tmp = path + '.tmp'
  with open(path + '.tmp', 'w') as f:
    json.dump(obj, f, indent=2, sort_keys=True)
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
      f.writelines(json.dumps(r) + '\n' for r in kept)
    os.replace(self.path + '.tmp', self.path)
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
    self._tb = SummaryWriter(os.path.join(workdir, 'tb'), purge_step=resume_step + 1)

  def write(self, record: dict) -> None:
    if not self._enabled:
      return
    with open(self.path, 'a') as f:
      f.write(json.dumps(record) + '\n')
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
