"""Character-level language-modelling data from a plain-text file.

The text (UTF-8) is split by position: the first 90% of its characters train,
the last 10% validate (the usual split of Tiny Shakespeare, Karpathy's char-rnn
and nanoGPT). The vocabulary is the sorted set of characters of the training
split; a validation character the training split lacks maps to one extra id,
``len(vocabulary)`` (an "unknown" token the model never sees in training).

Training samples are windows of ``seq_len + 1`` consecutive characters: sample
``s`` (a start position) has inputs ``tokens[s : s + T]`` and targets
``tokens[s + 1 : s + T + 1]`` (T = ``seq_len``), for every start
``0 <= s < n_train - T``. The validation set is cut into consecutive,
non-overlapping windows: window j has inputs ``val[jT : jT + T]`` and targets
``val[jT + 1 : jT + T + 1]``, for j < (n_val - 1) // T; every validation
character but the first and the last < T is predicted exactly once.

Partitions of the training windows across DCs and workers
(``dataset.partition``):

* ``'iid'``: the start positions shuffled (seeded) and split evenly, first
  across DCs, then across each DC's workers (:func:`hfl.data.partition.partition`
  with ``'iid'``): every worker reads random windows of the whole text.
* ``'contiguous'``: the training text is cut into D contiguous regions of
  (nearly) equal length, each region into W contiguous sub-regions; worker (d, w)
  owns the windows lying entirely inside its sub-region (each boundary loses T
  start positions). Plays and speakers differ between regions: a natural
  non-IID split.
"""

import os
from typing import NamedTuple

import numpy as np

from hfl.data import rows as rows_lib
from hfl.data.partition import partition as label_partition
from hfl.data.partition import Partition

TRAIN_FRACTION = 0.9
TEXT_PARTITIONS = ('iid', 'contiguous')


class TokenWindows(rows_lib.RowArray):
  """Windows of a token array as rows: row i is ``tokens[i + offset : i + offset + length]``.

  Indexing (first axis, numpy semantics: int, slice, integer array of any shape,
  1-D boolean mask) builds only the rows asked for.

  Attributes:
    tokens: int32 [n], the token ids.
    length: T, tokens per row.
    offset: 0 for inputs, 1 for next-token targets.
    stride: distance between the starts of consecutive rows (1: every start
      position; T: non-overlapping windows).
    shape: [N, T].
    dtype: int32.
  """

  def __init__(self, tokens: np.ndarray, length: int, offset: int, count: int,
               stride: int = 1):
    last = (count - 1) * stride + offset + length
    if count < 1 or last > len(tokens):
      raise ValueError(f'TokenWindows: {count} windows of {length} tokens (offset {offset}, '
                       f'stride {stride}) need {last} tokens; have {len(tokens)}.')
    self.tokens = tokens
    self.length, self.offset, self.stride = int(length), int(offset), int(stride)
    self.shape = (int(count), int(length))
    self.dtype = np.dtype(np.int32)

  def __repr__(self) -> str:
    return (f'TokenWindows(shape={self.shape}, offset={self.offset}, '
            f'stride={self.stride})')

  def __getitem__(self, key) -> np.ndarray:
    """Rows ``[key]``: int32 array ``row_index(key, N).shape + (T,)``."""
    rows = rows_lib.row_index(key, self.shape[0])
    start = rows * self.stride + self.offset
    return self.tokens[start[..., None] + np.arange(self.length)].astype(np.int32, copy=False)

  def __array__(self, dtype=None, copy=None) -> np.ndarray:
    out = self[slice(None)]
    return out if dtype is None else out.astype(dtype, copy=False)


class TextSplits(NamedTuple):
  """A character-level text corpus, encoded.

  Attributes:
    vocabulary: the training split's characters, sorted; id i is
      ``vocabulary[i]`` (id ``len(vocabulary)``, when ``num_tokens`` is one more,
      stands for validation characters unseen in training).
    num_tokens: the model's vocabulary size V (logits per position).
    train_tokens: int32 [n_train], the first 90% of the text.
    val_tokens: int32 [n_val], the rest.
  """
  vocabulary: str
  num_tokens: int
  train_tokens: np.ndarray
  val_tokens: np.ndarray


def encode(text: str, train_fraction: float = TRAIN_FRACTION) -> TextSplits:
  """Splits ``text`` by position and encodes it with the training characters.

  Args:
    text: the corpus.
    train_fraction: share of characters (from the start) that train;
      ``n_train = int(len(text) * train_fraction)``.

  Returns:
    TextSplits (int32 token arrays).
  """
  n_train = int(len(text) * train_fraction)
  vocabulary = ''.join(sorted(set(text[:n_train])))
  lut = {c: i for i, c in enumerate(vocabulary)}
  unknown = len(vocabulary)
  codes = np.fromiter((lut.get(c, unknown) for c in text), np.int32, count=len(text))
  num_tokens = unknown + int(bool(np.any(codes[n_train:] == unknown)))
  return TextSplits(vocabulary, num_tokens, codes[:n_train], codes[n_train:])


