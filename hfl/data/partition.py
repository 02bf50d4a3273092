"""Splitting a training set across datacenters and their workers.

Two methods (config field ``dataset.partition``):

* ``'iid'``: a seeded shuffle split as evenly as possible, first across the
  ``D`` DCs, then across each DC's ``W`` workers (sizes differ by at most one).
* ``'dirichlet'``: label skew with concentration ``alpha``
  (``dataset.dirichlet_alpha``), hierarchical like the system it models: each
  class's samples are split among the DCs with proportions ~ Dir(alpha); then,
  inside each DC, each class's samples *of that DC* are split among its workers
  with proportions ~ Dir(alpha). Small alpha -> each DC/worker sees few
  classes; large alpha -> close to IID.

Dirichlet remedy for empty clients: a draw in which some DC holds fewer than
``min_size * W`` samples, or some worker fewer than ``min_size``, is rejected
and redrawn (a bounded number of times; then ValueError). Non-finite or
all-zero proportion vectors (possible underflow at tiny alpha) are rejected the
same way, so no NaN ever reaches the split. Sample counts come from
floor(cumsum(p) * n_k), so every sample of a class is assigned exactly once.

Everything is deterministic given ``seed``; every sample lands in exactly one
worker's shard (the union of shards is a permutation of ``range(N)``).
"""

from typing import NamedTuple, Optional

import numpy as np

METHODS = ('iid', 'dirichlet')

# Rejection sampling bounds for the Dirichlet remedy.
_MAX_TRIES = 1000     # draws per level (DCs, or one DC's workers)
_MAX_RESTARTS = 20    # full restarts when a DC's workers cannot be filled
_DEFAULT_MIN_SIZE = 10


class Partition(NamedTuple):
  """Per-worker shards of the training set.

  Attributes:
    worker_indices: ``[D][W]`` tuple of tuples of int64 arrays, sorted
      ascending: indices into the training set held by worker ``w`` of DC
      ``d``. Disjoint; their union is ``range(N)``.
    dc_sizes: int64 [D], samples per DC (FedAvg weights are n_d / n).
    worker_sizes: int64 [D, W], samples per worker.
  """
  worker_indices: tuple
  dc_sizes: np.ndarray
  worker_sizes: np.ndarray


def _check_args(labels, num_dcs, workers_per_dc, method, alpha, seed):
  """Validates partition() arguments; returns labels as int64 [N]."""
  labels = np.asarray(labels)
  if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(f'partition: labels must be a 1-D integer array, got '
                     f'{labels.dtype} {labels.shape}.')
  if labels.size and labels.min() < 0:
    raise ValueError(f'partition: labels must be >= 0, got {labels.min()}.')
  for field, v in (('mesh.num_dcs', num_dcs),
                   ('mesh.workers_per_dc', workers_per_dc)):
    if not isinstance(v, (int, np.integer)) or v < 1:
      raise ValueError(f'{field} must be an integer >= 1, got {v!r}.')
  if method not in METHODS:
    raise ValueError(f'dataset.partition={method!r} is not supported; '
                     f'allowed values: {", ".join(METHODS)}.')
  try:
    alpha_ok = bool(np.isfinite(alpha) and alpha > 0)
  except TypeError:
    alpha_ok = False
  if method == 'dirichlet' and not alpha_ok:
    raise ValueError(
        f'dataset.dirichlet_alpha={alpha!r} must be a finite number > 0 for '
        "dataset.partition='dirichlet' (small, e.g. 0.1: strong label skew; "
        'large, e.g. 100: nearly IID).')
  if not isinstance(seed, (int, np.integer)) or seed < 0:
    raise ValueError(f'seed must be an integer >= 0, got {seed!r}.')
  clients = num_dcs * workers_per_dc
  if labels.size < clients:
    raise ValueError(
        f'partition: {labels.size} training samples cannot give each of '
        f'mesh.num_dcs * mesh.workers_per_dc = {num_dcs} * {workers_per_dc} '
        f'= {clients} workers at least one sample.')
  return labels.astype(np.int64, copy=False)


def _iid(n, num_dcs, workers_per_dc, seed):
  """Even seeded split; returns a [D][W] nested list of index arrays."""
  perm = np.random.default_rng([seed, 0]).permutation(n)
  return [[np.sort(w) for w in np.array_split(dc, workers_per_dc)]
          for dc in np.array_split(perm, num_dcs)]


def _draw_counts(class_counts, parts, alpha, min_size, rng):
  """Draws per-class Dirichlet splits until every part holds >= min_size.

  Args:
    class_counts: int64 [K], samples of each class to split.
    parts: number of parts P.
    alpha: Dirichlet concentration (> 0).
    min_size: minimum samples per part.
    rng: numpy Generator (advanced in place).

  Returns:
    int64 [K, P] counts whose rows sum to ``class_counts``, or None if no
    draw within the bound satisfied ``min_size``.
  """
  k = class_counts.shape[0]
  if class_counts.sum() < parts * min_size:
    return None
  for _ in range(_MAX_TRIES):
    props = rng.dirichlet(np.full(parts, alpha), size=k)  # [K, P]
    sums = props.sum(axis=1, keepdims=True)
    if not (np.all(np.isfinite(props)) and np.all(sums > 0)):
      continue  # underflow at tiny alpha: reject, never divide by zero.
    cum = np.cumsum(props / sums, axis=1)
    cuts = np.floor(cum * class_counts[:, None]).astype(np.int64)
    cuts[:, -1] = class_counts  # rounding: the last part takes the rest.
    cuts = np.minimum(np.maximum.accumulate(cuts, axis=1),
                      class_counts[:, None])
    counts = np.diff(cuts, axis=1, prepend=0)
    if counts.sum(axis=0).min() >= min_size:
      return counts
  return None


