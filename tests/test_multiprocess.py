"""Multi-process runs: 2 processes x 4 CPU devices against 1 process x 8 (issue 6).

The end-to-end tests run ``main.py`` in subprocesses on a tiny synthetic
Fashion-MNIST-layout dataset (gzip'd IDX files, 256 train / 64 test images):

  plain   1 process x 8 devices, no distributed runtime (the ordinary run);
  mp      2 processes x 4 devices through launch/local_multiprocess.py, first to
          step 4, then resumed from its checkpoint to step 6 (multi-process
          orbax save and restore, past an empty checkpoints/6 that process 0
          moves aside);
  single  1 process x 8 devices under the distributed runtime (the launcher with
          --num_processes=1), so collectives use gloo as in ``mp``.

``mp`` must equal ``single`` bitwise (parameters, optimizer and compressor state,
summary and every metrics record except wall-clock). Against ``plain`` the
accuracy, rounds, bytes and simulated time must be identical and the parameters
equal within 1e-6: XLA's in-process CPU all-reduce and gloo's all-reduce add the
4 workers' gradients in a different order, and float addition is not
associative, so the two differ by rounding (~1 ulp per step).

Process-local data: with 2 processes x 4 devices each process reads, from a
lazily normalised row source, exactly the training-batch and test rows of its own
devices and no others.

Failure tests: a missing process and an unreachable coordinator end with exit
status hfl.distributed.INIT_FAILED_EXIT_CODE and a one-line error within a
bounded time.
"""

import json
import os
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from hfl import data as data_lib
from hfl import distributed
from hfl import mesh as mesh_lib
from tests.helpers import write_idx

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHER = os.path.join(REPO, 'launch', 'local_multiprocess.py')
RUN_TIMEOUT_S = 170


# ------------------------------------------------------------------------------
# Helpers.
# ------------------------------------------------------------------------------

def make_dataset(directory: str, n_train: int = 256, n_test: int = 64, seed: int = 0) -> str:
  """Tiny learnable 10-class dataset in the Fashion-MNIST IDX layout."""
  rng = np.random.default_rng(seed)
  os.makedirs(directory, exist_ok=True)
  for split, n in (('train', n_train), ('t10k', n_test)):
    y = rng.integers(0, 10, n).astype(np.uint8)
    x = rng.integers(0, 200, (n, 28, 28)).astype(np.uint8)
    for c in range(10):  # a faint class-dependent stripe on noise
      x[y == c, 2 * c:2 * c + 3, :] += 40
    write_idx(os.path.join(directory, f'{split}-images-idx3-ubyte.gz'), x)
    write_idx(os.path.join(directory, f'{split}-labels-idx1-ubyte.gz'), y)
  return directory


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _env(**extra):
  env = dict(os.environ)
  for k in ('HFL_COORDINATOR', 'HFL_NUM_PROCESSES', 'HFL_PROCESS_ID', 'XLA_FLAGS'):
    env.pop(k, None)
  env['JAX_PLATFORMS'] = 'cpu'
  env.update(extra)
  return env


def main_args(workdir: str, data_dir: str, num_steps: int = 6):
  return ['--config=configs/smoke.py', f'--workdir={workdir}',
          f'--config.dataset.data_dir={data_dir}', f'--config.train.num_steps={num_steps}',
          '--config.train.checkpoint_every=0']


def run(cmd, timeout=RUN_TIMEOUT_S, **env):
  t0 = time.monotonic()
  proc = subprocess.run(cmd, cwd=REPO, env=_env(**env), capture_output=True, text=True,
                        timeout=timeout, check=False)
  return proc, time.monotonic() - t0


def run_ok(cmd, **env):
  proc, _ = run(cmd, **env)
  assert proc.returncode == 0, f'{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}'
  return proc


def launch(num_processes: int, args, **kw):
  return [sys.executable, LAUNCHER, f'--num_processes={num_processes}', '--quiet',
          '--init_timeout_s=60', '--timeout_s=160'] + [f'--{k}={v}' for k, v in kw.items()] + [
              '--'] + args


