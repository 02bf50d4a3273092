"""Datasets, partitioning across DCs/workers, and per-worker batches.

Public API::

    ds = load(name, data_dir)   # labels in memory, images converted on demand
    part = partition(ds.train_labels, D, W, method, alpha, seed)
    check_batch_size(part, batch_size)
    idx = batch_indices(part, batch_size, step, seed)  # int64 [D, W, B]
    x, y = ds.train_images[idx], ds.train_labels[idx]  # float32, int32

The images of a Dataset are :class:`~hfl.data.rows.NormalisedRows`: they keep
the raw uint8 storage (memory-mapped raw IDX files, decompressed gzip'd ones, or
TFDS records read on demand) and return standardised float32 rows only for the
rows indexed, so a process of a multi-process run converts, and transfers to
its devices, only the rows of its own DCs/workers. Labels are held in full (the
partition needs all of them).

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
from hfl.data.rows import fit_normaliser
from hfl.data.rows import host_nbytes
from hfl.data.rows import NormalisedRows
from hfl.data.rows import Normaliser
from hfl.data.rows import PaddedRows
from hfl.data.sampler import batch_indices
from hfl.data.sampler import check_batch_size
from hfl.data.tfds_source import load_tfds
from hfl.data.tfds_source import TFDS_IMAGE_DATASETS
from hfl.data.tfds_source import TfdsImages

__all__ = [
    'Dataset', 'load', 'normalise', 'IDX_DATASETS', 'TFDS_IMAGE_DATASETS',
    'FASHION_MNIST_DIR', 'load_idx', 'read_idx', 'load_tfds', 'Partition',
    'partition', 'label_counts', 'METHODS', 'batch_indices',
    'check_batch_size', 'NormalisedRows', 'Normaliser', 'fit_normaliser',
    'host_nbytes', 'PaddedRows', 'TfdsImages',
]

# Datasets read from IDX files, with their default directory ('' = none).
IDX_DATASETS = {'fashion_mnist': FASHION_MNIST_DIR, 'mnist': ''}


class Dataset(NamedTuple):
  """A normalised image-classification dataset.

  Attributes:
    name: the dataset name it was loaded under.
    train_images: NormalisedRows [N, H, W, C], dtype float32: ``[idx]`` returns
      the rows standardised with the training set's per-channel mean and std
      (pixels scaled to [0, 1] first), converted on demand from the raw
      storage (``train_images.raw``, uint8).
    train_labels: int32 [N], in [0, num_classes), in memory.
    test_images: NormalisedRows [M, H, W, C], standardised with the TRAINING
      stats.
    test_labels: int32 [M], in memory.
    num_classes: number of classes.
  """
  name: str
  train_images: NormalisedRows
  train_labels: np.ndarray
  test_images: NormalisedRows
  test_labels: np.ndarray
  num_classes: int

  def host_nbytes(self) -> int:
    """Bytes of process memory the dataset holds (see :func:`host_nbytes`).

    Raw uint8 images decompressed from gzip'd IDX files count in full,
    memory-mapped IDX files and TFDS records (read on demand) count 0, labels
    count in full. Fashion-MNIST from Debian's gzip'd files: 55,160,000 bytes
    (uint8 images 54,880,000 + int32 labels 280,000), against 219,800,000 for
    float32 copies of both image sets.
    """
    return sum(host_nbytes(a) for a in (self.train_images, self.train_labels,
                                        self.test_images, self.test_labels))


def normalise(train: np.ndarray, test: np.ndarray):
  """Standardises whole image arrays per channel with the training statistics.

  Materialises both float32 arrays; :func:`load` instead keeps the raw images
  and converts rows on demand (:class:`NormalisedRows`), with bitwise the same
  values.

  Args:
    train: [N, H, W, C] images (uint8, uint16 or float).
    test: [M, H, W, C] images of the same dtype.

  Returns:
    (train, test) float32 arrays of the input shapes: (x / scale - mean_c) /
    std_c, with scale 255 for uint8, mean_c and std_c over the training set
    (a constant channel gets std 1), from :func:`fit_normaliser`.
  """
  norm = fit_normaliser(train)
  return (np.asarray(NormalisedRows(train, norm)),
          np.asarray(NormalisedRows(test, norm)))


def load(name: str, data_dir: str = '') -> Dataset:
  """Loads dataset ``name`` (config ``dataset.name``); images convert on demand.

  Reads the labels, validates every file (IDX headers and sizes; TFDS
  features and splits) and fits the normalisation statistics, reading the
  training images once in chunks (for TFDS this decodes the training split
  once; for a memory-mapped IDX file it reads every page once, into the
  kernel's page cache, not into process memory); no float32 copy of either
  image set is made. The pass holds one float64 chunk of 8192 rows at a time
  (51 MB for 28x28 images), as the former eager normalisation did.

  Args:
    name: ``'fashion_mnist'`` or ``'mnist'`` (IDX files), or a TFDS name such
      as ``'cifar10'``.
    data_dir: ``dataset.data_dir``. Empty: for fashion_mnist
      ``/usr/share/datasets/fashion-mnist``; for TFDS ``$TFDS_DATA_DIR`` or
      TFDS's default; mnist has no default.

  Returns:
    A Dataset: images NormalisedRows (float32 NHWC on indexing; raw uint8
    storage, memory-mapped for raw IDX files), labels int32.

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
  norm = fit_normaliser(train_x)
  return Dataset(name, NormalisedRows(train_x, norm), train_y.astype(np.int32),
                 NormalisedRows(test_x, norm), test_y.astype(np.int32),
                 int(num_classes))
