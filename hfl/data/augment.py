"""Stateless training-image augmentation: random crop with zero padding, horizontal flip.

The standard CIFAR-10 augmentation (He et al., CVPR 2016, Sec. 4.2: "4 pixels
are padded on each side, and a 32x32 crop is randomly sampled from the padded
image or its horizontal flip"). It runs on the host, on the standardised
float32 rows of the batch, so the padding value 0 is the training set's
per-channel mean.

Stateless: the crop offsets and flips of worker (d, w) at step s are drawn from
``np.random.default_rng([seed, s, d, w, TAG])``, so a resumed run sees bitwise
the same augmented batches as an uninterrupted one, with no state to save, and
each process draws only those of its own workers' rows.
"""

import numpy as np

from hfl.data import rows as rows_lib

AUGMENTATIONS = ('none', 'crop_flip')
PAD = 4            # pixels of zero padding on each side before the random crop
TAG = 0x617567     # separates these streams from the sampler's ([seed, d, w, epoch])


def crop_flip_params(seed: int, step: int, dc: int, worker: int, batch: int,
                     pad: int = PAD) -> tuple[np.ndarray, np.ndarray]:
  """Crop offsets and flips of worker (dc, worker)'s batch at ``step``.

  Returns:
    (offsets int64 [B, 2] in [0, 2 * pad] (row, column of the crop's corner in
    the padded image), flips bool [B]).
  """
  rng = np.random.default_rng([seed, step, dc, worker, TAG])
  return rng.integers(0, 2 * pad + 1, size=(batch, 2)), rng.random(batch) < 0.5


def crop_flip(images: np.ndarray, offsets: np.ndarray, flips: np.ndarray,
              pad: int = PAD) -> np.ndarray:
  """Crops each image from its zero-padded copy at ``offsets``, flipped where ``flips``.

  Args:
    images: [B, H, W, C].
    offsets: int [B, 2], each in [0, 2 * pad].
    flips: bool [B]: mirror the crop left-right.
    pad: zero pixels added on each side.

  Returns:
    array [B, H, W, C] of ``images.dtype``: out[b, i, j] =
    padded[b, oy + i, ox + j'] with j' = W - 1 - j when flipped, else j.
  """
  b, h, w = images.shape[:3]
  padded = np.pad(images, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
  cols = np.where(flips[:, None], np.arange(w)[::-1], np.arange(w))      # [B, W]
  ys = offsets[:, 0, None] + np.arange(h)                                 # [B, H]
  xs = offsets[:, 1, None] + cols                                         # [B, W]
  return padded[np.arange(b)[:, None, None], ys[:, :, None], xs[:, None, :]]


class AugmentedBatch(rows_lib.RowArray):
  """One step's training batch ``source[idx]``, augmented, as a row source.

  Row k (k in [0, D * W * B)) is sample ``idx.flat[k]`` of ``source``, cropped
  and flipped with the parameters drawn for its worker (:func:`crop_flip_params`).
  Index it with ``np.arange(D * W * B).reshape(D, W, B)`` (or any block of
  that), e.g. through :func:`hfl.distributed.put_rows`: only the rows asked for
  are read, converted and augmented.

  Attributes:
    source: training images [N, H, W, C] (e.g. a NormalisedRows).
    idx: int [D, W, B], the step's sample indices (hfl.data.batch_indices).
    shape: [D * W * B, H, W, C].
    dtype: the source's.
  """

  def __init__(self, source, idx: np.ndarray, seed: int, step: int, pad: int = PAD):
    self.source = source
    self.idx = np.asarray(idx)
    d, w, b = self.idx.shape
    params = [[crop_flip_params(seed, step, i, j, b, pad) for j in range(w)] for i in range(d)]
    self.offsets = np.stack([[p[0] for p in row] for row in params]).reshape(-1, 2)
    self.flips = np.stack([[p[1] for p in row] for row in params]).reshape(-1)
    self.pad = pad
    self.shape = (self.idx.size,) + tuple(source.shape[1:])
    self.dtype = np.dtype(source.dtype)

  def index(self) -> np.ndarray:
    """int64 [D, W, B]: the row numbers of the whole batch, to index this source with."""
    return np.arange(self.idx.size).reshape(self.idx.shape)

  def __getitem__(self, key) -> np.ndarray:
    rows = rows_lib.row_index(key, self.shape[0])
    flat = rows.reshape(-1)
    images = np.asarray(self.source[self.idx.reshape(-1)[flat]])
    out = crop_flip(images, self.offsets[flat], self.flips[flat], self.pad)
    return out.reshape(rows.shape + self.shape[1:])