def load_state(workdir: str):
  """Numpy leaves of the newest checkpoint's TrainState, with their paths."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  root = os.path.join(os.path.abspath(workdir), 'checkpoints')
  step = max(int(s) for s in os.listdir(root) if s.isdigit())
  path = os.path.join(root, str(step), 'state')
  ckptr = ocp.PyTreeCheckpointer()
  tree = ckptr.metadata(path).item_metadata.tree
  args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree,
                      is_leaf=lambda x: hasattr(x, 'shape'))
  restored = ckptr.restore(path, restore_args=args)
  return step, [(jax.tree_util.keystr(p), np.asarray(x))
                for p, x in jax.tree_util.tree_leaves_with_path(restored)]


def read_outputs(workdir: str):
  with open(os.path.join(workdir, 'summary.json')) as f:
    summary = json.load(f)
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    records = [json.loads(line) for line in f if line.strip()]
  for r in [summary] + records:
    r.pop('wall_time_s', None)
  summary.pop('config')
  summary.pop('step_wall_s')  # measured wall-clock
  # One entry per start: its time and process count differ by construction.
  assert len(summary.pop('provenance')) >= 1
  return summary, records


# ------------------------------------------------------------------------------
# End to end: 2 x 4 against 1 x 8.
# ------------------------------------------------------------------------------

@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  root = tmp_path_factory.mktemp('mp')
  data = make_dataset(str(root / 'data'))
  out = {k: str(root / k) for k in ('plain', 'mp', 'single')}
  run_ok([sys.executable, 'main.py'] + main_args(out['plain'], data))
  # 2 processes x 4 devices, stopped after 4 steps and resumed to 6.
  run_ok(launch(2, main_args(out['mp'], data, num_steps=4)))
  step, _ = load_state(out['mp'])
  assert step == 4
  # An unusable newer step directory (a save cut short): process 0 moves it aside
  # between two barriers while process 1 waits, and both resume from step 4.
  os.makedirs(os.path.join(out['mp'], 'checkpoints', '6'))
  run_ok(launch(2, main_args(out['mp'], data, num_steps=6)))
  with open(os.path.join(out['mp'], 'logs', 'process_0.log')) as f:
    log = f.read()
  assert 'Resumed from' in log and 'checkpoints/6 skipped (empty directory' in log
  assert os.listdir(os.path.join(out['mp'], 'checkpoints_skipped')) == ['6']
  run_ok(launch(1, main_args(out['single'], data)))
  return out


@pytest.mark.multiprocess
def test_two_processes_equal_one_process_bitwise(runs):
  step_a, mp = load_state(runs['mp'])
  step_b, single = load_state(runs['single'])
  assert step_a == step_b == 6
  assert [p for p, _ in mp] == [p for p, _ in single]
  for (path, a), (_, b) in zip(mp, single):
    assert a.dtype == b.dtype and a.shape == b.shape, path
    np.testing.assert_array_equal(a, b, err_msg=path)
  summary, records = read_outputs(runs['mp'])
  # Stopped at 4 and extended to 6: said so, and otherwise the same as one session.
  assert summary.pop('changed_on_resume') == [dict(at_iteration=4,
                                                   changes=['train.num_steps: 4 -> 6'])]
  assert (summary, records) == read_outputs(runs['single'])


@pytest.mark.multiprocess
def test_two_processes_match_plain_single_process(runs):
  (s_mp, r_mp), (s_plain, r_plain) = read_outputs(runs['mp']), read_outputs(runs['plain'])
  for key in ('final_test_accuracy', 'best_test_accuracy', 'inter_dc_rounds',
              'intra_dc_iterations', 'bytes', 'sim_time_s', 'idle_s', 'time_to_target_s'):
    assert s_mp[key] == s_plain[key], key
  np.testing.assert_allclose(s_mp['final_test_loss'], s_plain['final_test_loss'], rtol=1e-5)
  assert [r['test_accuracy'] for r in r_mp] == [r['test_accuracy'] for r in r_plain]
  _, mp = load_state(runs['mp'])
  _, plain = load_state(runs['plain'])
  for (path, a), (_, b) in zip(mp, plain):
    if np.issubdtype(a.dtype, np.floating):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=path)
    else:
      np.testing.assert_array_equal(a, b, err_msg=path)


@pytest.mark.multiprocess
def test_only_process_zero_writes_logs(runs):
  logs = os.path.join(runs['mp'], 'logs')
  with open(os.path.join(logs, 'process_1.log')) as f:
    p1 = f.read()
  with open(os.path.join(logs, 'process_0.log')) as f:
    p0 = f.read()
  assert 'final test accuracy' in p0 and 'final test accuracy' not in p1
  assert 'eval step' in p0 and 'eval step' not in p1


# ------------------------------------------------------------------------------
# Failures are bounded and clear.
# ------------------------------------------------------------------------------

@pytest.mark.multiprocess
def test_missing_process_fails_clearly(tmp_path):
  data = make_dataset(str(tmp_path / 'data'))
  cmd = [sys.executable, LAUNCHER, '--num_processes=2', '--skip_process=1', '--quiet',
         '--init_timeout_s=8', '--timeout_s=90', '--'] + main_args(str(tmp_path / 'w'), data)
  proc, seconds = run(cmd, timeout=120)
  assert proc.returncode == distributed.INIT_FAILED_EXIT_CODE, proc.stderr[-3000:]
  assert seconds < 60
  assert 'a process is missing' in proc.stderr
  assert 'did not complete within 8 s' in proc.stderr


@pytest.mark.multiprocess
def test_unreachable_coordinator_fails_clearly(tmp_path):
  cmd = [sys.executable, 'main.py', '--config=configs/smoke.py',
         f'--workdir={tmp_path / "w"}', '--init_timeout_s=5']
  proc, seconds = run(cmd, timeout=120, HFL_COORDINATOR=f'127.0.0.1:{free_port()}',
                      HFL_NUM_PROCESSES='2', HFL_PROCESS_ID='1')
  assert proc.returncode == distributed.INIT_FAILED_EXIT_CODE, proc.stderr[-3000:]
  assert seconds < 60
  assert 'unreachable for 5 s' in proc.stderr


@pytest.mark.multiprocess
def test_incomplete_settings_fail_before_start(tmp_path):
  cmd = [sys.executable, 'main.py', '--config=configs/smoke.py',
         f'--workdir={tmp_path / "w"}', '--num_processes=2']
  proc, _ = run(cmd, timeout=120)
  assert proc.returncode == 2
  assert 'coordinator_address, process_id missing' in proc.stderr


# ------------------------------------------------------------------------------
# Unit tests (this process: 8 CPU devices from conftest.py).
# ------------------------------------------------------------------------------

def test_resolve_flags_env_and_errors():
  assert distributed.resolve(environ={}) is None
  info = distributed.resolve('10.0.0.1:1234', 4, 3, environ={})
  assert (info.num_processes, info.process_id, info.source) == (4, 3, 'flags')
  env = {'HFL_COORDINATOR': 'h:5', 'HFL_NUM_PROCESSES': '2', 'HFL_PROCESS_ID': '1'}
  info = distributed.resolve(environ=env)
  assert (info.coordinator_address, info.num_processes, info.process_id) == ('h:5', 2, 1)
  assert distributed.resolve(process_id=0, environ=env).process_id == 0  # flag wins
  with pytest.raises(distributed.DistributedInitError, match='process_id missing'):
    distributed.resolve('h:5', 2, environ={})
  with pytest.raises(distributed.DistributedInitError, match=r'must be in \[0, num_processes=2\)'):
    distributed.resolve('h:5', 2, 2, environ={})
  with pytest.raises(distributed.DistributedInitError, match='host:port'):
    distributed.resolve('nohost', 2, 0, environ={})
  with pytest.raises(distributed.DistributedInitError, match='must be an integer'):
    distributed.resolve(environ={'HFL_NUM_PROCESSES': 'two'})


def test_single_process_does_not_initialize(monkeypatch):
  for k in ('HFL_COORDINATOR', 'HFL_NUM_PROCESSES', 'HFL_PROCESS_ID'):
    monkeypatch.delenv(k, raising=False)
  called = []
  info = distributed.maybe_initialize(auto_detect=False, initialize_fn=called.append)
  assert not info.multi_process and not called
  info = distributed.maybe_initialize(num_processes=1, auto_detect=False,
                                      initialize_fn=called.append)
  assert info.num_processes == 1 and not called


def test_cpu_devices_per_process():
  info = distributed.ProcessInfo(2, 0, 'h:1', 'flags')
  assert distributed.cpu_devices_per_process(8, info) == 4
  with pytest.raises(ValueError, match='cannot be split evenly over 3 processes'):
    distributed.cpu_devices_per_process(8, distributed.ProcessInfo(3, 0, 'h:1', 'flags'))


def test_put_rows_and_put_global_equal_device_put_bitwise():
  mesh = mesh_lib.make_mesh(2, 4)
  rng = np.random.default_rng(0)
  source = rng.normal(size=(50, 3, 2)).astype(np.float32)
  idx = rng.integers(0, 50, (2, 4, 5))
  sh = NamedSharding(mesh, P('dc', 'worker'))
  got = distributed.put_rows(source, idx, sh)
  want = jax.device_put(source[idx], sh)
  assert got.sharding == want.sharding and got.shape == want.shape
  for a, b in zip(got.addressable_shards, want.addressable_shards):
    assert a.device == b.device and a.index == b.index
    np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))
  host = rng.normal(size=(3, 16, 2)).astype(np.float32)
  sh2 = NamedSharding(mesh, P(None, ('dc', 'worker')))
  np.testing.assert_array_equal(np.asarray(distributed.put_global(host, sh2)), host)
  metrics = {'loss': jax.device_put(np.arange(2, dtype=np.float32), NamedSharding(mesh, P('dc')))}
  np.testing.assert_array_equal(distributed.to_host(metrics)['loss'], [0, 1])


def test_to_host_stacked_equals_to_host_of_each_tree():
  mesh = mesh_lib.make_mesh(2, 4)
  sh = NamedSharding(mesh, P('dc'))
  rng = np.random.default_rng(1)
  trees = [{'loss': jax.device_put(rng.normal(size=2).astype(np.float32), sh),
            'bits': jax.device_put(rng.normal(size=2).astype(np.float32), sh)} for _ in range(3)]
  got = distributed.to_host_stacked(trees)
  assert len(got) == 3
  for g, t in zip(got, trees):
    want = distributed.to_host(t)
    assert set(g) == set(want)
    for k in want:
      np.testing.assert_array_equal(g[k], want[k])
  assert distributed.to_host_stacked([]) == []
  with pytest.raises(ValueError, match='share one shape'):
    distributed.to_host_stacked([{'a': trees[0]['loss'], 'b': jax.numpy.zeros(3)}])


class _CountingRaw:
  """Raw uint8 images that record every first-axis index they are asked for."""

  def __init__(self, raw):
    self.raw, self.requests = raw, []
    self.shape, self.dtype = raw.shape, raw.dtype

  def __getitem__(self, key):
    self.requests.append(np.asarray(key).copy())
    return self.raw[key]


def test_put_rows_reads_only_each_devices_rows_from_lazy_source():
  mesh = mesh_lib.make_mesh(2, 4)
  rng = np.random.default_rng(3)
  raw = rng.integers(0, 256, (60, 2, 2, 1), dtype=np.uint8)
  counting = _CountingRaw(raw)
  rows = data_lib.NormalisedRows(counting, data_lib.fit_normaliser(raw))
  idx = rng.integers(0, 60, (2, 4, 5))
  sh = NamedSharding(mesh, P('dc', 'worker'))
  got = distributed.put_rows(rows, idx, sh)
  # One read per addressable device, of exactly its (dc, worker) block of idx.
  want = sorted(idx[d, w].ravel().tolist() for d in range(2) for w in range(4))
  assert sorted(r.ravel().tolist() for r in counting.requests) == want
  np.testing.assert_array_equal(np.asarray(got), np.asarray(rows)[idx])


# Run by each of 2 processes (4 CPU devices each): places a training batch and
# the padded test set from lazy row sources and writes which rows it read.
_LOCALITY_SCRIPT = r"""
import json, sys
import numpy as np
sys.path.insert(0, {repo!r})
from hfl import distributed, mesh as mesh_lib
distributed.maybe_initialize({address!r}, 2, int(sys.argv[1]), timeout_s=60, auto_detect=False)
mesh_lib.configure_cpu_devices(4)
import jax
from jax.sharding import NamedSharding, PartitionSpec as P
from hfl import data
from hfl import train

