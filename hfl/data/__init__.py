"""Datasets, partitioning across DCs/workers, and per-worker batches.

Public API::

    ds = load(name, data_dir)   # labels in memory, images converted on demand
    part = partition_dataset(ds, D, W, method, alpha, seed)
    check_batch_size(part, batch_size)
    idx = batch_indices(part, batch_size, step, seed)  # int64 [D, W, B]
    x, y = ds.train_images[idx], ds.train_labels[idx]  # float32, int32
    (xs, xi), (ys, yi) = batch_rows(ds, idx, step, seed, augment)  # x = xs[xi]: augmented

The images of a Dataset are :class:`~hfl.data.rows.NormalisedRows`: they keep
the raw uint8 storage (memory-mapped raw IDX files, decompressed gzip'd ones, or
TFDS records read on demand) and return standardised float32 rows only for the
rows indexed, so a process of a multi-process run converts, and transfers to
its devices, only the rows of its own DCs/workers. Labels are held in full (the
partition needs all of them).

Where a dataset comes from (:func:`source_kind`): ``'fashion_mnist'`` and
``'mnist'`` are read from IDX files (default directory for Fashion-MNIST:
Debian's ``/usr/share/datasets/fashion-mnist``); the names of
:data:`TEXT_DATASETS` from a plain-text file (character-level language
modelling, :mod:`hfl.data.text`); any other name from an image folder when
``dataset.data_dir`` is a ``.tar``/``.tar.gz``/``.tgz`` archive or a directory
with ``train``/``test`` sub-directories (:mod:`hfl.data.imagefolder`, e.g.
``cifar10`` from ``cifar10-jpeg.tar.gz``), else through TFDS ``array_record``
data sources without TensorFlow.
"""

import os
from typing import NamedTuple

import numpy as np

from hfl.data import augment as augment_lib
from hfl.data import imagefolder
from hfl.data import text as text_lib
from hfl.data.augment import AUGMENTATIONS
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
    'host_nbytes', 'PaddedRows', 'TfdsImages', 'TEXT_DATASETS', 'TASKS', 'AUGMENTATIONS',
    'source_kind', 'task_of', 'partition_dataset', 'batch_rows', 'PARTITIONS', 'resolve_path',
]

# Datasets read from IDX files, with their default directory ('' = none).
IDX_DATASETS = {'fashion_mnist': FASHION_MNIST_DIR, 'mnist': ''}
# Datasets read from a plain-text file (character-level language modelling).
TEXT_DATASETS = ('tiny_shakespeare', 'text')
# What a dataset is for: classification (images) or language modelling (text).
TASKS = ('classification', 'language_model')
# dataset.partition methods per task.
PARTITIONS = {'classification': METHODS, 'language_model': text_lib.TEXT_PARTITIONS}


class Dataset(NamedTuple):
  """A normalised image-classification dataset, or an encoded text corpus.

  For a text dataset (``task == 'language_model'``) the "images" are token
  windows: ``train_images`` / ``train_labels`` are
  :class:`hfl.data.text.TokenWindows` [N, T] (inputs and next-character
  targets of every training window, built on demand), ``test_images`` /
  ``test_labels`` int32 [M, T] arrays of the non-overlapping validation
  windows, and ``num_classes`` is the vocabulary size V.

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
    task: ``'classification'`` or ``'language_model'`` (one of TASKS).
    vocabulary: text only: the characters of token ids 0, 1, ...
  """
  name: str
  train_images: NormalisedRows
  train_labels: np.ndarray
  test_images: NormalisedRows
  test_labels: np.ndarray
  num_classes: int
  task: str = 'classification'
  vocabulary: str = ''

  def describe(self) -> str:
    """One line for the log: sizes and storage."""
    if self.task == 'language_model':
      return (f'{self.name}: {len(self.vocabulary)} characters, train '
              f'{len(self.train_images.tokens)} characters ({self.train_images.shape[0]} '
              f'windows of {self.train_images.shape[1]}), validation {self.test_images.shape} '
              f'windows; {self.host_nbytes() / 1e6:.1f} MB of host memory')
    return (f'{self.name}: train {self.train_images.shape}, test {self.test_images.shape}, '
            f'raw {np.dtype(self.train_images.raw.dtype).name} images converted on demand; '
            f'{self.host_nbytes() / 1e6:.1f} MB of host memory')

  def host_nbytes(self) -> int:
    """Bytes of process memory the dataset holds (see :func:`host_nbytes`).

    Raw uint8 images decompressed from gzip'd IDX files count in full,
    memory-mapped IDX files and TFDS records (read on demand) count 0, labels
    count in full. Fashion-MNIST from Debian's gzip'd files: 55,160,000 bytes
    (uint8 images 54,880,000 + int32 labels 280,000), against 219,800,000 for
    float32 copies of both image sets.
    """
    if self.task == 'language_model':  # inputs and targets share one token array
      return (host_nbytes(self.train_images.tokens) + host_nbytes(self.test_images)
              + host_nbytes(self.test_labels))
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


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def resolve_path(path) -> str:
  """``path`` as given, or, when it is relative and exists only relative to the
  repository root (e.g. configs' ``../shared/data/...`` run from another
  directory), that path; '' for an empty path.

  Raises:
    FileNotFoundError: a relative ``path`` that exists in neither place (both named).
  """
  if not path:
    return ''
  path = os.fspath(path)
  full = os.path.expanduser(path)
  if os.path.isabs(full) or os.path.exists(full):
    return path
  alt = os.path.normpath(os.path.join(REPO_ROOT, full))
  if os.path.exists(alt):
    return alt
  tried = (f'from the working directory, here the repository root ({alt})'
           if os.path.abspath(full) == alt else
           f'from the working directory ({os.path.abspath(full)}), then from the repository '
           f'root ({alt})')
  raise FileNotFoundError(
      f'dataset.data_dir={path!r} does not exist: a relative path is tried {tried}; pass an '
      "absolute path (the README's dataset.data_dir row says what it holds)")


