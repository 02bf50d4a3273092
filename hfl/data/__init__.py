"""Datasets, partitioning across DCs/workers, and per-worker batches.

Public API::

    ds = load(name, data_dir)                        # Dataset of numpy arrays
    part = partition(ds.train_labels, D, W, method, alpha, seed)
    check_batch_size(part, batch_size)
    idx = batch_indices(part, batch_size, step, seed)  # int64 [D, W, B]
    x, y = ds.train_images[idx], ds.train_labels[idx]

``'fashion_mnist'`` and ``'mnist'`` are read from IDX files (default directory
for Fashion-MNIST: Debian's ``/usr/share/datasets/fashion-mnist``); every other
name goes through TFDS ``array_record`` data sources without TensorFlow.
"""

import os
from typing import NamedTuple

import numpy as np

from hfl.data.idx import FASHION_MNIST_DIR
from hfl.data.idx import load_idx
from hfl.data.idx import read_idx
from hfl.data.partition import label_counts
from hfl.data.partition import METHODS
from hfl.data.partition import partition
from hfl.data.partition import Partition
from hfl.data.sampler import batch_indices
from hfl.data.sampler import check_batch_size
from hfl.data.tfds_source import load_tfds
from hfl.data.tfds_source import TFDS_IMAGE_DATASETS

__all__ = [
    'Dataset', 'load', 'normalise', 'IDX_DATASETS', 'TFDS_IMAGE_DATASETS',
    'FASHION_MNIST_DIR', 'load_idx', 'read_idx', 'load_tfds', 'Partition',
    'partition', 'label_counts', 'METHODS', 'batch_indices',
    'check_batch_size',
]

# Datasets read from IDX files, with their default directory ('' = none).
IDX_DATASETS = {'fashion_mnist': FASHION_MNIST_DIR, 'mnist': ''}

_CHUNK = 8192


class Dataset(NamedTuple):
  """A normalised image-classification dataset held in host memory.

  Attributes:
    name: the dataset name it was loaded under.
    train_images: float32 [N, H, W, C], standardised with the training set's
      per-channel mean and std (pixels scaled to [0, 1] first).
    train_labels: int32 [N], in [0, num_classes).
    test_images: float32 [M, H, W, C], standardised with the TRAINING stats.
    test_labels: int32 [M].
    num_classes: number of classes.
  """
  name: str
  train_images: np.ndarray
  train_labels: np.ndarray
  test_images: np.ndarray
  test_labels: np.ndarray
  num_classes: int


def _scale(dtype: np.dtype) -> float:
  """Pixel value that maps to 1.0: 255 for uint8, 65535 for uint16, else 1."""
  if np.issubdtype(dtype, np.integer):
    return float(np.iinfo(dtype).max)
  return 1.0


def normalise(train: np.ndarray, test: np.ndarray):
  """Standardises images per channel with the training set's statistics.

  Args:
    train: [N, H, W, C] images (uint8, uint16 or float).
    test: [M, H, W, C] images of the same dtype.

  Returns:
    (train, test) float32 arrays of the input shapes: (x / scale - mean_c) /
    std_c, with scale 255 for uint8, mean_c and std_c over the training set
    (a constant channel gets std 1). Computed in chunks, so no float64 copy
    of the whole set is made.
  """
  scale = _scale(train.dtype)
  channels = train.shape[-1]
  total = np.zeros(channels, np.float64)
  total_sq = np.zeros(channels, np.float64)
  count = 0
  for i in range(0, train.shape[0], _CHUNK):
    chunk = train[i:i + _CHUNK].reshape(-1, channels).astype(np.float64)
    chunk /= scale
    total += chunk.sum(axis=0)
    total_sq += np.square(chunk).sum(axis=0)
    count += chunk.shape[0]
  mean = total / count
  std = np.sqrt(np.maximum(total_sq / count - np.square(mean), 0.0))
  std = np.where(std > 1e-8, std, 1.0)
  mul = (1.0 / (scale * std)).astype(np.float32)
  add = (-mean / std).astype(np.float32)

  def apply(x):
    out = np.empty(x.shape, np.float32)
    for i in range(0, x.shape[0], _CHUNK):
      out[i:i + _CHUNK] = x[i:i + _CHUNK].astype(np.float32) * mul + add
    return out

  return apply(train), apply(test)


def load(name: str, data_dir: str = '') -> Dataset:
  """Loads dataset ``name`` (config ``dataset.name``) as normalised numpy.

  Args:
    name: ``'fashion_mnist'`` or ``'mnist'`` (IDX files), or a TFDS name such
      as ``'cifar10'``.
    data_dir: ``dataset.data_dir``. Empty: for fashion_mnist
      ``/usr/share/datasets/fashion-mnist``; for TFDS ``$TFDS_DATA_DIR`` or
      TFDS's default; mnist has no default.

  Returns:
    A Dataset (images float32 NHWC, labels int32).

  Raises:
    FileNotFoundError: files missing / dataset not prepared (the message says
      how to get them).
    ValueError: corrupt files, unknown dataset name (the message lists the
      known names), or a TFDS dataset that is not image classification.
  """
  if not isinstance(name, str) or not name:
    raise ValueError(f'dataset.name={name!r} must be a non-empty string; '
                     f'known: {", ".join(IDX_DATASETS)} (IDX files), '
                     f'{", ".join(TFDS_IMAGE_DATASETS)} (TFDS).')
  data_dir = os.fspath(data_dir) if data_dir else ''
  if name in IDX_DATASETS:
    directory = data_dir or IDX_DATASETS[name]
    if not directory:
      raise FileNotFoundError(
          f'dataset.data_dir is empty and dataset.name={name!r} has no '
          'default directory: point dataset.data_dir at a directory holding '
          'its four IDX files (train-images-idx3-ubyte[.gz], '
          'train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz], '
          't10k-labels-idx1-ubyte[.gz]).')
    raw = load_idx(directory, name=name, num_classes=10)
    train_x, test_x = raw.train_images[..., None], raw.test_images[..., None]
    train_y, test_y, num_classes = raw.train_labels, raw.test_labels, 10
  else:
    raw = load_tfds(name, data_dir)
    train_x, test_x = raw.train_images, raw.test_images
    train_y, test_y, num_classes = (raw.train_labels, raw.test_labels,
                                    raw.num_classes)
  train_x, test_x = normalise(train_x, test_x)
  return Dataset(name, train_x, train_y.astype(np.int32),
                 test_x, test_y.astype(np.int32), int(num_classes))
