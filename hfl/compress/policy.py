"""Per-leaf compression policy: which compressor each pytree leaf gets.

Following DGC (Lin et al. 2018) and the seed thesis: large tensors (ndim >= 2 and
size >= ``small_threshold``) get the compressor named by the spec (top-k, QSGD,
...); small tensors (biases, norms) are sent dense in ``small`` precision (float32 =
identity, bfloat16, float16). A large leaf that PowerSGD's rank-r factors would not
shrink is sent dense in float32 (:func:`hfl.compress.lowrank.compresses`).

A spec is the ``compression.uplink`` / ``.downlink`` / ``.wan`` ConfigDict of
``configs/default.py``: ``name`` plus hyper-parameters (``density``, ``levels``,
``rank``, ``threshold_variant``). Everything is validated here, in Python, when
the policy is built, before any compilation; errors name the config field.

Compressors are registered by their own modules (:mod:`hfl.compress.registry`),
e.g. in :mod:`hfl.compress.co3`::

    register('co3', co3, ('fmt', 'gamma', 'coder', 'refit_every'),
             example={'fmt': 'fp4', 'gamma': 0.9})

Importing the package (``hfl/compress/__init__.py``) imports every module of
``hfl/compress/``, so the registry holds every compressor before this module is
used. :data:`REGISTRY` and :func:`register` here are the registry's own (aliases
kept for existing callers).
"""

import re
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from hfl.compress import base
from hfl.compress import casts
from hfl.compress import quantize
from hfl.compress.registry import REGISTRY, register  # noqa: F401 (re-exported)

SMALL_CHOICES = ('float32', 'bfloat16', 'float16')


def _get(spec, name, default=None):
  if isinstance(spec, str):
    return default
  if isinstance(spec, dict):
    return spec.get(name, default)
  try:
    return spec.get(name, default)  # ConfigDict
  except AttributeError:
    return getattr(spec, name, default)


def _is_int(v):
  return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


# Integer hyper-parameters that must be >= 1, with what they mean.
_POSITIVE_INTS = {'levels': 'QSGD quantisation levels s', 'bucket_size': 'QSGD entries per norm',
                  'rank': 'PowerSGD rank r', 'chunk_size': 'chunked_topk: entries per chunk; dct_topk: chunk edge'}


def _check_hyper(field, name, value):
  """Range checks of the shared hyper-parameters; ValueError naming the field."""
  where = f'{field}.{name}'
  if name == 'density':
    ok = (isinstance(value, (int, float, np.floating, np.integer))
          and not isinstance(value, bool) and 0.0 < float(value) <= 1.0)
    if not ok:
      raise ValueError(f'{where}={value!r}: density must be a number in (0, 1] '
                       '(fraction of entries kept)')
  elif name in _POSITIVE_INTS:
    if not _is_int(value) or value < 1:
      raise ValueError(f'{where}={value!r}: {name} must be an integer >= 1 '
                       f'({_POSITIVE_INTS[name]})')
    if name == 'levels' and value > quantize.MAX_LEVELS:
      raise ValueError(f'{where}={value!r}: levels must be at most {quantize.MAX_LEVELS} '
                       '(2**16: float32 keeps the stochastic rounding\'s fraction only '
                       'that far)')
  elif name == 'threshold_variant':
    if not isinstance(value, (bool, np.bool_)):
      raise ValueError(f'{where}={value!r}: threshold_variant must be True or False')


def _leaf_shape(leaf):
  return tuple(int(d) for d in np.shape(leaf))


def _small_factory(small, small_field):
  if small == 'float32':
    return base.identity
  if small in ('bfloat16', 'float16'):
    return casts.factory(jnp.dtype(small))
  raise ValueError(f'{small_field}={small!r}: must be one of {", ".join(SMALL_CHOICES)}')


