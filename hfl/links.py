"""One link of the hierarchy: error feedback, encode, collective, decode, for every
leaf of a pytree, and the finiteness checks of what crossed it.

A link is the uplink (workers to their DC's PS, over 'worker'), the PS downlink (the
PS to its workers; replicated SPMD, no collective), the WAN (DCs over 'dc', each DC's
payload split over its workers) or the round's correction through the downlink
(hfl.step.broadcast_correction). On each, every member sends the encoding of
p = x + γ e and keeps e <- p - D(payload) (error feedback: Seide et al., Interspeech
2014; Stich et al., NeurIPS 2018; at the PS as in DoubleSqueeze, Tang et al., ICML
2019), so Σ received + Σ residuals = Σ sent up to float32 rounding for every
compressor of the registry (tests/test_links.py).

- :class:`LinkState`, :func:`init_link`: a link's residuals and compressor states.
- :func:`exchange` (a collective over a mesh axis) and :func:`downlink` (the PS's,
  none) return an :class:`Exchanged`: the aggregate, the new state, each leaf's wire
  bits and its :class:`Check`.
- :class:`LinkCharge`, :func:`link_charge`: one link's bits in one program, static
  (Python int, fixed at trace time) and dynamic (int32[] per leaf, variable-length
  codes).
- Finiteness: every leaf's :class:`Check` on every link is reduced at once into a few
  uint32 words (:func:`fused_flags`, bit j of :func:`flag_layout`); the host unpacks
  them into int32[..., NUM_LINKS, L] flags (:func:`unpack_flags`: BAD_INPUT,
  BAD_PAYLOAD, BAD_RESIDUAL, those of :func:`finiteness_flags`) and names the first
  non-finite value by leaf, link, DC and worker (:func:`first_nonfinite`).
"""

from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from hfl import collectives
from hfl.collectives import chunk_bits, reduces
from hfl.compress import base
from hfl.compress import ef


class LinkState(NamedTuple):
  """One link's error-feedback state (uplink, PS downlink or WAN).

  Attributes:
    residual: error-feedback memory e, a pytree like the parameters (f32 leaves),
      with the link's leading axes ([D, W] uplink, [D] downlink and WAN); None at
      a leaf whose compressor is lossless (identity), which never leaves a residual
      (hfl.compress.ef.ef_step): such a link holds no parameter-sized copy, and
      its step takes and returns no array for that leaf.
    compressor_state: list with one compressor state per parameter leaf (leading
      axes likewise).
  """
  residual: Any
  compressor_state: Any


def with_lead(tree, lead):
  """Every leaf of ``tree`` broadcast to leading axes ``lead`` (a tuple of ints)."""
  return jax.tree.map(lambda x: jnp.broadcast_to(x, tuple(lead) + x.shape), tree)


def init_link(comps: Sequence[base.Compressor], params, lead) -> LinkState:
  """A link's initial state: zero residuals (None for a lossless compressor's leaf),
  fresh compressor states, each with leading axes ``lead`` (e.g. (D, W)).

  Raises:
    ValueError: not one compressor per leaf of ``params``.
  """
  leaves, treedef = jax.tree.flatten(params)
  if len(comps) != len(leaves):
    raise ValueError(f'init_link: {len(comps)} compressors for {len(leaves)} parameter leaves')
  residual = treedef.unflatten([None if c.lossless else jnp.zeros_like(x)
                                for c, x in zip(comps, leaves)])
  return LinkState(with_lead(residual, lead), with_lead([c.init() for c in comps], lead))



# Bit flags of one leaf's finiteness check on one link (hfl.train names them).
BAD_INPUT, BAD_PAYLOAD, BAD_RESIDUAL = 1, 2, 4
FLAG_NAMES = {BAD_INPUT: 'input', BAD_PAYLOAD: 'payload', BAD_RESIDUAL: 'residual'}


def _all_finite(*trees, part=None) -> jax.Array:
  """bool[]: every inexact (float) array in ``trees`` is finite.

  ``part`` = (index int32[], parts): only member ``index``'s share of every array
  (hfl.collectives.share: slice ``index`` of ``parts`` of the flattened array).

  An all-reduction of isfinite, not max |a|: XLA:CPU's vectorised max reduction
  drops NaN on arrays of a few thousand entries and more (measured on jax 0.10).
  """
  arrays = [a for t in trees for a in jax.tree.leaves(t)
            if jnp.issubdtype(jnp.result_type(a), jnp.inexact)]
  if not arrays:
    return jnp.bool_(True)
  if part is None:
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(a)) for a in arrays]))
  shares = [collectives.share(a, part[1], part[0]) for a in arrays]
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(v) | ~ok) for v, ok in shares]))


