"""The real workloads end to end: image folders with augmentation and LR schedules, the
character-level LM; per-task metrics and targets; config validation; old workdirs."""

import copy
import json
import math
import os

import jax
import jax.numpy as jnp
import ml_collections
import chex
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from configs import cifar10, cifar10_resnet20, shakespeare, smoke
from hfl import config as config_lib
from hfl import data as data_lib
from hfl import mesh as mesh_lib
from hfl import metrics, models, optim, tasks, train
from hfl import step as step_lib
from hfl.data import augment
from hfl import workdir as workdir_lib
from tests.helpers import crash_then_resume, final_state, mlp_identity, make_tree
from tests.helpers import set_overrides, write_archive

D, W = 2, 4


def _crash_and_resume(config_fn, tmp_path, monkeypatch, crash_step=8):
  """(reference workdir, resumed workdir): an uninterrupted run and one that crashes
  at ``crash_step`` and is rerun."""
  ref_dir, cut_dir = str(tmp_path / 'ref'), str(tmp_path / 'cut')
  train.train_and_evaluate(config_fn(), ref_dir)
  crash_then_resume(config_fn, cut_dir, monkeypatch, crash_step)
  return ref_dir, cut_dir


def _assert_same_state(a_dir, b_dir):
  step_a, a = final_state(a_dir)
  step_b, b = final_state(b_dir)
  assert step_a == step_b
  chex.assert_trees_all_equal(a, b)
  return a


# ------------------------------------------------------------------------------
# Image folder + crop/flip augmentation + cosine schedule.
# ------------------------------------------------------------------------------

@pytest.fixture(scope='module')
def image_archive(tmp_path_factory):
  root = tmp_path_factory.mktemp('imgfolder')
  classes = {'a': (16, 4), 'b': (16, 4), 'c': (16, 4)}
  return write_archive(root / 'tiny.tar.gz', make_tree(classes=classes, size=(8, 8))), str(
      root / 'cache')


def _image_config(archive, cache):
  return set_overrides(smoke.get_config(), **{
      'dataset.name': 'tiny_images', 'dataset.data_dir': archive, 'dataset.cache_dir': cache,
      'dataset.partition': 'iid', 'dataset.augment': 'crop_flip', 'train.batch_size': 4,
      'optimizer.name': 'nesterov', 'optimizer.schedule': 'cosine',
      'optimizer.warmup_steps': 3, 'optimizer.final_lr_ratio': 0.1, 'sync.k': 3})


@pytest.mark.slow
def test_augmented_scheduled_image_folder_run_resumes_bitwise(image_archive, tmp_path,
                                                              monkeypatch):
  calls = []
  real_crop_flip = augment.crop_flip
  monkeypatch.setattr(augment, 'crop_flip', lambda *a: calls.append(1) or real_crop_flip(*a))
  ref_dir, cut_dir = _crash_and_resume(lambda: _image_config(*image_archive), tmp_path,
                                       monkeypatch)
  assert len(calls) >= 12 * 8  # every worker's batch of every iteration was augmented
  state = _assert_same_state(ref_dir, cut_dir)
  # The schedule's count is in the checkpointed optimizer state: 12 updates per DC.
  counts = [np.asarray(v) for p, v in jax.tree_util.tree_flatten_with_path(state['opt_state'])[0]
            if 'count' in jax.tree_util.keystr(p)]
  assert counts and all(np.array_equal(c, [12, 12]) for c in counts)
  summary = json.load(open(os.path.join(cut_dir, 'summary.json')))
  assert summary['target_metric'] == 'test_accuracy' and summary['target_accuracy'] == 0.88


# ------------------------------------------------------------------------------
# The schedule's count at the step level: optimizer steps, not iterations.
# ------------------------------------------------------------------------------

