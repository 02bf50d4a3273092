"""Image-classification datasets from TFDS, read without TensorFlow.

Uses ``tfds`` random-access data sources (``array_record`` files), which need
no TensorFlow; images are decoded by PIL (or OpenCV when installed). Nothing
is downloaded: this module never calls ``download_and_prepare``. A dataset
that is not prepared under the data directory raises an error that says how
to prepare it, because the training machines are often offline.

Images are read lazily: :func:`load_tfds` reads every label (records
deserialised with the image left encoded, so no image is decoded) and returns
the images as :class:`TfdsImages`, which decodes only the records a caller
indexes, in batches, and keeps nothing. Normalisation statistics
(:func:`hfl.data.rows.fit_normaliser`) then decode the training split once at
load time (CIFAR-10: 50,000 PNGs); every training step decodes the batch rows
of this process's devices again (nothing big is cached), which costs host CPU
per step in exchange for host memory independent of the dataset size.

Data directory resolution: ``dataset.data_dir`` if set, else the environment
variable ``TFDS_DATA_DIR``, else TFDS's default (``~/tensorflow_datasets``).
"""

import os
from typing import Any, NamedTuple

import numpy as np

from hfl.data import rows as rows_lib

# Datasets known to work through this module (32x32x3 or 28x28x1 images with
# an integer 'label'). Other TFDS image-classification datasets with fixed-size
# 'image' and ClassLabel 'label' features work too.
# ('fashion_mnist' and 'mnist' are read from IDX files by hfl.data.load.)
TFDS_IMAGE_DATASETS = ('cifar10', 'cifar100', 'emnist', 'kmnist',
                       'svhn_cropped')

# Records per data-source request.
_CHUNK = 4096


class TfdsImages(rows_lib.RowArray):
  """The images of a TFDS random-access split, decoded on demand.

  Indexing (first axis, numpy semantics: int, slice, integer array of any
  shape, 1-D boolean mask) fetches the distinct requested records in batches
  of 4096 through the data source's ``__getitems__``, decodes their images and
  returns them as one array; nothing is cached.

  Attributes:
    source: the ``tfds`` data source of the split (decodes images).
    shape: [N, H, W, C] (a 2-D image feature gets C = 1).
    dtype: the image feature's numpy dtype (uint8 for PNG images).
    where: dataset/split description for error messages.
  """

  def __init__(self, source: Any, image_shape: tuple, dtype: np.dtype,
               where: str = ''):
    image_shape = tuple(int(d) for d in image_shape)
    if len(image_shape) == 2:  # [H, W] -> [H, W, 1]
      image_shape += (1,)
    self.source = source
    self.shape = (len(source),) + image_shape
    self.dtype = np.dtype(dtype)
    self.where = where

  def __repr__(self) -> str:
    return f'TfdsImages({self.where}, shape={self.shape}, dtype={self.dtype.name})'

  def __getitem__(self, key) -> np.ndarray:
    """Images ``[key]``: array ``row_index(key, N).shape + shape[1:]``.

    Raises:
      IndexError / TypeError: see :func:`hfl.data.rows.row_index`.
      ValueError: a record's image does not have the feature's shape.
    """
    rows = rows_lib.row_index(key, len(self))
    wanted, inverse = np.unique(rows.ravel(), return_inverse=True)
    out = np.empty((len(wanted),) + self.shape[1:], self.dtype)
    for start in range(0, len(wanted), _CHUNK):
      keys = wanted[start:start + _CHUNK].tolist()
      for j, record in enumerate(self.source.__getitems__(keys)):
        image = np.asarray(record['image'])
        if image.size != out[0].size:
          raise ValueError(f'TFDS {self.where}: record {keys[j]} has an image of '
                           f'shape {image.shape}; expected {self.shape[1:]}.')
        out[start + j] = image.reshape(self.shape[1:])
    if len(wanted) == rows.size and np.array_equal(wanted, rows.ravel()):
      return out.reshape(rows.shape + self.shape[1:])  # sorted, distinct: no gather
    return out[inverse.ravel()].reshape(rows.shape + self.shape[1:])


class TfdsSplits(NamedTuple):
  """TFDS images (read on demand) and labels, before normalisation.

  Attributes:
    train_images: TfdsImages [N, H, W, C], the feature's dtype (uint8 for PNG
      images).
    train_labels: int64 [N], in memory.
    test_images: TfdsImages [M, H, W, C].
    test_labels: int64 [M].
    num_classes: number of label classes.
  """
  train_images: TfdsImages
  train_labels: np.ndarray
  test_images: TfdsImages
  test_labels: np.ndarray
  num_classes: int


def resolve_data_dir(data_dir: str) -> str:
  """``data_dir`` if non-empty, else ``$TFDS_DATA_DIR``, else TFDS's default."""
  if data_dir:
    return os.path.expanduser(data_dir)
  env = os.environ.get('TFDS_DATA_DIR', '')
  if env:
    return os.path.expanduser(env)
  return os.path.expanduser(os.path.join('~', 'tensorflow_datasets'))


def prepare_hint(name: str, data_dir: str) -> str:
  """How to prepare dataset ``name`` under ``data_dir``, for error messages."""
  return (
      f'Prepare it on a machine with internet access: `pip install '
      f'tensorflow-datasets && tfds build {name} --data_dir={data_dir} '
      f'--file_format=array_record`, then copy the directory '
      f'{os.path.join(data_dir, name.split("/")[0])} to this machine (same '
      'path, or set dataset.data_dir / the environment variable '
      'TFDS_DATA_DIR to where you copied its parent). Building needs '
      'TensorFlow; reading it here does not.')


