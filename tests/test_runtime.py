"""hfl.runtime: the allocator re-exec (once, only when not chosen, never looping) and
that the allocator changes no result."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from hfl import runtime
from tests.helpers import make_fake_fashion_mnist

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'bench'))
import same_results  # noqa: E402  pylint: disable=g-import-not-at-top
TCMALLOC = runtime.find_tcmalloc()
needs_tcmalloc = pytest.mark.skipif(
    TCMALLOC is None, reason=f'{runtime.TCMALLOC} not installed (launch/setup.sh installs it)')
# Printed by each execution of the probe: pid, LD_PRELOAD, GLIBC_TUNABLES, marker, active().
PROBE = """
import os, sys
sys.path.insert(0, {repo!r})
from hfl import runtime
{patch}
print('run', os.getpid(), file=sys.stderr, flush=True)
runtime.use_fast_allocator()
print(os.getpid(), os.environ.get('LD_PRELOAD', ''), os.environ.get('GLIBC_TUNABLES', ''),
      os.environ.get(runtime.MARKER, ''), runtime.active(), sep='|')
{after}
"""


def clean_env(**extra):
  """The environment without any allocator choice (as a user's shell has it)."""
  env = {k: v for k, v in os.environ.items()
         if k not in ('LD_PRELOAD', 'GLIBC_TUNABLES', runtime.MARKER, runtime.CHOICE)}
  env.update(extra)
  return env


def probe(env, patch='', after=''):
  code = PROBE.format(repo=REPO, patch=patch, after=after)
  return subprocess.run([sys.executable, '-c', code, 'arg one', '--flag=2'], env=env,
                        capture_output=True, text=True, timeout=120, check=True)


def test_env_prefers_tcmalloc_and_keeps_user_preload():
  env, warning = runtime.allocator_env({'LD_PRELOAD': '/x/libfoo.so', 'PATH': '/bin'},
                                       tcmalloc='/lib/libtcmalloc_minimal.so.4')
  assert warning is None
  assert env['LD_PRELOAD'] == '/lib/libtcmalloc_minimal.so.4:/x/libfoo.so'
  assert env[runtime.MARKER] == 'tcmalloc'
  assert 'GLIBC_TUNABLES' not in env and env['PATH'] == '/bin'


def test_env_without_tcmalloc_falls_back_to_tunables_and_warns():
  env, warning = runtime.allocator_env({'GLIBC_TUNABLES': 'glibc.pthread.rseq=0'}, tcmalloc=None)
  assert env['GLIBC_TUNABLES'] == 'glibc.pthread.rseq=0:' + runtime.GLIBC_MALLOC_TUNABLES
  assert env[runtime.MARKER] == 'tunables' and 'LD_PRELOAD' not in env
  assert runtime.TCMALLOC in warning and 'launch/setup.sh' in warning
  env, warning = runtime.allocator_env({runtime.CHOICE: 'tcmalloc'}, tcmalloc=None)
  assert env[runtime.MARKER] == 'none' and 'GLIBC_TUNABLES' not in env and warning
  env, warning = runtime.allocator_env({runtime.CHOICE: 'tunables'}, tcmalloc='/lib/t.so')
  assert env[runtime.MARKER] == 'tunables' and 'LD_PRELOAD' not in env and warning is None
  with pytest.raises(ValueError, match="HFL_ALLOCATOR='jemalloc' is not one of"):
    runtime.allocator_env({runtime.CHOICE: 'jemalloc'}, tcmalloc=None)


def test_user_choice_is_respected():
  assert runtime.user_choice({}) is None
  assert runtime.user_choice({'LD_PRELOAD': '/usr/lib/libasan.so'}) is None
  assert runtime.user_choice({'LD_PRELOAD': '/opt/libjemalloc.so.2'}).startswith('LD_PRELOAD')
  assert runtime.user_choice({'GLIBC_TUNABLES': 'glibc.malloc.arena_max=2'})
  assert runtime.user_choice({'GLIBC_TUNABLES': 'glibc.pthread.rseq=0'}) is None
  assert runtime.user_choice({runtime.CHOICE: 'system'}) == 'HFL_ALLOCATOR=system'


@needs_tcmalloc
def test_reexec_once_with_tcmalloc_same_pid_and_argv():
  child = (f'import sys; sys.path.insert(0, {REPO!r}); from hfl import runtime; '
           'print(runtime.needs_reexec(), runtime.active())')
  # A child inherits the choice: no second re-exec.
  after = f'print(sys.argv[1:])\nimport subprocess\nsubprocess.run([sys.executable, "-c", {child!r}])'
  out = probe(clean_env(), after=after)
  runs = [l for l in out.stderr.splitlines() if l.startswith('run ')]
  assert len(runs) == 2 and runs[0] == runs[1], out.stderr  # two executions, one pid
  pid, preload, tunables, marker, active = out.stdout.splitlines()[0].split('|')
  assert runs[0] == f'run {pid}'
  assert TCMALLOC in preload.split(':') and tunables == ''
  assert marker == 'tcmalloc' and active == 'tcmalloc'
  assert out.stdout.splitlines()[1:] == ["['arg one', '--flag=2']", 'False tcmalloc']
  assert out.stderr.count('hfl:') == 0


@pytest.mark.parametrize('env', [{runtime.CHOICE: 'system'},
                                 {'GLIBC_TUNABLES': 'glibc.malloc.arena_max=1'}])
def test_no_reexec_when_user_chose(env):
  out = probe(clean_env(**env))
  assert len([l for l in out.stderr.splitlines() if l.startswith('run ')]) == 1
  assert out.stdout.split('|')[3] == ''  # no marker: untouched


def test_missing_tcmalloc_warns_once_and_uses_tunables():
  patch = 'runtime.find_tcmalloc = lambda: None'
  after = ("import subprocess\n"
           "subprocess.run([sys.executable, '-c', {!r}], check=True)".format(
               PROBE.format(repo=REPO, patch=patch, after='')))
  out = probe(clean_env(), patch=patch, after=after)
  assert out.stderr.count(f'hfl: {runtime.TCMALLOC} not found') == 1, out.stderr
  runs = [l for l in out.stderr.splitlines() if l.startswith('run ')]
  assert len(runs) == 3  # the first execution, its re-exec, the child (no re-exec)
  for line in out.stdout.splitlines():
    _, preload, tunables, marker, active = line.split('|')
    assert runtime.GLIBC_MALLOC_TUNABLES in tunables and marker == 'tunables'
    assert active == 'tunables' and 'tcmalloc' not in preload


def test_bad_choice_is_one_clear_line():
  out = subprocess.run([sys.executable, os.path.join(REPO, 'main.py'), '--helpshort'],
                       env=clean_env(HFL_ALLOCATOR='fast'), capture_output=True, text=True,
                       timeout=120)
  assert out.returncode == 2
  assert out.stderr == ("error: HFL_ALLOCATOR='fast' is not one of auto, tcmalloc, tunables, "
                        'system.\n')


def test_this_session_runs_with_the_allocator_it_announces():
  marker = os.environ.get(runtime.MARKER)
  if marker is None:
    pytest.skip('session started without the hook (HFL_ALLOCATOR=system or a user choice)')
  assert runtime.active() == (None if marker == 'none' else marker)


@needs_tcmalloc
@pytest.mark.slow
def test_pytest_session_reexecs_before_collection(tmp_path):
  """`python3 -m pytest` from the repo root re-executes once; output is not doubled."""
  out = subprocess.run(
      [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
       'tests/test_runtime.py::test_this_session_runs_with_the_allocator_it_announces'],
      cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stdout + out.stderr
  assert out.stdout.count('1 passed') == 1 and 'skipped' not in out.stdout


@needs_tcmalloc
@pytest.mark.slow
def test_allocator_changes_no_result(tmp_path):
  """The default CNN trained with glibc malloc and with tcmalloc: bitwise the same
  summary.json and metrics.jsonl apart from wall-clock fields."""
  (tmp_path / 'data').mkdir()
  data = make_fake_fashion_mnist(tmp_path / 'data')
  outputs = {}
  for name, env in (('glibc', clean_env(HFL_ALLOCATOR='system')), ('tcmalloc', clean_env())):
    workdir = tmp_path / name
    cmd = [sys.executable, 'main.py', '--config=configs/smoke.py', f'--workdir={workdir}',
           f'--config.dataset.data_dir={data}', '--config.model.name=cnn',
           '--config.optimizer.name=momentum', '--config.optimizer.learning_rate=0.02',
           '--config.train.num_steps=4', '--config.train.eval_every=1',
           '--config.train.checkpoint_every=0']
    run = subprocess.run(cmd, cwd=REPO, env=dict(env, JAX_PLATFORMS='cpu'),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    outputs[name] = same_results.load(str(workdir))
  losses = [r['test_loss'] for k, r in sorted(outputs['glibc'].items()) if k != 'summary.json']
  assert len(losses) == 2 and losses[0] != losses[1]  # it trained
  assert same_results.differences(outputs['glibc'], outputs['tcmalloc']) == []
  assert outputs['glibc']['summary.json']['final_test_loss'] == losses[-1]


def test_same_results_sees_one_ulp_and_ignores_wall_clock(tmp_path):
  def write(name, loss, wall):
    d = tmp_path / name
    d.mkdir()
    rec = {'step': 4, 'test_loss': loss, 'wall_time_s': wall}
    (d / 'metrics.jsonl').write_text(json.dumps(rec) + '\n')
    (d / 'summary.json').write_text(json.dumps(
        {'final_test_loss': loss, 'wall_time_s': wall, 'step_wall_s': {'round_median': wall}}))
    return str(d)
  a = write('a', 0.25, 1.0)
  assert same_results.main(['', a, write('b', 0.25, 7.0)]) == 0
  c = write('c', float(np.nextafter(0.25, 1.0)), 1.0)
  assert same_results.differences(same_results.load(a), same_results.load(c)) == [
      'metrics.jsonl[0].test_loss: 0.25 != 0.25000000000000006',
      'summary.json.final_test_loss: 0.25 != 0.25000000000000006']


def test_same_results_names_a_workdir_it_cannot_read(tmp_path, capsys):
  (tmp_path / 'a').mkdir()
  (tmp_path / 'a' / 'summary.json').write_text('{"x": 1}')
  (tmp_path / 'a' / 'metrics.jsonl').write_text('{"step": 1}\n')
  assert same_results.main(['same_results.py', str(tmp_path / 'a'), str(tmp_path / 'a')]) == 0
  assert same_results.main(['same_results.py', str(tmp_path / 'a'), str(tmp_path / 'b')]) == 2
  assert capsys.readouterr().err.startswith('error: cannot read a finished run: ')
  (tmp_path / 'a' / 'summary.json').write_text('{"x": ')
  assert same_results.main(['same_results.py', str(tmp_path / 'a'), str(tmp_path / 'a')]) == 2


def test_provenance_names_the_checkout_and_degrades_outside_one(tmp_path, monkeypatch):
  """Issue 47: every start records the commit, versions and machine; outside a git
  checkout (or without git) the git fields are None and nothing raises."""
  import subprocess  # pylint: disable=g-import-not-at-top
  from hfl import provenance  # pylint: disable=g-import-not-at-top
  entry = provenance.collect(5)
  assert set(entry) == set(provenance.FIELDS) and entry['at_iteration'] == 5
  head = subprocess.run(['git', '-C', provenance._REPO, 'rev-parse', 'HEAD'],
                        capture_output=True, text=True)
  if head.returncode == 0:  # a checkout (CI's fresh clone is one)
    assert entry['git_commit'] == head.stdout.strip() and isinstance(entry['git_dirty'], bool)
  monkeypatch.setattr(provenance, '_REPO', str(tmp_path))  # no checkout here
  provenance._static.cache_clear()
  try:
    outside = provenance.collect()
    assert outside['git_commit'] is None and outside['git_dirty'] is None
    assert outside['device_count'] >= 1 and outside['python'].count('.') == 2
  finally:
    provenance._static.cache_clear()