@pytest.mark.parametrize('name', ['cosine', 'linear'])
def test_schedule_without_warmup_is_optax_s_warmup_schedule_at_zero(name):
  """warmup_steps = 0 builds the decay alone (optax warns about a 0-step warm-up
  schedule); values bitwise those of optax's warm-up form with 0 warm-up steps."""
  cfg = ml_collections.ConfigDict(dict(name='sgd', learning_rate=0.1, schedule=name,
                                       warmup_steps=0, decay_steps=0, final_lr_ratio=0.1))
  ours = optim.make_schedule(cfg, 800)
  ref = (optax.warmup_cosine_decay_schedule(0.0, 0.1, 0, 800, 0.1 * 0.1) if name == 'cosine'
         else optax.join_schedules([optax.linear_schedule(0.0, 0.1, 0),
                                    optax.linear_schedule(0.1, 0.1 * 0.1, 800)], [0]))
  count = jnp.arange(0, 900, 7)
  chex.assert_trees_all_equal(jax.vmap(ours)(count), jax.vmap(ref)(count))
  assert float(ours(800)) == pytest.approx(0.01)


@pytest.mark.parametrize('shard', [False, True])
def test_schedule_counts_optimizer_steps_of_active_dcs(shard):
  cfg = ml_collections.ConfigDict(dict(name='momentum', learning_rate=0.1, momentum=0.9,
                                       weight_decay=0.0, schedule='cosine', warmup_steps=2,
                                       decay_steps=10, final_lr_ratio=0.0))
  optimizer = optim.make_optimizer(cfg)
  mesh = mesh_lib.make_mesh(D, W)
  net, params, comps = mlp_identity(4)
  outer = optax.sgd(1.0)
  state = step_lib.init_state(params, optimizer, outer, comps, D, W, jax.random.PRNGKey(1),
                              shard_state=shard)
  state = jax.device_put(state, step_lib.state_shardings(mesh, state))
  fn = step_lib.make_step(lambda p, x: net.apply({'params': p}, x), optimizer, outer, comps,
                          mesh, state)
  put = lambda x, *spec: jax.device_put(x, NamedSharding(mesh, P(*spec)))
  rng = np.random.default_rng(0)
  x0 = jax.tree.map(np.array, state.params)
  history = []
  for active in ([True, True], [True, False], [True, False]):
    batch = (put(rng.normal(size=(D, W, 3, 4, 4, 1)).astype(np.float32), 'dc', 'worker'),
             put(rng.integers(0, 10, (D, W, 3)).astype(np.int32), 'dc', 'worker'))
    state, _ = fn(state, batch, put(np.array(active), 'dc'), put(np.ones(D, np.float32)), False)
    jax.block_until_ready(state)
    history.append(jax.tree.map(np.array, state.params))
  counts = optax.tree_utils.tree_get_all_with_path(state.opt_state, 'count')
  assert counts
  for _, c in counts:  # DC 0 made 3 updates, DC 1 (inactive twice) 1; per worker if sharded
    np.testing.assert_array_equal(np.asarray(c), [[3] * W, [1] * W] if shard else [3, 1])
  # The first update uses the schedule at 0: 0 during the warm-up, so nothing moves.
  for a, b in zip(jax.tree.leaves(history[0]), jax.tree.leaves(x0)):
    np.testing.assert_array_equal(a, b)
  moved = [not np.array_equal(a[0], b[0]) for a, b in zip(jax.tree.leaves(history[1]),
                                                          jax.tree.leaves(history[0]))]
  assert any(moved)


# ------------------------------------------------------------------------------
# Character-level language model.
# ------------------------------------------------------------------------------

@pytest.fixture(scope='module')
def corpus(tmp_path_factory):
  rng = np.random.default_rng(0)
  words = ['the', 'king', 'queen', 'speaks', 'and', 'all', 'hear', 'him', 'now']
  text = ' '.join(rng.choice(words, size=900)) + '\n'
  path = tmp_path_factory.mktemp('text') / 'corpus.txt'
  path.write_text(text)
  return str(path)


def _lm_config(path, **overrides):
  return set_overrides(shakespeare.get_config(), **{
      'dataset.name': 'text', 'dataset.data_dir': path, 'model.num_layers': 1,
      'model.num_heads': 2, 'model.embed_dim': 16, 'model.seq_len': 8,
      'optimizer.learning_rate': 1e-2, 'optimizer.warmup_steps': 2, 'train.num_steps': 12,
      'train.batch_size': 2, 'train.eval_every': 1, 'train.checkpoint_every': 1,
      'train.log_every': 4, 'train.eval_batch_size': 64, 'sync.k': 3,
      'train.target_loss': 2.6, **overrides})