def finiteness_flags(x, payload, decoded, residual, lossless: bool = False,
                     part=None) -> jax.Array:
  """int32[] bit flags of one leaf on one link: BAD_INPUT where ``x`` (the gradient,
  aggregate or pseudo-gradient sent) has a non-finite entry, BAD_PAYLOAD where the
  payload or its decoded value does, BAD_RESIDUAL where the new residual does.

  ``lossless``: the leaf's compressor is lossless (its payload decodes to ``x``
  exactly and the residual is passed through unchanged, hfl.compress.ef.ef_step),
  so BAD_PAYLOAD is BAD_INPUT and only ``x`` is read.

  ``part`` = (index int32[], parts): the four values are identical on ``parts``
  members (a DC's workers hold the same PS and WAN link), so this member checks
  only its share ``index`` of each (hfl.collectives.share) and the flags of the whole leaf are the OR over the members
  (:func:`hfl.step.host_metrics` reports them per member, :func:`first_nonfinite` per DC).
  Each value is then read once per DC instead of once per worker.
  """
  ok = lambda *t: _all_finite(*t, part=part)
  if lossless:
    return jnp.where(ok(x), 0, BAD_INPUT | BAD_PAYLOAD).astype(jnp.int32)
  return (jnp.where(ok(x), 0, BAD_INPUT)
          | jnp.where(ok(payload, decoded), 0, BAD_PAYLOAD)
          | jnp.where(ok(residual), 0, BAD_RESIDUAL)).astype(jnp.int32)


class Check(NamedTuple):
  """One leaf's finiteness check on one link, not yet reduced: the arguments of
  :func:`finiteness_flags`. The step reduces every check of a program together
  (:func:`fused_flags`); :func:`check_flags` reduces one alone.

  Attributes:
    x: f32 array, the value sent (gradient, aggregate, pseudo-gradient, correction).
    payload: its payload (dict of arrays; the float ones are read).
    decoded: f32 array, the payload decoded.
    residual: f32 array, the new residual (None: no residual, lossless).
    lossless: the leaf's compressor is lossless (only ``x`` is read).
    part: None, or (index int32[], parts): this member checks its share only.
  """
  x: Any
  payload: Any
  decoded: Any
  residual: Any
  lossless: bool
  part: Any = None


def check_flags(check: Check) -> jax.Array:
  """int32[] :func:`finiteness_flags` of one :class:`Check` (its own reductions)."""
  return finiteness_flags(*check)


def _floats(*trees) -> list:
  """The inexact (float) arrays of ``trees``, in order."""
  return [a for t in trees for a in jax.tree.leaves(t)
          if jnp.issubdtype(jnp.result_type(a), jnp.inexact)]


def _check_items(check: Check) -> list:
  """[(flag mask, arrays)] of one check: what each of its flag bits reads (items
  without a float array, which can never fire, left out)."""
  if check.lossless:
    items = [(BAD_INPUT | BAD_PAYLOAD, _floats(check.x))]
  else:
    items = [(BAD_INPUT, _floats(check.x)),
             (BAD_PAYLOAD, _floats(check.payload, check.decoded)),
             (BAD_RESIDUAL, _floats(check.residual))]
  return [(mask, arrays) for mask, arrays in items if any(a.size for a in arrays)]


def _leaf_checks(check) -> tuple:
  """A leaf's entry in :attr:`LinkCharge.checks` as a tuple of :class:`Check`: None
  is (), a Check is (check,), a tuple of Checks stays (their flags are OR'ed)."""
  if check is None:
    return ()
  return (check,) if isinstance(check, Check) else tuple(check)


def flag_items(links: Sequence['LinkCharge']) -> list:
  """Every flag bit of a program, in order: [((link, leaf, mask), arrays, part)] over
  the links (in the order of :data:`LINK_NAMES`) and their leaves' checks."""
  return [((k, i, mask), arrays, check.part)
          for k, link in enumerate(links) for i, entry in enumerate(link.checks)
          for check in _leaf_checks(entry) for mask, arrays in _check_items(check)]


