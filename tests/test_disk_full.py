"""A disk that fills while a run writes its files: one error line (hfl.metrics.WriteError,
main.py), and what was written before stays whole (hfl.checkpoint.save's case is in
test_checkpoint.py)."""

import builtins
import errno
import json
import os
import subprocess
import sys

import pytest

from hfl import metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _FillingFile:
  """A file open for writing whose ``write`` writes only the first ``after_chars``
  characters, then raises ENOSPC (a disk filling mid-write)."""

  def __init__(self, f, after_chars: int):
    self._f, self._after = f, after_chars

  def write(self, text):
    self._f.write(text[:self._after])
    self._f.flush()
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self._f.close()


def _filling_open(monkeypatch, after_chars: int):
  """Makes hfl.metrics' ``open`` give a :class:`_FillingFile` for writing."""
  def fake_open(path, mode='r', **kwargs):
    f = builtins.open(path, mode, **kwargs)
    return _FillingFile(f, after_chars) if 'w' in mode or 'a' in mode else f
  monkeypatch.setattr(metrics, 'open', fake_open, raising=False)


def test_a_full_disk_leaves_the_old_file_and_no_temporary_one(tmp_path, monkeypatch):
  path = str(tmp_path / 'summary.json')
  metrics.write_json(path, {'old': 1})
  before = open(path).read()
  _filling_open(monkeypatch, after_chars=5)
  with pytest.raises(metrics.WriteError) as e:
    metrics.write_json(path, {'new': 2})
  assert e.value.errno == errno.ENOSPC and e.value.filename == path
  assert str(e.value) == (f'no space left on device (ENOSPC) while writing {path}; '
                          'summary.json is as it was before')
  assert open(path).read() == before and os.listdir(tmp_path) == ['summary.json']
  with pytest.raises(metrics.WriteError, match='; no new.json was written'):
    metrics.replace_file(str(tmp_path / 'new.json'), '{}')
  assert os.listdir(tmp_path) == ['summary.json']


def test_replace_file_puts_the_data_on_disk_before_the_rename(tmp_path, monkeypatch):
  """fsync of the temporary file's contents comes before the rename that makes it current
  (else a power loss can leave an empty file where the old one was)."""
  events, real_fsync, real_replace = [], os.fsync, os.replace
  monkeypatch.setattr(os, 'fsync', lambda fd: (events.append(('fsync', os.fstat(fd).st_size)),
                                               real_fsync(fd)))
  monkeypatch.setattr(os, 'replace', lambda a, b: (events.append(('replace', b)),
                                                   real_replace(a, b)))
  path = str(tmp_path / 'summary.json')
  metrics.replace_file(path, 'new text')
  assert events == [('fsync', len('new text')), ('replace', path)]
  assert open(path).read() == 'new text'


def test_a_full_disk_leaves_metrics_jsonl_with_whole_records_only(tmp_path, monkeypatch):
  w = metrics.MetricsWriter(str(tmp_path))
  w.write({'step': 2, 'test_accuracy': 0.5})
  before = open(w.path).read()
  _filling_open(monkeypatch, after_chars=7)  # '{"step"' of the next line reaches the file
  with pytest.raises(metrics.WriteError,
                     match=r'no space left on device \(ENOSPC\) while writing .*metrics.jsonl; '
                     'metrics.jsonl is as it was before the record of step 4'):
    w.write({'step': 4, 'test_accuracy': 0.75})
  monkeypatch.undo()
  w.close()
  assert open(w.path).read() == before
  assert [r['step'] for r in metrics.read_jsonl(w.path)] == [2]


def test_main_reports_a_full_disk_in_one_line_naming_the_checkpoint_to_resume(tmp_path):
  """main.py: exit status 2 (as for a workdir it cannot use) and one line: what was
  being written, the error, what is intact and the iteration a rerun resumes from."""
  workdir = tmp_path / 'run'
  step_dir = workdir / 'checkpoints' / '6'  # looks complete (hfl.checkpoint.incomplete_reason)
  for item in ('state', 'host'):
    (step_dir / item).mkdir(parents=True)
  (step_dir / 'commit_success.txt').write_text('')
  script = (
      'import errno, runpy, sys\n'
      'from hfl import metrics, train\n'
      'def full(config, workdir):\n'
      '  raise metrics.WriteError(workdir + "/summary.json", OSError(errno.ENOSPC, '
      '"No space left on device"), "summary.json is as it was before")\n'
      'train.train_and_evaluate = full\n'
      f'sys.argv = ["main.py", "--config=configs/smoke.py", "--workdir={workdir}"]\n'
      'runpy.run_path("main.py", run_name="__main__")\n')
  out = subprocess.run([sys.executable, '-c', script], cwd=REPO, capture_output=True, text=True,
                       env=dict(os.environ, JAX_PLATFORMS='cpu', HFL_ALLOCATOR='system'),
                       timeout=300, check=False)
  assert out.returncode == 2, out.stderr[-2000:]
  assert out.stderr.splitlines() == [
      f'error: no space left on device (ENOSPC) while writing {workdir}/summary.json; '
      'summary.json is as it was before. Free space there, then rerun the same command to '
      f'resume {workdir} from its checkpoint of iteration 6.'], out.stderr[-2000:]
  assert json.loads(json.dumps(sorted(os.listdir(workdir)))) == ['checkpoints']