@pytest.mark.slow
def test_lm_run_metrics_targets_and_bitwise_resume(corpus, tmp_path, monkeypatch):
  ref_dir, cut_dir = _crash_and_resume(lambda: _lm_config(corpus), tmp_path, monkeypatch)
  state = _assert_same_state(ref_dir, cut_dir)
  records = [json.loads(l) for l in open(os.path.join(ref_dir, 'metrics.jsonl'))]
  assert [r['round'] for r in records] == [1, 2, 3, 4]
  for r in records:
    assert r['test_bits_per_char'] == pytest.approx(r['test_loss'] / math.log(2), rel=1e-12)
    assert r['test_perplexity'] == pytest.approx(math.exp(r['test_loss']), rel=1e-12)
  assert records[-1]['test_loss'] < records[0]['test_loss']   # it learns
  summary = json.load(open(os.path.join(ref_dir, 'summary.json')))
  assert summary['target_metric'] == 'test_loss' and summary['target'] == 2.6
  assert summary['best_test_loss'] == min(r['test_loss'] for r in records)
  assert summary['final_test_bits_per_char'] == records[-1]['test_bits_per_char']
  # rounds_to_target: the first crossing of 2.6 (downwards), interpolated.
  losses = [r['test_loss'] for r in records]
  first = next(i for i, l in enumerate(losses) if l <= 2.6)
  if first == 0:
    assert summary['rounds_to_target'] == 1
  else:
    frac = (2.6 - losses[first - 1]) / (losses[first] - losses[first - 1])
    assert summary['rounds_to_target'] == pytest.approx(first + frac)
  # The evaluation against a single-device numpy reference on the validation windows.
  ds = data_lib.load('text', corpus, seq_len=8)
  net = models.from_config(_lm_config(corpus).model, ds.num_classes)
  logits = np.asarray(jax.jit(net.apply)({'params': state['global_params']}, ds.test_images),
                      np.float64)
  logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1,
                                                                            keepdims=True))
  logp -= logits.max(-1, keepdims=True)
  nll = -np.take_along_axis(logp, ds.test_labels[..., None], -1).mean()
  assert summary['final_test_loss'] == pytest.approx(nll, rel=1e-5)
  acc = (logits.argmax(-1) == ds.test_labels).mean()
  assert summary['final_test_accuracy'] == pytest.approx(acc, abs=1e-6)
  # A target changed on rerun of the finished run: the crossing is recomputed from the
  # evaluations already made (a plain loop over the losses here), and written.
  new_target = (losses[-1] + losses[-2]) / 2
  expect = next(r['round'] for r in records if r['test_loss'] <= new_target)
  i = [r['round'] for r in records].index(expect)
  if i > 0 and losses[i - 1] > new_target:
    expect = i + (new_target - losses[i - 1]) / (losses[i] - losses[i - 1])
  again = train.train_and_evaluate(_lm_config(corpus, **{'train.target_loss': new_target}),
                                   ref_dir)
  written = json.load(open(os.path.join(ref_dir, 'summary.json')))
  for out in (again, written):
    assert out['target'] == new_target
    assert out['rounds_to_target'] == pytest.approx(expect)
    assert out['final_test_loss'] == summary['final_test_loss']
  # The stored configs name the new target; every other field is the one trained with.
  stored = json.load(open(os.path.join(ref_dir, 'config.json')))
  for cfg in (stored, written['config']):
    assert cfg['train']['target_loss'] == new_target
    cfg['train']['target_loss'] = summary['config']['train']['target_loss']
    assert cfg == summary['config']


# ------------------------------------------------------------------------------
# Tasks, configs, compatibility.
# ------------------------------------------------------------------------------