def flag_layout(links: Sequence['LinkCharge']) -> tuple:
  """Static: ((link, leaf, mask), ...), what bit j of :func:`fused_flags`' words
  (word j // 32, bit j % 32) stands for: ``mask`` (BAD_*) of ``leaf`` on ``link``."""
  return tuple(where for where, _, _ in flag_items(links))


def _code_dtype(num_bits: int):
  """The narrowest unsigned dtype holding ``num_bits`` (<= 32) flag bits."""
  return jnp.uint8 if num_bits <= 8 else jnp.uint16 if num_bits <= 16 else jnp.uint32


def _codes(arrays, part, bit: int, dtype) -> list:
  """``dtype`` per entry of each array, flattened: 0 where finite (or outside this
  member's share), ``1 << bit`` where not."""
  out = []
  for a in arrays:
    if part is None:
      ok = jnp.isfinite(a).reshape(-1)
    else:
      v, valid = collectives.share(a, part[1], part[0])
      ok = jnp.isfinite(v) | ~valid
    out.append(jnp.where(ok, dtype(0), dtype(1 << bit)))
  return out


def fused_concat(arrays: list) -> jax.Array:
  """The concatenation of flat arrays of one dtype, written into one buffer for a
  single reduction: :func:`hfl.collectives.grouped_concat` (groups of
  :data:`hfl.collectives.CONCAT_GROUP` arrays, each one fusion with its producers on
  XLA:CPU), behind an optimization barrier that keeps XLA from splitting a reduction of
  the result back into one reduction per array (its algebraic simplifier's
  reduce-of-concatenate rule)."""
  return jax.lax.optimization_barrier(collectives.grouped_concat(arrays))


def _or_all(codes: list) -> jax.Array:
  """uint32[]: the OR of every entry of ``codes`` (flat arrays of one unsigned dtype),
  concatenated by :func:`fused_concat` and reduced once."""
  flat = fused_concat(codes)
  zero = np.zeros((), flat.dtype)
  return jax.lax.reduce(flat, zero, jax.lax.bitwise_or, (0,)).astype(jnp.uint32)


