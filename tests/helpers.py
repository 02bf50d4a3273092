"""Helpers several test files share: synthetic datasets, the smoke config, checkpoints.

Fixtures built on them (``fake_data``) are in ``tests/conftest.py``; test files
import these functions from here, never from each other.
"""

import gzip
import io
import json
import os
import tarfile

import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding, PartitionSpec as P
from PIL import Image

from configs import smoke
from hfl import models
from hfl import step as step_lib
from hfl.compress import base


# ------------------------------------------------------------------------------
# IDX files (the MNIST / Fashion-MNIST format).
# ------------------------------------------------------------------------------

def idx_bytes(arr: np.ndarray) -> bytes:
  """A uint8 array encoded as an IDX file: magic 0x0000 08 NDIM, big-endian dims, data."""
  arr = np.ascontiguousarray(arr)
  header = bytes([0, 0, 0x08, arr.ndim]) + b''.join(int(d).to_bytes(4, 'big') for d in arr.shape)
  return header + arr.astype('>u1').tobytes()


def write_idx(path: str, arr: np.ndarray) -> None:
  """Writes ``arr`` (values in [0, 255]) as an IDX file, gzip'd when ``path`` ends in .gz."""
  payload = idx_bytes(np.asarray(arr).astype(np.uint8))
  if os.fspath(path).endswith('.gz'):
    payload = gzip.compress(payload)
  with open(path, 'wb') as f:
    f.write(payload)


def make_fake_fashion_mnist(root, n_train=640, n_test=160, seed=0) -> str:
  """A learnable 10-class stand-in in Fashion-MNIST's IDX layout (28x28 grey, gzip)."""
  rng = np.random.default_rng(seed)
  protos = rng.integers(0, 255, size=(10, 28, 28))
  for split, n in (('train', n_train), ('t10k', n_test)):
    labels = rng.integers(0, 10, size=n)
    images = np.clip(protos[labels] * 0.6 + rng.normal(0, 40, size=(n, 28, 28)), 0, 255)
    write_idx(os.path.join(root, f'{split}-images-idx3-ubyte.gz'), images)
    write_idx(os.path.join(root, f'{split}-labels-idx1-ubyte.gz'), labels)
  return str(root)


# ------------------------------------------------------------------------------
# Image folders (CIFAR-10 style class directories).
# ------------------------------------------------------------------------------

# class -> number of (train, test) images; names deliberately not in creation order.
CLASSES = {'zebra': (3, 2), 'ant': (2, 1), 'moth': (4, 2)}


def png(arr: np.ndarray) -> bytes:
  buf = io.BytesIO()
  Image.fromarray(arr).save(buf, format='PNG')  # lossless: decoded pixels are exact
  return buf.getvalue()


def make_tree(seed=0, classes=CLASSES, size=(5, 4)):
  """{relpath: uint8 [H, W, 3]} of a small image folder (files named out of order)."""
  rng = np.random.default_rng(seed)
  tree = {}
  for cls, counts in classes.items():
    for split, n in zip(('train', 'test'), counts):
      for i in reversed(range(n)):
        tree[f'{split}/{cls}/img{i:02d}.png'] = rng.integers(0, 256, size + (3,), np.uint8)
  return tree


def write_archive(path, tree, prefix='', extra=()):
  """A .tar.gz of ``tree`` (PNG-encoded) plus ``extra`` (relpath, raw bytes) members."""
  with tarfile.open(path, 'w:gz') as tar:
    for rel, payload in [(r, png(a)) for r, a in tree.items()] + list(extra):
      info = tarfile.TarInfo(prefix + rel)
      info.size = len(payload)
      tar.addfile(info, io.BytesIO(payload))
  return str(path)


# ------------------------------------------------------------------------------
# Runs.
# ------------------------------------------------------------------------------

def set_overrides(c, **overrides):
  """Sets dotted ``overrides`` ('train.num_steps'=...) on config ``c``; returns ``c``."""
  for key, value in overrides.items():
    obj = c
    *parents, leaf = key.split('.')
    for p in parents:
      obj = obj[p]
    obj[leaf] = value
  return c


def smoke_config(data_dir, **overrides):
  """configs/smoke.py on ``data_dir`` with dotted ``overrides`` ('train.num_steps'=...)."""
  c = smoke.get_config()
  c.dataset.data_dir = data_dir
  return set_overrides(c, **overrides)


def final_state(workdir):
  """(step, TrainState pytree) of a workdir's newest checkpoint, as numpy arrays."""
  ckpts = os.path.join(workdir, 'checkpoints')
  last = max(int(x) for x in os.listdir(ckpts) if x.isdigit())
  return last, ocp.PyTreeCheckpointer().restore(os.path.join(ckpts, str(last), 'state'))