def test_eval_sums_against_numpy():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 5, 7)).astype(np.float32)
  labels = rng.integers(0, 7, (3, 5))
  mask = np.array([1.0, 1.0, 0.0], np.float32)
  correct, loss = tasks.eval_sums(jnp.asarray(logits), jnp.asarray(labels), jnp.asarray(mask))
  lg = logits.astype(np.float64)
  lse = np.log(np.exp(lg - lg.max(-1, keepdims=True)).sum(-1)) + lg.max(-1)
  nll = lse - np.take_along_axis(lg, labels[..., None], -1)[..., 0]
  assert float(loss) == pytest.approx(nll[:2].mean(1).sum(), rel=1e-6)
  assert float(correct) == pytest.approx((lg.argmax(-1) == labels)[:2].mean(1).sum())


def _cross(task, prev, cur, key):
  return metrics.crossing(prev, cur, task.target, key, task.metric, task.higher_is_better)


def test_crossing_both_directions():
  lm = tasks.Task('language_model', 'test_loss', False, 1.7)
  prev = dict(test_loss=1.9, round=10, sim_time_s=100.0)
  cur = dict(test_loss=1.5, round=20, sim_time_s=300.0)
  assert lm.reached(1.7) and not lm.reached(1.71)
  assert _cross(lm, prev, cur, 'round') == pytest.approx(15.0)
  assert _cross(lm, prev, cur, 'sim_time_s') == pytest.approx(200.0)
  cls = tasks.Task('classification', 'test_accuracy', True, 0.8)
  prev = dict(test_accuracy=0.7, round=4, sim_time_s=1.0)
  cur = dict(test_accuracy=0.9, round=8, sim_time_s=2.0)
  assert _cross(cls, prev, cur, 'round') == pytest.approx(6.0)
  assert _cross(cls, None, cur, 'round') == 8.0
  # An older run's last evaluation holds only test_accuracy: counts as absent for a loss.
  assert _cross(lm, {'test_accuracy': 0.5, 'round': 1}, dict(
      test_loss=1.0, round=3), 'round') == 3.0


BAD = [
    (cifar10, {'model.name': 'transformer'}, 'model.name'),
    (shakespeare, {'model.name': 'cnn'}, 'model.name'),
    (cifar10, {'dataset.partition': 'contiguous'}, 'dataset.partition'),
    (shakespeare, {'dataset.partition': 'dirichlet'}, 'dataset.partition'),
    (shakespeare, {'dataset.augment': 'crop_flip'}, 'dataset.augment'),
    (cifar10, {'dataset.augment': 'mixup'}, 'dataset.augment'),
    (shakespeare, {'model.embed_dim': 130}, 'model.embed_dim'),
    (shakespeare, {'model.seq_len': 0}, 'model.seq_len'),
    (shakespeare, {'train.target_loss': -1.0}, 'train.target_loss'),
    (cifar10, {'optimizer.schedule': 'step'}, 'optimizer.schedule'),
    (cifar10, {'optimizer.warmup_steps': -1}, 'optimizer.warmup_steps'),
    (cifar10, {'optimizer.warmup_steps': 5000}, 'optimizer.decay_steps'),
    (cifar10, {'optimizer.final_lr_ratio': 2.0}, 'optimizer.final_lr_ratio'),
    (cifar10, {'dataset.cache_dir': None}, 'dataset.cache_dir'),
]


@pytest.mark.parametrize('module,overrides,field', BAD, ids=[b[2] for b in BAD])
def test_bad_fields_are_named(module, overrides, field):
  c = module.get_config()
  with pytest.raises(ValueError, match=field.replace('.', r'\.')):
    config_lib.validate(set_overrides(c, **overrides))


def test_transformer_fields_are_required():
  c = smoke.get_config()
  set_overrides(c, **{'dataset.name': 'tiny_shakespeare', 'model.name': 'transformer',
             'dataset.partition': 'iid'})
  with pytest.raises(ValueError, match='model.num_layers, model.num_heads, model.embed_dim, '
                     'model.seq_len'):
    config_lib.validate(c)


