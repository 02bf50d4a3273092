"""Lazily normalised image rows: compact raw storage, float32 only on demand.

A :class:`NormalisedRows` stands for the standardised float32 array
``(raw / scale - mean_c) / std_c`` of a raw image array ``raw`` [N, H, W, C]
(uint8 for every dataset hfl reads) without ever holding it: indexing it with
numpy semantics (``rows[idx]`` for an int, a slice, an integer or boolean index
array of any shape) reads only the requested rows of ``raw`` and converts only
those. ``raw`` is anything with ``shape``, ``dtype`` and first-axis indexing:
a numpy array, an ``np.memmap`` of an IDX file (only the pages of the rows
read are ever loaded from disk), or a TFDS record reader
(:class:`hfl.data.tfds_source.TfdsImages`).

The values are bitwise those of converting the whole array at once: the
statistics are fitted by :func:`fit_normaliser` over the same 8192-row chunks
in the same order as always, and the conversion ``float32(x) * mul + add`` is
elementwise, so a row's value does not depend on which other rows are
converted with it.

:class:`PaddedRows` pads a row source with zero rows (evaluation pads the test
set to a multiple of the device count); :func:`host_nbytes` says how many bytes
of process memory an array or row source holds.
"""

from typing import Any, NamedTuple

import numpy as np

# Rows per chunk when fitting the statistics or converting many rows. The
# float64 sums are accumulated chunk by chunk, so the chunk size is part of the
# result (to the last bit): keep it.
CHUNK = 8192


def pixel_scale(dtype: np.dtype) -> float:
  """Pixel value that maps to 1.0: 255 for uint8, 65535 for uint16, else 1."""
  if np.issubdtype(dtype, np.integer):
    return float(np.iinfo(dtype).max)
  return 1.0


class Normaliser(NamedTuple):
  """Per-channel affine map ``x -> float32(x) * mul + add``.

  Attributes:
    mul: float32 [C], ``1 / (scale * std_c)``.
    add: float32 [C], ``-mean_c / std_c``.
  """
  mul: np.ndarray
  add: np.ndarray

  def apply(self, x: np.ndarray) -> np.ndarray:
    """Standardises raw rows ``x`` [..., C] (any shape ending in channels).

    Returns:
      float32 array of ``x.shape``.
    """
    return np.asarray(x).astype(np.float32) * self.mul + self.add


def fit_normaliser(train) -> Normaliser:
  """Fits per-channel standardisation to the training images.

  Reads ``train`` once, in consecutive chunks of :data:`CHUNK` rows, summing
  ``x / scale`` and its square per channel in float64 (no float copy of the
  whole set is made). A constant channel gets std 1.

  Args:
    train: raw images [N, ..., C] (numpy array, memmap or row source supporting
      slices ``train[i:j]``); uint8, uint16 or float.

  Returns:
    The Normaliser with the training set's mean and std (pixels scaled to
    [0, 1] first: scale 255 for uint8).
  """
  scale = pixel_scale(train.dtype)
  channels = train.shape[-1]
  total = np.zeros(channels, np.float64)
  total_sq = np.zeros(channels, np.float64)
  count = 0
  for i in range(0, train.shape[0], CHUNK):
    chunk = np.asarray(train[i:i + CHUNK]).reshape(-1, channels).astype(np.float64)
    chunk /= scale
    total += chunk.sum(axis=0)
    total_sq += np.square(chunk).sum(axis=0)
    count += chunk.shape[0]
  mean = total / count
  std = np.sqrt(np.maximum(total_sq / count - np.square(mean), 0.0))
  std = np.where(std > 1e-8, std, 1.0)
  mul = (1.0 / (scale * std)).astype(np.float32)
  add = (-mean / std).astype(np.float32)
  return Normaliser(mul, add)


def _is_basic(index) -> bool:
  """Whether ``index`` is a basic numpy index (int, slice, ``...``, None)."""
  return (index is None or index is Ellipsis or isinstance(index, slice)
          or (isinstance(index, (int, np.integer))
              and not isinstance(index, (bool, np.bool_))))


def _row_axes(first):
  """Axes that a first-axis index turns axis 0 into, or None if not one.

  An int gives 0, a slice or a 1-D boolean mask 1, an integer array (or list)
  its number of dimensions; anything else (``...``, None, booleans of other
  ranks) is not a plain row selector.
  """
  if isinstance(first, (bool, np.bool_)) or first is None or first is Ellipsis:
    return None
  if isinstance(first, (int, np.integer)):
    return 0
  if isinstance(first, slice):
    return 1
  arr = np.asarray(first)
  if arr.dtype == np.bool_:
    return 1 if arr.ndim == 1 else None
  if np.issubdtype(arr.dtype, np.integer) or arr.size == 0:
    return arr.ndim
  return None


def row_index(key, n: int) -> np.ndarray:
  """Row numbers selected by a first-axis index, with numpy's semantics.

  Args:
    key: an int, a slice, or an integer array/list of any shape (negative
      entries count from the end) or a 1-D boolean mask of length n.
    n: the number of rows.

  Returns:
    int64 array of non-negative row numbers, of the shape numpy's result's
    leading axes would have (0-d for an int).

  Raises:
    IndexError: an index outside [-n, n) or a mask of the wrong length.
    TypeError: a key that is none of the above.
  """
  if isinstance(key, slice):
    return np.arange(*key.indices(n), dtype=np.int64)
  arr = np.asarray(key)
  if arr.dtype == np.bool_:
    if arr.ndim != 1 or arr.shape[0] != n:
      raise IndexError(f'boolean row mask of shape {arr.shape} for {n} rows.')
    return np.flatnonzero(arr).astype(np.int64)
  if arr.size == 0:
    return arr.astype(np.int64)
  if not np.issubdtype(arr.dtype, np.integer):
    raise TypeError(f'row index must be an int, slice, integer array or boolean '
                    f'mask, got {type(key).__name__} {arr.dtype}.')
  if arr.min() < -n or arr.max() >= n:
    raise IndexError(f'row index out of range for {n} rows '
                     f'(min {arr.min()}, max {arr.max()}).')
  return np.where(arr < 0, arr + n, arr).astype(np.int64)


