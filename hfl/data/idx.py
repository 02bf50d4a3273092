"""Reader for the IDX format of MNIST and Fashion-MNIST (gzip'd or raw).

An IDX file is a 4-byte magic number ``0x00 0x00 TYPE NDIM`` followed by NDIM
big-endian uint32 dimension sizes and then the array data, big-endian, in C
order. MNIST and Fashion-MNIST ship four such files::

    train-images-idx3-ubyte[.gz]   uint8 [N, 28, 28]   magic 0x00000803
    train-labels-idx1-ubyte[.gz]   uint8 [N]           magic 0x00000801
    t10k-images-idx3-ubyte[.gz]    uint8 [M, 28, 28]
    t10k-labels-idx1-ubyte[.gz]    uint8 [M]

:func:`load_idx` validates every file's header and size at once but does not
read the images: a raw file is memory-mapped (:func:`open_idx`; only the pages
of the rows indexed are read from disk), a gzip'd one, which has no random
access, is decompressed whole into memory (as uint8). Labels are read whole.

Every error names the config field ``dataset.data_dir``, the file, what was
wrong and how to fix it, because a wrong data directory is the most common way
an experiment fails to start.
"""

import gzip
import os
import zlib
from typing import NamedTuple, Optional

import numpy as np

# Debian's `dataset-fashion-mnist` package installs the four files here.
FASHION_MNIST_DIR = '/usr/share/datasets/fashion-mnist'

# IDX type byte -> big-endian numpy dtype.
_IDX_DTYPES = {
    0x08: np.dtype('>u1'),
    0x09: np.dtype('>i1'),
    0x0B: np.dtype('>i2'),
    0x0C: np.dtype('>i4'),
    0x0D: np.dtype('>f4'),
    0x0E: np.dtype('>f8'),
}

_GZIP_MAGIC = b'\x1f\x8b'

# File stems of the four IDX files, by (split, kind).
IDX_STEMS = {
    ('train', 'images'): 'train-images-idx3-ubyte',
    ('train', 'labels'): 'train-labels-idx1-ubyte',
    ('test', 'images'): 't10k-images-idx3-ubyte',
    ('test', 'labels'): 't10k-labels-idx1-ubyte',
}


class IdxSplits(NamedTuple):
  """Raw IDX arrays, before normalisation.

  Attributes:
    train_images: uint8 [N, H, W], read-only: an ``np.memmap`` of a raw file
      (rows read from disk on demand), or an in-memory array decompressed from
      a gzip'd one (see :func:`open_idx`).
    train_labels: uint8 [N], in memory.
    test_images: uint8 [M, H, W], like train_images.
    test_labels: uint8 [M], in memory.
  """
  train_images: np.ndarray
  train_labels: np.ndarray
  test_images: np.ndarray
  test_labels: np.ndarray


def fix_hint(name: str = 'fashion_mnist') -> str:
  """How to get the IDX files of dataset ``name``, for error messages."""
  files = ', '.join(f'{s}[.gz]' for s in IDX_STEMS.values())
  if name == 'fashion_mnist':
    return ('Fix: `apt-get install -y dataset-fashion-mnist` (installs '
            f'{FASHION_MNIST_DIR}), or point dataset.data_dir at a directory '
            f'holding the four IDX files ({files}).')
  return ('Fix: point dataset.data_dir at a directory holding the four '
          f'{name} IDX files ({files}).')


def _error_prefix(data_dir: str, path: str) -> str:
  return f'dataset.data_dir={data_dir!r}: IDX file {path!r}'


def _read_bytes(path: str, data_dir: str, name: str) -> bytes:
  """Reads a file, transparently gunzipping it (detected by magic, not name)."""
  try:
    with open(path, 'rb') as f:
      raw = f.read()
  except OSError as e:
    raise FileNotFoundError(
        f'{_error_prefix(data_dir, path)} cannot be read ({e}). '
        f'{fix_hint(name)}') from e
  if raw[:2] != _GZIP_MAGIC:
    return raw
  try:
    return gzip.decompress(raw)
  except (OSError, EOFError, zlib.error) as e:
    raise ValueError(
        f'{_error_prefix(data_dir, path)} is a corrupt or truncated gzip file '
        f'({type(e).__name__}: {e}). Re-download or reinstall it. '
        f'{fix_hint(name)}') from e


