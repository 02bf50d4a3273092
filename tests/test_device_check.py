"""bench/device_check.py: the flags it gives main.py make valid configs at the same global batch."""

import ast
import copy
import os
import sys

import pytest

from hfl import config as config_lib, mesh as mesh_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'bench'))
import device_check  # noqa: E402  pylint: disable=g-import-not-at-top


def _apply(config_name: str, flags: list[str]):
  base = config_lib.load_file(os.path.join(REPO, 'configs', config_name + '.py'))
  values = {}
  for flag in flags:
    key, _, value = flag.removeprefix('--config.').partition('=')
    try:
      values[key] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      values[key] = value
  return base, config_lib.validate(config_lib.apply_overrides(copy.deepcopy(base), values),
                                   paths=False)  # the data may be absent here


@pytest.mark.parametrize('config_name', [c for c, _ in device_check.CONFIGS])
@pytest.mark.parametrize('mesh', [(1, 1), (2, 2)])
def test_overrides_keep_the_global_batch_and_validate(config_name, mesh):
  d, w = mesh
  base, c = _apply(config_name, device_check.overrides(config_name, d, w))
  assert (c.mesh.num_dcs, c.mesh.workers_per_dc) == (d, w)
  assert c.network.dc_speed == (1.0,) * d
  assert (c.mesh.num_dcs * c.mesh.workers_per_dc * c.train.batch_size
          == base.mesh.num_dcs * base.mesh.workers_per_dc * base.train.batch_size)
  assert c.train.num_steps == base.train.num_steps
  assert c.optimizer.warmup_steps == base.optimizer.warmup_steps


@pytest.mark.parametrize('config_name', [c for c, _ in device_check.CONFIGS])
def test_short_runs_shorten_the_warmup(config_name):
  base, c = _apply(config_name, device_check.overrides(config_name, 1, 1, num_steps=20))
  assert c.train.num_steps == 20
  assert c.optimizer.warmup_steps == min(base.optimizer.warmup_steps, 2)


def test_check_refuses_a_bad_mesh_and_missing_data(tmp_path, monkeypatch, capsys):
  with pytest.raises(SystemExit):
    device_check.main(['--mesh=2', f'--out={tmp_path}'])
  assert '--mesh must be two positive integers' in capsys.readouterr().err
  monkeypatch.setattr(device_check, 'DEVICE_DIR', str(tmp_path / 'nothing'))
  with pytest.raises(SystemExit):
    device_check.main([f'--out={tmp_path}'])
  assert 'run --prepare first' in capsys.readouterr().err


def test_check_refuses_a_bad_bench_batch_and_runs_the_chosen_models(tmp_path, monkeypatch,
                                                                     capsys):
  """--bench_batch must be >= 1; --bench_models and --bench_batch reach the step
  benchmark's command (e.g. the benchmark-only transformer_large)."""
  with pytest.raises(SystemExit):
    device_check.main(['--bench_batch=0', f'--out={tmp_path}'])
  assert '--bench_batch must be >= 1, got 0' in capsys.readouterr().err
  cmds = []

  def fake_run(cmd, log_path, timeout_s, env):
    cmds.append(cmd)
    open(log_path, 'w').close()
    return 0, 0.0
  monkeypatch.setattr(device_check, '_run', fake_run)
  monkeypatch.setattr(device_check, '_env', lambda: dict(os.environ))
  monkeypatch.setattr(device_check, 'CONFIGS', [])
  device_check.check(str(tmp_path / 'out'), '1,1', 10.0, None, bench_models='transformer_large',
                     bench_batch=32)
  assert cmds[0][1:] == ['bench/step_throughput.py', '--model=transformer_large', '--mesh=1,1',
                         '--batch=32', '--steps=20', '--blocks=5']


@pytest.mark.parametrize('case,needle', [
    ('missing', 'does not exist; pass the directory holding cifar10-jpeg.tar.gz, '
     'tinyshakespeare.txt'),
    ('a_file', 'is not a directory; pass the directory holding'),
    ('lacks_one', 'tinyshakespeare.txt does not exist (--prepare needs cifar10-jpeg.tar.gz, '
     'tinyshakespeare.txt there)'),
    ('dir_for_file', 'tinyshakespeare.txt is not a file'),
])
def test_prepare_refuses_a_bad_data_dir_before_writing(tmp_path, monkeypatch, capsys, case,
                                                       needle):
  """A bad --prepare --data_dir used to exit 1 with a bare message (no error: line)."""
  monkeypatch.setattr(device_check, 'DEVICE_DIR', str(tmp_path / 'dev'))
  data = tmp_path / 'data'
  if case == 'a_file':
    data.write_text('x')
  elif case != 'missing':
    data.mkdir()
    (data / 'cifar10-jpeg.tar.gz').write_bytes(b'x')
    if case == 'dir_for_file':
      (data / 'tinyshakespeare.txt').mkdir()
  with pytest.raises(SystemExit) as e:
    device_check.main(['--prepare', f'--data_dir={data}'])
  assert e.value.code == 2  # argparse's usage-error status, as for the other flags
  err = capsys.readouterr().err.strip().splitlines()
  assert err[0].startswith('usage:') and ': error: ' in err[-1], err  # usage, then one line
  assert f': error: --data_dir={data}' in err[-1] and needle in err[-1], err[-1]
  assert not any(': error: ' in l for l in err[:-1]), err
  assert not (tmp_path / 'dev').exists()


@pytest.mark.parametrize('text,shape', [('1,1', (1, 1)), ('2,4', (2, 4)), (' 3, 2', (3, 2))])
def test_parse_shape_reads_d_and_w(text, shape):
  assert mesh_lib.parse_shape(text) == shape


