"""Tests for hfl.data: IDX reader, TFDS source, partitioning, batch sampler."""

import gzip
import hashlib
import io
import os
import sys

import numpy as np
import pytest

from hfl import data
from hfl.data import idx as idx_lib
from hfl.data import sampler as sampler_lib
from tests.helpers import idx_bytes

FASHION_DIR = '/usr/share/datasets/fashion-mnist'
# sha256 of Debian's Fashion-MNIST normalised by the eager pipeline (float32).
_FMNIST_TRAIN_SHA256 = ('da3f3c3650c3c1e4c235ef6988d95ea6'
                        '384ac4617a94d0d27363e1f27aa8ce20')
_FMNIST_TEST_SHA256 = ('72e0a49e46ed60aa4fc501851ca21e78'
                       'fc7f6b05da1d88c263f18f1693bcc432')


# ----------------------------------------------------------------- IDX files


def _write_idx_dir(path, n_train=12, n_test=5, hw=(4, 3), gz=True, seed=0):
  """Writes the four IDX files into `path`; returns the arrays written."""
  rng = np.random.default_rng(seed)
  arrays = {
      'train-images-idx3-ubyte': rng.integers(0, 256, (n_train, *hw),
                                              dtype=np.uint8),
      'train-labels-idx1-ubyte': rng.integers(0, 10, n_train, dtype=np.uint8),
      't10k-images-idx3-ubyte': rng.integers(0, 256, (n_test, *hw),
                                             dtype=np.uint8),
      't10k-labels-idx1-ubyte': rng.integers(0, 10, n_test, dtype=np.uint8),
  }
  os.makedirs(path, exist_ok=True)
  for stem, arr in arrays.items():
    payload = idx_bytes(arr)
    if gz:
      with open(os.path.join(path, stem + '.gz'), 'wb') as f:
        f.write(gzip.compress(payload))
    else:
      with open(os.path.join(path, stem), 'wb') as f:
        f.write(payload)
  return arrays


@pytest.mark.parametrize('gz', [True, False])
def test_idx_roundtrip_and_load(tmp_path, gz):
  arrays = _write_idx_dir(str(tmp_path), gz=gz)
  raw = data.load_idx(str(tmp_path))
  np.testing.assert_array_equal(raw.train_images,
                                arrays['train-images-idx3-ubyte'])
  np.testing.assert_array_equal(raw.test_labels,
                                arrays['t10k-labels-idx1-ubyte'])
  ds = data.load('fashion_mnist', str(tmp_path))
  assert ds.name == 'fashion_mnist' and ds.num_classes == 10
  assert ds.train_images.shape == (12, 4, 3, 1)
  assert ds.test_images.shape == (5, 4, 3, 1)
  assert ds.train_images.dtype == np.float32
  assert ds.train_labels.dtype == np.int32 and ds.test_labels.dtype == np.int32
  np.testing.assert_array_equal(ds.train_labels,
                                arrays['train-labels-idx1-ubyte'])
  # Standardised with the training statistics.
  train_x = ds.train_images[:]
  assert abs(float(train_x.mean())) < 1e-5
  assert abs(float(train_x.std()) - 1.0) < 1e-4
  x = arrays['train-images-idx3-ubyte'] / 255.0
  expect = (arrays['t10k-images-idx3-ubyte'] / 255.0 - x.mean()) / x.std()
  np.testing.assert_allclose(ds.test_images[..., 0], expect, atol=1e-5)


def test_idx_read_other_dtype(tmp_path):
  arr = np.arange(6, dtype='>i4').reshape(2, 3)
  path = tmp_path / 'x.idx'
  path.write_bytes(bytes([0, 0, 0x0C, 2]) + (2).to_bytes(4, 'big') +
                   (3).to_bytes(4, 'big') + arr.tobytes())
  out = data.read_idx(str(path))
  np.testing.assert_array_equal(out, np.arange(6).reshape(2, 3))
  assert out.dtype == np.int32