def crash_then_resume(config_fn, workdir, monkeypatch, crash_step):
  """Trains ``config_fn()`` in ``workdir`` until the batch of ``crash_step`` is
  drawn (a simulated crash: KeyboardInterrupt, no summary.json written), then
  reruns it to the end; returns the rerun's summary."""
  import pytest  # pylint: disable=g-import-not-at-top
  from hfl import data as data_lib  # pylint: disable=g-import-not-at-top
  from hfl import train  # pylint: disable=g-import-not-at-top
  real = data_lib.batch_indices

  def crash(part, batch_size, step, seed):
    if step == crash_step:
      raise KeyboardInterrupt('simulated crash')
    return real(part, batch_size, step, seed)
  monkeypatch.setattr(data_lib, 'batch_indices', crash)
  with pytest.raises(KeyboardInterrupt):
    train.train_and_evaluate(config_fn(), workdir)
  assert not os.path.exists(os.path.join(workdir, 'summary.json'))
  monkeypatch.setattr(data_lib, 'batch_indices', real)
  return train.train_and_evaluate(config_fn(), workdir)


# ------------------------------------------------------------------------------
# The step on a (D=2, W=4) mesh, B examples of 8x8x1 per worker.
# ------------------------------------------------------------------------------

D, W, B = 2, 4, 4


def mlp_identity(hw: int):
  """(net, params, comps): the 'mlp' model (10 classes) initialised on [1, hw, hw, 1]
  inputs and identity compressors on every link."""
  net = models.get_model('mlp', 10)
  params = net.init(jax.random.PRNGKey(0), jax.numpy.zeros((1, hw, hw, 1)))['params']
  ident = [base.identity(l.shape) for l in jax.tree.leaves(params)]
  return net, params, step_lib.Compressors(ident, ident, ident)


def step_batches(n, seed=0):
  """``n`` iterations of random batches: (float32 [n, D, W, B, 8, 8, 1], int32 [n, D, W, B])."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, D, W, B, 8, 8, 1)).astype(np.float32)
  y = rng.integers(0, 10, size=(n, D, W, B)).astype(np.int32)
  return x, y


def put(mesh, x, *spec):
  """``x`` on ``mesh``, sharded as ``PartitionSpec(*spec)``."""
  return jax.device_put(x, NamedSharding(mesh, P(*spec)))


def run_steps(mesh, fn, state, xs, ys, active, weights, rounds):
  """Runs len(xs) iterations; returns the state and the last one's host metrics."""
  for t in range(len(xs)):
    state, m = fn(state, (put(mesh, xs[t], 'dc', 'worker'), put(mesh, ys[t], 'dc', 'worker')),
                  put(mesh, np.asarray(active[t]), 'dc'),
                  put(mesh, np.asarray(weights, np.float32)), rounds[t])
    jax.block_until_ready(state)
  return state, host_metrics(fn, m, rounds[-1], active[-1], weights)


def host_metrics(fn, m, do_round, active=(True, True), weights=(.5, .5)):
  """hfl.step.host_metrics of one iteration's device metrics."""
  return step_lib.host_metrics(fn.info[bool(do_round)], np.asarray(m), np.asarray(active),
                               np.asarray(weights, np.float32))


def run_schedule(sched, losses):
  """A K schedule's plans (the initial one, then one per loss) and its final state."""
  state = sched.init()
  plans = [sched.plan(state)]
  for loss in losses:
    plan, state = sched.next_round(state, loss)
    plans.append(plan)
  return plans, state


def pinned_workdir_without(tmp_path, config, section: str, field: str) -> str:
  """A workdir holding a checkpoint (pinned) whose config.json is ``config`` without
  ``section.field``, as a run started before the field was added wrote it; its path."""
  old = json.loads(config.to_json())
  del old[section][field]
  with open(os.path.join(tmp_path, 'config.json'), 'w') as f:
    json.dump(old, f)
  os.makedirs(os.path.join(tmp_path, 'checkpoints', '4'))
  return str(tmp_path)


def float64_grad(apply_fn, treedef, x, images, labels) -> list:
  """A numpy reference loop's gradient: the mean softmax cross-entropy of
  ``apply_fn`` at the float64 leaves ``x`` (evaluated in float32), as float64 leaves."""
  def loss(p):
    return optax.softmax_cross_entropy_with_integer_labels(apply_fn(p, images), labels).mean()
  p32 = jax.tree.unflatten(treedef, [l.astype(np.float32) for l in x])
  return [np.asarray(a, np.float64) for a in jax.tree.leaves(jax.grad(loss)(p32))]
