"""Image-folder datasets: ``root/{train,test}/<class>/<image>``, from a directory or a tar.

The layout of torchvision's ``ImageFolder`` and Keras's
``image_dataset_from_directory``: one sub-directory per class inside each
split; the class names sorted (as strings) give the labels 0, 1, ...; inside a
split the images are ordered by class, then by their path. The root is a
directory or a ``.tar`` / ``.tar.gz`` / ``.tgz`` archive of one (read directly,
without extracting it; a single top-level directory wrapping ``train`` and
``test`` is allowed). Files whose extension is not an image extension
(:data:`IMAGE_EXTENSIONS`) and hidden files are skipped, as torchvision does.

Images are decoded once, with Pillow, into uint8 arrays [N, H, W, C] (C = 3
for colour images, 1 when the first training image is greyscale; every image is
converted to that mode and must have the first image's size). The arrays are
cached on disk as ``.npy`` files and memory-mapped afterwards, so a process
reads only the pages of the rows it indexes (a multi-process run reads only
its own devices' rows, :mod:`hfl.data.rows`).

Cache: ``<cache root>/image_folder/<key>/``, where ``<key>`` is the SHA-256 of
the source's content (the archive's bytes; for a directory, every image's
relative path and bytes), of Pillow's version and of this module's format
version, so a changed source is never served stale. The cache root is
``dataset.cache_dir`` if set, else ``$HFL_CACHE_DIR``, else
``$XDG_CACHE_HOME/hfl``, else ``~/.cache/hfl`` (CIFAR-10's JPEG copy: 184 MB of
uint8 arrays). Entries are written to a temporary directory and renamed into
place, so concurrent processes and interrupted runs never see half an entry;
old entries are never deleted (remove the directory to reclaim the space). An
unwritable cache root is not an error: the decoded arrays are then kept in
memory and a warning is logged.

Hashing a directory source reads every image file once per load (about 55 MB
for CIFAR-10); an archive is hashed by reading its file once.
"""

import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
from typing import NamedTuple

import numpy as np
from absl import logging

from hfl import metrics

# Bump when the cached arrays' format or the decoding changes.
CACHE_FORMAT = 1
SPLITS = ('train', 'test')
IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.gif', '.ppm', '.pgm', '.pbm',
                    '.tif', '.tiff', '.webp')
ARCHIVE_SUFFIXES = ('.tar', '.tar.gz', '.tgz')
CACHE_ENV = 'HFL_CACHE_DIR'
_GREY_MODES = ('1', 'L', 'LA', 'I', 'I;16', 'F')


class ImageFolderSplits(NamedTuple):
  """Decoded image-folder splits, before normalisation.

  Attributes:
    train_images: uint8 [N, H, W, C], read-only; an ``np.memmap`` of the cache
      file (an in-memory array when the cache could not be written).
    train_labels: int64 [N], in [0, len(classes)).
    test_images: uint8 [M, H, W, C], like train_images.
    test_labels: int64 [M].
    classes: the class names, sorted; label i is ``classes[i]``.
    cache_path: the cache entry's directory ('' when kept in memory).
  """
  train_images: np.ndarray
  train_labels: np.ndarray
  test_images: np.ndarray
  test_labels: np.ndarray
  classes: tuple
  cache_path: str


def is_archive(path: str) -> bool:
  """Whether ``path`` names a tar archive by its suffix (``.tar``, ``.tar.gz``, ``.tgz``)."""
  return os.fspath(path).lower().endswith(ARCHIVE_SUFFIXES)


def is_image_folder(path: str) -> bool:
  """Whether ``path`` is an image-folder source: an archive by name, or a
  directory with a ``train`` or ``test`` sub-directory."""
  if not path:
    return False
  path = os.path.expanduser(os.fspath(path))
  if is_archive(path):
    return True
  return os.path.isdir(path) and any(os.path.isdir(os.path.join(path, s)) for s in SPLITS)