def task_of(name: str) -> str:
  """The task of dataset ``name``: ``'language_model'`` for TEXT_DATASETS, else
  ``'classification'``."""
  return 'language_model' if name in TEXT_DATASETS else 'classification'


def source_kind(name: str, data_dir: str = '') -> str:
  """Where :func:`load` reads dataset ``name`` from.

  Returns:
    ``'idx'``, ``'text'``, ``'image_folder'`` (``data_dir`` a tar archive by
    name, or a directory with a ``train`` or ``test`` sub-directory) or
    ``'tfds'``.
  """
  if name in IDX_DATASETS:
    return 'idx'
  if name in TEXT_DATASETS:
    return 'text'
  if data_dir and imagefolder.is_image_folder(data_dir):
    return 'image_folder'
  return 'tfds'


def load(name: str, data_dir: str = '', cache_dir: str = '',
         seq_len: int | None = None) -> Dataset:
  """Loads dataset ``name`` (config ``dataset.name``); images convert on demand.

  Reads the labels, validates every file (IDX headers and sizes; TFDS
  features and splits; image folders decoded once into the cache) and fits the
  normalisation statistics, reading the training images once in chunks (for
  TFDS this decodes the training split once; for a memory-mapped IDX file or
  image-folder cache it reads every page once, into the kernel's page cache,
  not into process memory); no float32 copy of either image set is made. The
  pass holds one float64 chunk of 8192 rows at a time (51 MB for 28x28 images).

  Args:
    name: ``'fashion_mnist'`` or ``'mnist'`` (IDX files), a text dataset
      (TEXT_DATASETS), or any other name (``'cifar10'``): an image folder or a
      TFDS dataset, by ``data_dir`` (:func:`source_kind`).
    data_dir: ``dataset.data_dir``. Empty: for fashion_mnist
      ``/usr/share/datasets/fashion-mnist``; for TFDS ``$TFDS_DATA_DIR`` or
      TFDS's default; mnist, text and image folders have no default.
    cache_dir: ``dataset.cache_dir``, root of the image-folder cache ('' =
      :func:`hfl.data.imagefolder.default_cache_root`).
    seq_len: text only (required): characters per training window (inputs;
      ``seq_len + 1`` with the targets).

  Returns:
    A Dataset: images NormalisedRows (float32 NHWC on indexing; raw uint8
    storage, memory-mapped for raw IDX files and image folders), labels int32;
    for text, token windows (see :class:`Dataset`).

  Raises:
    FileNotFoundError: files missing / dataset not prepared (the message says
      how to get them).
    ValueError: corrupt files, unknown dataset name (the message lists the
      known names), a TFDS dataset that is not image classification, a text
      dataset without ``seq_len``.
  """
  if not isinstance(name, str) or not name:
    raise ValueError(f'dataset.name={name!r} must be a non-empty string; '
                     f'known: {", ".join(IDX_DATASETS)} (IDX files), '
                     f'{", ".join(TEXT_DATASETS)} (a text file), any name with an '
                     'image-folder dataset.data_dir, '
                     f'{", ".join(TFDS_IMAGE_DATASETS)} (TFDS).')
  data_dir = resolve_path(data_dir)
  kind = source_kind(name, data_dir)
  if kind == 'text':
    return _load_text(name, data_dir, seq_len)
  if kind == 'idx':
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
    if kind == 'image_folder':
      raw = imagefolder.load_image_folder(data_dir, cache_dir)
      num_classes = len(raw.classes)
    else:
      if data_dir and os.path.isfile(os.path.expanduser(data_dir)):
        raise ValueError(
            f'dataset.data_dir={data_dir!r} is a file but not a tar archive '
            f'({", ".join(imagefolder.ARCHIVE_SUFFIXES)}): for dataset.name={name!r} point '
            'it at an image folder (a directory or archive of train/<class>/<image> and '
            'test/<class>/<image>) or a TFDS data directory.')
      raw = load_tfds(name, data_dir)
      num_classes = raw.num_classes
    train_x, test_x = raw.train_images, raw.test_images
    train_y, test_y = raw.train_labels, raw.test_labels
  norm = fit_normaliser(train_x)
  return Dataset(name, NormalisedRows(train_x, norm), train_y.astype(np.int32),
                 NormalisedRows(test_x, norm), test_y.astype(np.int32),
                 int(num_classes))