@pytest.mark.parametrize('text', ['2', '2,4,1', '0,4', '2,-1', 'a,b', '', '2.5,2'])
def test_parse_shape_names_the_flag_and_the_value(text):
  with pytest.raises(ValueError, match=rf'--mesh must be two positive integers .* got {text!r}'):
    mesh_lib.parse_shape(text)


def test_link_data_points_missing_paths_at_the_device_copy(tmp_path, monkeypatch):
  dev = tmp_path / 'dev'
  (dev / 'data').mkdir(parents=True)
  for name in device_check.DATA_FILES.values():
    (dev / 'data' / name).write_text(name)
  monkeypatch.setattr(device_check, 'DEVICE_DIR', str(dev))
  root = tmp_path / 'shared' / 'data'
  (root).mkdir(parents=True)
  kept = root / device_check.DATA_FILES['cifar10']
  kept.write_text('the real one')
  made = device_check.link_data(str(root))
  assert made == [str(root / device_check.DATA_FILES['shakespeare'])]
  assert kept.read_text() == 'the real one'  # an existing file is never replaced
  assert (root / device_check.DATA_FILES['shakespeare']).read_text() == 'tinyshakespeare.txt'
  assert os.path.realpath(made[0]) == str(dev / 'data' / device_check.DATA_FILES['shakespeare'])
  assert device_check.link_data(str(root)) == []  # rerunning changes nothing


@pytest.mark.slow
def test_sweep_mode_returns_runs_in_the_archive_layout(tmp_path, monkeypatch, fake_data):
  """A 2-run sweep of configs/smoke.py: both runs come back as runs/NAME/<run>/ with the
  three files the results page reads, and device_check.md lists them as finished."""
  monkeypatch.setattr(device_check, 'WORK_DIR', str(tmp_path / 'work'))
  sweep = tmp_path / 'tiny_sweep.py'
  sweep.write_text(
      'def get_sweep():\n'
      f"  return 'configs/smoke.py', {{'dataset.data_dir': {str(fake_data)!r}, "
      "'train.num_steps': 4, 'seed': [0, 1]}\n")
  monkeypatch.setattr(device_check, 'DEVICE_DIR', str(tmp_path / 'dev'))
  monkeypatch.setattr(device_check, 'link_data', lambda data_root=None: [])
  out = tmp_path / 'out'
  assert device_check.check_sweep(str(out), str(sweep), budget_s=300) == 0
  runs = sorted(os.listdir(out / 'runs' / 'tiny_sweep'))
  assert len(runs) == 2, runs
  for run in runs:
    assert sorted(os.listdir(out / 'runs' / 'tiny_sweep' / run)) == [
        'config.json', 'metrics.jsonl', 'summary.json']
  md = (out / 'device_check.md').read_text()
  assert md.count('| finished |') == 2, md


@pytest.mark.parametrize('i', range(len(device_check.hierarchy_runs())))
def test_step_check_hierarchies_validate_and_run_vmapped(i):
  """--step_check's one-device trainings: the default 2 x 4 and a 4 x 2 semi_sync."""
  name, config, data, flags = device_check.hierarchy_runs()[i]
  base, c = _apply(config, flags)
  assert c.mesh.simulate == 'vmap' and data.startswith(device_check.DEVICE_DIR)
  if name.startswith('default'):
    assert (c.mesh.num_dcs, c.mesh.workers_per_dc) == (base.mesh.num_dcs,
                                                       base.mesh.workers_per_dc) == (2, 4)
  else:
    assert (c.mesh.num_dcs, c.mesh.workers_per_dc, c.sync.strategy) == (4, 2, 'semi_sync')
    assert len(set(c.network.dc_speed)) == 4


def test_step_check_needs_fashion_mnist(tmp_path, monkeypatch, capsys):
  dev = tmp_path / 'dev'
  (dev / 'data').mkdir(parents=True)
  for name in device_check.DATA_FILES.values():
    (dev / 'data' / name).write_text(name)
  monkeypatch.setattr(device_check, 'DEVICE_DIR', str(dev))
  monkeypatch.setattr(device_check, 'WHEELS', [])
  with pytest.raises(SystemExit):
    device_check.main(['--step_check', f'--out={tmp_path}'])
  assert 'fashion-mnist' in capsys.readouterr().err


@pytest.mark.slow
def test_step_check_runs_every_stage_on_cpu(tmp_path, monkeypatch, fake_data):
  """The whole --step_check on this CPU, scaled down: the benchmarks and the trace of the
  CNN, and one vmapped hierarchy (configs/smoke.py) on fake data; device_check.md has
  each stage's table and the run finished."""
  monkeypatch.setattr(device_check, 'WORK_DIR', str(tmp_path / 'work'))
  monkeypatch.setattr(device_check, 'LARGE_MODEL', 'cnn')
  monkeypatch.setattr(device_check, 'TRACE_MODELS', 'cnn')
  monkeypatch.setattr(device_check, 'hierarchy_runs', lambda: [
      ('smoke_vmap', 'smoke', str(fake_data), ['--config.mesh.simulate=vmap'])])
  out = tmp_path / 'out'
  rc = device_check.check_step(str(out), budget_s=540, peak_tflops=None, num_steps=8,
                               bench_models='cnn', bench_batch=8)
  md = (out / 'device_check.md').read_text()
  assert rc == 0, md
  assert md.count('bench/step_throughput.py --model=cnn') == 2, md
  assert 'bench/trace_step.py --model=cnn' in md and '```' in md, md
  assert '| smoke_vmap | finished | 8 |' in md, md