def default_cache_root() -> str:
  """``$HFL_CACHE_DIR``, else ``$XDG_CACHE_HOME/hfl``, else ``~/.cache/hfl``."""
  env = os.environ.get(CACHE_ENV, '')
  if env:
    return os.path.expanduser(env)
  xdg = os.environ.get('XDG_CACHE_HOME', '') or os.path.join('~', '.cache')
  return os.path.join(os.path.expanduser(xdg), 'hfl')


def _is_image(name: str) -> bool:
  base = os.path.basename(name)
  return not base.startswith('.') and base.lower().endswith(IMAGE_EXTENSIONS)


def _entry(parts: list[str]):
  """(split, class, relpath) of an image path given as components below the root."""
  if len(parts) < 3 or parts[0] not in SPLITS or not _is_image(parts[-1]):
    return None
  return parts[0], parts[1], '/'.join(parts)


def _archive_files(path: str, where: str) -> dict:
  """{relpath below the root: bytes} of every image in a tar archive.

  Raises:
    ValueError: the file is not a readable tar archive.
  """
  try:
    tar = tarfile.open(path, 'r:*')
  except (tarfile.TarError, OSError, EOFError) as e:
    raise ValueError(f'{where} is not a readable tar archive ({type(e).__name__}: {e}); '
                     'expected a .tar/.tar.gz of train/<class>/<image> and '
                     'test/<class>/<image>.') from e
  files, names = {}, []
  try:
    with tar:
      for member in tar:
        parts = [p for p in member.name.split('/') if p not in ('', '.')]
        names.append(parts)
        if member.isfile() and _is_image(member.name):
          files['/'.join(parts)] = tar.extractfile(member).read()
  except (tarfile.TarError, OSError, EOFError) as e:
    raise ValueError(f'{where} is a corrupt or truncated tar archive '
                     f'({type(e).__name__}: {e}).') from e
  # One top-level directory wrapping train/ and test/ (e.g. cifar10/train/...).
  tops = {p[0] for p in names if p}
  if len(tops) == 1 and not tops & set(SPLITS):
    top = tops.pop() + '/'
    files = {k[len(top):]: v for k, v in files.items() if k.startswith(top)}
  return files


def _directory_files(path: str) -> dict:
  """{relpath below the root: absolute path} of every image under root/{train,test}."""
  files = {}
  for split in SPLITS:
    top = os.path.join(path, split)
    if not os.path.isdir(top):
      continue
    for dirpath, dirnames, filenames in os.walk(top):
      dirnames.sort()
      for f in sorted(filenames):
        full = os.path.join(dirpath, f)
        files[os.path.relpath(full, path).replace(os.sep, '/')] = full
  return files


def _index(files: dict, where: str) -> dict:
  """{split: [(class, relpath), ...] sorted} with the layout checked.

  Raises:
    ValueError: a split missing or without images, a class directory without
      images, or classes differing between train and test.
  """
  splits = {s: [] for s in SPLITS}
  for rel in files:
    e = _entry(rel.split('/'))
    if e is not None:
      splits[e[0]].append((e[1], e[2]))
  for split, entries in splits.items():
    if not entries:
      raise ValueError(
          f'{where} has no {split!r} split: expected images at {split}/<class>/<image> '
          f'(image extensions: {", ".join(IMAGE_EXTENSIONS)}).')
    entries.sort()
  classes = {s: sorted({c for c, _ in splits[s]}) for s in SPLITS}
  if classes['train'] != classes['test']:
    only_train = sorted(set(classes['train']) - set(classes['test']))
    only_test = sorted(set(classes['test']) - set(classes['train']))
    what = '; '.join(
        x for x in (f'train/{", train/".join(only_train)} without test/ counterpart'
                    if only_train else '',
                    f'test/{", test/".join(only_test)} without train/ counterpart'
                    if only_test else '') if x)
    raise ValueError(f'{where}: the classes differ between train and test ({what}); '
                     'both splits need the same class directories.')
  return splits


