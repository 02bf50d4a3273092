"""CIFAR-10 (JPEG image-folder copy): 2 DCs x 4 workers, the fast CIFAR CNN, crop + flip.

The default experiment (configs/default.py: non-IID Dirichlet 0.5 split, periodic
sync every K = 4 iterations, FedAvg) on CIFAR-10 read from the image-folder
archive ``../shared/data/cifar10-jpeg.tar.gz`` (decoded once into the cache,
``dataset.cache_dir``), with the fast CIFAR CNN (``model.name='cifar_cnn'``,
chosen by measurement: hfl.models.cifar_cnn, docs/benchmarks.md), 4-pixel
crop + horizontal-flip augmentation, and Nesterov momentum with a warm-up +
cosine learning-rate schedule.

  python main.py --config=configs/cifar10.py --workdir=workdirs/cifar10

reaches 80.8% test accuracy (75% after about 1,900 iterations) in 14 minutes on a
2-core CPU (docs/benchmarks.md, "The fast CIFAR-10 CNN").

``dataset.data_dir`` may also be a directory of the same layout, or a TFDS data
directory holding a prepared ``cifar10``.
"""

from configs import default

CIFAR10_ARCHIVE = '../shared/data/cifar10-jpeg.tar.gz'


def get_config(arg: str | None = None):
  c = default.get_config(arg)
  c.dataset.name = 'cifar10'
  c.dataset.data_dir = CIFAR10_ARCHIVE
  c.dataset.augment = 'crop_flip'
  c.model.name = 'cifar_cnn'
  c.optimizer.name = 'nesterov'
  c.optimizer.learning_rate = 0.05
  c.optimizer.momentum = 0.9
  c.optimizer.weight_decay = 5e-4
  c.optimizer.schedule = 'cosine'
  c.optimizer.warmup_steps = 100
  c.train.num_steps = 4800            # x 8 workers x 32 = 24.6 epochs of the 50,000 images
  c.train.batch_size = 32
  c.train.eval_every = 150            # rounds (600 iterations)
  c.train.checkpoint_every = 150
  c.train.target_accuracy = 0.75
  c.train.log_every = 100
  return c
