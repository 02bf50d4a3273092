"""Image-folder source (hfl.data.imagefolder): layout, labels, order, cache, errors."""

import logging
import os
import tarfile
import threading

import numpy as np
import pytest
from PIL import Image

from hfl import data
from hfl.data import imagefolder
from tests.helpers import CLASSES, make_tree, png as _png, write_archive

SHARED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), '..',
                      'shared', 'data')
CIFAR = os.path.join(SHARED, 'cifar10-jpeg.tar.gz')


def write_dir(root, tree):
  for rel, arr in tree.items():
    os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
    Image.fromarray(arr).save(os.path.join(root, rel))
  return str(root)


def expected(tree, split):
  """Hand-built reference: classes sorted, then paths sorted inside each class."""
  classes = sorted(CLASSES)
  rels = sorted((r for r in tree if r.startswith(split + '/')),
                key=lambda r: (r.split('/')[1], r))
  return (np.stack([tree[r] for r in rels]),
          np.array([classes.index(r.split('/')[1]) for r in rels]))


def test_archive_labels_and_order(tmp_path):
  tree = make_tree()
  out = imagefolder.load_image_folder(write_archive(tmp_path / 'a.tar.gz', tree),
                                      str(tmp_path / 'cache'))
  assert out.classes == ('ant', 'moth', 'zebra')
  for split, images, labels in (('train', out.train_images, out.train_labels),
                                ('test', out.test_images, out.test_labels)):
    ref_x, ref_y = expected(tree, split)
    np.testing.assert_array_equal(np.asarray(images), ref_x)
    np.testing.assert_array_equal(labels, ref_y)
  assert isinstance(out.train_images, np.memmap) and out.train_images.dtype == np.uint8
  assert out.cache_path.startswith(str(tmp_path / 'cache'))


def test_directory_and_wrapped_archive_read_the_same(tmp_path):
  tree = make_tree()
  a = imagefolder.load_image_folder(write_dir(tmp_path / 'dir', tree), str(tmp_path / 'c'))
  b = imagefolder.load_image_folder(
      write_archive(tmp_path / 'w.tar', tree, prefix='cifar/'), str(tmp_path / 'c'))
  for x, y in zip(a[:5], b[:5]):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_cache_is_reused_and_invalidated_when_the_archive_changes(tmp_path, monkeypatch):
  path = str(tmp_path / 'a.tar.gz')
  cache = str(tmp_path / 'cache')
  write_archive(path, make_tree(seed=0))
  first = imagefolder.load_image_folder(path, cache)
  # A second load of the same content decodes nothing (and opens no tar).
  real_decode = imagefolder._decode
  monkeypatch.setattr(imagefolder, '_decode', lambda *a: pytest.fail('decoded again'))
  again = imagefolder.load_image_folder(path, cache)
  assert again.cache_path == first.cache_path
  np.testing.assert_array_equal(np.asarray(again.train_images), np.asarray(first.train_images))
  monkeypatch.setattr(imagefolder, '_decode', real_decode)
  # Same path, new content: a new entry with the new pixels, never the stale ones.
  tree2 = make_tree(seed=1)
  write_archive(path, tree2)
  changed = imagefolder.load_image_folder(path, cache)
  assert changed.cache_path != first.cache_path
  np.testing.assert_array_equal(np.asarray(changed.train_images), expected(tree2, 'train')[0])


def test_directory_cache_invalidated_when_an_image_changes(tmp_path):
  tree = make_tree()
  root = write_dir(tmp_path / 'dir', tree)
  first = imagefolder.load_image_folder(root, str(tmp_path / 'c'))
  rel = 'test/moth/img01.png'
  tree[rel] = 255 - tree[rel]
  Image.fromarray(tree[rel]).save(os.path.join(root, rel))
  second = imagefolder.load_image_folder(root, str(tmp_path / 'c'))
  assert second.cache_path != first.cache_path
  np.testing.assert_array_equal(np.asarray(second.test_images), expected(tree, 'test')[0])


