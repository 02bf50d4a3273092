"""Streaming DiLoCo: fragments of the model that sync on a staggered, overlapped schedule.

Source: Douillard et al. 2025, "Streaming DiLoCo with overlapping communication:
Towards a Distributed Free Lunch", arXiv:2501.18512, Sec. 2 (streaming partial
updates; overlapping communication with computation; quantised outer gradients),
and, for ``eager``, Kale et al. 2025, "Eager Updates For Overlapped Communication
and Computation in DiLoCo", arXiv:2502.12996.

This module is host-side and pure (no device code): which leaves form each
fragment, and which fragment syncs / merges at which iteration. The device side
is ``hfl.step.stream_event``; the time model is ``hfl.network.exposed_comm_time``
and ``hfl.network.wan_bandwidth_for_utilisation``.

**Fragments** (:func:`partition`). The parameter pytree is cut into P fragments
by layer order: a *unit* is one top-level entry of the parameter dict (a flax
module: an embedding, a transformer block, a ResNet stage's conv, the head), the
units are ordered by the natural sort of their names (``Block_2`` before
``Block_10``; flax names a module's children ``Class_i`` in creation order), a
unit is never split, and the fragments are contiguous runs of units whose largest
parameter count is as small as possible (the linear-partition problem, solved
exactly by dynamic programming; ties go to the earliest cut). Within a fragment
the leaves keep ``jax.tree.leaves`` order. Each fragment's outer state is its own:
its leaves of the global copy and of the WAN residual, and its own outer
optimizer state (:func:`init_outer`: ``outer.init`` of the fragment's leaf list).

**Schedule** (:func:`event_at`). With K = H inner iterations per fragment
(``sync.k``), P fragments and τ overlap iterations, iterations are numbered
s = 1, 2, ... (s = the iterations done after it). Fragment p's exchange starts at
the end of every iteration s > 0 with s ≡ p·H/P (mod H) (so fragment 0 syncs at
H, 2H, ..., as periodic DiLoCo; fragment p first after p·H/P iterations) and is
merged at the end of iteration s + τ:

    x_p <- α x_p + (1 - α) x_global_p        (α = 0 replaces; Streaming DiLoCo)

With ``eager``, the DC applies its own outer step at the sync iteration as a
stand-in, x̃_p = outer(x_global_p, Δ_d), trains on from it, and at the merge
corrects it by the true global update: x_p <- x_p + (x_global_p_new - x̃_p) (the
τ local iterations are kept; a per-DC variant of Kale et al.'s eager update,
which mixes the local outer gradient with the delayed global one).

Requirements (:func:`check`): P divides H, 0 <= τ < H/P (at most one fragment in
flight, and its merge comes before the next fragment's sync), 0 <= α <= 1,
``eager`` needs τ >= 1. P = 1, τ = 0, α = 0 is periodic DiLoCo, bitwise.
"""

import re
from typing import NamedTuple, Sequence

import jax
import numpy as np


class Event(NamedTuple):
  """What the end of one iteration does (a static key of the compiled step).

  Attributes:
    sync: the fragment whose exchange starts (-1: none).
    merge: the fragment merged into the DC models (-1: none); with τ = 0 the
      fragment that syncs in the same iteration.
  """
  sync: int = -1
  merge: int = -1


class Spec(NamedTuple):
  """Static description of the streaming strategy (hfl.step reads it at trace time).

  Attributes:
    fragments: tuple of P tuples of leaf indices (``jax.tree.leaves`` order).
    alpha: mixing factor α in [0, 1] (0: replace the local fragment).
    eager: apply the DC's own outer step at the sync iteration (needs τ >= 1).
    k: ``sync.k``, iterations between two syncs of the same fragment.
    overlap_steps: τ, iterations between a fragment's sync and its merge.
  """
  fragments: tuple
  alpha: float = 0.0
  eager: bool = False
  k: int = 0
  overlap_steps: int = 0

  def event(self, s: int) -> 'Event':
    """The :class:`Event` at the end of iteration ``s`` (1-based; :func:`event_at`)."""
    return event_at(s, self.k, len(self.fragments), self.overlap_steps)


