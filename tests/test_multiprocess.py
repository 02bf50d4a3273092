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

import gzip
import json
import os
import socket
import struct
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

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHER = os.path.join(REPO, 'launch', 'local_multiprocess.py')
RUN_TIMEOUT_S = 170


# ------------------------------------------------------------------------------
# Helpers.
# ------------------------------------------------------------------------------

def write_idx(path: str, arr: np.ndarray) -> None:
  """Writes a gzip'd IDX file of uint8 data (magic 0x0000 08 NDIM)."""
  arr = np.ascontiguousarray(arr, np.uint8)
  header = bytes([0, 0, 0x08, arr.ndim]) + b''.join(struct.pack('>I', d) for d in arr.shape)
  with gzip.open(path, 'wb') as f:
    f.write(header + arr.tobytes())


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


def test_two_processes_equal_one_process_bitwise(runs):
  step_a, mp = load_state(runs['mp'])
  step_b, single = load_state(runs['single'])
  assert step_a == step_b == 6
  assert [p for p, _ in mp] == [p for p, _ in single]
  for (path, a), (_, b) in zip(mp, single):
    assert a.dtype == b.dtype and a.shape == b.shape, path
    np.testing.assert_array_equal(a, b, err_msg=path)
  assert read_outputs(runs['mp']) == read_outputs(runs['single'])


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

def test_missing_process_fails_clearly(tmp_path):
  data = make_dataset(str(tmp_path / 'data'))
  cmd = [sys.executable, LAUNCHER, '--num_processes=2', '--skip_process=1', '--quiet',
         '--init_timeout_s=8', '--timeout_s=90', '--'] + main_args(str(tmp_path / 'w'), data)
  proc, seconds = run(cmd, timeout=120)
  assert proc.returncode == distributed.INIT_FAILED_EXIT_CODE, proc.stderr[-3000:]
  assert seconds < 60
  assert 'a process is missing' in proc.stderr
  assert 'did not complete within 8 s' in proc.stderr


def test_unreachable_coordinator_fails_clearly(tmp_path):
  cmd = [sys.executable, 'main.py', '--config=configs/smoke.py',
         f'--workdir={tmp_path / "w"}', '--init_timeout_s=5']
  proc, seconds = run(cmd, timeout=120, HFL_COORDINATOR=f'127.0.0.1:{free_port()}',
                      HFL_NUM_PROCESSES='2', HFL_PROCESS_ID='1')
  assert proc.returncode == distributed.INIT_FAILED_EXIT_CODE, proc.stderr[-3000:]
  assert seconds < 60
  assert 'unreachable for 5 s' in proc.stderr


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