def _damaged_entry(tmp_path, archive: str, damaged_file: str):
  """(tree, archive path, cache root, entry): an archive loaded once, then one file of
  its cache entry truncated to half its size."""
  tree = make_tree()
  path = write_archive(tmp_path / archive, tree)
  cache = str(tmp_path / 'c')
  entry = imagefolder.load_image_folder(path, cache).cache_path
  damaged = os.path.join(entry, damaged_file)
  with open(damaged, 'r+b') as f:
    f.truncate(os.path.getsize(damaged) // 2)
  return tree, path, cache, entry


def test_damaged_cache_entry_is_replaced_and_moved_aside(tmp_path, monkeypatch, caplog):
  tree, path, cache, entry = _damaged_entry(tmp_path, 'a.tar.gz', 'train_images.npy')
  with caplog.at_level(logging.WARNING):
    repaired = imagefolder.load_image_folder(path, cache)
  warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
  assert len(warnings) == 1, warnings
  assert 'was unreadable (ValueError: mmap length' in warnings[0]
  assert f'moved to {entry}.damaged-1' in warnings[0]
  assert repaired.cache_path == entry
  # The damaged copy is kept (truncated), never deleted.
  aside = os.path.join(f'{entry}.damaged-1', 'train_images.npy')
  assert os.path.getsize(aside) < os.path.getsize(os.path.join(entry, 'train_images.npy'))
  # The next load reads the repaired entry: no decode, the original pixels.
  monkeypatch.setattr(imagefolder, '_decode', lambda *a: pytest.fail('decoded again'))
  again = imagefolder.load_image_folder(path, cache)
  assert isinstance(again.train_images, np.memmap)
  for split, images, labels in (('train', again.train_images, again.train_labels),
                                ('test', again.test_images, again.test_labels)):
    np.testing.assert_array_equal(np.asarray(images), expected(tree, split)[0])
    np.testing.assert_array_equal(labels, expected(tree, split)[1])


def test_damaged_entry_repaired_by_two_processes_at_once(tmp_path, monkeypatch, caplog):
  tree, path, cache, entry = _damaged_entry(tmp_path, 'a.tar', 'test_labels.npy')
  # Both loaders have decoded and found the damage before either writes.
  barrier = threading.Barrier(2, timeout=30)
  real_write = imagefolder._write_cache

  def write(*args):
    barrier.wait()
    return real_write(*args)

  monkeypatch.setattr(imagefolder, '_write_cache', write)
  results, errors = [], []

  def load():
    try:
      results.append(imagefolder.load_image_folder(path, cache))
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)

  threads = [threading.Thread(target=load) for _ in range(2)]
  with caplog.at_level(logging.WARNING):
    for t in threads:
      t.start()
    for t in threads:
      t.join(60)
  assert not errors and len(results) == 2
  assert caplog.text.count(f'moved to {entry}.damaged-1') == 1, caplog.text
  assert caplog.text.count('another process has already replaced it') == 1, caplog.text
  for out in results:
    assert out.cache_path == entry
    np.testing.assert_array_equal(np.asarray(out.test_images), expected(tree, 'test')[0])
    np.testing.assert_array_equal(out.test_labels, expected(tree, 'test')[1])
  # Repaired once: one damaged copy moved aside, not the repaired entry a second time.
  assert os.path.isdir(f'{entry}.damaged-1') and not os.path.exists(f'{entry}.damaged-2')