class Counting:
  def __init__(self, raw):
    self.raw, self.shape, self.dtype, self.rows = raw, raw.shape, raw.dtype, []
  def __getitem__(self, key):
    self.rows += np.asarray(key).ravel().tolist()
    return self.raw[key]

rng = np.random.default_rng(0)  # the same data and batch in both processes
raw = rng.integers(0, 256, (200, 3, 3, 1), dtype=np.uint8)
norm = data.fit_normaliser(raw)
train_src, test_src = Counting(raw), Counting(raw[:37])
mesh = mesh_lib.make_mesh(2, 4)
idx = rng.integers(0, 200, (2, 4, 6))
batch = distributed.put_rows(data.NormalisedRows(train_src, norm), idx,
                             NamedSharding(mesh, P('dc', 'worker')))
want = np.asarray(data.NormalisedRows(raw, norm)[idx])
for shard in batch.addressable_shards:
  np.testing.assert_array_equal(np.asarray(shard.data), want[shard.index])
# The test set as make_eval places it: 37 rows padded to 40, over all 8 devices.
rows = np.arange(40).reshape(5, 8)
test = distributed.put_rows(data.PaddedRows(data.NormalisedRows(test_src, norm), 40),
                            rows, NamedSharding(mesh, P(None, ('dc', 'worker'))))
positions = [[int(d), int(w)] for d in range(2) for w in range(4)
             if mesh.devices[d, w].process_index == jax.process_index()]
test_cols = sorted({{c for s in test.addressable_shards for c in range(40)[s.index[1]]}})
json.dump(dict(positions=positions, train_rows=train_src.rows, test_rows=test_src.rows,
               test_cols=test_cols), open(sys.argv[2], 'w'))
