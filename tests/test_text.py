"""Text source (hfl.data.text): split, vocabulary, windows, partitions, by hand."""

import os

import numpy as np
import pytest

from hfl import data
from hfl.data import text

SHAKESPEARE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), '..',
                           'shared', 'data', 'tinyshakespeare.txt')


def test_split_and_vocabulary_by_hand():
  # 20 characters: train = the first int(20 * 0.9) = 18, validation = the last 2, 'bz'.
  corpus = 'abcabcabcabcabcabcbz'
  s = text.encode(corpus)
  assert s.vocabulary == 'abc'                      # sorted training characters
  np.testing.assert_array_equal(s.train_tokens, [0, 1, 2] * 6)
  np.testing.assert_array_equal(s.val_tokens, [1, 3])  # 'z' unseen in training -> id 3
  assert s.num_tokens == 4
  assert text.encode('abab' * 5).num_tokens == 2       # no unseen character: no extra id


def test_train_windows_by_hand():
  tokens = np.arange(10, dtype=np.int32) * 10          # 0, 10, ..., 90
  x, y = text.train_windows(tokens, 3)
  assert x.shape == y.shape == (7, 3)                  # starts 0..6: s + 3 <= 9
  np.testing.assert_array_equal(x[0], [0, 10, 20])
  np.testing.assert_array_equal(y[0], [10, 20, 30])
  np.testing.assert_array_equal(x[6], [60, 70, 80])
  np.testing.assert_array_equal(y[6], [70, 80, 90])
  idx = np.array([[[4, 1]], [[6, 0]]])                 # [D=2, W=1, B=2]
  got = x[idx]
  assert got.shape == (2, 1, 2, 3) and got.dtype == np.int32
  np.testing.assert_array_equal(got[1, 0, 0], [60, 70, 80])
  with pytest.raises(ValueError, match='model.seq_len=10'):
    text.train_windows(tokens, 10)


def test_eval_windows_cover_validation_once():
  tokens = np.arange(11, dtype=np.int32)
  x, y = text.eval_windows(tokens, 3)                  # (11 - 1) // 3 = 3 windows
  np.testing.assert_array_equal(x, [[0, 1, 2], [3, 4, 5], [6, 7, 8]])
  np.testing.assert_array_equal(y, [[1, 2, 3], [4, 5, 6], [7, 8, 9]])
  with pytest.raises(ValueError, match='model.seq_len=11'):
    text.eval_windows(tokens, 11)


def test_contiguous_partition_by_hand():
  # 20 training characters, T = 2, D = 2, W = 2: regions of 5 characters
  # [0..4], [5..9], [10..14], [15..19]; starts s with s + 2 <= region end.
  p = text.partition_windows(20, 2, 2, 2, 'contiguous', seed=0)
  got = [[s.tolist() for s in dc] for dc in p.worker_indices]
  assert got == [[[0, 1, 2], [5, 6, 7]], [[10, 11, 12], [15, 16, 17]]]
  np.testing.assert_array_equal(p.worker_sizes, [[3, 3], [3, 3]])
  np.testing.assert_array_equal(p.dc_sizes, [6, 6])
  with pytest.raises(ValueError, match=r"contiguous.*model.seq_len \+ 1 = 6"):
    text.partition_windows(20, 5, 2, 2, 'contiguous', seed=0)


def test_iid_partition_covers_every_window_once():
  p = text.partition_windows(103, 3, 2, 4, 'iid', seed=5)
  allw = np.concatenate([s for dc in p.worker_indices for s in dc])
  np.testing.assert_array_equal(np.sort(allw), np.arange(100))
  assert p.worker_sizes.min() >= 12 and p.worker_sizes.max() <= 13
  # Seeded: the same seed gives the same split, another seed another.
  same = text.partition_windows(103, 3, 2, 4, 'iid', seed=5)
  other = text.partition_windows(103, 3, 2, 4, 'iid', seed=6)
  assert all(np.array_equal(a, b) for a, b in zip(p.worker_indices[0], same.worker_indices[0]))
  assert not np.array_equal(p.worker_indices[0][0], other.worker_indices[0][0])
  with pytest.raises(ValueError, match="dataset.partition='dirichlet'"):
    text.partition_windows(103, 3, 2, 4, 'dirichlet', seed=0)


def test_load_text_dataset(tmp_path):
  path = tmp_path / 'corpus.txt'
  corpus = 'to be or not to be, that is the question. ' * 5
  path.write_text(corpus)
  ds = data.load('text', str(path), seq_len=4)
  n_train = int(len(corpus) * 0.9)
  assert ds.task == 'language_model' and ds.vocabulary == ''.join(sorted(set(corpus[:n_train])))
  assert ds.train_images.shape == (n_train - 4, 4)
  decode = lambda ids: ''.join(ds.vocabulary[i] for i in ids)
  assert decode(ds.train_images[7]) == corpus[7:11]
  assert decode(ds.train_labels[7]) == corpus[8:12]
  val = corpus[n_train:]
  assert ds.test_images.shape == ((len(val) - 1) // 4, 4)
  assert decode(ds.test_labels[-1]) == val[4 * len(ds.test_labels) - 3:4 * len(ds.test_labels) + 1]
  (xs, xi), (ys, yi) = data.batch_rows(ds, np.array([[[3, 5]]]), 0, 0)
  np.testing.assert_array_equal(xs[xi][0, 0, 1], ds.train_images[5])
  np.testing.assert_array_equal(ys[yi][0, 0, 1], ds.train_labels[5])
  with pytest.raises(ValueError, match='model.seq_len=None'):
    data.load('text', str(path))
  with pytest.raises(ValueError, match="dataset.augment='crop_flip' needs images"):
    data.batch_rows(ds, np.array([[[3]]]), 0, 0, 'crop_flip')


def test_text_file_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match='dataset.data_dir'):
    data.load('text', str(tmp_path / 'missing.txt'), seq_len=4)
  with pytest.raises(ValueError, match='is a directory'):
    data.load('text', str(tmp_path), seq_len=4)
  bad = tmp_path / 'latin1.txt'
  bad.write_bytes('caf\xe9'.encode('latin-1'))
  with pytest.raises(ValueError, match='not UTF-8'):
    data.load('text', str(bad), seq_len=1)


@pytest.mark.skipif(not os.path.exists(SHAKESPEARE),
                    reason=f'{SHAKESPEARE} absent (no ../shared/data)')
def test_real_tiny_shakespeare():
  ds = data.load('tiny_shakespeare', SHAKESPEARE, seq_len=64)
  assert len(ds.vocabulary) == ds.num_classes == 65   # every character occurs in training
  assert len(ds.train_images.tokens) == 1_003_854      # int(1,115,394 * 0.9)
  assert ''.join(ds.vocabulary[i] for i in ds.train_images[0][:14]) == 'First Citizen:'
  assert ds.test_images.shape == ((1_115_394 - 1_003_854 - 1) // 64, 64)
