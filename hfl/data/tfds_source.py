"""Image-classification datasets from TFDS, read without TensorFlow.

Uses ``tfds`` random-access data sources (``array_record`` files), which need
no TensorFlow; images are decoded by PIL (or OpenCV when installed). Nothing
is downloaded: this module never calls ``download_and_prepare``. A dataset
that is not prepared under the data directory raises an error that says how
to prepare it, because the training machines are often offline.

Data directory resolution: ``dataset.data_dir`` if set, else the environment
variable ``TFDS_DATA_DIR``, else TFDS's default (``~/tensorflow_datasets``).
"""

import os
from typing import NamedTuple

import numpy as np

# Datasets known to work through this module (32x32x3 or 28x28x1 images with
# an integer 'label'). Other TFDS image-classification datasets with fixed-size
# 'image' and ClassLabel 'label' features work too.
# ('fashion_mnist' and 'mnist' are read from IDX files by hfl.data.load.)
TFDS_IMAGE_DATASETS = ('cifar10', 'cifar100', 'emnist', 'kmnist',
                       'svhn_cropped')

_CHUNK = 4096


class TfdsSplits(NamedTuple):
  """Raw TFDS arrays, before normalisation.

  Attributes:
    train_images: [N, H, W, C], the feature's dtype (uint8 for PNG images).
    train_labels: int64 [N].
    test_images: [M, H, W, C].
    test_labels: int64 [M].
    num_classes: number of label classes.
  """
  train_images: np.ndarray
  train_labels: np.ndarray
  test_images: np.ndarray
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


def _read_split(source, n: int, name: str, split: str):
  """Reads all n records of a data source into stacked numpy arrays."""
  images, labels = [], []
  for start in range(0, n, _CHUNK):
    records = source.__getitems__(list(range(start, min(n, start + _CHUNK))))
    images.extend(np.asarray(r['image']) for r in records)
    labels.extend(int(r['label']) for r in records)
  if not images:
    raise ValueError(f'TFDS dataset {name!r} split {split!r} is empty.')
  images = np.stack(images)
  if images.ndim == 3:  # [N, H, W] -> [N, H, W, 1]
    images = images[..., None]
  return images, np.asarray(labels, dtype=np.int64)


def load_tfds(name: str, data_dir: str = '', train_split: str = 'train',
              test_split: str = 'test') -> TfdsSplits:
  """Loads a prepared TFDS image-classification dataset into numpy arrays.

  Args:
    name: TFDS name, optionally with config/version, e.g. ``'cifar10'`` or
      ``'emnist/balanced'``.
    data_dir: ``dataset.data_dir``; empty means ``$TFDS_DATA_DIR`` or the TFDS
      default.
    train_split: split used for training.
    test_split: split used for evaluation.

  Returns:
    TfdsSplits with images [N, H, W, C] and int64 labels.

  Raises:
    ValueError: the name is unknown to TFDS, the dataset is not an image
      classification dataset with fixed-size 'image' and ClassLabel 'label'
      features, a split is missing, or the files are in a format without
      random access (TFRecord).
    FileNotFoundError: the dataset is not prepared under the data directory.
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  resolved = resolve_data_dir(data_dir)
  where = (f'dataset.name={name!r}, dataset.data_dir={data_dir!r} (searched '
           f'{resolved!r})')
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
  splits = builder.info.splits
  for split in (train_split, test_split):
    if split.split('[')[0] not in splits:
      raise ValueError(f'TFDS dataset {where} has no split {split!r}; it has '
                       f'{sorted(splits.keys())}.')
  file_format = str(getattr(builder.info, 'file_format', ''))
  out = []
  for split in (train_split, test_split):
    try:
      source = builder.as_data_source(split=split)
    except NotImplementedError as e:
      raise ValueError(
          f'TFDS dataset {where} is prepared in a format without random '
          f'access ({file_format or "unknown"}); hfl reads array_record '
          f'without TensorFlow. Rebuild it with --file_format=array_record. '
          f'{prepare_hint(name, resolved)}') from e
    out.append(_read_split(source, len(source), name, split))
  (train_x, train_y), (test_x, test_y) = out
  return TfdsSplits(train_x, train_y, test_x, test_y, int(num_classes))