def _load_text(name: str, data_dir: str, seq_len) -> Dataset:
  """A text dataset (:mod:`hfl.data.text`) as token windows of ``seq_len``."""
  if isinstance(seq_len, bool) or not isinstance(seq_len, (int, np.integer)) or seq_len < 1:
    raise ValueError(f'model.seq_len={seq_len!r} must be an integer >= 1 for the text '
                     f'dataset {name!r}.')
  splits = text_lib.encode(text_lib.read_text(data_dir))
  x, y = text_lib.train_windows(splits.train_tokens, int(seq_len))
  tx, ty = text_lib.eval_windows(splits.val_tokens, int(seq_len))
  return Dataset(name, x, y, tx, ty, splits.num_tokens, 'language_model', splits.vocabulary)


def partition_dataset(dataset: Dataset, num_dcs: int, workers_per_dc: int, method: str,
                      alpha: float, seed: int, min_size: int | None = None) -> Partition:
  """Splits a dataset's training samples across DCs and workers.

  Classification: :func:`partition` of the labels (``'iid'``, ``'dirichlet'``).
  Language modelling: :func:`hfl.data.text.partition_windows` of the window
  starts (``'iid'``, ``'contiguous'``; ``alpha`` and ``min_size`` unused).

  Raises:
    ValueError: a method the task does not support (names ``dataset.partition``)
      or that cannot be satisfied (see the two functions).
  """
  if dataset.task == 'language_model':
    windows = dataset.train_images
    return text_lib.partition_windows(len(windows.tokens), windows.length, num_dcs,
                                      workers_per_dc, method, seed)
  if method not in METHODS:
    raise ValueError(f'dataset.partition={method!r} is not supported for classification; '
                     f'allowed: {", ".join(METHODS)}.')
  return partition(dataset.train_labels, num_dcs, workers_per_dc, method, alpha, seed,
                   min_size=min_size)


def batch_rows(dataset: Dataset, idx: np.ndarray, step: int, seed: int,
               augment: str = 'none') -> tuple:
  """The training batch at ``step`` as (row source, index) pairs for inputs and targets.

  ``source[index]`` is the batch: the inputs ``train_images[idx]`` (augmented
  per worker and step with ``augment='crop_flip'``, :mod:`hfl.data.augment`)
  and the targets ``train_labels[idx]``. Handing the pairs to
  :func:`hfl.distributed.put_rows` reads only this process's rows.

  Args:
    dataset: the Dataset.
    idx: int [D, W, B] from :func:`batch_indices`.
    step: the iteration (augmentation stream).
    seed: ``seed`` (augmentation stream).
    augment: ``dataset.augment``: one of AUGMENTATIONS.

  Returns:
    ((inputs source, index), (targets source, index)).

  Raises:
    ValueError: an unknown ``augment``, or augmentation of text.
  """
  if augment not in AUGMENTATIONS:
    raise ValueError(f'dataset.augment={augment!r} is unknown; allowed: '
                     f'{", ".join(AUGMENTATIONS)}.')
  targets = (dataset.train_labels, idx)
  if augment == 'none':
    return (dataset.train_images, idx), targets
  if dataset.task != 'classification' or len(dataset.train_images.shape) != 4:
    raise ValueError(f'dataset.augment={augment!r} needs images [N, H, W, C]; '
                     f'dataset.name={dataset.name!r} has rows {dataset.train_images.shape}.')
  batch = augment_lib.AugmentedBatch(dataset.train_images, idx, seed, step)
  return (batch, batch.index()), targets