def check(k: int, num_fragments: int, overlap_steps: int, alpha: float,
          eager: bool) -> None:
  """Raises ValueError naming the ``sync.*`` field when the combination is invalid.

  Args:
    k: H = ``sync.k``; num_fragments: P = ``sync.fragments``; overlap_steps: τ
    = ``sync.overlap_steps``; alpha: ``sync.mixing_alpha``; eager: ``sync.eager``.
  """
  p, tau = num_fragments, overlap_steps
  if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or p < 1:
    raise ValueError(f'sync.fragments={p!r} must be an integer >= 1 (1: the whole model).')
  if k % p:
    raise ValueError(f'sync.fragments={p} must divide sync.k={k} (one fragment syncs '
                     f'every sync.k / sync.fragments iterations).')
  if isinstance(tau, bool) or not isinstance(tau, (int, np.integer)) or not 0 <= tau < k // p:
    raise ValueError(f'sync.overlap_steps={tau!r} must be an integer in [0, sync.k / '
                     f'sync.fragments) = [0, {k // p}) (one fragment in flight at a time).')
  if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1:
    raise ValueError(f'sync.mixing_alpha={alpha!r} must be a number in [0, 1] '
                     '(0: the merged fragment replaces the local one).')
  if not isinstance(eager, (bool, np.bool_)):
    raise ValueError(f'sync.eager={eager!r} must be True or False.')
  if eager and tau == 0:
    raise ValueError('sync.eager=True needs sync.overlap_steps >= 1 (with no overlap '
                     'the global update arrives at once: nothing to stand in for).')


def enabled(sync) -> bool:
  """Whether a ``sync`` config section asks for Streaming DiLoCo (any field off its
  default: ``fragments`` 1, ``overlap_steps`` 0, ``mixing_alpha`` 0, ``eager`` False;
  absent fields, as in older runs' configs, count as their defaults)."""
  return (sync.get('fragments', 1) != 1 or sync.get('overlap_steps', 0) != 0
          or sync.get('mixing_alpha', 0.0) != 0 or bool(sync.get('eager', False)))


def spec_from_config(sync, params) -> Spec | None:
  """The :class:`Spec` of a validated ``sync`` section (None when not :func:`enabled`)."""
  if not enabled(sync):
    return None
  return Spec(partition(params, int(sync.fragments)), float(sync.mixing_alpha),
              bool(sync.eager), int(sync.k), int(sync.get('overlap_steps', 0)))


