"""Image-folder datasets: ``root/{train,test}/<class>/<image>``, from a directory or a tar.

The layout of torchvision's ``ImageFolder`` and Keras's
``image_dataset_from_directory``: one sub-directory per class inside each
split; the class names sorted (as strings) give the labels 0, 1, ...; inside a
split the images are ordered by class, then by their path. The root is a
directory or a ``.tar`` / ``.tar.gz`` / ``.tgz`` archive of one (read directly,
without extracting it; a single top-level directory wrapping ``train`` and
``test`` is allowed). Files whose extension is not an image extension
(:data:`IMAGE_EXTENSIONS`) and hidden files are skipped, as torchvision does.

Images are decoded once, with Pillow, into uint8 arrays [N, H, W, C]. A colour
dataset stays colour: C = 3 when any image (of either split) is colour, and the
greyscale images among them are converted to RGB, their grey value replicated over
the three channels as torchvision's loader does (a warning gives the count and one
file); C = 1 only when every image is greyscale. Every image must have the first
training image's size, and at least two classes are required. The arrays are
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
unreadable entry (e.g. a truncated file) is decoded again and repaired once: the
new entry is written to a temporary directory, the damaged one is moved aside to
``<key>.damaged-<n>`` (nothing is deleted; remove it once inspected) and the new
one renamed into place, under the lock file ``<key>.lock`` so that processes
repairing the same entry at once neither fail nor move a repaired entry aside; one
warning says what was found and done. An unwritable cache root is not an error:
the decoded arrays are then kept in memory and a warning is logged.

Hashing a directory source reads every image file once per load (about 55 MB
for CIFAR-10); an archive is hashed by reading its file once.
"""

import fcntl
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
CACHE_FORMAT = 2  # 2: mixed grey/colour folders decode to RGB
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
      images, classes differing between train and test, or fewer than 2 classes.
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
  if len(classes['train']) < 2:
    (only,) = classes['train']
    raise ValueError(f'{where} has a single class, {only!r} (train/{only}, test/{only}): '
                     'a classifier needs at least 2 class directories in each split.')
  return splits


def _content_hash(path: str, files: dict, archive: bool) -> str:
  """SHA-256 (hex) of the source content, Pillow's version and CACHE_FORMAT."""
  import PIL  # lazy: PIL  pylint: disable=g-import-not-at-top
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


def _with_image(data: bytes, name: str, where: str, use):
  """``use(image)`` of the image opened with Pillow (lazily: ``use`` decodes if needed).

  Raises:
    ValueError: the bytes are not a decodable image (names the file).
  """
  from PIL import Image  # lazy: PIL  pylint: disable=g-import-not-at-top
  try:
    with Image.open(io.BytesIO(data)) as im:
      return use(im)
  except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
    raise ValueError(f'{where}: image {name!r} cannot be decoded ({type(e).__name__}: {e}); '
                     'replace or remove the file.') from e


def _decode(data: bytes, name: str, mode: str, where: str) -> np.ndarray:
  """Decodes one image with Pillow to uint8 [H, W, C] in ``mode`` ('L': C = 1, 'RGB': 3).

  Raises:
    ValueError: the bytes are not a decodable image (names the file).
  """
  arr = _with_image(data, name, where, lambda im: np.asarray(im.convert(mode), np.uint8))
  return arr if arr.ndim == 3 else arr[..., None]


def _common_mode(splits: dict, read, where: str) -> str:
  """'RGB' when any image is colour (logging how many greyscale ones are converted),
  'L' when all are greyscale; decodes only the images' headers.

  Raises:
    ValueError: an image whose header cannot be read (names the file).
  """
  grey = [rel for s in SPLITS for _, rel in splits[s]
          if _with_image(read(rel), rel, where, lambda im: im.mode) in _GREY_MODES]
  total = sum(len(splits[s]) for s in SPLITS)
  if len(grey) == total:
    return 'L'
  if grey:
    logging.warning('%s: %d of %d images are greyscale among colour ones (e.g. %r); they '
                    'are converted to RGB, the grey value replicated over the 3 channels.',
                    where, len(grey), total, grey[0])
  return 'RGB'


def _decode_split(entries, read, shape, mode, where):
  """uint8 [len(entries), *shape] of the entries decoded in order, in ``mode``."""
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
  mode = _common_mode(splits, read, where)
  first_rel = splits['train'][0][1]
  first = _decode(read(first_rel), first_rel, mode, where)
  classes = sorted({c for c, _ in splits['train']})
  label_of = {c: i for i, c in enumerate(classes)}
  arrays = {}
  for split in SPLITS:
    arrays[f'{split}_images'] = _decode_split(splits[split], read, first.shape, mode, where)
    arrays[f'{split}_labels'] = np.array([label_of[c] for c, _ in splits[split]], np.int64)
  return arrays


def _rename_into_place(tmp: str, entry: str) -> bool:
  """Renames the complete entry ``tmp`` to ``entry``; False when another process was first.

  Raises:
    OSError: the rename failed for another reason.
  """
  try:
    os.rename(tmp, entry)
  except OSError:
    if not os.path.isdir(entry):
      raise
    return False
  return True