def _assert_clear(msg, path, *words):
  assert 'dataset.data_dir' in msg
  assert str(path) in msg
  assert 'apt-get install -y dataset-fashion-mnist' in msg
  for w in words:
    assert w in msg, (w, msg)


def test_idx_missing_file(tmp_path):
  _write_idx_dir(str(tmp_path))
  os.remove(tmp_path / 't10k-labels-idx1-ubyte.gz')
  with pytest.raises(FileNotFoundError) as e:
    data.load('fashion_mnist', str(tmp_path))
  _assert_clear(str(e.value), tmp_path / 't10k-labels-idx1-ubyte.gz',
                'missing')


def test_missing_relative_data_dir_names_both_places_tried(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  with pytest.raises(FileNotFoundError) as e:
    data.load('cifar10', os.path.join('..', 'nope', 'cifar.tar.gz'))
  msg = str(e.value)
  assert msg.startswith("dataset.data_dir='../nope/cifar.tar.gz' does not exist")
  assert str(tmp_path.parent / 'nope' / 'cifar.tar.gz') in msg  # from the working directory
  assert os.path.normpath(os.path.join(data.REPO_ROOT, '..', 'nope', 'cifar.tar.gz')) in msg


def test_idx_missing_dir(tmp_path):
  missing = tmp_path / 'nope'
  with pytest.raises(FileNotFoundError) as e:
    data.load('fashion_mnist', str(missing))
  _assert_clear(str(e.value), missing, 'does not exist')


def test_idx_data_dir_that_is_a_file(tmp_path):
  garbage = tmp_path / 'garbage.bin'
  garbage.write_bytes(os.urandom(64))
  with pytest.raises(FileNotFoundError) as e:
    data.load('fashion_mnist', str(garbage))
  _assert_clear(str(e.value), garbage, 'is a file, not a directory')


@pytest.mark.parametrize('gz', [True, False])
def test_idx_bad_magic(tmp_path, gz):
  _write_idx_dir(str(tmp_path), gz=gz)
  stem = 'train-images-idx3-ubyte'
  path = tmp_path / (stem + ('.gz' if gz else ''))
  payload = b'\x12\x34\x08\x03' + idx_bytes(np.zeros((1, 2, 2), np.uint8))[4:]
  path.write_bytes(gzip.compress(payload) if gz else payload)
  with pytest.raises(ValueError) as e:
    data.load('fashion_mnist', str(tmp_path))
  _assert_clear(str(e.value), path, 'bad magic number', '0x12340803')


def test_idx_wrong_ndim(tmp_path):
  _write_idx_dir(str(tmp_path), gz=False)
  path = tmp_path / 'train-labels-idx1-ubyte'
  path.write_bytes(idx_bytes(np.zeros((12, 2, 2), np.uint8)))
  with pytest.raises(ValueError) as e:
    data.load('fashion_mnist', str(tmp_path))
  _assert_clear(str(e.value), path, '3 dimensions', 'expected 1')


@pytest.mark.parametrize('gz', [True, False])
def test_idx_truncated(tmp_path, gz):
  _write_idx_dir(str(tmp_path), gz=False)
  path = tmp_path / 't10k-images-idx3-ubyte'
  payload = path.read_bytes()[:-7]
  if gz:
    os.remove(path)
    path = tmp_path / 't10k-images-idx3-ubyte.gz'
    payload = gzip.compress(payload)
  path.write_bytes(payload)
  with pytest.raises(ValueError) as e:
    data.load('fashion_mnist', str(tmp_path))
  _assert_clear(str(e.value), path, 'truncated')


def test_idx_truncated_gzip_stream(tmp_path):
  _write_idx_dir(str(tmp_path), gz=True)
  path = tmp_path / 'train-images-idx3-ubyte.gz'
  path.write_bytes(path.read_bytes()[:-20])
  with pytest.raises(ValueError) as e:
    data.load('fashion_mnist', str(tmp_path))
  _assert_clear(str(e.value), path, 'corrupt or truncated gzip')


def test_idx_count_mismatch_and_bad_label(tmp_path):
  _write_idx_dir(str(tmp_path), gz=False)
  path = tmp_path / 'train-labels-idx1-ubyte'
  path.write_bytes(idx_bytes(np.zeros(11, np.uint8)))
  with pytest.raises(ValueError, match='count mismatch'):
    data.load('fashion_mnist', str(tmp_path))
  path.write_bytes(idx_bytes(np.full(12, 10, np.uint8)))
  with pytest.raises(ValueError, match='label 10'):
    data.load('fashion_mnist', str(tmp_path))


def test_mnist_needs_data_dir():
  with pytest.raises(FileNotFoundError, match='dataset.data_dir'):
    data.load('mnist', '')


@pytest.mark.skipif(not os.path.isdir(FASHION_DIR),
                    reason='dataset-fashion-mnist not installed')
def test_real_fashion_mnist():
  ds = data.load('fashion_mnist', '')  # default directory
  assert ds.train_images.shape == (60000, 28, 28, 1)
  assert ds.test_images.shape == (10000, 28, 28, 1)
  assert ds.train_labels.shape == (60000,)
  assert ds.test_labels.shape == (10000,)
  assert ds.num_classes == 10
  assert ds.train_labels.min() == 0 and ds.train_labels.max() == 9
  np.testing.assert_array_equal(np.bincount(ds.train_labels),
                                np.full(10, 6000))
  # Bitwise the values of the former eager pipeline (normalise() of the whole
  # sets, float32 C order), recorded before images became lazy: experiments
  # compare against runs made with it.
  for images, want in ((ds.train_images, _FMNIST_TRAIN_SHA256),
                       (ds.test_images, _FMNIST_TEST_SHA256)):
    digest = hashlib.sha256()
    for i in range(0, len(images), 8192):
      digest.update(images[i:i + 8192].tobytes())
    assert digest.hexdigest() == want
  x = ds.train_images[:]
  assert np.all(np.isfinite(x))
  assert abs(float(x.mean())) < 1e-3
  assert isinstance(ds.train_images.raw, np.ndarray)  # gzip'd: decompressed
  assert ds.train_images.raw.dtype == np.uint8
  # uint8 images and int32 labels, no float32 copy of the sets.
  assert ds.host_nbytes() == (60000 + 10000) * (28 * 28 + 4) == 55_160_000


# ----------------------------------------------------------------- lazy rows


def _frozen_normalise(train, test):
  """hfl.data.normalise as it was before images became lazy (frozen copy).

  The reference for the bitwise tests: whole arrays, float64 sums over
  8192-row chunks, then float32(x) * mul + add.
  """
  chunk_rows = 8192
  scale = float(np.iinfo(train.dtype).max)
  channels = train.shape[-1]
  total = np.zeros(channels, np.float64)
  total_sq = np.zeros(channels, np.float64)
  count = 0
  for i in range(0, train.shape[0], chunk_rows):
    chunk = train[i:i + chunk_rows].reshape(-1, channels).astype(np.float64)
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
    for i in range(0, x.shape[0], chunk_rows):
      out[i:i + chunk_rows] = x[i:i + chunk_rows].astype(np.float32) * mul + add
    return out
  return apply(train), apply(test)


def _assert_bitwise(got, want):
  assert got.dtype == want.dtype == np.float32 and got.shape == want.shape
  np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize('gz', [True, False])
def test_lazy_rows_bitwise_equal_eager_normalise(tmp_path, gz):
  # 9000 rows: the statistics span two 8192-row chunks.
  arrays = _write_idx_dir(str(tmp_path), n_train=9000, n_test=700, gz=gz)
  train_raw = arrays['train-images-idx3-ubyte'][..., None]
  test_raw = arrays['t10k-images-idx3-ubyte'][..., None]
  want_train, want_test = _frozen_normalise(train_raw, test_raw)
  ds = data.load('fashion_mnist', str(tmp_path))
  assert ds.train_images.shape == want_train.shape
  assert ds.train_images.dtype == np.float32
  rng = np.random.default_rng(0)
  idx = rng.integers(0, 9000, (2, 4, 16))  # a [D, W, B] batch, repeats allowed
  _assert_bitwise(ds.train_images[idx], want_train[idx])
  _assert_bitwise(ds.test_images[idx % 700], want_test[idx % 700])
  _assert_bitwise(ds.train_images[8000:8400], want_train[8000:8400])
  _assert_bitwise(np.asarray(ds.train_images), want_train)
  _assert_bitwise(np.asarray(ds.test_images), want_test)
  _assert_bitwise(data.normalise(train_raw, test_raw)[0], want_train)


def test_lazy_rows_index_like_numpy_multichannel():
  rng = np.random.default_rng(1)
  raw = rng.integers(0, 256, (30, 2, 3, 3), dtype=np.uint8)
  raw[..., 2] = 7  # a constant channel gets std 1
  want, _ = _frozen_normalise(raw, raw[:1])
  rows = data.NormalisedRows(raw, data.fit_normaliser(raw))
  mask = np.zeros(30, bool)
  mask[[1, 5, 29]] = True
  keys = [3, -1, np.int64(4), slice(2, 9, 3), [0, 29, 0], np.array([[1, 2], [3, 4]]),
          mask, (5, 1), (np.array([1, 2]), slice(None), 0), (slice(1, 4), ..., 2),
          (..., 0), (np.array([1, 2]), np.array([0, 1])), (), [], np.arange(0)]
  for key in keys:
    _assert_bitwise(rows[key], want[key])
  for bad in (30, -31, [0, 30]):
    with pytest.raises(IndexError):
      rows[bad]  # pylint: disable=pointless-statement


def test_dataset_holds_uint8_storage_not_float32(tmp_path):
  # Raw IDX files are memory-mapped: the Dataset holds the labels only.
  _write_idx_dir(str(tmp_path / 'raw'), n_train=100, n_test=20, gz=False)
  ds = data.load('fashion_mnist', str(tmp_path / 'raw'))
  for images in (ds.train_images, ds.test_images):
    assert isinstance(images, data.NormalisedRows)
    assert isinstance(images.raw, np.memmap) and images.raw.dtype == np.uint8
    # Nothing but the raw storage and the per-channel statistics.
    assert set(vars(images)) == {'raw', 'normaliser'}
    assert all(a.nbytes == 4 for a in images.normaliser)  # float32 [1]
  assert ds.host_nbytes() == (100 + 20) * 4
  # gzip'd files are decompressed whole: uint8 in memory, still no float32 copy.
  _write_idx_dir(str(tmp_path / 'gz'), n_train=100, n_test=20, gz=True)
  ds = data.load('fashion_mnist', str(tmp_path / 'gz'))
  assert type(ds.train_images.raw) is np.ndarray  # pylint: disable=unidiomatic-typecheck
  assert ds.train_images.raw.dtype == np.uint8
  assert ds.host_nbytes() == (100 + 20) * (4 * 3 + 4)
  assert data.host_nbytes(np.asarray(ds.train_images)) == 100 * 4 * 3 * 4


def test_open_idx_memory_maps_raw_and_validates_eagerly(tmp_path):
  arrays = _write_idx_dir(str(tmp_path), gz=False)
  path = str(tmp_path / 'train-images-idx3-ubyte')
  mm = idx_lib.open_idx(path, expected_ndim=3)
  assert isinstance(mm, np.memmap) and not mm.flags.writeable
  np.testing.assert_array_equal(mm, arrays['train-images-idx3-ubyte'])
  rows = mm[np.array([3, 1])]  # a fancy index copies just those rows
  assert type(rows) is np.ndarray  # pylint: disable=unidiomatic-typecheck
  np.testing.assert_array_equal(rows, arrays['train-images-idx3-ubyte'][[3, 1]])
  # A file that is one byte short fails at open time, not at the first read.
  with open(path, 'r+b') as f:
    f.truncate(os.path.getsize(path) - 1)
  with pytest.raises(ValueError, match='truncated'):
    idx_lib.open_idx(path, expected_ndim=3)
  # No rows: an empty array (mmap refuses empty mappings), then a clear error.
  (tmp_path / 'train-images-idx3-ubyte').write_bytes(
      idx_bytes(np.zeros((0, 4, 3), np.uint8)))
  (tmp_path / 'train-labels-idx1-ubyte').write_bytes(
      idx_bytes(np.zeros(0, np.uint8)))
  assert idx_lib.open_idx(path).shape == (0, 4, 3)
  with pytest.raises(ValueError, match='holds no images'):
    data.load('fashion_mnist', str(tmp_path))


def test_padded_rows_equal_zero_padded_concatenation():
  raw = np.random.default_rng(2).integers(0, 256, (5, 2, 2, 1), dtype=np.uint8)
  rows = data.NormalisedRows(raw, data.fit_normaliser(raw))
  full = np.concatenate([np.asarray(rows), np.zeros((3, 2, 2, 1), np.float32)])
  padded = data.PaddedRows(rows, 8)
  assert padded.shape == (8, 2, 2, 1) and padded.dtype == np.float32
  idx = np.arange(8).reshape(2, 4)
  _assert_bitwise(padded[idx], full[idx])
  _assert_bitwise(padded[np.array([7, 6])], full[[7, 6]])
  with pytest.raises(IndexError):
    padded[np.array([8])]  # pylint: disable=expression-not-assigned


# ----------------------------------------------------------------- TFDS


def _png(arr):
  import PIL.Image  # pylint: disable=g-import-not-at-top
  buf = io.BytesIO()
  PIL.Image.fromarray(arr).save(buf, format='PNG')
  return buf.getvalue()


def _build_tiny_tfds(data_dir, name, version, shape, num_classes, sizes):
  """Prepares a tiny array_record image dataset offline (no TensorFlow).

  Images are PNG-encoded with PIL and handed to tfds as bytes, so tfds never
  needs TensorFlow to encode them (it would to encode numpy arrays).
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  class _Tiny(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    VERSION = tfds.core.Version(version)

    def _info(self):
      return tfds.core.DatasetInfo(
          builder=self,
          features=tfds.features.FeaturesDict({
              'id': tfds.features.Text(),
              'image': tfds.features.Image(shape=shape),
              'label': tfds.features.ClassLabel(num_classes=num_classes),
          }))

    def _split_generators(self, dl_manager):
      del dl_manager
      return {split: self._generate_examples(split, n)
              for split, n in sizes.items()}

    def _generate_examples(self, split, n):
      rng = np.random.default_rng(len(split))
      for i in range(n):
        img = rng.integers(0, 256, shape, dtype=np.uint8)
        yield f'{split}_{i}', {'id': f'{split}_{i}',
                               'image': _png(np.squeeze(img, -1)
                                             if shape[-1] == 1 else img),
                               'label': i % num_classes}

  _Tiny.name = name
  builder = _Tiny(data_dir=str(data_dir), file_format='array_record')
  builder.download_and_prepare()


def test_tfds_cifar10_layout_offline(tmp_path):
  # A tiny stand-in prepared under the real cifar10 name/version/features, so
  # load('cifar10') goes through the registered cifar10 builder.
  _build_tiny_tfds(tmp_path, 'cifar10', '3.0.2', (32, 32, 3), 10,
                   {'train': 20, 'test': 7})
  ds = data.load('cifar10', str(tmp_path))
  assert ds.name == 'cifar10' and ds.num_classes == 10
  assert ds.train_images.shape == (20, 32, 32, 3)
  assert ds.test_images.shape == (7, 32, 32, 3)
  assert ds.train_images.dtype == np.float32
  assert ds.train_labels.dtype == np.int32
  assert sorted(ds.train_labels.tolist()) == sorted(i % 10 for i in range(20))
  np.testing.assert_allclose(ds.train_images[:].mean(axis=(0, 1, 2)), 0,
                             atol=1e-4)
  assert 'tensorflow' not in sys.modules
  # Images are read on demand: only the distinct requested records, batched.
  assert isinstance(ds.train_images.raw, data.TfdsImages)
  assert ds.host_nbytes() == (20 + 7) * 4  # the labels
  calls = []

  class Counting:

    def __init__(self, source):
      self.source = source

    def __len__(self):
      return len(self.source)

    def __getitems__(self, keys):
      calls.append(list(keys))
      return self.source.__getitems__(keys)

  ds.train_images.raw.source = Counting(ds.train_images.raw.source)
  idx = np.array([[3, 3], [0, 17]])
  got = ds.train_images[idx]
  assert calls == [[0, 3, 17]]
  # Bitwise what reading the whole split and normalising it eagerly gives.
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  builder = tfds.builder('cifar10', data_dir=str(tmp_path))
  eager = {split: np.stack([np.asarray(r['image']) for r in
                            builder.as_data_source(split=split)])
           for split in ('train', 'test')}
  want_train, want_test = _frozen_normalise(eager['train'], eager['test'])
  _assert_bitwise(got, want_train[idx])
  _assert_bitwise(np.asarray(ds.test_images), want_test)


def test_tfds_unregistered_grayscale_from_env(tmp_path, monkeypatch):
  _build_tiny_tfds(tmp_path, 'hfl_tiny_gray', '1.0.0', (6, 5, 1), 3,
                   {'train': 9, 'test': 4})
  monkeypatch.setenv('TFDS_DATA_DIR', str(tmp_path))
  ds = data.load('hfl_tiny_gray', '')
  assert ds.train_images.shape == (9, 6, 5, 1)
  assert ds.num_classes == 3
  assert 'tensorflow' not in sys.modules


def test_tfds_not_prepared_error(tmp_path):
  with pytest.raises(FileNotFoundError) as e:
    data.load('cifar10', str(tmp_path))
  msg = str(e.value)
  assert "'cifar10'" in msg and 'not prepared' in msg
  assert str(tmp_path) in msg and 'dataset.data_dir' in msg
  assert 'tfds build cifar10' in msg and 'TFDS_DATA_DIR' in msg
  assert not os.listdir(tmp_path) or 'downloads' not in os.listdir(tmp_path)
  assert 'tensorflow' not in sys.modules


def test_tfds_not_prepared_in_idx_dir_hints(tmp_path):
  _write_idx_dir(str(tmp_path))
  with pytest.raises(FileNotFoundError, match='holds IDX files'):
    data.load('cifar10', str(tmp_path))


def test_tfds_not_prepared_uses_env_dir(tmp_path, monkeypatch):
  monkeypatch.setenv('TFDS_DATA_DIR', str(tmp_path / 'tfds_home'))
  with pytest.raises(FileNotFoundError, match='tfds_home'):
    data.load('cifar10', '')


def test_unknown_dataset_lists_known_names(tmp_path):
  with pytest.raises(ValueError) as e:
    data.load('no_such_dataset_xyz', str(tmp_path))
  msg = str(e.value)
  for known in ('fashion_mnist', 'mnist', 'cifar10'):
    assert known in msg
  assert 'tensorflow' not in sys.modules


# ----------------------------------------------------------------- partition


def _labels(n=6000, k=10, seed=0):
  return np.random.default_rng(seed).integers(0, k, n)


def _check_invariants(part, n, num_dcs, workers):
  assert len(part.worker_indices) == num_dcs
  assert all(len(dc) == workers for dc in part.worker_indices)
  flat = np.concatenate([s for dc in part.worker_indices for s in dc])
  assert flat.dtype == np.int64
  np.testing.assert_array_equal(np.sort(flat), np.arange(n))
  assert part.dc_sizes.dtype == np.int64 and part.dc_sizes.shape == (num_dcs,)
  assert part.worker_sizes.shape == (num_dcs, workers)
  assert int(part.dc_sizes.sum()) == n
  np.testing.assert_array_equal(part.worker_sizes.sum(axis=1), part.dc_sizes)
  assert part.worker_sizes.min() >= 1
  for d, dc in enumerate(part.worker_indices):
    for w, s in enumerate(dc):
      assert s.shape[0] == part.worker_sizes[d, w]


def _same(a, b):
  return all(np.array_equal(x, y) for da, db in
             zip(a.worker_indices, b.worker_indices) for x, y in zip(da, db))


@pytest.mark.parametrize('num_dcs,workers', [(1, 1), (2, 4), (4, 2), (3, 5),
                                             (8, 1)])
@pytest.mark.parametrize('method,alpha', [('iid', 0.0), ('dirichlet', 0.05),
                                          ('dirichlet', 0.5),
                                          ('dirichlet', 100.0)])
def test_partition_invariants(num_dcs, workers, method, alpha):
  labels = _labels()
  part = data.partition(labels, num_dcs, workers, method, alpha, seed=3)
  _check_invariants(part, labels.size, num_dcs, workers)
  again = data.partition(labels, num_dcs, workers, method, alpha, seed=3)
  assert _same(part, again)
  if num_dcs * workers > 1:
    other = data.partition(labels, num_dcs, workers, method, alpha, seed=4)
    assert not _same(part, other)
  if method == 'dirichlet':
    assert part.worker_sizes.min() >= 10  # default minimum shard


def test_partition_iid_even():
  part = data.partition(_labels(1003), 2, 3, 'iid', 0.0, 0)
  assert part.worker_sizes.max() - part.worker_sizes.min() <= 1
  assert abs(int(part.dc_sizes[0]) - int(part.dc_sizes[1])) <= 1


def _dc_skew(alpha, seed=0):
  """Mean total-variation distance of DC label distributions from global."""
  labels = _labels(20000)
  part = data.partition(labels, 4, 2, 'dirichlet', alpha, seed)
  counts = data.label_counts(part, labels, 10).sum(axis=1)  # [D, K]
  dist = counts / counts.sum(axis=1, keepdims=True)
  glob = np.bincount(labels, minlength=10) / labels.size
  return 0.5 * np.abs(dist - glob).sum(axis=1).mean()


def test_partition_dirichlet_skew_tracks_alpha():
  strong, weak = _dc_skew(0.05), _dc_skew(100.0)
  assert strong > 0.5, strong
  assert weak < 0.05, weak
  assert _dc_skew(0.5) > weak


def test_partition_dirichlet_workers_skewed_within_dc():
  labels = _labels(20000)
  part = data.partition(labels, 2, 4, 'dirichlet', 0.05, 0)
  counts = data.label_counts(part, labels, 10)  # [D, W, K]
  dc = counts.sum(axis=1, keepdims=True)
  w_dist = counts / counts.sum(axis=2, keepdims=True)
  dc_dist = dc / dc.sum(axis=2, keepdims=True)
  assert 0.5 * np.abs(w_dist - dc_dist).sum(axis=2).mean() > 0.3


def test_partition_dirichlet_tiny_alpha_no_nan_no_empty():
  labels = _labels(2000, k=4)
  part = data.partition(labels, 2, 2, 'dirichlet', 1e-3, 0, min_size=1)
  _check_invariants(part, labels.size, 2, 2)


def test_partition_dirichlet_impossible_raises():
  # Every worker needs 200 samples but there are 8 * 200 - 1.
  labels = _labels(1599)
  with pytest.raises(ValueError) as e:
    data.partition(labels, 2, 4, 'dirichlet', 0.1, 0, min_size=200)
  msg = str(e.value)
  for field in ('dataset.dirichlet_alpha', 'mesh.num_dcs',
                'mesh.workers_per_dc'):
    assert field in msg


def test_partition_arg_errors():
  labels = _labels(100)
  for alpha in (0.0, -1.0, float('nan'), None):
    with pytest.raises(ValueError, match='dataset.dirichlet_alpha'):
      data.partition(labels, 2, 2, 'dirichlet', alpha, 0)
  with pytest.raises(ValueError, match='dataset.partition') as e:
    data.partition(labels, 2, 2, 'shards', 0.5, 0)
  assert 'iid' in str(e.value) and 'dirichlet' in str(e.value)
  with pytest.raises(ValueError, match='mesh.num_dcs'):
    data.partition(labels, 0, 2, 'iid', 0.5, 0)
  with pytest.raises(ValueError, match='mesh.workers_per_dc'):
    data.partition(labels, 2, 0, 'iid', 0.5, 0)
  with pytest.raises(ValueError, match='at least one sample'):
    data.partition(labels[:3], 2, 2, 'iid', 0.5, 0)


# ----------------------------------------------------------------- sampler


def test_batch_indices_deterministic_and_in_shard():
  part = data.partition(_labels(3000), 2, 4, 'dirichlet', 0.5, 0)
  a = data.batch_indices(part, 16, 5, seed=7)
  sampler_lib._epoch_permutation.cache_clear()  # result must not need cache
  b = data.batch_indices(part, 16, 5, seed=7)
  assert a.shape == (2, 4, 16) and a.dtype == np.int64
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, data.batch_indices(part, 16, 5, seed=8))
  assert not np.array_equal(a, data.batch_indices(part, 16, 6, seed=7))
  for d in range(2):
    for w in range(4):
      assert np.isin(a[d, w], part.worker_indices[d][w]).all()


def test_batch_indices_one_epoch_covers_shard_once():
  part = data.partition(_labels(640), 2, 2, 'iid', 0.0, 1)  # 160 per worker
  bs = 16
  steps = 160 // bs
  seen = np.concatenate([data.batch_indices(part, bs, s, 0)
                         for s in range(steps)], axis=-1)  # [D, W, 160]
  for d in range(2):
    for w in range(2):
      np.testing.assert_array_equal(np.sort(seen[d, w]),
                                    part.worker_indices[d][w])
  # The next epoch is a different order of the same samples.
  nxt = np.concatenate([data.batch_indices(part, bs, s, 0)
                        for s in range(steps, 2 * steps)], axis=-1)
  assert not np.array_equal(seen, nxt)
  np.testing.assert_array_equal(np.sort(nxt, -1), np.sort(seen, -1))


def _stream(shard, seed, d, w, epochs):
  return np.concatenate([
      shard[np.random.default_rng([seed, d, w, e]).permutation(shard.size)]
      for e in range(epochs)])


def test_batch_indices_span_epochs_matches_stream():
  labels = _labels(77)
  part = data.partition(labels, 1, 2, 'iid', 0.0, 0)  # shards of 39 and 38
  bs = 10
  for s in range(12):
    got = data.batch_indices(part, bs, s, 3)
    for w in range(2):
      shard = part.worker_indices[0][w]
      stream = _stream(shard, 3, 0, w, 5)
      np.testing.assert_array_equal(got[0, w], stream[s * bs:(s + 1) * bs])
  # A batch larger than the shard spans several epochs.
  big = data.batch_indices(part, 100, 1, 3)
  for w in range(2):
    stream = _stream(part.worker_indices[0][w], 3, 0, w, 8)
    np.testing.assert_array_equal(big[0, w], stream[100:200])


def test_batch_indices_fast():
  import time  # pylint: disable=g-import-not-at-top
  labels = _labels(60000)
  part = data.partition(labels, 2, 4, 'iid', 0.0, 0)
  data.batch_indices(part, 64, 0, 0)
  t0 = time.perf_counter()
  for s in range(200):
    data.batch_indices(part, 64, s, 0)
  per_call = (time.perf_counter() - t0) / 200
  assert per_call < 2e-3, per_call


def test_check_batch_size():
  part = data.partition(_labels(100), 2, 2, 'iid', 0.0, 0)  # 25 each
  data.check_batch_size(part, 25)
  with pytest.raises(ValueError) as e:
    data.check_batch_size(part, 26)
  msg = str(e.value)
  assert 'train.batch_size=26' in msg and '25 samples' in msg
  with pytest.raises(ValueError, match='train.batch_size'):
    data.check_batch_size(part, 0)
