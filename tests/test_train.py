"""End-to-end training: outputs, exact resume, and clear errors on bad input."""

import concurrent.futures
import glob
import gzip
import json
import os
import shutil
import subprocess
import sys

import chex
import jax
import numpy as np
import pytest

from hfl import config as config_lib
from hfl import data as data_lib
from hfl import step as step_lib
from hfl import network, provenance, tasks, train
from hfl import setup as setup_lib
from hfl import cost
from hfl.compress import dgc
from hfl.sync import schedule as schedule_lib
from hfl import diagnostics
from hfl import workdir as workdir_lib
from tests.helpers import crash_then_resume, final_state, smoke_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='module')
def smoke_run(fake_data, tmp_path_factory):
  """(workdir, summary) of the smoke config on the gzip'd fake data.

  The step is traced once per program (local iteration, round): the model's apply
  function, traced inside the step, may be traced at most twice in the whole run
  (``chex.assert_max_traces``), so a silent recompilation of the step fails here.
  """
  workdir = str(tmp_path_factory.mktemp('smoke') / 'run')
  make_step = step_lib.make_step
  counted = lambda apply_fn, *a, **k: make_step(chex.assert_max_traces(apply_fn, n=2), *a, **k)
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(step_lib, 'make_step', counted)
    return workdir, train.train_and_evaluate(smoke_config(fake_data), workdir)


@pytest.mark.slow
def test_smoke_run_writes_outputs(smoke_run):
  workdir, summary = smoke_run
  with open(os.path.join(workdir, 'summary.json')) as f:
    on_disk = json.load(f)
  for key in ('final_test_accuracy', 'best_test_accuracy', 'inter_dc_rounds',
              'intra_dc_iterations', 'bytes', 'sim_time_s', 'wall_time_s', 'time_to_target_s',
              'rounds_to_target', 'config'):
    assert key in on_disk, key
  assert set(on_disk['bytes']) == {'intra_up', 'intra_down', 'inter_dc'}
  assert on_disk['intra_dc_iterations'] == 12 and on_disk['inter_dc_rounds'] == 6
  assert 0 <= on_disk['final_test_accuracy'] <= 1
  assert on_disk['final_test_accuracy'] > 0.3  # learnable data: well above chance (0.1)
  records = [json.loads(l) for l in open(os.path.join(workdir, 'metrics.jsonl'))]
  assert [r['round'] for r in records] == [1, 2, 3, 4, 5, 6]
  for key in ('step', 'round', 'test_accuracy', 'test_loss', 'train_loss', 'bytes',
              'sim_time_s', 'wall_time_s'):
    assert key in records[0]
  # Byte totals: uncompressed f32 model, 8 workers up and down per iteration, the
  # round's result (the summed pseudo-gradient) reaching each DC's 4 workers once per
  # round, and each of the 2 DCs sends its pseudo-gradient to the other once per round.
  n = sum(np.prod(x.shape) for x in __import__('jax').tree.leaves(final_state(workdir)[1]['global_params']))
  assert summary['bytes']['intra_up'] == 12 * 8 * n * 4
  assert summary['bytes']['intra_down'] == 12 * 8 * n * 4 + 6 * 2 * 4 * n * 4
  assert summary['bytes']['inter_dc'] == 6 * 2 * n * 4
  assert summary['sim_time_s'] > 0
  assert os.path.isdir(os.path.join(workdir, 'tb'))
  # Measured iteration wall-clock: 6 round and 6 local iterations, the first call of
  # each of the two programs (its compilation) left out.
  wall = on_disk['step_wall_s']
  assert (wall['round_n'], wall['local_n']) == (5, 5)
  assert 0 < wall['local_median'] < on_disk['wall_time_s']
  assert 0 < wall['round_median'] < on_disk['wall_time_s']
  # Provenance: one start, every field present (issue 47).
  [start] = on_disk['provenance']
  assert set(start) == set(provenance.FIELDS) and start['at_iteration'] == 0
  assert start['backend'] == 'cpu' and start['device_count'] == 8
  assert start['process_count'] == 1 and start['jax'] == jax.__version__


@pytest.mark.slow
def test_memory_mapped_idx_files_train_like_gzipped_ones(fake_data, smoke_run, tmp_path):
  # The same files uncompressed are memory-mapped (rows read from disk on
  # demand) instead of decompressed into memory: the run must not change.
  raw_dir = tmp_path / 'raw'
  raw_dir.mkdir()
  for name in os.listdir(fake_data):
    with gzip.open(os.path.join(fake_data, name), 'rb') as f:
      (raw_dir / name[:-len('.gz')]).write_bytes(f.read())
  assert isinstance(data_lib.load('fashion_mnist', str(raw_dir)).train_images.raw, np.memmap)
  workdir = str(tmp_path / 'run')
  summary = train.train_and_evaluate(smoke_config(str(raw_dir)), workdir)
  ref_dir, ref = smoke_run
  for key in ('final_test_accuracy', 'best_test_accuracy', 'final_test_loss', 'bytes',
              'sim_time_s', 'inter_dc_rounds', 'intra_dc_iterations'):
    assert summary[key] == ref[key], key
  records = lambda w: [{k: v for k, v in json.loads(l).items() if k != 'wall_time_s'}
                       for l in open(os.path.join(w, 'metrics.jsonl'))]
  assert records(workdir) == records(ref_dir)
  chex.assert_trees_all_equal(final_state(workdir)[1], final_state(ref_dir)[1])


@pytest.mark.slow
def test_interrupted_run_resumes_bitwise(fake_data, tmp_path, monkeypatch):
  ref_dir, cut_dir = str(tmp_path / 'ref'), str(tmp_path / 'cut')
  cfg = dict(**{'optimizer.name': 'momentum', 'sync.k': 3, 'train.num_steps': 12})
  train.train_and_evaluate(smoke_config(fake_data, **cfg), ref_dir)

  summary = crash_then_resume(lambda: smoke_config(fake_data, **cfg), cut_dir, monkeypatch, 8)

  step_a, a = final_state(ref_dir)
  step_b, b = final_state(cut_dir)
  assert step_a == step_b == 12
  chex.assert_trees_all_equal(a, b)
  ref = json.load(open(os.path.join(ref_dir, 'summary.json')))
  for key in ('final_test_accuracy', 'bytes', 'sim_time_s', 'inter_dc_rounds'):
    assert summary[key] == ref[key], key
  steps = [json.loads(l)['step'] for l in open(os.path.join(cut_dir, 'metrics.jsonl'))]
  assert steps == sorted(set(steps))  # each evaluation exactly once
  # One provenance entry per start: from 0, then from the checkpoint it resumed at.
  assert [p['at_iteration'] for p in ref['provenance']] == [0]
  assert [p['at_iteration'] for p in summary['provenance']] == [0, 6]
  assert all(set(p) == set(provenance.FIELDS) for p in summary['provenance'])


