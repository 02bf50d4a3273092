"""Fused collectives: one collective per group of leaves instead of one per leaf.

Why. A round of hfl exchanges one payload per parameter leaf (and a sparse or
quantised payload is itself several arrays: values and indices, symbols and a
scale). XLA combines the round's collectives into one tuple operation, but the
multi-process CPU backend (gloo over TCP) still runs every operand as its own
collective, one after the other, and each pays its own round trips: gloo sends a
message only once the receiver has announced a ready buffer, so even a 2-process
all-gather costs about two one-way latencies and a ring all-reduce about four
(``hfl.network.gloo_collective_latencies``). Over a WAN those latencies, not the
bytes, dominate a round of a small model. Concatenating the leaves into one
buffer and running the collective once pays them once.

What. :func:`fused` applies a collective written for one flat array to a whole
pytree with one call per *bucket* of leaves:

* arithmetic collectives (``psum``): a bucket is one dtype (sums must add like
  with like), so a float32 model's pseudo-gradient is one all-reduce;
* data movement (``all_gather``, ``pack_bytes=True``): every leaf is bitcast to
  bytes and all of them share one bucket, so a top-k payload's float32 values
  and int32 indices of every leaf travel in one all-gather. Sub-byte dtypes
  (int4, ...) cannot be bitcast to bytes and get a bucket per dtype.

Leaves with different varying-manual-axes types (inside ``shard_map``) are never
mixed, so the results keep their types. The results are exactly those of
applying the collective to every leaf separately (the same elements meet in the
same reduction; bitcasts are exact).

Several independent callers (one per leaf, e.g. ``hfl.links.exchange``) fuse
their collectives through generators: each caller is written as a generator
that yields one :class:`Call` and receives its result; :func:`run` drives one
generator with its collective applied directly, :func:`run_fused` drives many,
fusing the calls of equal ``group`` (:func:`fused_calls`).
"""

from typing import Any, Callable, Hashable, Iterator, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np


class Call(NamedTuple):
  """One collective a caller needs on a pytree.

  Attributes:
    fn: the collective on one array: maps ``x`` of any shape to an array of
      shape ``lead + x.shape`` or, for a flat ``x[n]``, ``lead + (n,)`` (e.g.
      ``lambda a: jax.lax.psum(a, 'dc')`` with lead (), or
      ``lambda a: jax.lax.all_gather(a, 'dc')`` with lead (axis_size,)).
      Applied to flat buffers when fused, so it must be elementwise over the
      flattened array (true of psum and all-gather).
    tree: the operands, a pytree of arrays.
    group: calls with equal ``group`` may share one collective (they must then
      have the same ``fn`` semantics); e.g. ``('psum', 'dc')``.
    pack_bytes: ``fn`` only moves data (an all-gather), so leaves of any dtype
      may travel together as bytes; False for reductions.
  """
  fn: Callable[[jax.Array], jax.Array]
  tree: Any
  group: Hashable
  pack_bytes: bool = False


def _vma(x):
  """``x``'s varying-manual-axes type inside shard_map (hashable; None outside)."""
  aval = jax.typeof(x)
  for name in ('manual_axis_type', 'vma'):  # the attribute's name differs across JAX versions
    t = getattr(aval, name, None)
    if t is not None:
      return t
  return None


def manual(axis: str) -> bool:
  """Whether ``axis`` is a manual mesh axis of an enclosing ``shard_map`` (False for a
  ``jax.vmap`` axis name: hfl.step's one-device simulation, where every member's
  value is its own batched copy and there are no varying-manual-axes types)."""
  return axis in getattr(jax.sharding.get_abstract_mesh(), 'manual_axes', ())


def pvary(tree, axis: str):
  """``tree`` cast to ``axis``-varying inside shard_map; unchanged under vmap."""
  return jax.lax.pcast(tree, axis, to='varying') if manual(axis) else tree


def all_gather(x, axis_name: str, **kwargs):
  """``jax.lax.all_gather(x, axis_name, to='invarying', **kwargs)`` inside shard_map
  (the result is invariant over the axis); the plain all-gather under vmap, where
  ``to`` does not apply."""
  if manual(axis_name):
    kwargs['to'] = 'invarying'
  return jax.lax.all_gather(x, axis_name, **kwargs)


def _packable(dtype) -> bool:
  """Whether leaves of ``dtype`` can be moved as whole bytes (bitcast or bool -> uint8)."""
  dtype = np.dtype(dtype)
  return dtype == np.bool_ or (dtype.itemsize >= 1 and dtype.itemsize * 8 == _bits(dtype))