def test_shipped_configs_validate():
  # paths=False: their data (../shared/data) is absent on a user's machine.
  for module in (cifar10, cifar10_resnet20, shakespeare):
    config_lib.validate(module.get_config(), paths=False)


def test_older_workdir_without_the_new_fields_resumes(tmp_path):
  c = smoke.get_config()
  old = json.loads(c.to_json())
  for section, field in (('dataset', 'cache_dir'), ('dataset', 'augment'),
                         ('optimizer', 'schedule'), ('optimizer', 'warmup_steps'),
                         ('optimizer', 'decay_steps'), ('optimizer', 'final_lr_ratio'),
                         ('train', 'target_loss')):
    del old[section][field]
  (tmp_path / 'config.json').write_text(json.dumps(old))
  (tmp_path / 'checkpoints' / '4').mkdir(parents=True)  # a run with a checkpoint: pinned
  assert workdir_lib.check_workdir_config(str(tmp_path), c) == []
  c.optimizer.schedule = 'cosine'   # but a changed schedule is refused
  with pytest.raises(ValueError, match='optimizer.schedule'):
    workdir_lib.check_workdir_config(str(tmp_path), c)


def test_another_spelling_of_the_data_dir_resumes(tmp_path):
  c = smoke.get_config()
  c.dataset.data_dir = '/data/fmnist'
  (tmp_path / 'config.json').write_text(c.to_json())
  (tmp_path / 'checkpoints' / '4').mkdir(parents=True)  # a run with a checkpoint: pinned
  for same in ('/data/fmnist/', '/data//fmnist', '/data/x/../fmnist'):
    c.dataset.data_dir = same
    assert workdir_lib.check_workdir_config(str(tmp_path), c) == []
  c.dataset.data_dir = '/data/fmnist2'   # another directory is refused
  with pytest.raises(ValueError, match='dataset.data_dir'):
    workdir_lib.check_workdir_config(str(tmp_path), c)


def test_workdir_without_config_json_is_checked_against_its_summary(tmp_path):
  """A half-copied workdir (config.json lost) is checked against summary.json's
  config; with checkpoints but neither file it is refused, not resumed blind."""
  c = smoke.get_config()
  (tmp_path / 'summary.json').write_text(json.dumps({'config': json.loads(c.to_json())}))
  assert workdir_lib.check_workdir_config(str(tmp_path), c) == []
  changed = copy.deepcopy(c)
  changed.sync.k = c.sync.k + 1
  with pytest.raises(ValueError, match='sync.k'):
    workdir_lib.check_workdir_config(str(tmp_path), changed)
  (tmp_path / 'summary.json').unlink()
  assert workdir_lib.check_workdir_config(str(tmp_path), changed) == []  # a new run
  (tmp_path / 'checkpoints' / '50').mkdir(parents=True)
  with pytest.raises(ValueError, match='checkpoints but no config.json'):
    workdir_lib.check_workdir_config(str(tmp_path), c)


@pytest.mark.parametrize('text', ['{garbage', '', '[1, 2]'])
def test_a_corrupt_config_json_is_named(tmp_path, text):
  (tmp_path / 'config.json').write_text(text)
  before = (tmp_path / 'config.json').read_bytes()
  with pytest.raises(ValueError, match=r'config\.json'):
    workdir_lib.check_workdir_config(str(tmp_path), smoke.get_config())
  assert (tmp_path / 'config.json').read_bytes() == before


def test_ignored_fields_name_what_the_run_does_not_use():
  c = smoke.get_config()
  c.sync.strategy = 'sync'
  c.compression.uplink.name = 'topk'
  ignored = config_lib.ignored_fields(c)
  assert 'sync.k' in ignored and 'compression.uplink.density' not in ignored
  assert 'compression.uplink.levels' in ignored and 'compression.downlink.density' in ignored
  same = copy.deepcopy(c)
  same.sync.k, same.compression.downlink.density = 7, 0.3
  assert config_lib.experiment_key(same) == config_lib.experiment_key(c)
  same.compression.uplink.density = 0.3  # used by top-k
  assert config_lib.experiment_key(same) != config_lib.experiment_key(c)