def _read_labels(source, name: str, split: str) -> np.ndarray:
  """Reads every label of a data source (built with the image undecoded)."""
  n = len(source)
  if not n:
    raise ValueError(f'TFDS dataset {name!r} split {split!r} is empty.')
  labels = np.empty(n, np.int64)
  for start in range(0, n, _CHUNK):
    records = source.__getitems__(list(range(start, min(n, start + _CHUNK))))
    labels[start:start + len(records)] = [int(r['label']) for r in records]
  return labels


def load_tfds(name: str, data_dir: str = '', train_split: str = 'train',
              test_split: str = 'test') -> TfdsSplits:
  """Opens a prepared TFDS image-classification dataset; reads its labels.

  Args:
    name: TFDS name, optionally with config/version, e.g. ``'cifar10'`` or
      ``'emnist/balanced'``.
    data_dir: ``dataset.data_dir``; empty means ``$TFDS_DATA_DIR`` or the TFDS
      default.
    train_split: split used for training.
    test_split: split used for evaluation.

  Returns:
    TfdsSplits with images [N, H, W, C] read on demand (:class:`TfdsImages`)
    and int64 labels in memory. Reading the labels deserialises every record
    once but decodes no image.

  Raises:
    ValueError: the name is unknown to TFDS, the dataset is not an image
      classification dataset with fixed-size 'image' and ClassLabel 'label'
      features, a split is missing, or the files are in a format without
      random access (TFRecord).
    FileNotFoundError: the dataset is not prepared under the data directory.
  """
  import tensorflow_datasets as tfds  # lazy: tensorflow_datasets  pylint: disable=g-import-not-at-top

  resolved = resolve_data_dir(data_dir)
  where = (f'dataset.name={name!r}, dataset.data_dir={data_dir!r} (searched '
           f'{resolved!r})')
  builder = _prepared_builder(tfds, name, resolved, where)
  image_shape, num_classes, dtype = _image_features(builder, where)
  splits = builder.info.splits
  for split in (train_split, test_split):
    if split.split('[')[0] not in splits:
      raise ValueError(f'TFDS dataset {where} has no split {split!r}; it has '
                       f'{sorted(splits.keys())}.')
  out = []
  for split in (train_split, test_split):
    source, label_source = _data_sources(tfds, builder, split, name, resolved, where)
    labels = _read_labels(label_source, name, split)
    out.append((TfdsImages(source, image_shape, dtype, f'{name!r} split {split!r}'), labels))
  (train_x, train_y), (test_x, test_y) = out
  return TfdsSplits(train_x, train_y, test_x, test_y, int(num_classes))


def _prepared_builder(tfds, name: str, resolved: str, where: str):
  """The TFDS builder of ``name`` under ``resolved``, which must be prepared.

  Raises:
    ValueError: TFDS knows no dataset ``name``.
    FileNotFoundError: it is not prepared under ``resolved``.
  """
  try:
    builder = tfds.builder(name, data_dir=resolved)
  except tfds.core.registered.DatasetNotFoundError as e:
    raise ValueError(
        f'Unknown dataset {where}: TFDS knows no dataset of that name and none '
        f'is prepared there. Known datasets: IDX files: fashion_mnist, mnist; '
        f'TFDS: {", ".join(TFDS_IMAGE_DATASETS)} (or any TFDS image '
        'classification dataset, see tfds.list_builders()).') from e
  if not builder.is_prepared():
    idx_note = ''
    if any(f.startswith('train-images-idx3-ubyte')
           for f in (os.listdir(resolved) if os.path.isdir(resolved) else ())):
      idx_note = (' That directory holds IDX files (the fashion_mnist '
                  'default): for a TFDS dataset set dataset.data_dir to a '
                  "TFDS data directory, or to '' to use TFDS_DATA_DIR.")
    raise FileNotFoundError(
        f'TFDS dataset not prepared: {where}; expected its files under '
        f'{os.fspath(builder.data_dir)!r} and this machine cannot download.'
        f'{idx_note} {prepare_hint(name, resolved)}')
  return builder


def _image_features(builder, where: str):
  """(image shape (H, W, C), number of classes, image numpy dtype) of a builder.

  Raises:
    ValueError: no 'image' and 'label' features, variable-size images, or a
      label that is not a ClassLabel with a known number of classes.
  """
  features = builder.info.features
  keys = set(features.keys()) if hasattr(features, 'keys') else set()
  if not {'image', 'label'} <= keys:
    raise ValueError(
        f'TFDS dataset {where} has features {sorted(keys)}; hfl needs an '
        "'image' and a 'label' feature (image classification).")
  image_shape = tuple(features['image'].shape)
  if any(d is None for d in image_shape):
    raise ValueError(f'TFDS dataset {where} has variable-size images '
                     f'{image_shape}; hfl needs fixed-size images.')
  num_classes = getattr(features['label'], 'num_classes', None)
  if not num_classes:
    raise ValueError(f"TFDS dataset {where}: 'label' is not a ClassLabel "
                     'feature with a known number of classes.')
  return image_shape, num_classes, np.dtype(getattr(features['image'], 'np_dtype', np.uint8))


def _data_sources(tfds, builder, split: str, name: str, resolved: str, where: str):
  """(image source, label source with the image left undecoded) of one split.

  Raises:
    ValueError: the files are in a format without random access (TFRecord).
  """
  try:
    return (builder.as_data_source(split=split),
            builder.as_data_source(split=split,
                                   decoders={'image': tfds.decode.SkipDecoding()}))
  except NotImplementedError as e:
    file_format = str(getattr(builder.info, 'file_format', ''))
    raise ValueError(
        f'TFDS dataset {where} is prepared in a format without random '
        f'access ({file_format or "unknown"}); hfl reads array_record '
        f'without TensorFlow. Rebuild it with --file_format=array_record. '
        f'{prepare_hint(name, resolved)}') from e