def test_entry_repaired_meanwhile_is_kept(tmp_path, caplog):
  path = write_archive(tmp_path / 'a.tar', make_tree())
  out = imagefolder.load_image_folder(path, str(tmp_path / 'c'))
  arrays = {k: np.asarray(getattr(out, k)) for k in
            ('train_images', 'train_labels', 'test_images', 'test_labels')}
  meta_before = open(os.path.join(out.cache_path, 'meta.json')).read()
  with caplog.at_level(logging.WARNING):
    assert imagefolder._write_cache(out.cache_path, arrays, {'classes': []}, damaged='x')
  assert 'another process has already replaced it' in caplog.text
  assert open(os.path.join(out.cache_path, 'meta.json')).read() == meta_before
  assert not os.path.exists(out.cache_path + '.damaged-1')
  assert [p for p in os.listdir(tmp_path / 'c' / 'image_folder') if p.startswith('.tmp')] == []


def test_one_greyscale_image_among_colour_ones_is_converted_to_rgb(tmp_path, caplog):
  tree = make_tree()
  grey = np.random.default_rng(3).integers(0, 256, (5, 4), np.uint8)
  tree['train/moth/img02.png'] = grey  # png() of a 2-D array is a mode 'L' file
  path = write_archive(tmp_path / 'a.tar', tree)
  with caplog.at_level(logging.WARNING):
    out = imagefolder.load_image_folder(path, str(tmp_path / 'c'))
  assert out.train_images.shape == (9, 5, 4, 3) and out.test_images.shape == (5, 5, 4, 3)
  assert "1 of 14 images are greyscale among colour ones (e.g. 'train/moth/img02.png')" in (
      caplog.text)
  tree['train/moth/img02.png'] = np.repeat(grey[..., None], 3, axis=-1)
  np.testing.assert_array_equal(np.asarray(out.train_images), expected(tree, 'train')[0])


def test_all_greyscale_images_stay_one_channel(tmp_path):
  tree = {k: v[..., 0] for k, v in make_tree().items()}
  out = imagefolder.load_image_folder(write_archive(tmp_path / 'a.tar', tree),
                                      str(tmp_path / 'c'))
  assert out.train_images.shape == (9, 5, 4, 1)
  np.testing.assert_array_equal(np.asarray(out.test_images)[..., 0], expected(tree, 'test')[0])


def test_single_class_is_refused(tmp_path):
  tree = make_tree(classes={'cat': (2, 1)})
  path = write_archive(tmp_path / 'a.tar', tree)
  with pytest.raises(ValueError, match=r"dataset\.data_dir=.*a\.tar' has a single class, "
                                       r"'cat' \(train/cat, test/cat\).*at least 2"):
    imagefolder.load_image_folder(path, str(tmp_path / 'c'))
  assert not os.path.exists(tmp_path / 'c')  # refused before decoding or caching


def test_unwritable_cache_keeps_arrays_in_memory(tmp_path):
  blocker = tmp_path / 'file'
  blocker.write_text('not a directory')
  tree = make_tree()
  out = imagefolder.load_image_folder(write_archive(tmp_path / 'a.tar', tree), str(blocker))
  assert out.cache_path == ''
  np.testing.assert_array_equal(out.train_images, expected(tree, 'train')[0])


def test_corrupt_image_names_the_file_and_field(tmp_path):
  path = write_archive(tmp_path / 'a.tar.gz', make_tree(),
                       extra=[('train/moth/broken.jpg', b'\xff\xd8not a jpeg')])
  with pytest.raises(ValueError, match=r"dataset\.data_dir=.*'train/moth/broken\.jpg'"):
    imagefolder.load_image_folder(path, str(tmp_path / 'c'))