def _dirichlet(labels, num_dcs, workers_per_dc, alpha, seed, min_size):
  """Hierarchical Dirichlet split; returns a [D][W] nested list of arrays."""
  rng = np.random.default_rng([seed, 1])
  _, inverse = np.unique(labels, return_inverse=True)
  order = np.argsort(inverse, kind='stable')
  class_counts = np.bincount(inverse).astype(np.int64)  # [K]
  starts = np.concatenate([[0], np.cumsum(class_counts)])
  # Shuffle once; every later split takes contiguous runs of these.
  by_class = [rng.permutation(order[starts[k]:starts[k + 1]])
              for k in range(class_counts.shape[0])]
  counts = None
  for _ in range(_MAX_RESTARTS):
    dc_counts = _draw_counts(class_counts, num_dcs, alpha,
                             min_size * workers_per_dc, rng)  # [K, D]
    if dc_counts is None:
      break
    per_dc = [_draw_counts(dc_counts[:, d], workers_per_dc, alpha, min_size,
                           rng) for d in range(num_dcs)]  # D x [K, W]
    if all(c is not None for c in per_dc):
      counts = np.stack(per_dc, axis=1)  # [K, D, W]
      break
  if counts is None:
    raise ValueError(
        f'dataset.dirichlet_alpha={alpha!r} with mesh.num_dcs={num_dcs} and '
        f'mesh.workers_per_dc={workers_per_dc}: could not draw a Dirichlet '
        f'partition of {labels.size} samples ({class_counts.shape[0]} '
        f'classes) that gives every worker at least {min_size} samples '
        f'after {_MAX_TRIES} draws per level and {_MAX_RESTARTS} restarts. '
        'Raise dataset.dirichlet_alpha, use fewer DCs/workers, or lower '
        'train.batch_size (each worker is asked for at least one batch).')
  flat = counts.reshape(counts.shape[0], -1)  # [K, D*W], DC-major.
  bounds = np.concatenate(
      [np.zeros((flat.shape[0], 1), np.int64), np.cumsum(flat, axis=1)],
      axis=1)
  shards = []
  for c in range(flat.shape[1]):
    parts = [by_class[k][bounds[k, c]:bounds[k, c + 1]]
             for k in range(flat.shape[0])]
    shards.append(np.sort(np.concatenate(parts)))
  return [shards[d * workers_per_dc:(d + 1) * workers_per_dc]
          for d in range(num_dcs)]


def partition(labels: np.ndarray, num_dcs: int, workers_per_dc: int,
              method: str, alpha: float, seed: int,
              min_size: Optional[int] = None) -> Partition:
  """Partitions a training set across DCs and their workers.

  Args:
    labels: int [N], class of each training sample (values >= 0).
    num_dcs: D, ``mesh.num_dcs``.
    workers_per_dc: W, ``mesh.workers_per_dc``.
    method: ``dataset.partition``, one of ``METHODS``.
    alpha: ``dataset.dirichlet_alpha`` (> 0); ignored for ``'iid'``.
    seed: non-negative integer seed.
    min_size: Dirichlet only: minimum samples per worker (a DC needs
      ``min_size * W``). None means ``min(10, N // (D * W))``. The training
      loop may pass its per-worker batch size here.

  Returns:
    A Partition; shard indices are int64 and sorted.

  Raises:
    ValueError: unknown method (names ``dataset.partition``), alpha <= 0
      (names ``dataset.dirichlet_alpha``), bad mesh sizes or seed, fewer
      samples than workers, or no Dirichlet draw within the bound gives every
      worker ``min_size`` samples.
  """
  labels = _check_args(labels, num_dcs, workers_per_dc, method, alpha, seed)
  seed = int(seed)
  num_dcs, workers_per_dc = int(num_dcs), int(workers_per_dc)
  n = labels.shape[0]
  if method == 'iid':
    shards = _iid(n, num_dcs, workers_per_dc, seed)
  else:
    if min_size is None:
      min_size = min(_DEFAULT_MIN_SIZE, n // (num_dcs * workers_per_dc))
    shards = _dirichlet(labels, num_dcs, workers_per_dc, float(alpha), seed,
                        max(1, int(min_size)))
  worker_indices = tuple(tuple(s.astype(np.int64, copy=False) for s in dc)
                         for dc in shards)
  worker_sizes = np.array([[s.shape[0] for s in dc] for dc in worker_indices],
                          dtype=np.int64)
  return Partition(worker_indices, worker_sizes.sum(axis=1), worker_sizes)


def label_counts(part: Partition, labels: np.ndarray,
                 num_classes: int) -> np.ndarray:
  """Per-worker label histogram, for logging and checks.

  Args:
    part: a Partition of ``labels``.
    labels: int [N].
    num_classes: K.

  Returns:
    int64 [D, W, K]: samples of class k held by worker (d, w).
  """
  labels = np.asarray(labels)
  return np.array(
      [[np.bincount(labels[idx], minlength=num_classes) for idx in dc]
       for dc in part.worker_indices], dtype=np.int64)