"""


@pytest.mark.multiprocess
def test_two_processes_read_only_their_own_rows(tmp_path):
  script = tmp_path / 'locality.py'
  script.write_text(_LOCALITY_SCRIPT.format(repo=REPO, address=f'127.0.0.1:{free_port()}'))
  procs = [subprocess.Popen([sys.executable, str(script), str(p), str(tmp_path / f'{p}.json')],
                            cwd=REPO, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True) for p in range(2)]
  for proc in procs:
    out, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, out[-3000:]
  results = [json.load(open(tmp_path / f'{p}.json')) for p in range(2)]
  idx = np.random.default_rng(0)
  idx.integers(0, 256, (200, 3, 3, 1), dtype=np.uint8)  # same stream as the script
  idx = idx.integers(0, 200, (2, 4, 6))
  # 'dc' spans the processes: process p holds DC p's 4 workers.
  assert [sorted(map(tuple, r['positions'])) for r in results] == [
      [(p, w) for w in range(4)] for p in range(2)]
  for r in results:
    own = [idx[d, w] for d, w in r['positions']]
    assert sorted(r['train_rows']) == sorted(np.concatenate(own).tolist())
    # Test rows: only those of its own devices' columns, padding never read.
    cols = r['test_cols']
    assert len(cols) == 4  # 4 of the 8 columns (devices)
    assert sorted(r['test_rows']) == sorted(
        i for i in np.arange(40).reshape(5, 8)[:, cols].ravel().tolist() if i < 37)
  assert set(results[0]['test_cols']).isdisjoint(results[1]['test_cols'])


# ------------------------------------------------------------------------------
# Issue 18: launchers and start-up, as a user first meets them.
# ------------------------------------------------------------------------------

EMULATED_WAN = os.path.join(REPO, 'launch', 'emulated_wan.py')


def run_in(cwd, cmd, timeout=RUN_TIMEOUT_S, **env):
  """Runs ``cmd`` in directory ``cwd`` (not the checkout); returns the CompletedProcess."""
  return subprocess.run(cmd, cwd=cwd, env=_env(**env), capture_output=True, text=True,
                        timeout=timeout, check=False)


def _one_line_error(proc, *needles):
  """Exit status 2 and a single stderr line containing every needle."""
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
  assert len(lines) == 1, proc.stderr
  for n in needles:
    assert n in lines[0], (n, lines[0])


def _checkout_files():
  out = subprocess.run(['git', 'status', '--porcelain', '--ignored', '--untracked-files=all'],
                       cwd=REPO, capture_output=True, text=True, check=True).stdout
  return {l[3:] for l in out.splitlines() if '__pycache__' not in l and '.pytest_cache' not in l}


@pytest.mark.parametrize('flags', [['--wan_latency_ms=inf'], ['--wan_latency_ms=nan'],
                                   ['--wan_mbps=inf'], ['--timeout_s=nan'],
                                   ['--', '--config.network.wan_latency_s=inf']])
@pytest.mark.multiprocess
def test_emulated_wan_refuses_non_finite_settings_before_anything(tmp_path, flags):
  """Fault 1: an infinite delay used to kill the delay line mid-run (traffic then
  bypassed it) and write "Infinity" into wan_info.json; now it is refused first,
  in one line, with nothing created (checked before root, so runs anywhere)."""
  extra = flags[1:] if flags[0] == '--' else []
  cmd = [sys.executable, EMULATED_WAN] + (flags if not extra else []) + [
      '--', f'--config={REPO}/configs/smoke.py', '--workdir=w'] + extra
  proc = run_in(tmp_path, cmd, timeout=60)
  _one_line_error(proc, 'must be a finite number')
  assert not (tmp_path / 'w').exists()


@pytest.mark.parametrize('flags,field', [
    (['--wan_mbps=1e12'], '--wan_mbps=1e+12'),
    (['--', '--config.network.wan_bandwidth_mbps=2e6'], 'network.wan_bandwidth_mbps=2e+06')])
@pytest.mark.multiprocess
def test_emulated_wan_refuses_a_rate_tc_cannot_shape_before_anything(tmp_path, flags, field):
  extra = flags[1:] if flags[0] == '--' else []
  cmd = [sys.executable, EMULATED_WAN] + (flags if not extra else []) + [
      '--', f'--config={REPO}/configs/smoke.py', '--workdir=w'] + extra
  proc = run_in(tmp_path, cmd, timeout=60)
  _one_line_error(proc, f'{field} Mbit/s exceeds 1e+06 (1 Tbit/s)')
  assert not (tmp_path / 'w').exists()


@pytest.mark.parametrize('flag', ['--timeout_s=nan', '--grace_s=inf', '--timeout_s=-1'])
@pytest.mark.multiprocess
def test_local_launcher_refuses_non_finite_settings(tmp_path, flag):
  proc = run_in(tmp_path, [sys.executable, LAUNCHER, flag, '--',
                           f'--config={REPO}/configs/smoke.py', '--workdir=w'], timeout=60)
  _one_line_error(proc, flag.split('=')[0])
  assert not (tmp_path / 'w').exists()


def test_json_writer_refuses_or_nulls_non_finite_numbers(tmp_path):
  from hfl import metrics  # pylint: disable=g-import-not-at-top

  def strict(text):  # a strict parser: NaN / Infinity tokens are errors
    return json.loads(text, parse_constant=lambda c: pytest.fail(f'non-standard token {c}'))

  path = str(tmp_path / 'info.json')
  metrics.write_json(path, {'a': 1.5, 'b': [np.float32(2.0), np.int64(3)], 'c': None})
  before = open(path).read()
  assert strict(before) == {'a': 1.5, 'b': [2.0, 3], 'c': None}
  for bad in (float('inf'), float('nan'), np.float32('-inf')):
    with pytest.raises(ValueError, match=r'info\.json\.x\.y\[1\] = '):
      metrics.write_json(path, {'x': {'y': [0.0, bad]}})
    assert open(path).read() == before  # the old file is untouched
  assert strict(metrics.dumps({'x': [float('nan'), 1.0]}, 'null')) == {'x': [None, 1.0]}
  with pytest.raises(ValueError, match='nonfinite'):
    metrics.dumps({}, 'zero')
  # metrics.jsonl records too.
  w = metrics.MetricsWriter(str(tmp_path))
  with pytest.raises(ValueError, match='test_loss = nan'):
    w.write({'step': 1, 'test_loss': float('nan')})
  w.close()
  assert not os.path.exists(tmp_path / 'metrics.jsonl') or not open(
      tmp_path / 'metrics.jsonl').read().strip()


def test_every_json_file_is_written_through_the_strict_writer():
  """Fault 1: no module writes JSON with Python's default (NaN/Infinity-emitting)
  json.dump/json.dumps; they use hfl.metrics.dumps / write_json (allow_nan=False).
  hfl/sweep.py and hfl/report/ are left to issue 18's sweep/report part."""
  import re  # pylint: disable=g-import-not-at-top
  offenders = []
  for top in ('hfl', 'launch', 'bench', 'main.py'):
    root = os.path.join(REPO, top)
    paths = [root] if top.endswith('.py') else [
        os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith('.py')]
    for path in paths:
      rel = os.path.relpath(path, REPO)
      if rel in ('hfl/metrics.py', 'hfl/sweep.py') or rel.startswith('hfl/report'):
        continue
      for i, line in enumerate(open(path), 1):
        if re.search(r'json\.dumps?\(', line):
          offenders.append(f'{rel}:{i}: {line.strip()}')
  assert not offenders, offenders
  from hfl import metrics  # pylint: disable=g-import-not-at-top
  import inspect  # pylint: disable=g-import-not-at-top
  assert 'allow_nan=False' in inspect.getsource(metrics.dumps)