def _bits(dtype) -> int:
  try:
    return int(jnp.finfo(dtype).bits)
  except ValueError:
    try:
      return int(jnp.iinfo(dtype).bits)
    except ValueError:
      return np.dtype(dtype).itemsize * 8


def _to_bytes(x):
  """uint8[size * itemsize]: ``x`` flattened, as bytes."""
  flat = x.reshape(-1)
  if flat.dtype == jnp.bool_:
    return flat.astype(jnp.uint8)
  if flat.dtype.itemsize == 1:
    return jax.lax.bitcast_convert_type(flat, jnp.uint8)
  return jax.lax.bitcast_convert_type(flat, jnp.uint8).reshape(-1)


def _from_bytes(b, like, lead):
  """Inverse of :func:`_to_bytes` on ``b`` of shape lead + (size * itemsize,)."""
  dtype = like.dtype
  if dtype == jnp.bool_:
    out = b.astype(jnp.bool_)
  elif dtype.itemsize == 1:
    out = jax.lax.bitcast_convert_type(b, dtype)
  else:
    out = jax.lax.bitcast_convert_type(b.reshape(lead + (-1, dtype.itemsize)), dtype)
  return out.reshape(lead + like.shape)


def _bucket_key(x, pack_bytes: bool):
  dtype = np.dtype(x.dtype)
  if pack_bytes and _packable(dtype):
    return ('bytes', _vma(x))
  return ('dtype', str(dtype), _vma(x))


# Arrays one concatenation takes: XLA:CPU fuses a concatenation with its elementwise
# producers only up to 8 operands (measured, jax 0.10); past that it writes every
# operand out on its own and then copies them all into the result.
CONCAT_GROUP = 8


def grouped_concat(arrays: Sequence[jax.Array]) -> jax.Array:
  """``jnp.concatenate(arrays)`` (flat arrays of one dtype) built as groups of
  :data:`CONCAT_GROUP` arrays, then the groups.

  The same values; on XLA:CPU each group is one fusion with its arrays' producers, and
  an optimization barrier keeps XLA from merging the groups back into one
  concatenation of every array. Measured with ``bench/op_count.py``
  (docs/benchmarks.md, issue 52): the round program of a model with more than 8
  leaves loses about one operation per leaf.
  """
  if len(arrays) == 1:
    return arrays[0]
  groups = [jnp.concatenate(arrays[i:i + CONCAT_GROUP])
            for i in range(0, len(arrays), CONCAT_GROUP)]
  return jnp.concatenate(jax.lax.optimization_barrier(groups)) if len(groups) > 1 else groups[0]


def fused_calls(calls: Sequence[Call]) -> list:
  """Results of ``calls``, with one collective per (group, bucket) of leaves.

  Args:
    calls: the collectives to run; their leaves may be of any shape and dtype.

  Returns:
    One pytree per call, the structure of its ``tree``, each leaf equal to
    ``call.fn(leaf)`` (shape ``lead + leaf.shape``, the leaf's dtype).
  """
  flats = [jax.tree.flatten(c.tree) for c in calls]
  results = [[None] * len(leaves) for leaves, _ in flats]
  buckets = {}  # (group, bucket key) -> [(call index, leaf index)]
  for ci, (c, (leaves, _)) in enumerate(zip(calls, flats)):
    for li, x in enumerate(leaves):
      key = (c.group, _bucket_key(x, c.pack_bytes))
      buckets.setdefault(key, []).append((ci, li))
  for (_, bkey), members in buckets.items():
    as_bytes = bkey[0] == 'bytes'
    fn = calls[members[0][0]].fn
    pieces = [flats[ci][0][li] for ci, li in members]
    flat = [_to_bytes(x) if as_bytes else x.reshape(-1) for x in pieces]
    out = fn(grouped_concat(flat))
    lead = tuple(out.shape[:-1])
    offset = 0
    for (ci, li), x, f in zip(members, pieces, flat):
      part = jax.lax.slice_in_dim(out, offset, offset + f.shape[0], axis=out.ndim - 1)
      offset += f.shape[0]
      results[ci][li] = (_from_bytes(part, x, lead) if as_bytes
                         else part.reshape(lead + x.shape))
  return [jax.tree.unflatten(td, res) for (_, td), res in zip(flats, results)]