@pytest.mark.slow
def test_extending_a_run_past_unusable_newest_checkpoints(fake_data, smoke_run, tmp_path):
  """Fault: a finished run plus an empty newer step directory failed to resume with
  KeyError 'Item "host" was not found' until someone deleted it. Here the finished
  12-step run gets an empty checkpoints/16, a committed but truncated
  checkpoints/14 and orbax's temporary directory of an interrupted save of step 18;
  extended to 16 steps it resumes from 12, saves 14 and 16 again, and ends bitwise
  where the same extension ends without them (same machine, same program)."""
  import jax  # pylint: disable=g-import-not-at-top
  from hfl import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  src, _ = smoke_run
  broken_dir, clean_dir = str(tmp_path / 'broken'), str(tmp_path / 'clean')
  shutil.copytree(src, broken_dir)
  shutil.copytree(src, clean_dir)
  ckpts = os.path.join(broken_dir, 'checkpoints')
  os.makedirs(os.path.join(ckpts, '16'))
  shutil.copytree(os.path.join(ckpts, '12'), os.path.join(ckpts, '14'))
  data = max(glob.glob(os.path.join(ckpts, '14', 'state', '**', 'd', '*'), recursive=True),
             key=os.path.getsize)
  with open(data, 'r+b') as f:
    f.truncate(os.path.getsize(data) // 2)
  shutil.copytree(os.path.join(ckpts, '10'), os.path.join(ckpts, '18' + ckpt_lib.TMP_MARK))
  cfg = {'train.num_steps': 16}
  summary = train.train_and_evaluate(smoke_config(fake_data, **cfg), broken_dir)
  ref = train.train_and_evaluate(smoke_config(fake_data, **cfg), clean_dir)
  assert summary['intra_dc_iterations'] == 16
  assert sorted(os.listdir(os.path.join(broken_dir, ckpt_lib.SKIPPED_DIR))) == [
      '14', '16', '18' + ckpt_lib.TMP_MARK]
  assert sorted(os.listdir(ckpts)) == ['14', '16']
  for key in ('final_test_accuracy', 'bytes', 'sim_time_s', 'inter_dc_rounds'):
    assert summary[key] == ref[key], key
  chex.assert_trees_all_equal(final_state(broken_dir)[1], final_state(clean_dir)[1])


BAD = [
    ({'mesh.num_dcs': 3}, 'mesh.num_dcs'),
    ({'sync.k': 0}, 'sync.k'),
    ({'sync.strategy': 'gossip'}, 'sync.strategy'),
    ({'dataset.name': 'imagenet_foo'}, 'imagenet_foo'),
    ({'model.name': 'vgg'}, 'model.name'),
    ({'network.wan_bandwidth_mbps': -1.0}, 'network.wan_bandwidth_mbps'),
    ({'network.dc_speed': (1.0,)}, 'network.dc_speed'),
    ({'train.batch_size': 100000}, 'train.batch_size'),
    # Not one batch per worker in the 640 samples: refused before the partitioner searches
    # for a Dirichlet split (which took a minute to fail with 10,000 workers).
    ({'train.batch_size': 81},
     'train.batch_size=81 x 8 workers (mesh.num_dcs=2 x mesh.workers_per_dc=4) = 648 '
     'exceeds the 640 training samples'),
    ({'dataset.data_dir': '/nonexistent/fmnist'}, 'dataset.data_dir'),
    ({'dataset.dirichlet_alpha': 0.0}, 'dataset.dirichlet_alpha'),
    ({'train.target_accuracy': 88.0}, 'train.target_accuracy'),
    ({'optimizer.learning_rate': -0.1}, 'optimizer.learning_rate'),
    # Non-finite floats: inf once passed every range check and failed at the first
    # JSON write, leaving an empty checkpoints/ behind.
    ({'optimizer.learning_rate': float('inf')}, 'optimizer.learning_rate=inf must be a finite number'),
    ({'network.lan_latency_s': float('nan')}, 'network.lan_latency_s=nan must be a finite number'),
    ({'network.dc_speed': (1.0, float('inf'))}, 'network.dc_speed[1]=inf must be a finite number'),
    ({'train.num_steps': 10**20}, 'train.num_steps=100000000000000000000 must be an integer in'),
    ({'train.num_steps': 8, 'optimizer.warmup_steps': 8},
     'optimizer.warmup_steps=8 must be < train.num_steps=8'),
    # Options that would silently do nothing where they are set.
    ({'sync.k_min_ratio': 0.5}, "sync.k_min_ratio=0.5 has no effect with sync.strategy='periodic'"),
    ({'sync.lr_scaling': 'inverse_k'}, "sync.lr_scaling='inverse_k' has no effect with"),
    ({'sync.progress_test': 'window_means'},
     "sync.progress_test='window_means' has no effect without sync.progress_aware=True"),
]


@pytest.mark.parametrize('overrides,field', BAD, ids=[b[1] for b in BAD])
def test_bad_config_fails_before_compilation_naming_the_field(fake_data, tmp_path, overrides,
                                                              field, monkeypatch):
  import jax  # pylint: disable=g-import-not-at-top
  def no_compile(*a, **k):
    raise AssertionError('compiled before validating the config')
  monkeypatch.setattr(jax, 'jit', no_compile)
  with pytest.raises((ValueError, FileNotFoundError)) as e:
    train.train_and_evaluate(smoke_config(fake_data, **overrides), str(tmp_path / 'w'))
  assert field in str(e.value)
  assert not os.path.exists(tmp_path / 'w')


# What hfl.setup.setup builds from the config (network model, fault plan, outer
# optimizer, K schedule) and the data path: refused by hfl.config.validate itself, so
# that the sweep's pre-check refuses them too.
SETUP_ONLY_BAD = [
    ({'network.wan_bandwidth_mbps': -5.0}, 'network.wan_bandwidth_mbps=-5.0 must be'),
    ({'network.compute_time_s': -1.0}, 'network.compute_time_s=-1.0 must be'),
    ({'network.wan_latencies_per_round': -1.0}, 'network.wan_latencies_per_round=-1.0 must be'),
    ({'network.dc_speed': (1.0,)}, 'network.dc_speed=(1.0,) must hold mesh.num_dcs=2'),
    ({'sync.faults': '5:1-2'}, 'sync.faults: DC id 5'),
    ({'sync.outer.name': 'bogus'}, 'sync.outer.name must be one of'),
    ({'sync.outer.momentum': 1.5}, 'sync.outer.momentum must be in [0, 1)'),
    ({'sync.progress_aware': True, 'sync.progress_window': 0}, 'sync.progress_window'),
    ({'sync.progress_aware': True, 'sync.progress_factor': 1.0}, 'sync.progress_factor'),
    ({'dataset.data_dir': '/nonexistent'}, "dataset.data_dir='/nonexistent' does not exist"),
    ({'dataset.data_dir': 'no/such/dir'}, "dataset.data_dir='no/such/dir' does not exist"),
    ({'dataset.data_dir': None}, 'config field dataset.data_dir (default '),
]


@pytest.mark.parametrize('overrides,problem', SETUP_ONLY_BAD, ids=[b[1] for b in SETUP_ONLY_BAD])
def test_validate_refuses_what_setup_would(tmp_path, overrides, problem, monkeypatch):
  import jax  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(jax, 'jit', lambda *a, **k: (_ for _ in ()).throw(
      AssertionError('compiled while validating the config')))
  config_lib.validate(smoke_config(str(tmp_path)))  # the same config, valid
  with pytest.raises(ValueError) as e:
    config_lib.validate(smoke_config(str(tmp_path), **overrides))
  assert problem in str(e.value)


def test_a_config_directory_is_named_as_one(tmp_path):
  """--config=configs/ exists but is a directory: said so, not "not found"."""
  with pytest.raises(FileNotFoundError, match=f'config file {tmp_path} is a directory'):
    config_lib.load_file(str(tmp_path))
  out = subprocess.run([sys.executable, os.path.join(REPO, 'main.py'), '--config=configs/',
                        f'--workdir={tmp_path / "w"}'], env=dict(os.environ, JAX_PLATFORMS='cpu'),
                       capture_output=True, text=True, timeout=300, cwd=REPO)
  assert out.returncode == 2
  assert out.stderr == ('error: could not load --config (configs/ is a directory, not a config '
                        'file); pass a config file such as configs/default.py.\n')
  assert not os.path.exists(tmp_path / 'w')


@pytest.mark.parametrize('data_dir', [data_lib.FASHION_MNIST_DIR, data_lib.FASHION_MNIST_DIR + '/'])
def test_mnist_from_the_fashion_mnist_directory_is_refused(data_dir, tmp_path):
  # configs/default.py's data_dir holds Fashion-MNIST, in MNIST's file layout.
  cfg = smoke_config(data_dir, **{'dataset.name': 'mnist'})
  with pytest.raises(ValueError) as e:
    config_lib.validate(cfg)
  msg = str(e.value)
  assert msg.startswith(f'dataset.data_dir={data_dir!r} is the default directory of '
                        "dataset.name='fashion_mnist', but dataset.name='mnist'")
  assert "set dataset.data_dir to mnist's own IDX directory" in msg
  config_lib.validate(smoke_config(data_dir))  # fashion_mnist from its own directory
  config_lib.validate(smoke_config(str(tmp_path), **{'dataset.name': 'mnist'}))


def test_corrupt_data_file_names_the_file(fake_data, tmp_path):
  bad = tmp_path / 'bad'
  bad.mkdir()
  for name in os.listdir(fake_data):
    data = open(os.path.join(fake_data, name), 'rb').read()
    if name.startswith('train-images'):
      data = data[:len(data) // 3]
    (bad / name).write_bytes(data)
  with pytest.raises(ValueError) as e:
    train.train_and_evaluate(smoke_config(str(bad)), str(tmp_path / 'w'))
  assert 'train-images' in str(e.value) and 'dataset.data_dir' in str(e.value)


@pytest.mark.slow
def test_failing_rerun_leaves_existing_workdir_intact(fake_data, tmp_path):
  workdir = str(tmp_path / 'run')
  train.train_and_evaluate(smoke_config(fake_data, **{'train.num_steps': 4}), workdir)

  def snapshot():
    out = {}
    for root, _, files in os.walk(workdir):
      for f in files:
        p = os.path.join(root, f)
        out[p] = open(p, 'rb').read()
    return out
  before = snapshot()
  for overrides in ({'sync.k': 0}, {'sync.k': 3}, {'dataset.data_dir': '/nonexistent'}):
    with pytest.raises((ValueError, FileNotFoundError)) as e:
      train.train_and_evaluate(smoke_config(fake_data, **overrides), workdir)
    assert 'sync.k' in str(e.value) or 'dataset.data_dir' in str(e.value)
  assert snapshot() == before


def test_a_finished_run_without_checkpoints_is_reported_not_retrained(fake_data, tmp_path):
  """Checkpoints deleted (as docs/results/runs keeps runs): the same config reports the
  run again; a longer one is refused. Either way metrics.jsonl and summary.json stay (the
  run used to train again from step 0, emptying metrics.jsonl first)."""
  import shutil  # pylint: disable=g-import-not-at-top
  workdir = str(tmp_path / 'run')
  config = smoke_config(fake_data, **{'train.num_steps': 4})
  summary = train.train_and_evaluate(config, workdir)
  shutil.rmtree(os.path.join(workdir, 'checkpoints'))
  kept = {f: open(os.path.join(workdir, f), 'rb').read()
          for f in ('metrics.jsonl', 'summary.json', 'config.json')}
  assert train.train_and_evaluate(config, workdir) == json.loads(kept['summary.json'])
  assert summary['final_test_accuracy'] == json.loads(kept['summary.json'])['final_test_accuracy']
  with pytest.raises(ValueError, match='holds a finished run .* but no checkpoint that '
                     'restores, so this config could only train it again from step 0'):
    train.train_and_evaluate(smoke_config(fake_data, **{'train.num_steps': 6}), workdir)
  assert {f: open(os.path.join(workdir, f), 'rb').read() for f in kept} == kept


def test_a_run_resumed_with_a_changed_config_says_so_and_yields_to_a_fresh_one(fake_data, tmp_path):
  """Extending a finished run records the change (summary.json's changed_on_resume); the
  report names it. Beside a fresh run of its final config and seed it is no second sample:
  the fresh run is kept, the extended one left out as its repeat."""
  from hfl import report  # pylint: disable=g-import-not-at-top
  from hfl.report import tables  # pylint: disable=g-import-not-at-top
  ext, fresh = str(tmp_path / 'extended'), str(tmp_path / 'fresh')
  train.train_and_evaluate(smoke_config(fake_data, **{'train.num_steps': 2}), ext)
  summary = train.train_and_evaluate(smoke_config(fake_data, **{'train.num_steps': 6}), ext)
  assert summary['changed_on_resume'] == [dict(at_iteration=2,
                                               changes=['train.num_steps: 2 -> 6'])]
  assert 'changed_on_resume' not in train.train_and_evaluate(
      smoke_config(fake_data, **{'train.num_steps': 6}), fresh)
  frame = report.load([str(tmp_path)])
  table = tables.build_table(frame)  # one sample of seed 0: the fresh run, as configured
  assert len(table) == 1 and table.iloc[0]['repeats'] == [(ext, fresh)]
  assert table.iloc[0]['workdirs'] == [fresh] and table.iloc[0]['changed'] == []
  table = tables.build_table(report.load([ext]))  # alone: kept, and named as changed
  assert table.iloc[0]['workdirs'] == [ext]
  assert (f'Runs resumed with a changed config (config.json holds the last; results may differ '
          f'from a fresh run of it): `{ext}` (at 2: train.num_steps: 2 -> 6).'
          in tables.to_markdown(table, frame.attrs['target']))


def test_a_metrics_log_that_lost_evaluations_is_refused_not_summarized(fake_data, tmp_path):
  """summary.json deleted (to rebuild it) and metrics.jsonl cut after its first record:
  the rebuilt summary held an early evaluation's accuracy as the final one. Refused,
  both ends named, nothing written."""
  workdir = str(tmp_path / 'run')
  config = smoke_config(fake_data, **{'train.num_steps': 4})
  train.train_and_evaluate(config, workdir)
  os.remove(os.path.join(workdir, 'summary.json'))
  log = os.path.join(workdir, 'metrics.jsonl')
  with open(log) as f:
    first = f.readline()
  with open(log, 'w') as f:
    f.write(first + first[:20])  # a second record cut mid-write
  with pytest.raises(ValueError, match=r'metrics.jsonl ends at round 1, but the checkpoint '
                     r'of iteration 4 was evaluated at round 2: the log lost evaluations'):
    train.train_and_evaluate(config, workdir)
  assert open(log).read() == first + first[:20]
  assert not os.path.exists(os.path.join(workdir, 'summary.json'))


@pytest.mark.slow
def test_main_cli_runs_and_rejects_bad_flags(fake_data, tmp_path):
  """main.py trains with a warning for an unused flag, and refuses each bad flag or
  --config with exit status 2 and one line, writing nothing. The processes are
  independent, so they run side by side."""
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  main = [sys.executable, os.path.join(REPO, 'main.py')]
  base = main + [f'--config={os.path.join(REPO, "configs/smoke.py")}',
                 f'--config.dataset.data_dir={fake_data}', '--config.train.num_steps=4']
  typo_dir = f'--workdir={tmp_path / "typo"}'
  (tmp_path / 'noget.py').write_text('x = 1\n')
  (tmp_path / 'syntax.py').write_text('x = 1\ndef get_config(:\n  pass\n')
  help_line = ('Config fields are listed in the README (config reference) and '
               'configs/default.py.')
  typos = [
      ('--config.optimizer.learnin_rate=0.1', "error: unknown config field "
       "'optimizer.learnin_rate'; did you mean 'optimizer.learning_rate'? "),
      ('--config.optimiser.learning_rate=0.1', "error: unknown config field "
       "'optimiser.learning_rate'; did you mean 'optimizer.learning_rate'? "),
      ('--config.sync.kk=8', "error: unknown config field 'sync.kk'; did you mean 'sync.k'? "),
      ('--config.zzzz=1', "error: unknown config field 'zzzz'. "),
      ('--config.optimizer.lr=0.1', "error: unknown config field 'optimizer.lr'; did you "
       "mean 'optimizer.learning_rate'? "),
      ('--config.sync.k=four', "error: flag --config.sync.k=four: invalid literal for int() "
       "with base 10: 'four' (an integer field). "),
      ('--config.sync.progress_aware=yes', 'error: flag --config.sync.progress_aware=yes: not '
       'a boolean (a boolean field takes true or false). '),
  ]
  unloadable = [
      ('configs/nope.py', [], f'configs/nope.py not found from {tmp_path}'),
      ('configs/nope.py', ['--config.seed=1'], f'configs/nope.py not found from {tmp_path}'),
      ('noget.py', ['--config.seed=1'], 'noget.py defines no get_config()')]
  # (command, cwd) per process; the first trains, the others are refused.
  cmds = {
      'ok': (base + [f'--workdir={tmp_path / "cli"}',
                     '--config.compression.uplink.density=0.02'], REPO),
      'bad': (base + [f'--workdir={tmp_path / "bad"}', '--config.sync.k=0'], REPO),
      'extra': (base + [typo_dir, 'extra'], REPO),
      'arg': (main + [f'--config={os.path.join(REPO, "configs/smoke.py")}:foo', typo_dir], REPO),
      'syntax': (main + ['--config=syntax.py', typo_dir], tmp_path),
      **{f'typo{i}': (base + [typo_dir, flag], REPO) for i, (flag, _) in enumerate(typos)},
      **{f'nope{i}': (main + [f'--config={config}', typo_dir] + override, tmp_path)
         for i, (config, override, _) in enumerate(unloadable)},
  }
  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    futures = {k: pool.submit(subprocess.run, cmd, env=env, capture_output=True, text=True,
                              timeout=300, cwd=cwd) for k, (cmd, cwd) in cmds.items()}
    out = {k: f.result() for k, f in futures.items()}
  ok = out['ok']
  assert ok.returncode == 0, ok.stderr[-3000:]
  assert os.path.exists(tmp_path / 'cli' / 'summary.json')
  # A density for the identity compressor is unused: the run warns and goes on.
  assert ("--config.compression.uplink.density is ignored: compression.uplink.name='identity' "
          'takes no hyper-parameters') in ok.stderr
  assert 'final test accuracy' in ok.stdout
  assert out['bad'].returncode == 2
  assert 'sync.k=0 must be >= 1' in out['bad'].stderr
  for i, (flag, expected) in enumerate(typos):
    assert out[f'typo{i}'].returncode == 2, flag
    assert out[f'typo{i}'].stderr == expected + help_line + '\n', flag
  extra = out['extra']
  assert extra.returncode == 2  # a stray word: one line, not absl's full help
  assert extra.stderr.startswith("error: unexpected arguments ['extra']; main.py takes only flags")
  arg = out['arg']
  assert arg.returncode == 2  # shipped configs take no ARG in --config=FILE:ARG
  assert "this config takes no argument after ':' (got 'foo')" in arg.stderr
  assert 'Traceback' not in arg.stderr
  for i, (config, override, detail) in enumerate(unloadable):
    nope = out[f'nope{i}']
    assert nope.returncode == 2, (config, override)
    assert nope.stderr == (f'error: could not load --config ({detail}); pass a config file '
                           'such as configs/default.py.\n'), (config, override)
  bad = out['syntax']
  assert bad.returncode == 2
  assert bad.stderr.startswith('error: could not load --config (SyntaxError in '), bad.stderr
  assert 'syntax.py, line 2: ' in bad.stderr and bad.stderr.count('\n') == 1, bad.stderr
  assert not os.path.exists(tmp_path / 'typo')


@pytest.mark.parametrize('kind', ['file', 'under_file', 'empty'])
def test_main_refuses_an_unusable_workdir_before_anything(tmp_path, kind):
  """A --workdir that is a file, lies under a file, or is empty: exit status 2 and one
  line naming --workdir, before data loading or compilation; the file is untouched."""
  f = tmp_path / 'a_file'
  f.write_text('keep me')
  workdir = {'file': str(f), 'under_file': str(f / 'run'), 'empty': ''}[kind]
  out = subprocess.run([sys.executable, os.path.join(REPO, 'main.py'),
                        f'--config={os.path.join(REPO, "configs/smoke.py")}',
                        f'--workdir={workdir}'], env=dict(os.environ, JAX_PLATFORMS='cpu'),
                       capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
  assert out.returncode == 2, out.stderr[-2000:]
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(f'error: --workdir={workdir!r} '), lines
  assert f.read_text() == 'keep me' and sorted(os.listdir(tmp_path)) == ['a_file']

def test_a_workdir_that_cannot_be_created_is_named(fake_data, tmp_path, monkeypatch):
  """A --workdir the OS refuses to create (read-only mount, /proc) is a ValueError
  naming --workdir, raised before anything is compiled."""
  def refuse(path, exist_ok=False):
    raise PermissionError(13, 'Permission denied', path)
  monkeypatch.setattr(train.os, 'makedirs', refuse)
  with pytest.raises(ValueError, match=r"--workdir='.*ro' cannot be created: Permission denied"):
    train.train_and_evaluate(smoke_config(fake_data), str(tmp_path / 'ro'))


def _finished_workdir(tmp_path, num_steps=4):
  """(workdir, config) as a finished smoke run leaves them, without training:
  config.json, summary.json, metrics.jsonl, tb/ and a checkpoint of step
  ``num_steps`` that looks complete (orbax's files and commit marker, no arrays)."""
  config = smoke_config(str(tmp_path / 'data'), **{'train.num_steps': num_steps})
  workdir = tmp_path / 'run'
  step_dir = workdir / 'checkpoints' / str(num_steps)
  for d in (step_dir / 'state', step_dir / 'host', workdir / 'tb'):
    d.mkdir(parents=True)
  (step_dir / 'commit_success.txt').write_text('')
  (workdir / 'config.json').write_text(config.to_json())
  (workdir / 'summary.json').write_text(json.dumps(dict(
      intra_dc_iterations=num_steps, sim_time_s=1.5, config=json.loads(config.to_json()))))
  (workdir / 'metrics.jsonl').write_text('{"step": 2}\n')
  return str(workdir), config


def _listing(workdir):
  return sorted((root, sorted(dirs), sorted(files)) for root, dirs, files in os.walk(workdir))


@pytest.mark.parametrize('name,make', [
    ('checkpoints', 'file'), ('checkpoints_skipped', 'file'), ('tb', 'file'), ('logs', 'file'),
    ('config.json', 'dir'), ('summary.json', 'dir'), ('metrics.jsonl', 'dir'),
    ('tb', 'broken_link')])
def test_workdir_entries_of_the_wrong_type_are_refused_untouched(tmp_path, name, make):
  """checkpoints/ as a file, metrics.jsonl as a directory, ...: one ValueError naming
  the path, what it is and what it must be, before anything reads or writes them."""
  workdir, config = _finished_workdir(tmp_path)
  path = os.path.join(workdir, name)
  if os.path.isdir(path):
    shutil.rmtree(path)
  elif os.path.exists(path):
    os.remove(path)
  if make == 'file':
    with open(path, 'w') as f:
      f.write('keep me')
  elif make == 'dir':
    os.mkdir(path)
  else:
    os.symlink(os.path.join(workdir, 'nowhere'), path)
  before = _listing(workdir)
  must, what = ('a directory' if workdir_lib.WORKDIR_ENTRIES[name][0] else 'a file',
                workdir_lib.WORKDIR_ENTRIES[name][1])
  kind = {'file': 'a file', 'dir': 'a directory', 'broken_link': 'a broken symbolic link'}[make]
  problem = (f'cannot be used: {path} is {kind}, but must be {must} ({what}); move it out '
             'of the way, or use a new --workdir')
  assert workdir_lib.workdir_entries_problem(workdir) == problem
  with pytest.raises(ValueError) as e:
    workdir_lib.check_workdir_config(workdir, config)
  assert str(e.value) == f'--workdir={workdir!r} {problem}'
  assert _listing(workdir) == before
  assert workdir_lib.workdir_entries_problem(str(tmp_path / 'new')) is None


def test_main_refuses_a_workdir_entry_of_the_wrong_type_in_one_line(tmp_path):
  """tb/ as a file: exit status 2 and one line, before JAX starts; nothing touched."""
  workdir = tmp_path / 'run'
  workdir.mkdir()
  (workdir / 'tb').write_text('keep me')
  out = subprocess.run([sys.executable, os.path.join(REPO, 'main.py'),
                        f'--config={os.path.join(REPO, "configs/smoke.py")}',
                        f'--workdir={workdir}'], env=dict(os.environ, JAX_PLATFORMS='cpu'),
                       capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
  assert out.returncode == 2, out.stderr[-2000:]
  assert out.stderr == (f"error: --workdir={str(workdir)!r} cannot be used: {workdir / 'tb'} "
                        'is a file, but must be a directory (TensorBoard event files); move it '
                        'out of the way, or use a new --workdir\n')
  assert os.listdir(workdir) == ['tb'] and (workdir / 'tb').read_text() == 'keep me'


@pytest.mark.parametrize('text', ['{"final_test', '[1, 2]', '{}',
                                  '{"final_test_accuracy": "high"}'])
def test_a_corrupt_summary_of_a_finished_run_is_named_with_what_to_do(tmp_path, text):
  """Reporting a finished run again reads its summary.json: a damaged one (not JSON,
  no object, or not a finished run's: the report's check) is named, with the remedy
  (without it the run resumes at its last checkpoint, finishes at once and writes
  it again). ``{}`` used to end in a KeyError traceback."""
  workdir, config = _finished_workdir(tmp_path)
  summary = os.path.join(workdir, 'summary.json')
  with open(summary, 'w') as f:
    f.write(text)
  with pytest.raises(ValueError) as e:
    workdir_lib.reported_summary(workdir, tasks.from_config(config), config)
  assert str(e.value).startswith(f'{summary} '), str(e.value)
  assert str(e.value).endswith('; delete it and rerun the same command to rewrite it from '
                               'metrics.jsonl and the last checkpoint')
  assert open(summary).read() == text


def test_a_shorter_run_is_refused_from_the_checkpoints_before_compiling(tmp_path):
  """train.num_steps below the newest complete checkpoint's step: refused by
  check_workdir_config (before anything is compiled); an incomplete newer step
  directory does not count."""
  workdir, config = _finished_workdir(tmp_path)
  os.makedirs(os.path.join(workdir, 'checkpoints', '6'))  # empty: never committed
  shorter = smoke_config(config.dataset.data_dir, **{'train.num_steps': 2})
  with pytest.raises(ValueError) as e:
    workdir_lib.check_workdir_config(workdir, shorter)
  assert str(e.value) == (f'train.num_steps=2 is below the 4 iterations --workdir={workdir} '
                          'has already done; use a new workdir for a shorter run.')
  assert workdir_lib.check_workdir_config(workdir, config) == []
  longer = smoke_config(config.dataset.data_dir, **{'train.num_steps': 6})
  assert workdir_lib.check_workdir_config(workdir, longer) == ['train.num_steps: 4 -> 6']


def test_a_run_stopped_before_its_first_checkpoint_may_start_over_with_another_config(
    tmp_path):
  """config.json, an empty metrics.jsonl and checkpoints/ without a step: nothing trained
  is kept, so another config is no conflict (it was refused as 'a different config')."""
  config = smoke_config(str(tmp_path / 'data'), **{'train.num_steps': 4})
  workdir = tmp_path / 'run'
  (workdir / 'checkpoints').mkdir(parents=True)
  (workdir / 'config.json').write_text(config.to_json())
  (workdir / 'metrics.jsonl').write_text('')
  other = smoke_config(str(tmp_path / 'data'), **{'train.num_steps': 4, 'sync.k': 4})
  assert workdir_lib.check_workdir_config(str(workdir), other) == []
  (workdir / 'checkpoints' / '2').mkdir()  # a checkpoint (even a partial one): pinned
  with pytest.raises(ValueError, match='holds a run with a different config'):
    workdir_lib.check_workdir_config(str(workdir), other)


def test_a_read_only_workdir_only_reports_its_finished_run(tmp_path, monkeypatch):
  """On read-only media (os.access says so) a finished run is reported again (that
  writes nothing); extending it, or a workdir without config.json (rewritten on
  resume), is refused before anything is compiled."""
  workdir, config = _finished_workdir(tmp_path)
  monkeypatch.setattr(train.os, 'access', lambda path, mode: mode != os.W_OK)
  assert workdir_lib.check_workdir_config(workdir, config) == []
  longer = smoke_config(config.dataset.data_dir, **{'train.num_steps': 6})
  refused = (f'--workdir={workdir!r} cannot be written (read-only?); from there a finished '
             'run can only be reported again: copy the workdir somewhere writable to '
             'continue it.')
  with pytest.raises(ValueError) as e:
    workdir_lib.check_workdir_config(workdir, longer)
  assert str(e.value) == refused
  os.remove(os.path.join(workdir, 'config.json'))
  with pytest.raises(ValueError) as e:
    workdir_lib.check_workdir_config(workdir, config)
  assert str(e.value) == refused


def test_a_cut_short_last_metrics_line_is_skipped_with_a_warning(tmp_path, caplog):
  """A crash mid-write cuts the last line of metrics.jsonl: skipped with a warning
  naming file and line; a bad line elsewhere is an error naming them."""
  import logging  # pylint: disable=g-import-not-at-top
  from hfl import metrics as metrics_lib  # pylint: disable=g-import-not-at-top
  path = tmp_path / 'metrics.jsonl'
  path.write_text('{"step": 2}\n\n{"step": 4}\n{"step": 6, "te')
  with caplog.at_level(logging.WARNING):
    assert metrics_lib.read_jsonl(str(path)) == [{'step': 2}, {'step': 4}]
  assert (f'{path}:4: skipping the last line, which is not JSON (cut short by a crash '
          'mid-write?)') in caplog.text
  path.write_text('{"step": 2}\n{"st\n{"step": 6}\n')
  with pytest.raises(ValueError) as e:
    metrics_lib.read_jsonl(str(path))
  assert str(e.value).startswith(f'{path}:2 is not JSON (')
  assert str(e.value).endswith('); fix or delete that line')

def test_main_names_a_missing_config_or_workdir_flag(tmp_path):
  """No --config or no --workdir, or one given twice: exit status 2 and one line saying
  which flag (and an example command), before anything starts."""
  for args, flag in ((['--workdir=w'], '--config'),
                     ([f'--config={os.path.join(REPO, "configs/smoke.py")}'], '--workdir')):
    out = subprocess.run([sys.executable, os.path.join(REPO, 'main.py')] + args,
                         env=dict(os.environ, JAX_PLATFORMS='cpu'), capture_output=True,
                         text=True, timeout=300, cwd=str(tmp_path))
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr == (f'error: {flag} is required, e.g. python3 main.py '
                          '--config=configs/default.py --workdir=workdirs/run\n')
  # Overrides without a --config file to override.
  out = subprocess.run([sys.executable, os.path.join(REPO, 'main.py'), '--workdir=w',
                        '--config.train.num_steps=80'],
                       env=dict(os.environ, JAX_PLATFORMS='cpu'), capture_output=True,
                       text=True, timeout=300, cwd=str(tmp_path))
  assert out.returncode == 2
  assert out.stderr.startswith('error: --config.FIELD overrides need a --config file')
  assert out.stderr.count('\n') == 1 and not os.path.exists(tmp_path / 'w')
  smoke = os.path.join(REPO, 'configs/smoke.py')
  out = subprocess.run([sys.executable, os.path.join(REPO, 'main.py'), f'--config={smoke}',
                        '--workdir=w', '--config.seed=1', '--config', smoke],
                       env=dict(os.environ, JAX_PLATFORMS='cpu'), capture_output=True,
                       text=True, timeout=300, cwd=str(tmp_path))
  assert out.returncode == 2
  assert out.stderr == f'error: --config given 2 times (--config={smoke}, --config); give it once\n'
  assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_semi_sync_with_equal_speeds_equals_periodic(fake_data, tmp_path):
  cfg = {'train.num_steps': 6, 'train.checkpoint_every': 0}
  train.train_and_evaluate(smoke_config(fake_data, **cfg), str(tmp_path / 'p'))
  train.train_and_evaluate(smoke_config(fake_data, **cfg, **{'sync.strategy': 'semi_sync'}),
                           str(tmp_path / 's'))
  _, a = final_state(str(tmp_path / 'p'))
  _, b = final_state(str(tmp_path / 's'))
  chex.assert_trees_all_equal(a, b)


@pytest.mark.slow
def test_dc_outage_leaves_the_other_training_and_the_run_finishing(fake_data, tmp_path,
                                                                    caplog):
  # DC 0's outage in round 20 lies beyond the run's 4 rounds (numbered 1-4): it is
  # warned about.
  cfg = {'train.num_steps': 8, 'sync.faults': '1:1-2,0:20', 'train.checkpoint_every': 0}
  summary = train.train_and_evaluate(smoke_config(fake_data, **cfg), str(tmp_path / 'f'))
  assert ('sync.faults: DC 0 was to be absent in round 20, but the run ended after 4 '
          'rounds (rounds 1-4)') in caplog.text
  assert 'DC 1 was to be absent' not in caplog.text
  full = train.train_and_evaluate(
      smoke_config(fake_data, **dict(cfg, **{'sync.faults': ''})), str(tmp_path / 'n'))
  assert summary['inter_dc_rounds'] == 4 and summary['intra_dc_iterations'] == 8
  # With 2 DCs, a round with one DC absent has no peer to exchange with: no WAN bytes.
  assert summary['bytes']['inter_dc'] == full['bytes']['inter_dc'] / 2
  assert summary['final_test_accuracy'] > 0.3


@pytest.mark.slow
def test_an_outage_shows_under_the_round_it_was_configured_for(fake_data, tmp_path):
  """Issue 51, fault 3: sync.faults='1:2' counted rounds from 0, metrics.jsonl from 1, so
  the outage showed as round 3. Rounds are numbered from 1 everywhere: DC 1 misses
  round 2, the second, and the metrics show it there (no samples, weight 0, nothing on
  the WAN), with the round count the record of that round carries."""
  cfg = {'train.num_steps': 6, 'sync.faults': '1:2', 'train.checkpoint_every': 0}
  train.train_and_evaluate(smoke_config(fake_data, **cfg), str(tmp_path / 'f'))
  records = [json.loads(l) for l in open(tmp_path / 'f' / 'metrics.jsonl')]
  assert [r['round'] for r in records] == [1, 2, 3]
  rounds = {d['round']: d for r in records for d in r['dc_rounds']}
  assert sorted(rounds) == [1, 2, 3]
  absent = sorted(n for n, d in rounds.items() if d['samples'][1] == 0)
  assert absent == [2]
  assert rounds[2]['weight'][1] == 0 and rounds[2]['samples'][0] > 0
  assert [r['round'] for r in records if r['dc_rounds'][0]['samples'][1] == 0] == [2]
  inter = [r['bytes']['inter_dc'] for r in records]
  assert inter[1] == inter[0] > 0 and inter[2] == 2 * inter[0]  # round 2 sent nothing


@pytest.mark.slow
def test_heterogeneous_semi_sync_fednova_nesterov_runs(fake_data, tmp_path):
  cfg = {'train.num_steps': 9, 'sync.strategy': 'semi_sync', 'sync.aggregation': 'fednova',
         'network.dc_speed': (3.0, 1.0), 'sync.outer.name': 'nesterov',
         'sync.outer.learning_rate': 0.7, 'sync.outer.momentum': 0.9,
         'train.checkpoint_every': 0}
  summary = train.train_and_evaluate(smoke_config(fake_data, **cfg), str(tmp_path / 'h'))
  records = [json.loads(l) for l in open(tmp_path / 'h' / 'metrics.jsonl')]
  # The slow DC runs K_base = 2 iterations per round; the 3x faster DC fills the same
  # round time (less than 3x: both pay the same LAN time per iteration).
  assert records[0]['k_d'][1] == 2 and 4 <= records[0]['k_d'][0] <= 6
  assert summary['idle_s'][0] >= 0 and summary['idle_s'][1] >= 0
  assert np.isfinite(summary['final_test_loss'])


@pytest.mark.slow
def test_divergence_stops_before_anything_non_finite_is_written(fake_data, tmp_path):
  workdir = str(tmp_path / 'div')
  cfg = smoke_config(fake_data, **{'optimizer.learning_rate': 1e6})
  with pytest.raises(FloatingPointError, match='new --workdir'):
    train.train_and_evaluate(cfg, workdir)
  assert not os.path.exists(os.path.join(workdir, 'summary.json'))
  path = os.path.join(workdir, 'metrics.jsonl')
  if os.path.exists(path):  # strict JSON: no NaN/Infinity tokens
    for line in open(path):
      rec = json.loads(line, parse_constant=lambda c: pytest.fail(f'{c} in metrics.jsonl'))
      assert np.isfinite(rec['test_loss'])
  if os.path.isdir(os.path.join(workdir, 'checkpoints')) and os.listdir(
      os.path.join(workdir, 'checkpoints')):
    _, state = final_state(workdir)
    import jax  # pylint: disable=g-import-not-at-top
    for x in jax.tree.leaves(state['global_params']):
      assert np.all(np.isfinite(np.asarray(x)))


@pytest.mark.slow
def test_divergence_message_is_true_of_the_run(fake_data, tmp_path):
  # Diverges before its only checkpoint (at the end), uncompressed: no checkpoint to
  # speak of, no compression to make milder.
  cfg = smoke_config(fake_data, **{'optimizer.learning_rate': 1e6,
                                   'train.checkpoint_every': 0})
  with pytest.raises(FloatingPointError) as e:
    train.train_and_evaluate(cfg, str(tmp_path / 'div'))
  msg = str(e.value)
  assert 'checkpoint' not in msg and 'compression' not in msg, msg
  assert msg.endswith('training diverged. Lower optimizer.learning_rate (now 1000000.0) in '
                      'a new --workdir (a workdir keeps its config).'), msg
  # With checkpoints and compressed links: both are mentioned, as they are.
  cfg = smoke_config(fake_data, **{'compression.uplink.name': 'topk',
                                   'compression.wan.name': 'bf16'})
  advice = diagnostics.divergence_advice(cfg, '/w', 6)
  assert advice == (
      'The checkpoints in /w (up to step 6, before the divergence) are kept. Lower '
      "optimizer.learning_rate (now 0.1) or use milder compression than "
      "compression.uplink.name='topk', compression.wan.name='bf16' in a new --workdir "
      '(a workdir keeps its config).')


class _Calls(__import__('typing').NamedTuple):
  n: object


def _nan_from_third_call(shape, **unused):
  """A faulty compressor: float32 values, NaN from its third encode on."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from hfl.compress import base  # pylint: disable=g-import-not-at-top
  del unused

  def encode(x, state, key):
    del key
    return {'values': jnp.where(state.n >= 2, jnp.nan, x)}, _Calls(state.n + 1)
  return base.Compressor('nan_from_third_call', tuple(shape),
                         lambda: _Calls(jnp.zeros((), jnp.int32)), encode,
                         lambda p: p['values'])


@pytest.mark.slow
def test_non_finite_payload_stops_the_run_naming_leaf_and_link(fake_data, tmp_path):
  """Issue 12, fault 3: a non-finite payload stops the run like a non-finite loss
  (FloatingPointError, exit status 3 in main.py), naming the leaf and the link,
  before anything non-finite is evaluated or saved. The WAN compressor turns the
  third round's pseudo-gradient into NaN (rounds end at iterations 2, 4, 6)."""
  from hfl.compress import policy  # pylint: disable=g-import-not-at-top
  policy.register('nan_from_third_call', _nan_from_third_call)
  try:
    cfg = smoke_config(fake_data, **{'compression.wan.name': 'nan_from_third_call'})
    with pytest.raises(FloatingPointError) as e:
      train.train_and_evaluate(cfg, str(tmp_path / 'nan'))
  finally:
    policy.REGISTRY.pop('nan_from_third_call')
  msg = str(e.value)
  assert msg.startswith("at iteration 6 the first non-finite value is the payload and "
                        "residual of leaf ['Dense_0']['kernel'] on the WAN (DC 0)"), msg
  _, state = final_state(str(tmp_path / 'nan'))  # the last checkpoint: round 2, finite
  import jax  # pylint: disable=g-import-not-at-top
  for x in jax.tree.leaves(state):
    assert np.all(np.isfinite(np.asarray(x)))


@pytest.mark.slow
def test_dc_outage_discards_the_absent_dcs_round(fake_data, tmp_path):
  """Issue 12, fault 7: smoke config, momentum, top-k uplink, K = 4, 4 steps, DC 1
  absent in the first round (round 1). DC 1's optimizer state, residuals and compressor states are
  back at their start-of-round values (the initial zeros; they held max |momentum|
  0.67 and max |residual| 0.29), while DC 0's equal those of the same run without
  the outage (its own round does not depend on DC 1), and the global model is DC
  0's local model alone."""
  import jax  # pylint: disable=g-import-not-at-top
  cfg = {'optimizer.name': 'momentum', 'compression.uplink.name': 'topk', 'sync.k': 4,
         'train.num_steps': 4, 'train.checkpoint_every': 0}
  train.train_and_evaluate(smoke_config(fake_data, **cfg, **{'sync.faults': '1:1'}),
                           str(tmp_path / 'f'))
  train.train_and_evaluate(smoke_config(fake_data, **cfg), str(tmp_path / 'n'))
  _, got = final_state(str(tmp_path / 'f'))
  _, ref = final_state(str(tmp_path / 'n'))
  fields = (('opt_state',), ('up', 'residual'), ('up', 'compressor_state'),
            ('down', 'residual'), ('down', 'compressor_state'), ('wan', 'residual'),
            ('wan', 'compressor_state'))
  pick = lambda tree, path: tree[path[0]] if len(path) == 1 else tree[path[0]][path[1]]
  for field in fields:
    for a, b in zip(jax.tree.leaves(pick(got, field)), jax.tree.leaves(pick(ref, field))):
      a, b = np.asarray(a), np.asarray(b)
      np.testing.assert_array_equal(a[1], np.zeros_like(a[1]), err_msg=str(field))
      if field != ('wan', 'residual'):  # DC 0's own round does not depend on DC 1
        np.testing.assert_array_equal(a[0], b[0], err_msg=str(field))
  assert max(np.abs(np.asarray(x)[1]).max() for x in jax.tree.leaves(ref['opt_state'])) > 0.1
  assert max(np.abs(np.asarray(x)[1]).max()
             for x in jax.tree.leaves(ref['up']['residual'])) > 0.1
  # Every DC restarts from the new global model.
  for g, x in zip(jax.tree.leaves(got['global_params']), jax.tree.leaves(got['params'])):
    np.testing.assert_array_equal(np.asarray(x)[1], np.asarray(g))


# ------------------------------------------------------------------------------
# The loop state and the resolved warm-up, without a run.
# ------------------------------------------------------------------------------

def test_warmup_stage_of_every_step_matches_dgc_warmup_stage():
  """Setup precomputes the stage boundaries; the loop looks the stage up by step."""
  for steps in range(1, 14):
    for stages in range(1, 7):
      w = setup_lib.Warmup(setup_lib.warmup_starts(steps, stages), (None,) * stages)
      for step in range(steps + 3):
        ref = dgc.warmup_stage(step, steps, stages)
        assert w.stage(step) == (ref if ref < stages else None), (steps, stages, step)
  assert setup_lib.Warmup().stage(0) is None  # warm-up off


def _loop_state(schedule):
  ls = cost.new_loop_state(schedule, 2)
  ls = cost.account_iteration(ls, network.from_config(smoke_config('').network, 2), dict(
      up_bits=np.array([8 * 3, 8 * 5 + 4]), down_bits=np.array([16, 16])), [True, True])
  return ls._replace(evals=cost.Evaluations(best_test_accuracy=0.5, last_eval=dict(
      test_accuracy=0.5, round=1, sim_time_s=2.5)), since_eval=cost.SinceEval(round_loss=(1.25,)))


def test_loop_state_round_trips_through_the_checkpoint_dict_and_reads_old_ones():
  schedule = schedule_lib.make_schedule('periodic', 2, 3, 3)
  ls = _loop_state(schedule)._replace(run=cost.RunRecord(
      provenance=(dict(at_iteration=0, git_commit=None),)))
  assert ls.bits == dict(intra_up=68, intra_down=32, inter_dc=0)
  host = json.loads(json.dumps(cost.to_host(ls, 7.5)))  # what a checkpoint holds
  assert host['bytes'] == dict(intra_up=8.5, intra_down=4, inter_dc=0)
  back = cost.from_host(host, schedule)
  assert back.run.wall_time_s == 7.5
  chex.assert_trees_all_equal(back._replace(run=back.run._replace(wall_time_s=0.0)),
                              ls)  # clock, plan, schedule, ...
  assert back.evals.last_eval == ls.evals.last_eval and back.schedule == ls.schedule
  assert back.run.provenance == ls.run.provenance
  # Checkpoints of older versions: bytes only (exact bits derived), no best_test_loss,
  # no provenance.
  old = {k: v for k, v in host.items() if k not in ('bits', 'best_test_loss', 'provenance')}
  assert cost.from_host(old, schedule).bits == ls.bits
  assert cost.from_host(old, schedule).evals.best_test_loss is None
  assert cost.from_host(old, schedule).run.provenance == ()  # older checkpoints: none recorded


def test_the_accounting_at_stop_round_trips_and_only_the_summary_reads_it():
  """Issue 51, fault 1: the clock and WAN exposure of a run that stops after its last
  round (an overlapped transfer charged whole) travel beside the loop state's own;
  :func:`hfl.cost.stopped` swaps them in for the summary."""
  schedule = schedule_lib.make_schedule('periodic', 2, 3, 3)
  at_stop = cost.AtStop(network.Clock(np.array([3.0, 3.0]), np.array([0.0, 0.5])), 0.75)
  ls = _loop_state(schedule)._replace(wan=dict(exposed_s=0.25, peak_bits=8, peak_dc_bits=8),
                                      at_stop=at_stop)
  back = cost.from_host(json.loads(json.dumps(cost.to_host(ls, 0.0))), schedule)
  chex.assert_trees_all_equal(back.at_stop, at_stop)
  end = cost.stopped(back)
  chex.assert_trees_all_equal(end.clock, at_stop.clock)
  assert end.wan == dict(exposed_s=0.75, peak_bits=8, peak_dc_bits=8) and end.at_stop is None
  assert cost.stopped(end) is end and ls.wan['exposed_s'] == 0.25


def test_a_run_whose_faults_counted_rounds_from_0_is_not_continued():
  """Issue 51, fault 3: rounds in sync.faults are numbered from 1 now; a checkpoint
  written before (no ``fault_rounds_from``) of a run with outages is not continued,
  since its spec would now name rounds one later."""
  host = cost.to_host(_loop_state(schedule_lib.make_schedule('periodic', 2, 3, 3)), 0.0)
  workdir_lib.check_fault_rounds('1:2', host, 'w')
  old = {k: v for k, v in host.items() if k != 'fault_rounds_from'}
  workdir_lib.check_fault_rounds(' ', old, 'w')  # no outages: nothing to misread
  with pytest.raises(ValueError, match=r"counted rounds from 0; .* sync.faults='1:2' would "
                     'name rounds one later'):
    workdir_lib.check_fault_rounds('1:2', old, 'w')


def test_record_eval_keeps_the_best_and_the_first_crossing():
  schedule = schedule_lib.make_schedule('periodic', 2, 3, 3)
  task = tasks.Task('classification', 'test_accuracy', True, 0.6)
  ls = _loop_state(schedule)  # last evaluation: accuracy 0.5 at round 1, 2.5 s
  rec = dict(test_accuracy=0.7, test_loss=0.9, round=3, sim_time_s=4.5)
  ls = train.record_eval(ls, task, rec)
  # Crossed 0.6 halfway between the evaluations: round 2, 3.5 s (hand-computed).
  ev = ls.evals
  assert ev.rounds_to_target == pytest.approx(2.0) and ev.time_to_target_s == pytest.approx(3.5)
  assert (ev.best_test_accuracy, ev.best_test_loss, ls.since_eval.round_loss) == (0.7, 0.9, ())
  ls = train.record_eval(ls, task, dict(rec, test_accuracy=0.65, test_loss=1.0, round=5))
  ev = ls.evals
  assert ev.rounds_to_target == pytest.approx(2.0)  # the first crossing is kept
  assert (ev.best_test_accuracy, ev.best_test_loss) == (0.7, 0.9)
  assert ev.last_eval == dict(test_accuracy=0.65, sim_time_s=4.5, round=5)


def test_progress_line_shows_the_per_dc_k_of_semi_sync():
  plan = schedule_lib.RoundPlan(np.array([9, 7, 5, 4]), 4)
  assert diagnostics.k_text(plan) == '[9,7,5,4] (K_base 4)'
  assert diagnostics.k_text(schedule_lib.RoundPlan(np.array([4, 4]), 4)) == '4'


def test_a_workdir_in_use_by_another_run_is_refused_untouched(fake_data, tmp_path):
  """While another run holds WORKDIR/.lock (fcntl.flock), a second run stops before it
  reads or writes anything there, naming the holder; once the lock is free, the
  lock file is gone and a workdir the refused run created is removed again."""
  import fcntl  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / 'run'
  workdir.mkdir()
  (workdir / 'metrics.jsonl').write_text('{"step": 2}\n')
  lock = workdir / workdir_lib.LOCK_FILE
  lock.write_text('pid 12345 on elsewhere, since 2026-12-04 10:00:00\n')
  with open(lock) as held:
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with pytest.raises(workdir_lib.WorkdirInUseError) as e:
      train.train_and_evaluate(smoke_config(fake_data), str(workdir))
    assert str(e.value).startswith(f'{workdir} is in use by another run (pid 12345 on '
                                   'elsewhere, since 2026-12-04 10:00:00; ')
    assert isinstance(e.value, ValueError)
    assert sorted(os.listdir(workdir)) == ['.lock', 'metrics.jsonl']
    assert lock.read_text().startswith('pid 12345')
  # Free: the lock is taken, the holder written, and both removed at the end.
  with workdir_lib.workdir_lock(str(workdir)):
    assert lock.read_text().startswith(f'pid {os.getpid()} on ')
  assert sorted(os.listdir(workdir)) == ['metrics.jsonl']
  # A refused config leaves no workdir behind that the run itself created.
  with pytest.raises(ValueError, match='sync.k'):
    train.train_and_evaluate(smoke_config(fake_data, **{'sync.k': 0}), str(tmp_path / 'new'))
  assert not (tmp_path / 'new').exists()
  # A workdir that cannot be created is refused before anything is loaded.
  (tmp_path / 'a_file').write_text('')
  with pytest.raises(ValueError, match=r"--workdir='.*a_file/run' cannot be created: "):
    train.train_and_evaluate(smoke_config(fake_data), str(tmp_path / 'a_file' / 'run'))


def test_describe_sync_names_the_strategy_and_only_the_options_that_are_on():
  from hfl import setup as setup_lib  # pylint: disable=g-import-not-at-top
  c = config_lib.load_file('configs/smoke.py')
  assert setup_lib.describe_sync(c, [2, 2]) == (
      "sync.strategy='periodic', first round K_d=[2, 2], aggregation='fedavg', "
      "outer='avg' (lr 1.0, momentum 0.0)")
  c.sync.strategy, c.sync.control_variates, c.sync.prox_mu = 'semi_sync', 'scaffold', 0.01
  assert setup_lib.describe_sync(c, [4, 2]).endswith(
      "K_d=[4, 2], aggregation='fedavg', outer='avg' (lr 1.0, momentum 0.0); "
      "prox_mu=0.01, control_variates='scaffold'")