def build(spec, shapes, small_threshold: int, small: str,
          field: str = 'compression', small_field: str | None = None,
          dense_leaves: str = '') -> list[base.Compressor]:
  """Builds one compressor per leaf of ``shapes``, aligned with ``jax.tree.leaves``.

  Leaves with ndim < 2 or size < ``small_threshold``, and leaves whose path
  (``jax.tree_util.keystr``, e.g. ``"['embedding']['embedding']"``) matches the
  regular expression ``dense_leaves`` (``re.search``; '' matches none), get the dense
  ``small`` precision (identity for float32, else a cast); the others get
  ``REGISTRY[spec.name]`` with the spec's hyper-parameters.

  Args:
    spec: ConfigDict (or dict) with ``name`` and hyper-parameters, or a bare
      compressor name.
    shapes: pytree of arrays or ShapeDtypeStructs (only shapes are used).
    small_threshold: int >= 0, minimum size of a compressed leaf.
    small: 'float32' | 'bfloat16' | 'float16'.
    field: config path of ``spec`` for error messages, e.g. 'compression.uplink'.
    small_field: config path of ``small`` for errors (default: the parent of
      ``field`` + '.small', e.g. 'compression.small').

  Returns:
    list of Compressor, one per leaf.

  Raises:
    ValueError: unknown name, out-of-range hyper-parameter, bad ``small`` or
      negative ``small_threshold``; the message names the field, the value and
      what is allowed.
  """
  parent = field.rsplit('.', 1)[0] if '.' in field else ''
  if small_field is None:
    small_field = f'{parent}.small' if parent else 'small'
  thr_field = f'{parent}.small_threshold' if parent else 'small_threshold'
  if not _is_int(small_threshold) or small_threshold < 0:
    raise ValueError(f'{thr_field}={small_threshold!r}: must be an integer >= 0')
  small_make = _small_factory(small, small_field)
  name, hyper = check_spec(spec, field)
  factory = REGISTRY[name][0]
  dense = dense_pattern(dense_leaves, f'{parent}.dense_leaves' if parent else 'dense_leaves')

  out = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]:
    shape = _leaf_shape(leaf)
    size = int(np.prod(shape, dtype=np.int64))
    if (len(shape) < 2 or size < small_threshold
        or (dense is not None and dense.search(jax.tree_util.keystr(path)))):
      out.append(small_make(shape))
      continue
    try:
      out.append(factory(shape, **hyper))
    except ValueError as e:
      raise _factory_error(field, name, hyper, e) from e
  return out


def dense_pattern(pattern: str, field: str = 'compression.dense_leaves'):
  """``pattern`` compiled (None for ''), or ValueError naming ``field`` when it is not
  a string or not a valid regular expression."""
  if not isinstance(pattern, str):
    raise ValueError(f'{field}={pattern!r} must be a string (a regular expression on leaf '
                     "paths such as \"['embedding']['embedding']\"; '' = none)")
  if not pattern:
    return None
  try:
    return re.compile(pattern)
  except re.error as e:
    raise ValueError(f'{field}={pattern!r} is not a valid regular expression ({e})') from e


def check_spec(spec, field: str = 'compression') -> tuple[str, dict]:
  """Checks a spec's name and shared hyper-parameter ranges (no shapes needed).

  What the factory itself refuses (e.g. CO3's ``gamma``) is found by
  :func:`build`, which calls it.

  Args:
    spec: as for :func:`build`.
    field: config path of ``spec`` for error messages.

  Returns:
    ``(name, hyper)``: the compressor name and the keyword arguments its
    factory gets (the registered hyper-parameters the spec sets).

  Raises:
    ValueError: unknown name or out-of-range ``density``, ``levels``,
      ``bucket_size``, ``rank`` or ``threshold_variant``, naming the field.
  """
  name = spec if isinstance(spec, str) else _get(spec, 'name')
  if name not in REGISTRY:
    raise ValueError(f'{field}.name={name!r}: unknown compressor; allowed: '
                     f'{", ".join(sorted(REGISTRY))}')
  hyper = {}
  for h in REGISTRY[name][1]:
    v = _get(spec, h)
    if v is None:
      continue
    _check_hyper(field, h, v)
    hyper[h] = v
  return name, hyper


def _factory_error(field: str, name: str, hyper: dict, e: ValueError) -> ValueError:
  """A factory's ValueError, prefixed with the config field it is about.

  When the message names exactly one of the hyper-parameters the spec sets, the
  prefix is that field and its value (``compression.uplink.gamma=1.5: co3: gamma
  must be in [0, 1]``; a trailing ``, got VALUE`` is dropped as it repeats the
  value); otherwise it is the spec's field with its name and hyper-parameters.
  """
  msg = str(e)
  about = [h for h in hyper if re.search(rf'\b{re.escape(h)}\b', msg)]
  if len(about) != 1:
    settings = ', '.join(f'{k}={v!r}' for k, v in hyper.items())
    return ValueError(f'{field} (name={name!r}{", " if settings else ""}{settings}): {msg}')
  h = about[0]
  msg = re.sub(r',\s*got\s[^;]*$', '', msg.replace(f'{h}={hyper[h]!r}', h))
  return ValueError(f'{field}.{h}={hyper[h]!r}: {msg}')