def fused(fn: Callable[[jax.Array], jax.Array], tree, pack_bytes: bool = False):
  """``jax.tree.map(fn, tree)`` with one ``fn`` call per bucket of leaves (module docstring).

  Args:
    fn: a collective on one flat array (see :class:`Call`).
    tree: pytree of arrays.
    pack_bytes: ``fn`` only moves data: all byte-addressable leaves share one call.

  Returns:
    The pytree of ``fn(leaf)`` (shape ``lead + leaf.shape``, the leaf's dtype).
  """
  return fused_calls([Call(fn, tree, 0, pack_bytes)])[0]


def fused_psum(tree, axis_name):
  """``jax.lax.psum(tree, axis_name)`` with one all-reduce per dtype (and type)."""
  return fused(lambda a: jax.lax.psum(a, axis_name), tree)


def fused_all_gather(tree, axis_name, **kwargs):
  """``jax.lax.all_gather(leaf, axis_name, **kwargs)`` of every leaf in one all-gather.

  ``kwargs`` must keep the gathered axis first and untiled (e.g. ``to=``).
  """
  return fused(lambda a: jax.lax.all_gather(a, axis_name, **kwargs), tree, pack_bytes=True)


def _finish(gen: Iterator, result):
  try:
    gen.send(result)
  except StopIteration as stop:
    return stop.value
  raise RuntimeError('a fused caller must yield exactly one collectives.Call')


def run(gen: Iterator):
  """Drives one caller generator with its collective applied leaf by leaf (no fusion).

  Returns:
    The generator's return value (a generator that yields nothing returns at once).
  """
  try:
    call = next(gen)
  except StopIteration as stop:
    return stop.value
  return _finish(gen, jax.tree.map(call.fn, call.tree))


def run_fused(gens: Sequence[Iterator]) -> list:
  """Drives several caller generators, fusing their collectives (:func:`fused_calls`).

  Each generator runs up to its one yield (in order), then all the yielded calls
  run fused, then each generator is resumed with its own result.

  Returns:
    The generators' return values, in order.
  """
  done, pending = {}, []
  for i, gen in enumerate(gens):
    try:
      pending.append((i, gen, next(gen)))
    except StopIteration as stop:
      done[i] = stop.value
  results = fused_calls([call for _, _, call in pending])
  for (i, gen, _), result in zip(pending, results):
    done[i] = _finish(gen, result)
  return [done[i] for i in range(len(gens))]


# --------------------------------------------------------------------------------
# Split collectives: a value identical over one mesh axis is moved over another
# axis in 1/N slices, one per member of the first, and re-assembled afterwards.
# --------------------------------------------------------------------------------