class RowArray:
  """What the row sources share with numpy arrays: ``ndim`` and ``len`` from ``shape``."""

  shape: tuple

  @property
  def ndim(self) -> int:
    return len(self.shape)

  def __len__(self) -> int:
    return self.shape[0]


class NormalisedRows(RowArray):
  """Standardised float32 images, converted from raw storage row by row.

  Attributes:
    raw: the raw images [N, ..., C] (their storage: uint8 for IDX and TFDS).
    normaliser: the per-channel map applied to the rows read.
  """

  def __init__(self, raw: Any, normaliser: Normaliser):
    self.raw = raw
    self.normaliser = normaliser

  @property
  def shape(self) -> tuple:
    """``raw.shape``: [N, H, W, C]."""
    return tuple(self.raw.shape)

  @property
  def dtype(self) -> np.dtype:
    """Always float32."""
    return np.dtype(np.float32)

  def __repr__(self) -> str:
    return (f'NormalisedRows(shape={self.shape}, raw={type(self.raw).__name__} '
            f'{np.dtype(self.raw.dtype).name})')

  def __getitem__(self, key) -> np.ndarray:
    """``standardised[key]`` with numpy semantics, reading only the rows selected.

    Args:
      key: an index on the first axis (int, slice, integer array or list of
        any shape, 1-D boolean mask), or a tuple whose first element is one and
        whose further elements are basic indices (ints, slices, ``...``, None).
        Other keys (starting with ``...``, or with index arrays on later axes)
        are answered too, by converting every row first.

    Returns:
      A new float32 array, as numpy would return for the same key.

    Raises:
      IndexError: a row index out of range.
    """
    if isinstance(key, tuple):
      first, rest = (key[0], key[1:]) if key else (slice(None), ())
    else:
      first, rest = key, ()
    lead = _row_axes(first)
    if lead is None or not all(map(_is_basic, rest)):
      return np.asarray(self)[key]
    rows = self.normaliser.apply(self.raw[first])
    return rows[(slice(None),) * lead + rest] if rest else rows

  def __array__(self, dtype=None, copy=None) -> np.ndarray:
    """All rows as one float32 array (N x row size x 4 bytes), built in chunks."""
    if copy is False:
      raise ValueError('NormalisedRows converts on demand: np.asarray makes a copy.')
    out = np.empty(self.shape, np.float32)
    for i in range(0, len(self), CHUNK):
      out[i:i + CHUNK] = self[i:i + CHUNK]
    return out if dtype is None else out.astype(dtype, copy=False)


class PaddedRows:
  """A row source extended with zero rows up to ``length`` rows.

  Attributes:
    source: the row source [N, ...] (numpy array or :class:`NormalisedRows`).
    length: total rows, >= N; rows N .. length-1 read as zeros.
  """

  def __init__(self, source: Any, length: int):
    if length < len(source):
      raise ValueError(f'PaddedRows: length {length} < {len(source)} source rows.')
    self.source = source
    self.length = int(length)

  @property
  def shape(self) -> tuple:
    return (self.length,) + tuple(self.source.shape[1:])

  @property
  def dtype(self) -> np.dtype:
    return np.dtype(self.source.dtype)

  def __len__(self) -> int:
    return self.length

  def __getitem__(self, idx) -> np.ndarray:
    """Rows ``idx`` (an integer array of any shape, entries in [0, length)).

    Returns:
      array ``idx.shape + source.shape[1:]`` of the source's dtype: the source
      rows for entries < N (read with one ``source[...]`` call), zeros beyond.

    Raises:
      IndexError: an entry outside [0, length).
    """
    idx = np.asarray(idx)
    if not np.issubdtype(idx.dtype, np.integer):
      raise TypeError(f'PaddedRows takes integer index arrays, got {idx.dtype}.')
    if idx.size and (idx.min() < 0 or idx.max() >= self.length):
      raise IndexError(f'PaddedRows: index out of range [0, {self.length}).')
    out = np.zeros(idx.shape + self.shape[1:], self.dtype)
    real = idx < len(self.source)
    if real.any():
      out[real] = self.source[idx[real]]
    return out


def host_nbytes(x: Any) -> int:
  """Bytes of process memory held by an array or row source.

  In-memory numpy arrays count their ``nbytes``; memory-mapped files
  (``np.memmap``) and sources that read records on demand count 0: their
  pages live in the kernel's page cache, are read only when rows are fetched
  and can be dropped at any time. A :class:`NormalisedRows` holds its raw
  storage only.
  """
  if isinstance(x, NormalisedRows):
    return host_nbytes(x.raw)
  if isinstance(x, PaddedRows):
    return host_nbytes(x.source)
  if isinstance(x, np.memmap):
    return 0
  if isinstance(x, np.ndarray):
    return int(x.nbytes)
  return 0