def _content_hash(path: str, files: dict, archive: bool) -> str:
  """SHA-256 (hex) of the source content, Pillow's version and CACHE_FORMAT."""
  import PIL  # pylint: disable=g-import-not-at-top
  h = hashlib.sha256(f'hfl-image-folder-{CACHE_FORMAT}-pillow-{PIL.__version__}\n'.encode())
  if archive:
    with open(path, 'rb') as f:
      for block in iter(lambda: f.read(1 << 20), b''):
        h.update(block)
    return h.hexdigest()
  for rel in sorted(files):
    if _entry(rel.split('/')) is None:
      continue
    with open(files[rel], 'rb') as f:
      data = f.read()
    h.update(f'{rel}\0{len(data)}\0'.encode())
    h.update(data)
  return h.hexdigest()


def _decode(data: bytes, name: str, mode: str | None, where: str) -> np.ndarray:
  """Decodes one image with Pillow to uint8 [H, W, C] in ``mode`` (None: keep colour/grey).

  Raises:
    ValueError: the bytes are not a decodable image (names the file).
  """
  from PIL import Image  # pylint: disable=g-import-not-at-top
  try:
    with Image.open(io.BytesIO(data)) as im:
      im.load()
      if mode is None:
        mode = 'L' if im.mode in _GREY_MODES else 'RGB'
      arr = np.asarray(im.convert(mode), dtype=np.uint8)
  except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
    raise ValueError(f'{where}: image {name!r} cannot be decoded ({type(e).__name__}: {e}); '
                     'replace or remove the file.') from e
  return arr if arr.ndim == 3 else arr[..., None]


def _decode_split(entries, read, shape, mode, where):
  """uint8 [len(entries), *shape] of the entries decoded in order."""
  out = np.empty((len(entries),) + shape, np.uint8)
  for i, (_, rel) in enumerate(entries):
    arr = _decode(read(rel), rel, mode, where)
    if arr.shape != shape:
      raise ValueError(f'{where}: image {rel!r} is {arr.shape[1]}x{arr.shape[0]} with '
                       f'{arr.shape[2]} channel(s); the first training image is '
                       f'{shape[1]}x{shape[0]} with {shape[2]}: every image must have one '
                       'size.')
    out[i] = arr
  return out


def _decode_all(splits: dict, read, where: str) -> dict:
  """{'train_images', 'train_labels', 'test_images', 'test_labels'} decoded arrays."""
  first_rel = splits['train'][0][1]
  first = _decode(read(first_rel), first_rel, None, where)
  mode = 'L' if first.shape[-1] == 1 else 'RGB'
  classes = sorted({c for c, _ in splits['train']})
  label_of = {c: i for i, c in enumerate(classes)}
  arrays = {}
  for split in SPLITS:
    arrays[f'{split}_images'] = _decode_split(splits[split], read, first.shape, mode, where)
    arrays[f'{split}_labels'] = np.array([label_of[c] for c, _ in splits[split]], np.int64)
  return arrays


def _write_cache(entry: str, arrays: dict, meta: dict) -> bool:
  """Writes a cache entry atomically; False (and a warning) when it cannot."""
  parent = os.path.dirname(entry)
  try:
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix='.tmp-', dir=parent)
  except OSError as e:
    logging.warning('Image-folder cache %s is not writable (%s); keeping the decoded '
                    'images in memory. Set dataset.cache_dir or $%s to a writable '
                    'directory.', parent, e, CACHE_ENV)
    return False
  try:
    for key, arr in arrays.items():
      np.save(os.path.join(tmp, key + '.npy'), arr)
    with open(os.path.join(tmp, 'meta.json'), 'w') as f:
      f.write(metrics.dumps(meta, indent=2))
    try:
      os.rename(tmp, entry)
    except OSError:
      if not os.path.isdir(entry):  # not "another process was first"
        raise
  except OSError as e:
    logging.warning('Could not write the image-folder cache %s (%s); keeping the '
                    'decoded images in memory.', entry, e)
    return False
  finally:
    if os.path.isdir(tmp):
      shutil.rmtree(tmp, ignore_errors=True)
  return True