def read_text(path: str) -> str:
  """The UTF-8 text of ``path`` (``dataset.data_dir``).

  Raises:
    FileNotFoundError: no such file (names the field).
    ValueError: a directory, not UTF-8, or empty.
  """
  where = f'dataset.data_dir={os.fspath(path)!r}'
  full = os.path.expanduser(os.fspath(path))
  if not full:
    raise FileNotFoundError('dataset.data_dir is empty: point it at a plain-text (UTF-8) file '
                            'for a text dataset.')
  if os.path.isdir(full):
    raise ValueError(f'{where} is a directory; a text dataset reads one plain-text (UTF-8) '
                     'file.')
  try:
    with open(full, 'rb') as f:
      raw = f.read()
  except OSError as e:
    raise FileNotFoundError(f'{where} cannot be read ({e}); point it at a plain-text (UTF-8) '
                            'file.') from e
  try:
    text = raw.decode('utf-8')
  except UnicodeDecodeError as e:
    raise ValueError(f'{where} is not UTF-8 text ({e}).') from e
  if not text:
    raise ValueError(f'{where} is empty.')
  return text


def train_windows(tokens: np.ndarray, seq_len: int) -> tuple[TokenWindows, TokenWindows]:
  """(inputs, targets) row sources [n - T, T] of every training window start.

  Raises:
    ValueError: the training text is not longer than ``seq_len`` (names the fields).
  """
  count = len(tokens) - seq_len
  if count < 1:
    raise ValueError(f'model.seq_len={seq_len} needs a training text longer than {seq_len} '
                     f'characters; the training split (90%) has {len(tokens)}.')
  return (TokenWindows(tokens, seq_len, 0, count),
          TokenWindows(tokens, seq_len, 1, count))


def eval_windows(tokens: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
  """(inputs, targets) int32 [(n - 1) // T, T], non-overlapping validation windows.

  Raises:
    ValueError: fewer than T + 1 validation characters (names the fields).
  """
  count = (len(tokens) - 1) // seq_len
  if count < 1:
    raise ValueError(f'model.seq_len={seq_len} needs more than {seq_len} validation '
                     f'characters (the last 10% of dataset.data_dir); there are {len(tokens)}.')
  return (np.asarray(TokenWindows(tokens, seq_len, 0, count, stride=seq_len)),
          np.asarray(TokenWindows(tokens, seq_len, 1, count, stride=seq_len)))


def partition_windows(n_text: int, seq_len: int, num_dcs: int, workers_per_dc: int,
                      method: str, seed: int) -> Partition:
  """Splits the training windows (start positions) across DCs and workers.

  Args:
    n_text: characters of the training split (windows: starts 0 .. n_text - T - 1).
    seq_len: T.
    num_dcs: D.
    workers_per_dc: W.
    method: ``'iid'`` or ``'contiguous'`` (module docstring).
    seed: seed of the ``'iid'`` shuffle (``'contiguous'`` uses none).

  Returns:
    A Partition of the window starts (sorted int64 per worker).

  Raises:
    ValueError: unknown method (names ``dataset.partition``), or a region too
      short for one window (names ``model.seq_len`` and the mesh fields).
  """
  if method not in TEXT_PARTITIONS:
    raise ValueError(f'dataset.partition={method!r} is not supported for text; allowed: '
                     f'{", ".join(TEXT_PARTITIONS)}.')
  count = n_text - seq_len
  if method == 'iid':
    return label_partition(np.zeros(max(count, 0), np.int64), num_dcs, workers_per_dc,
                           'iid', 1.0, seed)
  bounds = [np.array_split(r, workers_per_dc)
            for r in np.array_split(np.arange(n_text), num_dcs)]
  shards = []
  for d, dc in enumerate(bounds):
    row = []
    for w, region in enumerate(dc):
      if len(region) < seq_len + 1:
        raise ValueError(
            f"dataset.partition='contiguous': worker (dc={d}, worker={w}) gets "
            f'{len(region)} characters of text, fewer than one window of model.seq_len + 1 '
            f'= {seq_len + 1}; use fewer DCs/workers (mesh.num_dcs={num_dcs}, '
            f'mesh.workers_per_dc={workers_per_dc}) or a shorter model.seq_len.')
      row.append(np.arange(region[0], region[-1] - seq_len + 1, dtype=np.int64))
    shards.append(tuple(row))
  sizes = np.array([[len(s) for s in dc] for dc in shards], np.int64)
  return Partition(tuple(shards), sizes.sum(axis=1), sizes)