def _replace_damaged(entry: str, tmp: str) -> str:
  """Puts the complete entry ``tmp`` in place of the unreadable ``entry``, which is moved
  aside to ``<entry>.damaged-<n>``; under the lock ``<entry>.lock``, so that processes
  repairing it at once do it once. Returns what was done, for the log.

  Raises:
    OSError: the lock or a rename failed.
  """
  with open(entry + '.lock', 'a') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
    try:
      _read_cache(entry)
      return 'another process has already replaced it'
    except ValueError:
      pass
    aside = ''
    if os.path.lexists(entry):
      n = 1
      while os.path.lexists(f'{entry}.damaged-{n}'):
        n += 1
      aside = f'{entry}.damaged-{n}'
      os.rename(entry, aside)
    if not _rename_into_place(tmp, entry):
      return 'another process has already written a new one'
  if not aside:
    return 'it had been removed meanwhile; wrote a new one'
  return (f'decoded the source again and replaced it; the damaged entry was moved to {aside} '
          '(delete it once inspected)')


def _write_cache(entry: str, arrays: dict, meta: dict, damaged: str = '') -> bool:
  """Writes a cache entry atomically; False (and a warning) when it cannot.

  ``damaged``: why the existing ``entry`` is unreadable ('' when there is none); it is
  then replaced (:func:`_replace_damaged`) and one warning says what was found and done.
  """
  parent = os.path.dirname(entry)
  left = (f' The existing entry is unreadable ({damaged}) and was left as it is.'
          if damaged else '')
  try:
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix='.tmp-', dir=parent)
  except OSError as e:
    logging.warning('Image-folder cache %s is not writable (%s); keeping the decoded '
                    'images in memory. Set dataset.cache_dir or $%s to a writable '
                    'directory.%s', parent, e, CACHE_ENV, left)
    return False
  try:
    for key, arr in arrays.items():
      np.save(os.path.join(tmp, key + '.npy'), arr)
    with open(os.path.join(tmp, 'meta.json'), 'w') as f:
      f.write(metrics.dumps(meta, indent=2))
    if damaged:
      done = _replace_damaged(entry, tmp)
      logging.warning('The image-folder cache entry %s was unreadable (%s); %s.',
                      entry, damaged, done)
    else:
      _rename_into_place(tmp, entry)
  except OSError as e:
    logging.warning('Could not write the image-folder cache %s (%s); keeping the '
                    'decoded images in memory.%s', entry, e, left)
    return False
  finally:
    if os.path.isdir(tmp):
      shutil.rmtree(tmp, ignore_errors=True)
  return True


def _read_cache(entry: str):
  """(arrays, meta) of a complete cache entry, the images memory-mapped.

  Raises:
    ValueError: the entry is unreadable (a file missing, truncated or malformed, or
      arrays disagreeing with meta.json); the message says what is wrong.
  """
  try:
    with open(os.path.join(entry, 'meta.json')) as f:
      meta = json.load(f)
    if not isinstance(meta, dict) or not isinstance(meta.get('classes'), list):
      raise ValueError('meta.json has no list of classes')
    arrays = {}
    for split in SPLITS:
      images = np.load(os.path.join(entry, f'{split}_images.npy'), mmap_mode='r')
      labels = np.load(os.path.join(entry, f'{split}_labels.npy'))
      count = meta.get(f'{split}_count')
      if images.dtype != np.uint8 or images.ndim != 4 or labels.shape != (count,) or (
          len(images) != count):
        raise ValueError(f'{split} images {images.dtype}{list(images.shape)} and labels '
                         f'{list(labels.shape)} do not match {split}_count={count!r}')
      arrays[f'{split}_images'], arrays[f'{split}_labels'] = images, labels
  except (OSError, ValueError, EOFError) as e:
    raise ValueError(f'{type(e).__name__}: {e}') from e
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
    (decoded on the first load of this content, or when its cache entry is
    unreadable, which is then replaced), int64 labels.

  Raises:
    FileNotFoundError: ``data_dir`` does not exist.
    ValueError: not a readable archive, a split missing, classes differing
      between train and test, fewer than 2 classes, an undecodable image or one of
      another size (each message names ``dataset.data_dir`` and the file).
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
  cached, damaged = None, ''
  if os.path.lexists(entry):
    try:
      cached = _read_cache(entry)
    except ValueError as e:
      damaged = str(e)
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
    written = _write_cache(entry, arrays, meta, damaged)
    if written:
      try:
        arrays = _read_cache(entry)[0]
      except ValueError as e:
        logging.warning('Could not read back the image-folder cache entry %s (%s); keeping '
                        'the decoded images in memory.', entry, e)
        written = False
    if not written:
      entry = ''
  return ImageFolderSplits(arrays['train_images'], arrays['train_labels'],
                           arrays['test_images'], arrays['test_labels'], classes, entry)