def _read_cache(entry: str):
  """(arrays, meta) of a complete cache entry, or None."""
  try:
    with open(os.path.join(entry, 'meta.json')) as f:
      meta = json.load(f)
    arrays = {}
    if not isinstance(meta.get('classes'), list):
      raise KeyError('classes')
    for split in SPLITS:
      arrays[f'{split}_images'] = np.load(os.path.join(entry, f'{split}_images.npy'),
                                          mmap_mode='r')
      arrays[f'{split}_labels'] = np.load(os.path.join(entry, f'{split}_labels.npy'))
  except (OSError, ValueError, KeyError) as e:
    logging.warning('Ignoring the unreadable image-folder cache entry %s (%s).', entry, e)
    return None
  return arrays, meta


def load_image_folder(data_dir: str, cache_dir: str = '') -> ImageFolderSplits:
  """Reads an image-folder dataset from a directory or a tar archive, via the cache.

  Args:
    data_dir: ``dataset.data_dir``: a directory holding ``train/<class>/<image>``
      and ``test/<class>/<image>``, or a ``.tar``/``.tar.gz``/``.tgz`` archive of
      that layout.
    cache_dir: ``dataset.cache_dir`` ('' = ``$HFL_CACHE_DIR``, else
      ``$XDG_CACHE_HOME/hfl``, else ``~/.cache/hfl``).

  Returns:
    ImageFolderSplits: uint8 images [N, H, W, C] memory-mapped from the cache
    (decoded on the first load of this content), int64 labels.

  Raises:
    FileNotFoundError: ``data_dir`` does not exist.
    ValueError: not a readable archive, a split missing, classes differing
      between train and test, an undecodable image or one of another size (each
      message names ``dataset.data_dir`` and the file).
  """
  path = os.path.expanduser(os.fspath(data_dir))
  where = f'dataset.data_dir={os.fspath(data_dir)!r}'
  if not os.path.exists(path):
    raise FileNotFoundError(f'{where} does not exist: expected a directory or a '
                            '.tar/.tar.gz holding train/<class>/<image> and '
                            'test/<class>/<image>.')
  archive = os.path.isfile(path)
  if archive:  # hashed from the file alone: a cache hit never decompresses it
    files = None
    key = _content_hash(path, {}, archive=True)
  else:
    files = _directory_files(path)
    key = _content_hash(path, files, archive=False)
  entry = os.path.join(os.path.expanduser(cache_dir) if cache_dir else default_cache_root(),
                       'image_folder', key[:32])
  cached = _read_cache(entry) if os.path.isdir(entry) else None
  if cached is not None:
    arrays, meta = cached
    classes = tuple(meta['classes'])
  else:
    if archive:
      files = _archive_files(path, where)
      read = files.__getitem__
    else:
      def read(rel):
        with open(files[rel], 'rb') as f:
          return f.read()
    splits = _index(files, where)
    classes = tuple(sorted({c for c, _ in splits['train']}))
    logging.info('Decoding the image folder %s once (cache: %s).', path, entry)
    arrays = _decode_all(splits, read, where)
    meta = dict(source=os.path.abspath(path), sha256=key, classes=list(classes),
                format=CACHE_FORMAT, **{f'{s}_count': len(splits[s]) for s in SPLITS})
    written = _write_cache(entry, arrays, meta) and _read_cache(entry)
    if written:
      arrays = written[0]
    else:
      entry = ''
  return ImageFolderSplits(arrays['train_images'], arrays['train_labels'],
                           arrays['test_images'], arrays['test_labels'], classes, entry)

