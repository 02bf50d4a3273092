"""Crop + flip augmentation (hfl.data.augment): reference values, statelessness, row locality."""

import numpy as np

from hfl import data
from hfl.data import augment


def reference_crop_flip(images, offsets, flips, pad):
  """Pixel-by-pixel: out[b, i, j] = padded[b, oy + i, ox + j'] (j' mirrored when flipped)."""
  b, h, w, c = images.shape
  out = np.empty_like(images)
  for n in range(b):
    padded = np.zeros((h + 2 * pad, w + 2 * pad, c), images.dtype)
    padded[pad:pad + h, pad:pad + w] = images[n]
    oy, ox = offsets[n]
    for i in range(h):
      for j in range(w):
        jj = w - 1 - j if flips[n] else j
        out[n, i, j] = padded[oy + i, ox + jj]
  return out


def test_crop_flip_matches_pixel_reference():
  rng = np.random.default_rng(0)
  images = rng.normal(size=(6, 5, 7, 3)).astype(np.float32)
  offsets = np.array([[0, 0], [4, 4], [8, 8], [2, 7], [8, 0], [3, 1]])
  flips = np.array([False, True, False, True, True, False])
  np.testing.assert_array_equal(augment.crop_flip(images, offsets, flips, 4),
                                reference_crop_flip(images, offsets, flips, 4))
  # Offset (pad, pad) without a flip is the identity.
  np.testing.assert_array_equal(
      augment.crop_flip(images, np.full((6, 2), 4), np.zeros(6, bool), 4), images)


def test_params_are_a_function_of_seed_step_dc_worker():
  a = augment.crop_flip_params(3, 10, 1, 2, 64)
  np.testing.assert_array_equal(a[0], augment.crop_flip_params(3, 10, 1, 2, 64)[0])
  np.testing.assert_array_equal(a[1], augment.crop_flip_params(3, 10, 1, 2, 64)[1])
  assert a[0].min() >= 0 and a[0].max() <= 8 and a[1].dtype == bool
  for other in ((4, 10, 1, 2), (3, 11, 1, 2), (3, 10, 0, 2), (3, 10, 1, 3)):
    b = augment.crop_flip_params(*other, 64)
    assert not (np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])), other


class CountingRows:
  """A row source that records which rows were read."""

  def __init__(self, arr):
    self.arr, self.shape, self.dtype, self.read = arr, arr.shape, arr.dtype, []

  def __getitem__(self, idx):
    self.read.extend(np.asarray(idx).ravel().tolist())
    return self.arr[idx]


def test_augmented_batch_rows_and_locality():
  rng = np.random.default_rng(1)
  images = rng.normal(size=(40, 6, 6, 2)).astype(np.float32)
  idx = rng.choice(40, size=(2, 3, 4), replace=False)          # [D, W, B]
  src = CountingRows(images)
  batch = augment.AugmentedBatch(src, idx, seed=7, step=5)
  full = batch[batch.index()]
  assert full.shape == (2, 3, 4, 6, 6, 2)
  for d in range(2):
    for w in range(3):
      off, flip = augment.crop_flip_params(7, 5, d, w, 4)
      np.testing.assert_array_equal(full[d, w],
                                    reference_crop_flip(images[idx[d, w]], off, flip, 4))
  # One worker's block (what a process owning only that device reads) is the same
  # and reads only that worker's rows.
  src.read.clear()
  block = batch[batch.index()[1:2, 2:3]]
  np.testing.assert_array_equal(block, full[1:2, 2:3])
  assert sorted(src.read) == sorted(idx[1, 2].tolist())


def test_batch_rows_with_augmentation(tmp_path):
  rng = np.random.default_rng(2)
  raw = rng.integers(0, 256, (16, 8, 8, 3), np.uint8)
  norm = data.fit_normaliser(raw)
  ds = data.Dataset('x', data.NormalisedRows(raw, norm), np.arange(16, dtype=np.int32) % 3,
                    data.NormalisedRows(raw[:4], norm), np.zeros(4, np.int32), 3)
  idx = np.arange(16).reshape(2, 2, 4)
  (xs, xi), (ys, yi) = data.batch_rows(ds, idx, step=3, seed=1, augment='crop_flip')
  np.testing.assert_array_equal(ys[yi], ds.train_labels[idx])
  off, flip = augment.crop_flip_params(1, 3, 1, 0, 4)
  np.testing.assert_array_equal(xs[xi][1, 0], augment.crop_flip(ds.train_images[idx[1, 0]],
                                                                off, flip))
  (xs, xi), _ = data.batch_rows(ds, idx, step=3, seed=1, augment='none')
  np.testing.assert_array_equal(xs[xi], ds.train_images[idx])