def _emulated_first_failure():
  sys.path.insert(0, os.path.join(REPO, 'launch'))
  import emulated_wan  # pylint: disable=g-import-not-at-top
  return emulated_wan.first_failure


@pytest.mark.multiprocess
def test_emulated_wan_watch_names_a_dead_helper_or_process(tmp_path):
  """Fault 1: the launcher watches its helpers, not only the training processes."""
  first_failure = _emulated_first_failure()
  log = tmp_path / 'helper.log'  # an earlier run's words, then this run's (logs are appended to)
  log.write_text('OldError: an earlier run\n')
  start = log.stat().st_size
  with open(log, 'a') as f:
    f.write('OverflowError: timestamp out of range\n')
  sleep = lambda: subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])
  dead = subprocess.Popen([sys.executable, '-c', 'raise SystemExit(3)'])
  dead.wait()
  running = {0: (sleep(), str(log), start), 1: (sleep(), str(log), start)}
  try:
    assert first_failure(running, {}) is None
    code, msg = first_failure(running, {'the delay line': (dead, str(log), start)})
    assert code == 1 and 'the delay line' in msg and 'status 3' in msg
    assert 'OverflowError' in msg and 'OldError' not in msg  # this run's last words only
    code, msg = first_failure({0: running[0], 1: (dead, str(log), start)}, {})
    assert code == 3 and 'process 1 (DC 1) failed with status 3' in msg
    assert 'OverflowError' in msg and 'OldError' not in msg
  finally:
    for q, *_ in running.values():
      q.kill()
      q.wait()


@pytest.mark.multiprocess
def test_launcher_port_in_use_is_named_before_anything_starts(tmp_path):
  """Fault 3: a taken --port said "Failed to start RPC server ... before any JAX
  operation"; now the launcher names the port and starts nothing."""
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    s.listen()
    port = s.getsockname()[1]
    proc = run_in(tmp_path, [sys.executable, LAUNCHER, f'--port={port}', '--',
                             f'--config={REPO}/configs/smoke.py', '--workdir=w'], timeout=60)
    _one_line_error(proc, f'port {port} is already in use')
    assert not (tmp_path / 'w').exists()
    # main.py by hand, as process 0 of 2: the same, before JAX starts.
    proc = run_in(tmp_path, [sys.executable, os.path.join(REPO, 'main.py'),
                             f'--config={REPO}/configs/smoke.py', '--workdir=w',
                             f'--coordinator_address=127.0.0.1:{port}', '--num_processes=2',
                             '--process_id=0'], timeout=120)
    _one_line_error(proc, f'port {port} is already in use')
    assert not (tmp_path / 'w').exists()


@pytest.mark.multiprocess
def test_launcher_missing_workdir_or_config_starts_nothing(tmp_path):
  """Fault 3: a missing --workdir was caught only after both processes had started,
  leaving ./hfl_logs/ behind."""
  proc = run_in(tmp_path, [sys.executable, LAUNCHER, '--', f'--config={REPO}/configs/smoke.py'],
                timeout=60)
  _one_line_error(proc, '--workdir')
  proc = run_in(tmp_path, [sys.executable, LAUNCHER, '--', '--config=configs/smoke.py',
                           '--workdir=w'], timeout=60)
  _one_line_error(proc, 'configs/smoke.py', str(tmp_path))  # relative to the caller
  proc = run_in(tmp_path, [sys.executable, EMULATED_WAN, '--',
                           f'--config={REPO}/configs/smoke.py'], timeout=60)
  _one_line_error(proc, '--workdir')
  assert os.listdir(tmp_path) == []


@pytest.mark.multiprocess
def test_launcher_failure_tail_is_this_sessions_output_only(tmp_path):
  """Process logs are appended to, so the tail printed for a failed process used to
  show an earlier session's last lines (here its OldError); now only this session's."""
  fake = tmp_path / 'fake_python'  # stands in for `python main.py ...`: process 1 fails
  fake.write_text('#!/bin/sh\nif [ "$HFL_PROCESS_ID" = 1 ]; then echo "this session: boom"; '
                  'exit 3; fi\n')
  fake.chmod(0o755)
  logs = tmp_path / 'w' / 'logs'
  logs.mkdir(parents=True)
  earlier = ''.join(f'earlier session line {i}\n' for i in range(20)) + 'OldError: stale\n'
  for i in (0, 1):
    (logs / f'process_{i}.log').write_text(earlier)
  proc = run_in(tmp_path, [sys.executable, LAUNCHER, '--num_processes=2', '--quiet',
                           f'--python={fake}', '--grace_s=1', '--',
                           f'--config={REPO}/configs/smoke.py', '--workdir=w'], timeout=120)
  assert proc.returncode == 3, proc.stderr
  assert "process 1 failed with status 3" in proc.stderr, proc.stderr
  assert "Tail of this session's output in" in proc.stderr, proc.stderr
  tail = proc.stderr.split(f"{logs / 'process_1.log'}:\n")[1]
  assert tail.strip() == 'this session: boom', proc.stderr  # no earlier line, no OldError
  assert (logs / 'process_1.log').read_text().startswith(earlier)  # the log keeps it all
  sys.path.insert(0, os.path.join(REPO, 'launch'))
  import common  # pylint: disable=g-import-not-at-top
  log = str(logs / 'process_1.log')
  assert common.tail(log, 2).startswith('[launch] ') and common.tail(log, 1) == (
      'this session: boom\n')  # from the start (the default): the whole file's last lines
  assert common.tail(log, start=os.path.getsize(log)) == '(no output)'
  assert common.tail(str(tmp_path / 'nope.log')) == '(no log)'