def chunk(size: int, parts: int) -> int:
  """Entries of one member's slice of a ``size``-entry array split in ``parts``:
  ceil(size / parts) (Python int)."""
  return -(-int(size) // parts)


def pad_flat(a, parts: int):
  """``a`` flattened and zero-padded to a multiple of ``parts`` entries (a's dtype)."""
  flat = a.reshape(-1)
  return jnp.pad(flat, (0, chunk(flat.size, parts) * parts - flat.size))


def split(a, parts: int, index):
  """Slice ``index`` (int or int32[]) of ``a`` flattened and zero-padded to a
  multiple of ``parts``: [ceil(size / parts)], a's dtype."""
  n = chunk(a.size, parts)
  return jax.lax.dynamic_slice_in_dim(pad_flat(a, parts), index * n, n)


def share(a, parts: int, index):
  """Member ``index``'s share of ``a`` for a reduction: (values [ceil(size / parts)],
  valid bool[same]).

  The entries of :func:`split`'s slice ``index`` without the zero-padding copy: a
  window of ``a`` flattened, shifted back from the end where it would overrun, with
  ``valid`` marking the entries that are slice ``index``'s own (the rest belong to
  slice ``index - 1``). Summing ``where(valid, f(values), 0)`` over members counts
  every entry once, and each member reads only its window (XLA:CPU may write the
  window out before reducing it). An empty ``a`` gives empty values.
  """
  flat = a.reshape(-1)
  n = flat.shape[0]
  c = chunk(n, parts)
  if n == 0:
    return flat, jnp.zeros((0,), bool)
  start = index * c
  window = jax.lax.dynamic_slice_in_dim(flat, jnp.minimum(start, n - c), c)
  pos = jnp.minimum(start, n - c) + jnp.arange(c)
  return window, (pos >= start) & (pos < start + c)


def split_tree(tree, parts: int, index):
  """:func:`split` of every leaf of ``tree``: leaves [ceil(size / parts)]."""
  return jax.tree.map(lambda a: split(a, parts, index), tree)


def chunk_bits(payload, parts: int) -> int:
  """Bits of one member's 1/parts slice of every array of ``payload`` (static).

  Args:
    payload: pytree of arrays or ShapeDtypeStructs.
    parts: members the arrays are split across (each flattened, zero-padded to a
      multiple of ``parts``).

  Returns:
    Python int: sum over arrays of ceil(size / parts) * itemsize * 8.
  """
  return sum(chunk(np.prod(a.shape, dtype=np.int64), parts) * jnp.dtype(a.dtype).itemsize * 8
             for a in jax.tree.leaves(payload))


def unsplit(parts_gathered, shape):
  """Inverse of :func:`split` after an all-gather of the slices on the last axis:
  ``parts_gathered`` [..., parts * chunk] -> [..., *shape]."""
  size = int(np.prod(shape, dtype=np.int64))
  lead = parts_gathered.shape[:-1]
  return parts_gathered[..., :size].reshape(lead + tuple(shape))


def all_gather_split(payload, axis: str, split_axis: str, split_size: int):
  """``all_gather(payload, axis)`` with each member of ``split_axis`` sending 1/split_size.

  Used for the inter-DC exchange: a DC's payload is identical on its W workers, so
  worker w sends only slice w over 'dc' and the slices are re-assembled inside the
  DC over 'worker'. The WAN then carries each DC's payload once (plus < W padding
  entries per payload array), not W times.

  Returns:
    payload pytree with a leading [axis_size] dimension, invariant over both axes.
  """
  idx = jax.lax.axis_index(split_axis)

  def leaf(a):
    mine = split(a, split_size, idx)
    g = all_gather(mine, axis)                      # [n_axis, chunk]
    g = all_gather(g, split_axis, axis=1, tiled=True)  # [n_axis, W*chunk]
    return unsplit(g, a.shape)
  return jax.tree.map(leaf, payload)


def psum_split(payload, axis: str, split_axis: str, split_size: int):
  """``psum(payload, axis)`` with each member of ``split_axis`` reducing 1/split_size
  (then all-gathered over ``split_axis``); leaves keep their shapes and dtypes."""
  idx = jax.lax.axis_index(split_axis)

  def leaf(a):
    s = jax.lax.psum(split(a, split_size, idx), axis)
    s = all_gather(s, split_axis, tiled=True)
    return unsplit(s, a.shape)
  return jax.tree.map(leaf, payload)


def psum_scatter_split(payload, axis: str, axis_size: int):
  """``split(psum(payload, axis), axis_size, axis_index(axis))`` as one reduce-scatter.

  Returns:
    payload pytree, each leaf this member's slice [ceil(size / axis_size)] of the
    leaf flattened and zero-padded (varying over ``axis``).
  """
  return jax.tree.map(
      lambda a: jax.lax.psum_scatter(pad_flat(a, axis_size), axis, scatter_dimension=0,
                                     tiled=True), payload)


def all_gather_unsplit(slices, shapes, axis: str):
  """Inverse of :func:`split_tree` across ``axis``: all-gathers every member's slice.

  Args:
    slices: pytree, leaves [chunk] (member i holds slice i).
    shapes: pytree of the same structure whose leaves have the full shapes.
    axis: the mesh axis the slices are split over.

  Returns:
    pytree of full leaves, invariant over ``axis``.
  """
  return jax.tree.map(
      lambda s, like: unsplit(all_gather(s, axis, tiled=True),
                              like.shape), slices, shapes)


def reduces(c) -> bool:
  """Whether a leaf's payloads are summed by an all-reduce instead of all-gathered.

  Only for a lossless linear compressor (identity: float32 values): a float32
  all-reduce then moves exactly what each member sends and adds it in float32,
  as a parameter server does. Every lossy payload (casts included) is
  all-gathered in its wire dtype and each one decoded before the float32 sum, so
  the receiver adds exactly what the sender's error feedback assumes it sent.

  Args:
    c: a ``hfl.compress.base.Compressor``.
  """
  return c.linear and c.lossless


def reduce_scatters(cu, cd) -> bool:
  """Whether a leaf's uplink is a reduce-scatter under sharded optimizer state.

  Only for an uncompressed leaf: a lossless linear uplink ``cu`` and downlink
  ``cd`` (identity; both are then elementwise casts, valid on slices), so that no
  worker needs more than its slice of the aggregate and the PS keeps no downlink
  residual.
  """
  return reduces(cu) and reduces(cd)
