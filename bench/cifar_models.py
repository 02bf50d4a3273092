"""Candidate CIFAR-10 CNNs: training images/s and test accuracy after a short run.

Plain data-parallel-free training on ONE device with ``jax.jit`` (no hfl step,
no mesh), to choose the fast CNN of configs/cifar10.py: every candidate trains
on the same data pipeline as hfl (the image-folder source, standardisation,
host-side crop + flip augmentation), with momentum SGD (Nesterov, 0.9),
L2 weight decay 5e-4, and a linear warm-up + cosine learning-rate schedule over
the run, for the same number of epochs.

  python3 bench/cifar_models.py --data=../shared/data/cifar10-jpeg.tar.gz \
      --models=cnn,cifar_cnn,convnet3,convnet6 --epochs=3

Prints, per model: parameters, multiply-adds per image, train images/s
and per CPU-second of this process (the machine is shared: CPU time is the steadier
measure; measured over the whole run, compilation and evaluation excluded), test
accuracy and loss at the end, wall seconds. Results: docs/benchmarks.md.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from hfl import data as data_lib  # noqa: E402
from hfl import models  # noqa: E402
from hfl.data import augment  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from arg_types import existing_path, int_at_least, names_in, number_in  # noqa: E402

# Candidates: name -> constructor(num_classes).
CANDIDATES = {
    'cnn': lambda k: models.get_model('cnn', k),
    'convnet3': lambda k: models.ConvNet(k, ((32,), (64,), (128,)), norm=True),
    'convnet3_fc': lambda k: models.ConvNet(k, ((32,), (64,), (128,)), norm=True, dense=256),
    'convnet3_nonorm': lambda k: models.ConvNet(k, ((32,), (64,), (128,)), norm=False),
    'cifar_cnn': lambda k: models.get_model('cifar_cnn', k),  # = convnet3_fc without norm
    'convnet6': lambda k: models.ConvNet(k, ((32, 32), (64, 64), (128, 128)), norm=True),
    'convnet6_nonorm': lambda k: models.ConvNet(k, ((32, 32), (64, 64), (128, 128)),
                                                norm=False),
    'convnet_wide': lambda k: models.ConvNet(k, ((64, 64), (128, 128), (256, 256)), norm=True),
    'resnet20': lambda k: models.get_model('resnet20', k),
}


def macs(model, shape) -> int:
  """Multiply-adds of one forward pass of one image (from XLA's cost analysis / 2)."""
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((1,) + shape))['params']
  f = jax.jit(lambda p, x: model.apply({'params': p}, x))
  cost = f.lower(params, jnp.zeros((1,) + shape)).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  return int(cost.get('flops', 0) / 2)


def run(name, ds, args):
  model = CANDIDATES[name](ds.num_classes)
  shape = tuple(ds.train_images.shape[1:])
  params = model.init(jax.random.PRNGKey(args.seed), jnp.zeros((1,) + shape))['params']
  n_params = sum(x.size for x in jax.tree.leaves(params))
  n = len(ds.train_labels)
  steps_per_epoch = n // args.batch
  total = steps_per_epoch * args.epochs
  sched = optax.warmup_cosine_decay_schedule(0.0, args.lr, max(1, total // 20), total)
  tx = optax.chain(optax.add_decayed_weights(args.wd),
                   optax.sgd(sched, momentum=0.9, nesterov=True))
  opt = tx.init(params)

  @jax.jit
  def step(params, opt, x, y):
    def loss_fn(p):
      logits = model.apply({'params': p}, x)
      return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    loss, g = jax.value_and_grad(loss_fn)(params)
    upd, opt = tx.update(g, opt, params)
    return optax.apply_updates(params, upd), opt, loss

  @jax.jit
  def eval_chunk(params, x, y):
    logits = model.apply({'params': params}, x)
    return (jnp.sum(jnp.argmax(logits, -1) == y),
            jnp.sum(optax.softmax_cross_entropy_with_integer_labels(logits, y)))

  test_x, test_y = np.asarray(ds.test_images), ds.test_labels
  rng = np.random.default_rng(args.seed)
  train_s, data_s, cpu_s, done = 0.0, 0.0, 0.0, 0
  t0 = time.time()
  for s in range(total):
    e, i = divmod(s, steps_per_epoch)
    if i == 0:
      perm = rng.permutation(n)
    t, c = time.perf_counter(), time.process_time()
    idx = perm[i * args.batch:(i + 1) * args.batch]
    x = ds.train_images[idx]
    if args.augment:
      off, flip = augment.crop_flip_params(args.seed, s, 0, 0, args.batch)
      x = augment.crop_flip(x, off, flip)
    y = ds.train_labels[idx]
    t1 = time.perf_counter()
    params, opt, loss = step(params, opt, x, y)
    loss = float(loss)
    if s > 0:  # the first call compiles
      train_s += time.perf_counter() - t
      cpu_s += time.process_time() - c
      data_s += t1 - t
      done += args.batch
    if s % 100 == 0:
      print(f'  {name} step {s}/{total} epoch {e} loss {loss:.3f} '
            f'{done / max(train_s, 1e-9):.0f} img/s', flush=True)
  t_eval = time.perf_counter()
  correct, loss_sum = 0, 0.0
  for j in range(0, len(test_y), 1000):
    c, l = eval_chunk(params, test_x[j:j + 1000], test_y[j:j + 1000])
    correct += int(c)
    loss_sum += float(l)
  eval_s = time.perf_counter() - t_eval
  return dict(model=name, params=n_params, macs=macs(model, shape),
              img_per_s=done / train_s, img_per_cpu_s=done / cpu_s, data_share=data_s / train_s,
              test_accuracy=correct / len(test_y), test_loss=loss_sum / len(test_y),
              eval_s=eval_s, wall_s=time.time() - t0)


def main():
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--data', type=existing_path(), default='../shared/data/cifar10-jpeg.tar.gz')
  p.add_argument('--models', type=names_in(CANDIDATES, 'model'),
                 default='cnn,cifar_cnn,convnet3,convnet6')
  p.add_argument('--epochs', type=int_at_least(1), default=3)
  p.add_argument('--batch', type=int_at_least(1), default=128)
  p.add_argument('--lr', type=number_in(0, lo_open=True), default=0.05)
  p.add_argument('--wd', type=number_in(0), default=5e-4)
  p.add_argument('--seed', type=int, default=0)
  p.add_argument('--no_augment', dest='augment', action='store_false')
  args = p.parse_args()
  ds = data_lib.load('cifar10', args.data)
  print(f'jax {jax.__version__}, {jax.devices()[0].platform}, load '
        f'{os.getloadavg()[0]:.1f}; {args.epochs} epochs, batch {args.batch}, lr {args.lr}, '
        f'augment {args.augment}', flush=True)
  print('| model | params | MACs/img | train img/s | train img/CPU-s | host data share '
        '| test acc | test loss | eval 10k s | wall s |')
  print('|---|---|---|---|---|---|---|---|---|---|', flush=True)
  for name in args.models:
    r = run(name, ds, args)
    print(f'| {r["model"]} | {r["params"]:,} | {r["macs"] / 1e6:.1f} M | {r["img_per_s"]:.0f} '
          f'| {r["img_per_cpu_s"]:.0f} | {r["data_share"]:.0%} | {r["test_accuracy"]:.4f} '
          f'| {r["test_loss"]:.3f} | {r["eval_s"]:.1f} | {r["wall_s"]:.0f} |', flush=True)
  print(f'load average at the end: {os.getloadavg()}')


if __name__ == '__main__':
  main()