@pytest.mark.multiprocess
def test_emulated_wan_without_root_is_one_line_and_creates_nothing(tmp_path):
  """Fault 3: without root it printed a traceback after creating WORKDIR/logs."""
  script = ('import os, runpy, sys; os.geteuid = lambda: 1000; '
            f'sys.argv = ["emulated_wan.py", "--", "--config={REPO}/configs/smoke.py", '
            '"--workdir=w"]; runpy.run_path(sys.argv_path, run_name="__main__")')
  script = script.replace('sys.argv_path', repr(EMULATED_WAN))
  proc = run_in(tmp_path, [sys.executable, '-c', script], timeout=60)
  _one_line_error(proc, 'needs root', 'sudo')
  assert os.listdir(tmp_path) == []


@pytest.mark.multiprocess
def test_relative_paths_are_the_callers(tmp_path):
  """Fault 2: from outside the checkout, a relative --workdir and --config mean the
  caller's directory for the launcher, every process and main.py; nothing is
  written into the checkout."""
  data = make_dataset(str(tmp_path / 'data'))
  caller = tmp_path / 'caller'
  caller.mkdir()
  (caller / 'mycfg.py').write_text('from configs import smoke\n\n\ndef get_config(arg=None):\n'
                                   '  return smoke.get_config(arg)\n')
  before = _checkout_files()
  args = ['--config=mycfg.py', f'--config.dataset.data_dir={data}',
          '--config.train.num_steps=2', '--config.train.checkpoint_every=1']
  proc = run_in(caller, [sys.executable, LAUNCHER, '--num_processes=2', '--quiet',
                         '--init_timeout_s=60', '--timeout_s=160', '--'] + args
                + ['--workdir=relrun'])
  assert proc.returncode == 0, proc.stderr[-3000:]
  proc = run_in(caller, [sys.executable, os.path.join(REPO, 'main.py')] + args
                + ['--workdir=direct'])
  assert proc.returncode == 0, proc.stderr[-3000:]
  for run_dir in ('relrun', 'direct'):
    for name in ('summary.json', 'metrics.jsonl', 'config.json', 'checkpoints'):
      assert (caller / run_dir / name).exists(), (run_dir, name)
  assert (caller / 'relrun' / 'logs' / 'process_1.log').exists()
  assert _checkout_files() == before


def test_dc_placement_problem_names_straddling_dcs():
  """Fault 4 (unit): which DCs straddle processes, and how to fix it."""
  assert distributed.dc_placement_problem(np.array([[0, 0], [1, 1]])) is None
  assert distributed.dc_placement_problem(np.array([[0, 0], [1, 1]]), True) is None
  msg = distributed.dc_placement_problem(np.array([[0, 0], [0, 1], [1, 1]]))
  assert 'DC 1 spans processes 0, 1' in msg and 'DC 0' not in msg and 'DC 2' not in msg
  assert 'mesh.num_dcs=3 x mesh.workers_per_dc=2 on 2 processes' in msg
  assert 'divides mesh.num_dcs (1, 3)' in msg
  # Two whole DCs in one process: fine in general, not for the emulated WAN.
  two = np.array([[0, 0], [0, 0], [1, 1], [1, 1]])
  assert distributed.dc_placement_problem(two) is None
  msg = distributed.dc_placement_problem(two, one_dc_per_process=True)
  assert 'process 0 holds DCs 0, 1' in msg and 'process 1 holds DCs 2, 3' in msg
  assert 'mesh.num_dcs=4 processes (one per DC)' in msg


@pytest.mark.multiprocess
def test_dc_straddling_processes_warns_or_is_refused(tmp_path):
  """Fault 4: 2 processes, 3 DCs x 2 workers: DC 1 spans both processes. The local
  launcher warns (process 0's log) and runs; with the emulated WAN's
  one-DC-per-process model (HFL_ONE_DC_PER_PROCESS=1) every process refuses."""
  data = make_dataset(str(tmp_path / 'data'))
  args = ['--config=configs/smoke.py', f'--config.dataset.data_dir={data}',
          '--config.mesh.num_dcs=3', '--config.mesh.workers_per_dc=2',
          '--config.network.dc_speed=(1.0, 1.0, 1.0)', '--config.train.num_steps=2',
          '--config.train.checkpoint_every=0']
  proc, _ = run(launch(2, args + [f'--workdir={tmp_path / "refused"}']), timeout=150,
                HFL_ONE_DC_PER_PROCESS='1')
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert 'the emulated WAN runs each DC as one process' in proc.stderr
  assert 'DC 1 spans processes 0, 1' in proc.stderr
  assert not (tmp_path / 'refused' / 'summary.json').exists()
  proc, _ = run(launch(2, args + [f'--workdir={tmp_path / "warned"}']), timeout=170)
  assert proc.returncode == 0, proc.stderr[-3000:]
  log = (tmp_path / 'warned' / 'logs' / 'process_0.log').read_text()
  assert 'warning: DC 1 spans processes 0, 1' in log
  assert 'use a process count that divides mesh.num_dcs (1, 3)' in log


def _netns_unavailable() -> str:
  """Why the emulated WAN cannot run here, or '' when it can."""
  if os.geteuid() != 0:
    return 'needs root (network namespaces, tc)'
  probe = subprocess.run(['ip', 'netns', 'list'], capture_output=True, text=True, check=False)
  if probe.returncode:
    return f'ip netns unavailable: {probe.stderr.strip()}'
  return ''


needs_netns = pytest.mark.skipif(bool(_netns_unavailable()), reason=_netns_unavailable())