def fused_flags(links: Sequence['LinkCharge'], num_words: int) -> jax.Array:
  """uint32[num_words]: every finiteness check of a program in a few reductions.

  Bit j (:func:`flag_layout`) is set where an array of its item has a non-finite
  entry (within the member's share, with ``part``): each entry becomes 0 or
  ``1 << (j % 32)`` (in the narrowest of uint8, uint16 and uint32 holding the
  word's bits), and the entries of the 32 items of one word, concatenated, are
  OR-reduced at once (:func:`_or_all`). A few operations per 32
  flag bits instead of several per leaf and link (on XLA:CPU: one per
  :data:`hfl.collectives.CONCAT_GROUP` arrays, one concatenation, and a chain of about log_32 of its
  length reduce-windows). :func:`hfl.step.host_metrics` unpacks the bits into the per-leaf
  flags :func:`finiteness_flags` gives. Words past the last bit are 0.

  Raises:
    ValueError: the checks need more than ``num_words`` words.
  """
  items = flag_items(links)
  if -(-len(items) // 32) > num_words:
    raise ValueError(f'fused_flags: {len(items)} flag bits need more than {num_words} words')
  words = []
  for start in range(0, len(items), 32):
    word = items[start:start + 32]
    dtype = _code_dtype(len(word))  # 1, 2 or 4 bytes per checked entry
    words.append(_or_all([c for j, (_, arrays, part) in enumerate(word)
                          for c in _codes(arrays, part, j, dtype)]))
  words += [jnp.uint32(0)] * (num_words - len(words))
  return jnp.stack(words) if words else jnp.zeros((0,), jnp.uint32)


class Exchanged(NamedTuple):
  """One member's side of a pytree crossing one link (:func:`exchange`, :func:`downlink`).

  Attributes:
    agg: pytree like the input, f32: the aggregate, identical on every member (a
      leaf's slice f32[ceil(size / W)] where it was reduce-scattered).
    link: the member's new :class:`LinkState`.
    bits: list per leaf, wire bits of the member's payload: Python int (static)
      or int32[] (variable-length codes).
    checks: list per leaf, its :class:`Check` (reduced with the program's others,
      :func:`fused_flags`).
    payloads: list per leaf, the member's payload (dict of arrays).
  """
  agg: Any
  link: LinkState
  bits: list
  checks: list
  payloads: list

  @property
  def flags(self) -> list:
    """list per leaf, int32[] finiteness flags (BAD_INPUT | BAD_PAYLOAD |
    BAD_RESIDUAL), each leaf reduced on its own (:func:`check_flags`)."""
    return [check_flags(c) for c in self.checks]


def _collect(c: base.Compressor, sent, payload, axis: str, axis_size: int, weights,
             split_axis: str | None, split_size: int, scatter: bool):
  """Generator: yields one leaf's collective (a ``collectives.Call``), returns its
  f32 aggregate; a reduce-scatter returns at once (it is never fused).

  ``sent`` = D(payload), f32 like the leaf: identity payloads (float32) are
  all-reduced as ``sent / axis_size`` (or ``sent * weights[member]``); every
  other payload is all-gathered in its wire dtype and each one decoded before the
  float32 sum (hfl.compress.ef.aggregate).
  """
  if reduces(c):
    # The plain mean divides the sum (one pass fewer than dividing every member's
    # value first); weights multiply each member's value before the sum.
    mine = sent if weights is None else sent * weights[jax.lax.axis_index(axis)]
    mean = (lambda a: a / axis_size) if weights is None else (lambda a: a)
    if scatter:
      return mean(collectives.psum_scatter_split(mine, axis, axis_size))
    if split_axis is None:
      return mean((yield collectives.Call(lambda a: jax.lax.psum(a, axis), mine,
                                          ('psum', axis))))
    return mean((yield collectives.Call(
        lambda a: collectives.psum_split(a, axis, split_axis, split_size), mine,
        ('psum_split', axis, split_axis, split_size))))
  if split_axis is None:
    gathered = yield collectives.Call(
        lambda a: collectives.all_gather(a, axis), payload,
        ('all_gather', axis), pack_bytes=True)
  else:
    gathered = yield collectives.Call(
        lambda a: collectives.all_gather_split(a, axis, split_axis, split_size), payload,
        ('all_gather_split', axis, split_axis, split_size), pack_bytes=True)
  return ef.aggregate(c, gathered, axis_size, weights)


def exchange(comps: Sequence[base.Compressor], xs, link: LinkState, key, axis: str,
             axis_size: int, *, weights=None, split_axis: str | None = None,
             split_size: int = 1, scatter: Sequence[bool] | None = None,
             key_offset: int = 0, fuse: bool = False) -> Exchanged:
  """Error-feedback-compresses every leaf of ``xs``, sends it over ``axis``, aggregates.

  Every member sends the encoding of its own unscaled p = x + γ e
  (hfl.compress.ef.tree_ef_step; γ from the compressor state's ``ef_gamma``, CO3's
  decaying memory, else 1; no residual for lossless compressors), keeps
  e <- p - D(payload), and the receiver adds exactly D(payload) of each member in
  float32 with the member's weight applied in float32: Σ_m w_m (received_m + e_m)
  = Σ_m w_m p_m up to float32 rounding, for every compressor, link, W and weights
  (error feedback: Seide et al. 2014; Stich et al. 2018). Identity payloads are
  summed by an all-reduce; every other payload is all-gathered in its wire dtype
  and each one decoded before the sum (:func:`hfl.collectives.reduces`).

  Args:
    comps: one compressor per leaf of ``xs``.
    xs: pytree of f32 leaves, this member's values.
    link: this member's :class:`LinkState` (residual like ``xs``).
    key: PRNG key; leaf i encodes with ``fold_in(key, key_offset + i)``.
    axis: mesh axis name; axis_size: members on it.
    weights: f32[axis_size] aggregation weights; None for the plain mean.
    split_axis: a mesh axis over which ``xs`` is identical; its members then each
      send 1/split_size of every payload and re-gather the rest over it
      (hfl.collectives.all_gather_split / psum_split). split_size: its members.
    scatter: per leaf, reduce-scatter instead of all-reduce (ZeRO-1; the leaf's
      compressor must be lossless and linear): that leaf's aggregate is this
      member's slice f32[ceil(size / axis_size)] and its bits those of the padded
      payload handed to the reduce-scatter.
    fuse: run all leaves' collectives fused (hfl.collectives.run_fused), one per
      kind and dtype; otherwise one per leaf.

  Returns:
    :class:`Exchanged`.

  Raises:
    ValueError: a scattered leaf whose compressor is not lossless and linear, or
      ``scatter`` with ``split_axis``/``weights``.
  """
  leaves, treedef = jax.tree.flatten(xs)
  scatter = list(scatter) if scatter is not None else [False] * len(leaves)
  for c, sc in zip(comps, scatter):
    if sc and not (reduces(c) and split_axis is None and weights is None):
      raise ValueError(f'exchange: scatter needs a lossless linear compressor (got {c.name}) '
                       'and no split_axis/weights')
  xs32 = [x.astype(jnp.float32) for x in leaves]
  payloads, residual, states = ef.tree_ef_step(
      comps, treedef.unflatten(xs32), link.residual, link.compressor_state, key,
      key_offset=key_offset)
  sent = [c.decode(p) for c, p in zip(comps, payloads)]  # what every receiver gets
  gens = [_collect(c, s, p, axis, axis_size, weights, split_axis, split_size, sc)
          for c, s, p, sc in zip(comps, sent, payloads, scatter)]
  aggs = collectives.run_fused(gens) if fuse else [collectives.run(g) for g in gens]
  bits = [axis_size * chunk_bits(p, axis_size) if sc else c.wire_bits(p)
          for c, p, sc in zip(comps, payloads, scatter)]
  # With split_axis every value here is identical over it: each member checks 1/split_size.
  part = None if split_axis is None else (jax.lax.axis_index(split_axis), split_size)
  checks = [Check(x, p, s, r, c.lossless, part) for c, x, p, s, r in
            zip(comps, xs32, payloads, sent, treedef.flatten_up_to(residual))]
  return Exchanged(treedef.unflatten(aggs), LinkState(residual, states), bits, checks,
                   payloads)


def downlink(comps: Sequence[base.Compressor], qs, link: LinkState, key,
             parts: Sequence | None = None) -> Exchanged:
  """The PS's downlink: error-feedback-compresses every leaf of the aggregate ``qs``.

  p = q + γ e; payload = C(p); e <- p - D(payload) (no residual for lossless
  compressors; DoubleSqueeze-style error feedback at the PS, Tang et al. 2019);
  every worker of the DC receives D(payload). The PS is replicated on the DC's
  workers (SPMD), so nothing crosses a collective here: each worker decodes the
  same payload.

  Args:
    comps: one downlink compressor per leaf.
    qs: pytree of f32 leaves (or slices, for an elementwise lossless compressor),
      the aggregate.
    link: the PS's :class:`LinkState` (residual like ``qs``).
    key: PRNG key; leaf i encodes with ``fold_in(key, i)``.
    parts: per leaf, None or :func:`finiteness_flags`' ``part`` (the leaf's values
      are identical on the DC's workers, each checks its share); default: None.

  Returns:
    :class:`Exchanged` whose ``agg`` is D(payload), what every worker receives.
  """
  leaves, treedef = jax.tree.flatten(qs)
  parts = [None] * len(leaves) if parts is None else list(parts)
  payloads, residual, states = ef.tree_ef_step(comps, qs, link.residual,
                                               link.compressor_state, key)
  received = [c.decode(p) for c, p in zip(comps, payloads)]
  checks = [Check(q, p, r, e, c.lossless, pt) for c, q, p, r, e, pt in
            zip(comps, leaves, payloads, received, treedef.flatten_up_to(residual), parts)]
  return Exchanged(treedef.unflatten(received), LinkState(residual, states),
                   [c.wire_bits(p) for c, p in zip(comps, payloads)], checks, payloads)


class LinkCharge(NamedTuple):
  """One link's accounting of one program on one device.

  Attributes:
    static: Python int, bits whose size is fixed at trace time.
    dynamic: list per leaf, int32[] bits of variable-length codes (0 otherwise).
    checks: list per leaf, its :class:`Check`; a tuple of Checks, whose flags are
      OR'ed (e.g. a second payload of the same leaf); or None where the link sent
      nothing.
  """
  static: int
  dynamic: list
  checks: list


def is_static(bits) -> bool:
  """Whether a payload's bit count is a Python int fixed at trace time (not an int32[]
  count of a variable-length code)."""
  return isinstance(bits, (int, np.integer))


def link_charge(bits: Sequence, checks: Sequence, extra: int = 0) -> LinkCharge:
  """Splits per-leaf ``bits`` into a static total (plus ``extra``) and per-leaf
  int32 dynamic counts; ``checks``: per leaf, a :class:`Check` or None."""
  return LinkCharge(
      int(extra) + sum(int(b) for b in bits if is_static(b)),
      [jnp.int32(0) if is_static(b) else jnp.int32(0) + b.astype(jnp.int32) for b in bits],
      list(checks))


def no_charge(num_leaves: int) -> LinkCharge:
  """A link that moves nothing in this program (the WAN without a round)."""
  return LinkCharge(0, [jnp.int32(0)] * num_leaves, [None] * num_leaves)


NUM_LINKS = 4  # uplink, downlink, WAN, the round's correction (LINK_NAMES)


FLAG_BITS_PER_LEAF = 4  # room per leaf and link: a lossy check's 3, or several checks'


def flag_words(num_leaves: int) -> int:
  """uint32 words of finiteness flags in the metrics: room for
  :data:`FLAG_BITS_PER_LEAF` flag bits per leaf and link (a lossy check takes three,
  a lossless one one), so every program of a step, whatever its compressors'
  lossless-ness, packs its metrics to the same length."""
  return -(-FLAG_BITS_PER_LEAF * NUM_LINKS * num_leaves // 32)


def unpack_flags(words, layout: Sequence, num_leaves: int) -> np.ndarray:
  """int32[..., NUM_LINKS, L] per-leaf flags (those of :func:`finiteness_flags`) from
  the metrics' flag words int32[..., n] (:func:`fused_flags`) and the program's
  :func:`flag_layout` ``layout``."""
  words = np.asarray(words).astype(np.uint32)
  lead = words.shape[:-1]
  flags = np.zeros(lead + (NUM_LINKS * num_leaves,), np.int64)
  if layout:
    j = np.arange(len(layout))
    on = (words[..., j // 32] >> (j % 32).astype(np.uint32)) & 1  # [..., bits]
    where = np.array([k * num_leaves + i for k, i, _ in layout])
    masks = np.array([mask for _, _, mask in layout], np.int64)
    for flag in FLAG_NAMES:  # OR: whether any set bit of a (link, leaf) carries ``flag``
      onto = np.zeros((len(layout), NUM_LINKS * num_leaves), np.int64)
      onto[j, where] = (masks & flag) != 0
      flags |= np.where(on.astype(np.int64) @ onto > 0, flag, 0)
  return flags.reshape(lead + (NUM_LINKS, num_leaves)).astype(np.int32)


LINK_NAMES = ('uplink', 'downlink', 'WAN', "round's correction through the downlink")


def first_nonfinite(flags, leaf_names: Sequence[str] | None = None) -> str | None:
  """Where the first non-finite value of one iteration was, in words, or None.

  Args:
    flags: int32[D, W, NUM_LINKS, L] from :func:`hfl.step.host_metrics`.
    leaf_names: the L leaves' pytree paths (default: their indices).

  Returns:
    e.g. ``"input of leaf ['Dense_0']['kernel'] on the uplink (DC 0, worker 2)"``
    (the input is the gradient on the uplink, the aggregate on the downlink, the
    pseudo-gradient on the WAN, the correction on the round's correction; all but
    the uplink name the DC only, whose workers each check a share of them) — links
    in the order of :data:`LINK_NAMES`; None when every value was finite.
  """
  flags = np.asarray(flags)
  for link in range(flags.shape[2]):
    bad = np.argwhere(flags[:, :, link, :] != 0)
    if len(bad):
      d, w, leaf = (int(v) for v in bad[0])
      bits = flags[d, w, link, leaf] if link == 0 else np.bitwise_or.reduce(
          flags[d, :, link, leaf])
      what = [name for bit, name in FLAG_NAMES.items() if bits & bit]
      name = leaf if leaf_names is None else leaf_names[leaf]
      where = f'DC {d}, worker {w}' if link == 0 else f'DC {d}'
      return f'{" and ".join(what)} of leaf {name} on the {LINK_NAMES[link]} ({where})'
  return None