def _parse_header(head: bytes, size: int, where: str, name: str,
                  expected_ndim: Optional[int]):
  """Validates an IDX header against the total size of the (decompressed) file.

  Args:
    head: the file's first bytes (at least its header, or the whole file).
    size: the file's total length in bytes, decompressed.
    where: error-message prefix naming dataset.data_dir and the file.
    name: dataset name, for the fix hint.
    expected_ndim: if given, the number of dimensions the file must have.

  Returns:
    (dtype, dims, header_length): the big-endian element dtype, the dimension
    sizes, and the offset of the data.

  Raises:
    ValueError: bad magic number, unknown type, wrong number of dimensions,
      truncated header, or a data size that does not match the header.
  """
  if size < 4:
    raise ValueError(f'{where} is truncated: {size} bytes, shorter than '
                     f'the 4-byte magic number. {fix_hint(name)}')
  magic = int.from_bytes(head[:4], 'big')
  type_code, ndim = head[2], head[3]
  if head[0] != 0 or head[1] != 0 or type_code not in _IDX_DTYPES or ndim == 0:
    raise ValueError(
        f'{where} has a bad magic number 0x{magic:08X} (an IDX file starts '
        'with 0x0000TTNN, TT a type code in '
        f'{sorted(hex(t) for t in _IDX_DTYPES)}, NN >= 1 dimensions); it is '
        f'not an IDX file or it is corrupt. {fix_hint(name)}')
  if expected_ndim is not None and ndim != expected_ndim:
    raise ValueError(
        f'{where} has {ndim} dimensions (magic 0x{magic:08X}); expected '
        f'{expected_ndim}. Are the image and label files swapped? '
        f'{fix_hint(name)}')
  header = 4 + 4 * ndim
  if size < header:
    raise ValueError(f'{where} is truncated inside its header ({size} '
                     f'bytes, header needs {header}). {fix_hint(name)}')
  dims = tuple(int.from_bytes(head[4 + 4 * i:8 + 4 * i], 'big')
               for i in range(ndim))
  dtype = _IDX_DTYPES[type_code]
  expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
  got = size - header
  if got != expected:
    what = 'truncated' if got < expected else 'longer than its header says'
    raise ValueError(
        f'{where} is {what}: header dims {dims} need {expected} data bytes, '
        f'file has {got}. {fix_hint(name)}')
  return dtype, dims, header


def read_idx(path: str, data_dir: str = '', name: str = 'fashion_mnist',
             expected_ndim: Optional[int] = None) -> np.ndarray:
  """Reads one IDX file into a native-endian numpy array.

  Args:
    path: the file; gzip'd or raw (detected from the content).
    data_dir: the configured ``dataset.data_dir``, only for error messages.
    name: the dataset name, only for the fix hint in error messages.
    expected_ndim: if given, the number of dimensions the file must have.

  Returns:
    Array of the file's shape and dtype (uint8 for MNIST-style files), in
    native byte order, writable.

  Raises:
    FileNotFoundError: the file is missing or unreadable.
    ValueError: bad magic number, unknown type, wrong number of dimensions,
      truncated or oversized payload, or a corrupt gzip stream.
  """
  buf = _read_bytes(path, data_dir, name)
  dtype, dims, header = _parse_header(buf, len(buf), _error_prefix(data_dir, path),
                                      name, expected_ndim)
  arr = np.frombuffer(buf, dtype=dtype, offset=header).reshape(dims)
  return arr.astype(dtype.newbyteorder('='), copy=True)


def open_idx(path: str, data_dir: str = '', name: str = 'fashion_mnist',
             expected_ndim: Optional[int] = None) -> np.ndarray:
  """Opens one IDX file for reading rows on demand; validates it now.

  The header and the file size are checked here, before anything is
  returned, so a corrupt file fails at load time, not at the first read. A raw
  (not gzip'd) file is memory-mapped: no data is read now, and indexing reads
  only the pages of the rows it selects. A gzip'd file has no random access: it
  is decompressed whole into memory once (for Fashion-MNIST's training images
  47 MB), and the array is a read-only view of that buffer (no second copy).

  Args:
    path: the file; gzip'd or raw (detected from the content).
    data_dir: the configured ``dataset.data_dir``, only for error messages.
    name: the dataset name, only for the fix hint in error messages.
    expected_ndim: if given, the number of dimensions the file must have.

  Returns:
    A read-only array of the file's shape and dtype: an ``np.memmap`` for a
    raw file (big-endian for multi-byte types; values convert correctly), an
    in-memory native-endian array for a gzip'd one.

  Raises:
    FileNotFoundError: the file is missing or unreadable.
    ValueError: bad magic number, unknown type, wrong number of dimensions,
      truncated or oversized payload, or a corrupt gzip stream.
  """
  where = _error_prefix(data_dir, path)
  try:
    with open(path, 'rb') as f:
      head = f.read(4 + 4 * 255)  # the longest possible header
      size = os.fstat(f.fileno()).st_size
  except OSError as e:
    raise FileNotFoundError(f'{where} cannot be read ({e}). {fix_hint(name)}') from e
  if head[:2] == _GZIP_MAGIC:
    buf = _read_bytes(path, data_dir, name)
    dtype, dims, header = _parse_header(buf, len(buf), where, name, expected_ndim)
    arr = np.frombuffer(buf, dtype=dtype, offset=header).reshape(dims)
    return arr if arr.dtype.isnative else arr.astype(dtype.newbyteorder('='))
  dtype, dims, header = _parse_header(head, size, where, name, expected_ndim)
  if size == header:  # no rows: nothing to map (mmap refuses empty mappings)
    return np.empty(dims, dtype)
  return np.memmap(path, dtype=dtype, mode='r', offset=header, shape=dims)