@needs_netns
@pytest.mark.multiprocess
def test_emulated_wan_run_in_callers_directory(tmp_path):
  """Fault 2 for the emulated WAN: relative --workdir/--config are the caller's;
  wan_info.json is strict JSON."""
  data = make_dataset(str(tmp_path / 'data'))
  caller = tmp_path / 'caller'
  caller.mkdir()
  (caller / 'mycfg.py').write_text('from configs import smoke\n\n\ndef get_config(arg=None):\n'
                                   '  return smoke.get_config(arg)\n')
  proc = run_in(caller, [sys.executable, EMULATED_WAN, '--wan_latency_ms=5', '--timeout_s=300',
                         '--', '--config=mycfg.py', f'--config.dataset.data_dir={data}',
                         '--config.train.num_steps=2', '--config.train.checkpoint_every=0',
                         '--workdir=rel'], timeout=330)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  info = json.loads((caller / 'rel' / 'wan_info.json').read_text(),
                    parse_constant=lambda c: pytest.fail(c))
  assert info['one_way_delay_ms'] == 5.0
  assert (caller / 'rel' / 'summary.json').exists()
  assert (caller / 'rel' / 'logs' / 'process_1.log').exists()


@needs_netns
@pytest.mark.multiprocess
def test_emulated_wan_fails_when_its_delay_line_dies(tmp_path):
  """Fault 1: the delay line dying mid-run used to go unnoticed (exit 0, no delay).
  Only where the kernel lacks netem is there a delay line to kill."""
  _emulated_first_failure()  # imports launch/emulated_wan.py
  import emulated_wan  # pylint: disable=g-import-not-at-top
  if emulated_wan.has_netem():
    pytest.skip('this kernel has netem: the launcher uses no delay line')
  data = make_dataset(str(tmp_path / 'data'))
  cmd = [sys.executable, EMULATED_WAN, '--wan_latency_ms=5', '--timeout_s=300', '--',
         '--config=configs/smoke.py', f'--config.dataset.data_dir={data}',
         '--config.train.num_steps=100000', '--config.train.checkpoint_every=0',
         f'--workdir={tmp_path / "w"}']
  proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  try:
    for _ in range(20):  # the launcher names the delay line's pid on stderr
      line = proc.stderr.readline()
      if 'delay line (pid' in line or not line:
        break
    assert 'delay line (pid' in line, line
    pid = int(line.split('(pid ')[1].split(')')[0])
    log = tmp_path / 'w' / 'logs' / 'process_0.log'
    deadline = time.monotonic() + 200
    while 'step' not in (log.read_text() if log.exists() else '') and time.monotonic() < deadline:
      time.sleep(1)
    os.killpg(pid, 9)  # the delay line runs in its own session
    _, err = proc.communicate(timeout=120)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == 1, err[-3000:]
  assert 'error: the delay line (pid' in err and 'mid-run' in err
  assert subprocess.run(['ip', 'netns', 'list'], capture_output=True, text=True,
                        check=False).stdout.count('hflwan') == 0


# ------------------------------------------------------------------------------
# Launcher pre-checks (in this process: nothing is started) and a backend that
# does not start.
# ------------------------------------------------------------------------------

def _local_launcher():
  sys.path.insert(0, os.path.join(REPO, 'launch'))
  import local_multiprocess  # pylint: disable=g-import-not-at-top
  return local_multiprocess


_SMOKE = f'--config={REPO}/configs/smoke.py'


@pytest.mark.parametrize('argv, needles', [
    (['--', _SMOKE, '--workdir=afile'], ['--workdir=afile', 'not a directory']),
    (['--log_dir=afile', '--', _SMOKE, '--workdir=w'], ['--log_dir=afile', 'not a directory']),
    (['--log_dir=afile/logs', '--', _SMOKE, '--workdir=w'], ['afile is a file']),
    (['--python=/nonexistent/py', '--', _SMOKE, '--workdir=w'],
     ['--python=/nonexistent/py', 'not an executable']),
    (['--num_processes=3', '--', _SMOKE, '--workdir=w'],
     ['--num_processes=3', 'mesh.num_dcs=2', 'mesh.workers_per_dc=4', 'cannot be split']),
    (['--num_processes=2', '--', _SMOKE, '--workdir=w', '--config.mesh.num_dcs=3',
      '--config.mesh.workers_per_dc', '1'], ['mesh.num_dcs=3', 'mesh.workers_per_dc=1']),
    ([_SMOKE, '--workdir=w'], ['unrecognized arguments', "main.py's flags go after --"]),
    (['--num_processes=0', '--', _SMOKE, '--workdir=w'], ['--num_processes=0 must be >= 1']),
    # An id out of range used to be ignored: every process started.
    (['--skip_process=2', '--', _SMOKE, '--workdir=w'],
     ['--skip_process=2 is not a process id: with --num_processes=2 it must be in 0..1']),
    (['--skip_process=0', '--skip_process=-1', '--', _SMOKE, '--workdir=w'],
     ['--skip_process=-1 is not a process id', 'must be in 0..1']),
    (['--skip_process=0', '--skip_process=1', '--', _SMOKE, '--workdir=w'],
     ['--skip_process skips all 2 process(es): nothing would run']),
])
def test_local_launcher_refuses_bad_launch_before_writing(tmp_path, monkeypatch, capsys,
                                                          argv, needles):
  """A workdir or log dir that is a file, a missing interpreter, a mesh the process
  count does not split, and main.py flags before ``--`` used to end in tracebacks
  (some after logs were written, or after every process started), and a
  --skip_process out of range was ignored; now one line, exit 2, nothing written."""
  (tmp_path / 'afile').write_text('keep')
  monkeypatch.chdir(tmp_path)
  code = _local_launcher().main(argv)
  err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
  assert code == 2 and len(err) == 1 and 'error:' in err[0], err
  for n in needles:
    assert n in err[0], (n, err[0])
  assert os.listdir(tmp_path) == ['afile'] and (tmp_path / 'afile').read_text() == 'keep'


@pytest.mark.parametrize('failure', [AssertionError(), RuntimeError(
    "Unable to initialize backend 'cuda': no CUDA devices")])