def payload_shape(compressor: base.Compressor):
  """The payload of ``compressor`` as a dict of jax.ShapeDtypeStruct (nothing runs)."""
  x = jax.ShapeDtypeStruct(compressor.shape, jnp.float32)
  key = jax.eval_shape(lambda: jax.random.PRNGKey(0))
  payload, _ = jax.eval_shape(
      lambda x, k: compressor.encode(x, compressor.init(), k), x, key)
  return payload


def static_bits(compressor: base.Compressor) -> int:
  """Payload bits of ``compressor`` from its payload's static shapes and dtypes.

  Exact for every compressor whose ``wire_bits`` is static (the default,
  :func:`base.payload_bits`). For a variable-length code (CO3) it is the size of
  the fixed-width payload the simulation moves (8 bits per symbol + header), only an
  estimate of the charged length: typically far above it, but a leaf of rare
  symbols can cost more (a CO3 Huffman codeword has up to
  ``coding.MAX_CODE_LEN`` bits, plus a sign bit).

  Returns:
    Python int.
  """
  return base.payload_bits(payload_shape(compressor))


def describe(compressors: Sequence[base.Compressor], shapes) -> str:
  """A markdown table (leaf path, shape, compressor, bits per entry) for logging.

  Args:
    compressors: as returned by :func:`build` for ``shapes``.
    shapes: the same pytree.

  Returns:
    str; the last row is the total (bits per entry averaged over all entries).
  """
  paths = jax.tree_util.tree_flatten_with_path(shapes)[0]
  rows = [('leaf', 'shape', 'compressor', 'bits/entry')]
  tot_bits = tot_size = 0
  for (path, leaf), c in zip(paths, compressors):
    shape = _leaf_shape(leaf)
    size = int(np.prod(shape, dtype=np.int64))
    bits = static_bits(c)
    approx = '' if c.wire_bits is base.payload_bits else '~'
    tot_bits += bits
    tot_size += size
    rows.append((jax.tree_util.keystr(path) or '<root>', str(shape), c.name,
                 f'{approx}{bits / max(size, 1):.3f}'))
  rows.append(('total', f'{tot_size} entries', f'{tot_bits / 8:.0f} bytes',
               f'{tot_bits / max(tot_size, 1):.3f}'))
  widths = [max(len(r[i]) for r in rows) for i in range(4)]
  fmt = lambda r: '| ' + ' | '.join(s.ljust(w) for s, w in zip(r, widths)) + ' |'
  lines = [fmt(rows[0]), '|' + '|'.join('-' * (w + 2) for w in widths) + '|']
  lines += [fmt(r) for r in rows[1:]]
  return '\n'.join(lines)


LOSSLESS_NAMES = ('identity', 'float32')  # registry names of hfl.compress.base.identity
# Registry names whose ``wire_bits`` is the coded length of each payload (hfl.compress.co3),
# so that DCs sending equal shapes may be charged different bits.
VARIABLE_LENGTH_NAMES = ('co3',)


def lossy_downlink(compression) -> bool:
  """Whether some leaf's downlink compressor may be lossy: ``compression.downlink.name``
  not identity/float32, or small leaves cast (``compression.small`` not float32).
  Where it is not, both ``compression.broadcast`` modes (hfl.config.BROADCASTS)
  train bitwise the same run.

  Args:
    compression: the ``compression`` section, a ConfigDict or a config.json dict.
  """
  return (compression['downlink']['name'] not in LOSSLESS_NAMES
          or compression.get('small', 'float32') != 'float32')


def correction_name(compression) -> str:
  """The registry name of the round's correction's own compressor
  (``compression.correction.name``), or '' where it is the downlink's (the field unset,
  or a config older than it).

  Args:
    compression: the ``compression`` section, a ConfigDict or a config.json dict.
  """
  spec = compression.get('correction')
  return (spec.get('name', '') if spec is not None else '') or ''


def lossy_correction(compression) -> bool:
  """Whether the round's correction may be lossy at some leaf, so that
  ``compression.broadcast='downlink'`` sends it through a compressor with error
  feedback instead of re-gathering the global model: its own compressor
  (``compression.correction.name``, :func:`correction_name`) not identity/float32, or
  small leaves cast; without one, :func:`lossy_downlink`.

  Args:
    compression: the ``compression`` section, a ConfigDict or a config.json dict.
  """
  name = correction_name(compression)
  if not name:
    return lossy_downlink(compression)
  return name not in LOSSLESS_NAMES or compression.get('small', 'float32') != 'float32'