def sync_fragment(s: int, k: int, num_fragments: int) -> int:
  """The fragment whose exchange starts at the end of iteration ``s`` (1-based), or -1."""
  period = k // num_fragments
  if s <= 0 or s % period:
    return -1
  return (s // period) % num_fragments


def event_at(s: int, k: int, num_fragments: int, overlap_steps: int) -> Event:
  """The :class:`Event` at the end of iteration ``s`` (module docstring's schedule)."""
  return Event(sync_fragment(s, k, num_fragments),
               sync_fragment(s - overlap_steps, k, num_fragments))


def _natural(name: str):
  return [int(t) if t.isdigit() else t for t in re.split(r'(\d+)', name)]


def units(params) -> list[tuple[str, list[int], int]]:
  """The layer units of a parameter pytree, in layer order.

  Returns:
    list of ``(name, leaf indices, entries)``: one per top-level key (natural sort
    of the names; a pytree that is not a dict is one unit per leaf).
  """
  paths = jax.tree_util.tree_flatten_with_path(params)[0]
  groups: dict[str, list[int]] = {}
  sizes: dict[str, int] = {}
  for i, (path, leaf) in enumerate(paths):
    head = path[0] if path else None
    name = str(getattr(head, 'key', getattr(head, 'idx', i)))
    groups.setdefault(name, []).append(i)
    sizes[name] = sizes.get(name, 0) + int(np.prod(np.shape(leaf), dtype=np.int64))
  return [(n, groups[n], sizes[n]) for n in sorted(groups, key=_natural)]


def _linear_partition(sizes: Sequence[int], parts: int) -> list[int]:
  """Cut points of ``sizes`` into ``parts`` contiguous non-empty runs minimising the
  largest run sum (exact dynamic programme; the earliest cut wins ties)."""
  n = len(sizes)
  pre = np.concatenate([[0], np.cumsum(sizes)])
  best = np.full((parts + 1, n + 1), np.inf)
  cut = np.zeros((parts + 1, n + 1), np.int64)
  best[0, 0] = 0
  for p in range(1, parts + 1):
    for j in range(p, n + 1):
      for i in range(p - 1, j):
        cost = max(best[p - 1, i], pre[j] - pre[i])
        if cost < best[p, j]:
          best[p, j], cut[p, j] = cost, i
  bounds, j = [n], n
  for p in range(parts, 0, -1):
    j = int(cut[p, j])
    bounds.append(j)
  return bounds[::-1]


def partition(params, num_fragments: int) -> tuple:
  """Partitions a parameter pytree into fragments by layer order (module docstring).

  Args:
    params: the parameter pytree (arrays or ShapeDtypeStructs; shapes only).
    num_fragments: P >= 1.

  Returns:
    tuple of P tuples of leaf indices (``jax.tree.leaves(params)`` order, sorted
    within each fragment); together they hold every leaf once.

  Raises:
    ValueError: P exceeds the number of units (naming ``sync.fragments``).
  """
  us = units(params)
  if num_fragments > len(us):
    raise ValueError(f'sync.fragments={num_fragments} exceeds the model\'s {len(us)} '
                     f'layer units ({", ".join(u[0] for u in us)}); a unit is never split.')
  b = _linear_partition([u[2] for u in us], num_fragments)
  return tuple(tuple(sorted(i for u in us[b[p]:b[p + 1]] for i in u[1]))
               for p in range(num_fragments))


def describe(fragments: tuple, params) -> str:
  """A markdown table (fragment, units, leaves, entries, first sync) for logging."""
  us = units(params)
  leaves = jax.tree.leaves(params)
  lines = ['| fragment | units | leaves | entries |', '|---|---|---|---|']
  for p, frag in enumerate(fragments):
    names = [name for name, idx, _ in us if set(idx) & set(frag)]
    size = sum(int(np.prod(np.shape(leaves[i]), dtype=np.int64)) for i in frag)
    lines.append(f'| {p} | {", ".join(names)} | {len(frag)} | {size} |')
  return '\n'.join(lines)


def _is_none(x) -> bool:
  return x is None


def select(tree, fragment: Sequence[int]) -> list:
  """The fragment's leaves of a params-like pytree, as a list. A None in place of a
  leaf (a lossless link's residual, hfl.links.LinkState) counts as a leaf."""
  leaves = jax.tree.leaves(tree, is_leaf=_is_none)
  return [leaves[i] for i in fragment]


def replace(tree, fragment: Sequence[int], new: Sequence):
  """``tree`` with the fragment's leaves replaced by ``new`` (same structure; None
  counts as a leaf, as in :func:`select`)."""
  leaves, treedef = jax.tree.flatten(tree, is_leaf=_is_none)
  leaves = list(leaves)
  for i, x in zip(fragment, new):
    leaves[i] = x
  return treedef.unflatten(leaves)


def init_outer(outer, params, fragments: tuple) -> tuple:
  """Per-fragment outer optimizer states: ``outer.init`` of each fragment's leaf list."""
  return tuple(outer.init(select(params, f)) for f in fragments)