def test_backend_that_does_not_start_is_named(monkeypatch, failure):
  """JAX_PLATFORMS=cuda without a GPU ended in a bare AssertionError from jax.devices()."""
  def broken():
    raise failure
  monkeypatch.setattr(jax, 'devices', broken)
  before = jax.config.jax_platforms
  jax.config.update('jax_platforms', 'cuda')
  try:
    with pytest.raises(ValueError) as e:  # main.py's error line, exit status 2
      mesh_lib.make_mesh(2, 4)
  finally:
    jax.config.update('jax_platforms', before)
  assert isinstance(e.value, mesh_lib.BackendUnavailableError)
  msg = str(e.value)
  assert "JAX_PLATFORMS='cuda'" in msg and 'cpu always does' in msg
  assert (str(failure) or 'no device of that platform') in msg


def test_main_names_a_backend_that_does_not_start(tmp_path):
  proc, _ = run([sys.executable, 'main.py', '--config=configs/smoke.py',
                 f'--workdir={tmp_path / "w"}'], timeout=120, JAX_PLATFORMS='nosuchplatform')
  _one_line_error(proc, "JAX_PLATFORMS='nosuchplatform'", 'Set JAX_PLATFORMS to a platform')
  assert not (tmp_path / 'w').exists()


def test_main_refuses_more_simulated_cpu_devices_than_xla_cpu_collectives_can_meet(tmp_path):
  # 2 x 129 = 258 > MAX_CPU_DEVICES: with mesh.simulate='devices' refused before JAX's
  # backend starts, nothing written ('auto' runs such a hierarchy vmapped on one device).
  assert 2 * 129 > mesh_lib.MAX_CPU_DEVICES >= 2 * 128
  proc, _ = run([sys.executable, 'main.py', '--config=configs/smoke.py',
                 f'--workdir={tmp_path / "w"}', '--config.mesh.workers_per_dc=129',
                 '--config.mesh.simulate=devices'], timeout=120)
  _one_line_error(proc, 'mesh.num_dcs * mesh.workers_per_dc = 258 simulated CPU devices',
                  f'at most {mesh_lib.MAX_CPU_DEVICES}')
  assert not (tmp_path / 'w').exists()


def _sigterm_after_first_checkpoint(cmd, workdir):
  """Starts ``cmd``, sends it SIGTERM once WORKDIR holds a checkpoint and the lock,
  and returns (the ended Popen, its stderr)."""
  proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  try:
    deadline = time.monotonic() + 150
    ckpts = workdir / 'checkpoints'
    while not (ckpts.is_dir() and any(n.isdigit() for n in os.listdir(ckpts))):
      assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
      time.sleep(0.5)
    assert (workdir / '.lock').is_file()
    proc.terminate()
    _, err = proc.communicate(timeout=90)
  finally:
    proc.kill()
  return proc, err


@pytest.mark.slow
def test_sigterm_stops_a_run_like_ctrl_c_and_it_resumes(tmp_path):
  """SIGTERM (kill, a scheduler's stop) unwinds like Ctrl-C: exit status 143, one
  line naming the checkpoint to resume from, the workdir's lock removed; the same
  command then resumes and finishes."""
  data = make_dataset(str(tmp_path / 'data'))
  workdir = tmp_path / 'w'
  cmd = [sys.executable, 'main.py'] + main_args(str(workdir), data, num_steps=100000)[:-1] + [
      '--config.train.checkpoint_every=1', '--config.train.eval_every=50',
      '--config.train.log_every=50']
  ckpts = workdir / 'checkpoints'
  proc, err = _sigterm_after_first_checkpoint(cmd, workdir)
  assert proc.returncode == 143, err[-2000:]
  assert 'Traceback' not in err, err[-3000:]  # the save in flight finished first
  last = err.strip().splitlines()[-1]
  assert last.startswith(f'interrupted by SIGTERM: rerun the same command to resume {workdir} '
                         'from its checkpoint of iteration '), last
  step = int(last.rsplit(' ', 1)[1].rstrip('.'))
  assert step >= 2 and (ckpts / str(step)).is_dir()
  assert not (workdir / '.lock').exists()
  resumed = run_ok(cmd[:-3] + [f'--config.train.num_steps={step + 4}',
                               '--config.train.checkpoint_every=1'])
  assert f'Resumed from {workdir} at step {step}' in resumed.stderr
  summary = json.loads((workdir / 'summary.json').read_text())
  assert summary['intra_dc_iterations'] == step + 4


@pytest.mark.parametrize('field', ['num_dcs', 'workers_per_dc'])
def test_main_names_an_empty_mesh_axis_before_the_backend_starts(tmp_path, field):
  proc, _ = run([sys.executable, 'main.py', '--config=configs/smoke.py',
                 f'--workdir={tmp_path / "w"}', f'--config.mesh.{field}=0'], timeout=120)
  _one_line_error(proc, f'mesh.{field}=0 must be >= 1')
  assert not (tmp_path / 'w').exists()


@pytest.mark.multiprocess
def test_launcher_stopped_by_sigterm_lets_its_processes_stop_cleanly(tmp_path):
  """SIGTERM to local_multiprocess.py reaches every process as SIGTERM (main.py
  finishes a checkpoint save in progress, then stops): exit 143 and one line; no
  half-written checkpoint, no lock left; each process's log ends with its own
  interrupt line, and a rerun appends to the logs."""
  data = make_dataset(str(tmp_path / 'data'))
  workdir = tmp_path / 'w'
  args = main_args(str(workdir), data, num_steps=100000)[:-1] + [
      '--config.train.checkpoint_every=1', '--config.train.log_every=50']
  ckpts = workdir / 'checkpoints'
  proc, err = _sigterm_after_first_checkpoint(launch(2, args), workdir)
  assert proc.returncode == 143, err[-3000:]
  assert err.strip().splitlines()[-1].startswith('[launch] interrupted: the processes were '
                                                 'stopped (SIGTERM')
  assert not [n for n in os.listdir(ckpts) if not n.isdigit()]
  assert not (workdir / '.lock').exists()
  for i in range(2):
    log = (workdir / 'logs' / f'process_{i}.log').read_text().strip().splitlines()
    assert log[0].startswith('[launch] ') and log[0].endswith(f'process {i} of 2 starts')
    assert log[-1].startswith(f'interrupted by SIGTERM: rerun the same command to resume '
                              f'{workdir} from its checkpoint of iteration '), log[-3:]