def test_truncated_png_names_the_file(tmp_path):
  full = _png(np.random.default_rng(0).integers(0, 256, (5, 4, 3), np.uint8))
  bad = full[:len(full) // 2]
  path = write_archive(tmp_path / 'a.tar', make_tree(), extra=[('test/ant/cut.png', bad)])
  with pytest.raises(ValueError, match=r"'test/ant/cut\.png' cannot be decoded"):
    imagefolder.load_image_folder(path, str(tmp_path / 'c'))


def test_image_of_another_size_names_the_file(tmp_path):
  odd = {'train/moth/zz.png': np.zeros((7, 4, 3), np.uint8)}
  path = write_archive(tmp_path / 'a.tar', {**make_tree(), **odd})
  with pytest.raises(ValueError,
                     match=r"'train/moth/zz\.png' is 4x7 .* first training image is 4x5"):
    imagefolder.load_image_folder(path, str(tmp_path / 'c'))


def test_missing_split_names_the_split_and_field(tmp_path):
  tree = {k: v for k, v in make_tree().items() if k.startswith('train/')}
  path = write_archive(tmp_path / 'a.tar.gz', tree)
  with pytest.raises(ValueError, match=r"dataset\.data_dir=.* has no 'test' split"):
    imagefolder.load_image_folder(path, str(tmp_path / 'c'))


def test_classes_differing_between_splits_are_named(tmp_path):
  tree = make_tree()
  tree['test/beetle/img00.png'] = tree.pop('test/ant/img00.png')
  path = write_archive(tmp_path / 'a.tar.gz', tree)
  with pytest.raises(ValueError, match=r'train/ant without test/.*test/beetle without train/'):
    imagefolder.load_image_folder(path, str(tmp_path / 'c'))


def test_not_an_archive_and_missing_path(tmp_path):
  fake = tmp_path / 'x.tar.gz'
  fake.write_bytes(b'definitely not gzip')
  with pytest.raises(ValueError, match='dataset.data_dir=.*not a readable tar'):
    imagefolder.load_image_folder(str(fake), str(tmp_path / 'c'))
  with pytest.raises(FileNotFoundError, match='dataset.data_dir=.*does not exist'):
    imagefolder.load_image_folder(str(tmp_path / 'nope.tar'), str(tmp_path / 'c'))


def test_skips_hidden_and_non_image_files(tmp_path):
  tree = make_tree()
  path = write_archive(tmp_path / 'a.tar', tree,
                       extra=[('train/ant/.DS_Store', b'junk'), ('README.txt', b'hi'),
                              ('train/ant/notes.txt', b'x')])
  out = imagefolder.load_image_folder(path, str(tmp_path / 'c'))
  assert len(out.train_labels) == sum(n for n, _ in CLASSES.values())


def test_load_dispatches_image_folders_by_data_dir(tmp_path):
  tree = make_tree()
  path = write_archive(tmp_path / 'a.tar.gz', tree)
  ds = data.load('anything', path, cache_dir=str(tmp_path / 'c'))
  assert data.source_kind('anything', path) == 'image_folder'
  assert ds.num_classes == 3 and ds.task == 'classification'
  assert ds.train_images.shape == (9, 5, 4, 3)
  raw = expected(tree, 'train')[0]
  np.testing.assert_allclose(ds.train_images[:], data.normalise(raw, raw)[0])
  not_tar = tmp_path / 'data.bin'
  not_tar.write_bytes(b'x')
  with pytest.raises(ValueError, match='dataset.data_dir=.*is a file but not a tar archive'):
    data.load('cifar10', str(not_tar))


@pytest.mark.skipif(not os.path.exists(CIFAR), reason=f'{CIFAR} absent (no ../shared/data)')
def test_real_cifar10_jpeg_archive(tmp_path):
  ds = data.load('cifar10', CIFAR, cache_dir=str(tmp_path))
  assert ds.train_images.shape == (50000, 32, 32, 3)
  assert ds.test_images.shape == (10000, 32, 32, 3)
  np.testing.assert_array_equal(np.bincount(ds.train_labels), [5000] * 10)
  np.testing.assert_array_equal(np.bincount(ds.test_labels), [1000] * 10)
  # Label 1 is 'automobile' (sorted names); its first test image decodes like Pillow's.
  with tarfile.open(CIFAR) as tar:
    ref = np.asarray(Image.open(tar.extractfile('test/automobile/0000.jpg')).convert('RGB'))
  np.testing.assert_array_equal(ds.test_images.raw[1000], ref)
  assert ds.test_labels[1000] == 1 and ds.test_labels[999] == 0