def find_idx_file(data_dir: str, stem: str, name: str = 'fashion_mnist') -> str:
  """Returns the path of ``stem.gz`` or ``stem`` in ``data_dir``.

  Raises:
    FileNotFoundError: the directory or both file variants are missing.
  """
  if not os.path.isdir(data_dir):
    what = ('is a file, not a directory' if os.path.exists(data_dir) else
            'directory does not exist')
    raise FileNotFoundError(
        f'dataset.data_dir={data_dir!r}: {what} (looking for {stem}[.gz] in it). '
        f'{fix_hint(name)}')
  for candidate in (stem + '.gz', stem):
    path = os.path.join(data_dir, candidate)
    if os.path.isfile(path):
      return path
  raise FileNotFoundError(
      f'dataset.data_dir={data_dir!r}: IDX file '
      f'{os.path.join(data_dir, stem + ".gz")!r} is missing (also tried '
      f'without .gz). {fix_hint(name)}')


def load_idx(data_dir: str, name: str = 'fashion_mnist',
             num_classes: int = 10) -> IdxSplits:
  """Reads and cross-checks the four IDX files of an MNIST-style dataset.

  Args:
    data_dir: directory with the four files (see module doc).
    name: dataset name, for error messages.
    num_classes: labels must lie in ``[0, num_classes)``.

  Returns:
    IdxSplits with uint8 images [N, H, W] opened with :func:`open_idx`
    (memory-mapped when the files are not gzip'd; every file's header and
    size are validated now) and uint8 labels [N] read into memory.

  Raises:
    FileNotFoundError: a file or the directory is missing.
    ValueError: a file is corrupt or truncated, images and labels disagree in
      count, train and test images disagree in size, or a label is out of
      range.
  """
  arrays = {}
  for (split, kind), stem in IDX_STEMS.items():
    path = find_idx_file(data_dir, stem, name)
    read = open_idx if kind == 'images' else read_idx
    arr = read(path, data_dir, name, expected_ndim=3 if kind == 'images' else 1)
    if arr.dtype != np.uint8:
      raise ValueError(
          f'{_error_prefix(data_dir, path)} holds {arr.dtype} data; expected '
          f'unsigned bytes (ubyte). {fix_hint(name)}')
    arrays[split, kind] = (arr, path)
  for split in ('train', 'test'):
    (images, ipath), (labels, lpath) = (arrays[split, 'images'],
                                        arrays[split, 'labels'])
    if images.shape[0] != labels.shape[0]:
      raise ValueError(
          f'dataset.data_dir={data_dir!r}: {split} count mismatch: '
          f'{ipath!r} has {images.shape[0]} images but {lpath!r} has '
          f'{labels.shape[0]} labels. {fix_hint(name)}')
    if images.shape[0] == 0:
      raise ValueError(f'dataset.data_dir={data_dir!r}: {ipath!r} holds no '
                       f'images. {fix_hint(name)}')
    if labels.size and int(labels.max()) >= num_classes:
      raise ValueError(
          f'dataset.data_dir={data_dir!r}: {lpath!r} has label '
          f'{int(labels.max())}, outside [0, {num_classes}). '
          f'{fix_hint(name)}')
  train_hw = arrays['train', 'images'][0].shape[1:]
  test_hw = arrays['test', 'images'][0].shape[1:]
  if train_hw != test_hw:
    raise ValueError(
        f'dataset.data_dir={data_dir!r}: train images are {train_hw} but test '
        f'images are {test_hw}. {fix_hint(name)}')
  return IdxSplits(arrays['train', 'images'][0], arrays['train', 'labels'][0],
                   arrays['test', 'images'][0], arrays['test', 'labels'][0])
