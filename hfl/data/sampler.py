"""Stateless per-worker minibatch indices.

Worker (d, w) reads an endless stream: its shard in the order of permutation
``perm_0``, then ``perm_1``, ..., where epoch ``e`` uses
``np.random.default_rng([seed, d, w, e]).permutation(shard_size)``. Step ``s``
takes stream positions ``[s*B, (s+1)*B)``, so a batch may span two epochs and
within one epoch every sample of the shard is seen exactly once.

:func:`batch_indices` is a pure function of (partition, batch_size, step,
seed): a resumed run sees exactly the same batches as an uninterrupted one,
with no sampler state to checkpoint. Epoch permutations are kept in a small
LRU cache for speed (about 0.1 ms per call for 8 workers of 7,500 samples);
the cache never changes a result.
"""

import functools

import numpy as np

from hfl.data.partition import Partition

_CACHE_SIZE = 512


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _epoch_permutation(seed: int, d: int, w: int, epoch: int,
                       size: int) -> np.ndarray:
  """Read-only int64 [size]: the order of worker (d, w)'s shard in ``epoch``."""
  perm = np.random.default_rng([seed, d, w, epoch]).permutation(size)
  perm.flags.writeable = False
  return perm


def check_batch_size(part: Partition, batch_size: int) -> None:
  """Checks that every worker's shard can fill one batch.

  Args:
    part: the Partition.
    batch_size: ``train.batch_size``, samples per worker per step.

  Raises:
    ValueError: batch_size < 1, or larger than the smallest worker shard (the
      message names ``train.batch_size``, the value, the smallest shard size
      and its worker).
  """
  sizes = np.asarray(part.worker_sizes)
  d, w = np.unravel_index(int(np.argmin(sizes)), sizes.shape)
  smallest = int(sizes[d, w])
  if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
    raise ValueError(f'train.batch_size={batch_size!r} must be an integer '
                     f'>= 1 (the smallest worker shard has {smallest} '
                     'samples).')
  if batch_size > smallest:
    raise ValueError(
        f'train.batch_size={batch_size} exceeds the smallest worker shard: '
        f'worker (dc={d}, worker={w}) holds {smallest} samples. Lower '
        'train.batch_size, or use fewer workers / a larger '
        'dataset.dirichlet_alpha for larger shards.')


def batch_indices(part: Partition, batch_size: int, step: int,
                  seed: int) -> np.ndarray:
  """Training-set indices of every worker's minibatch at ``step``.

  Args:
    part: the Partition (D DCs, W workers each).
    batch_size: B >= 1, samples per worker; may exceed a shard (the batch
      then spans several epochs), though training checks it does not with
      :func:`check_batch_size`.
    step: s >= 0, the intra-DC iteration.
    seed: non-negative integer seed.

  Returns:
    int64 [D, W, B]: entry [d, w] holds indices into the training set, all in
    worker (d, w)'s shard, at stream positions [s*B, (s+1)*B).

  Raises:
    ValueError: batch_size < 1, step < 0, seed < 0, or an empty shard.
  """
  if batch_size < 1:
    raise ValueError(f'train.batch_size={batch_size!r} must be >= 1.')
  if step < 0:
    raise ValueError(f'batch_indices: step={step!r} must be >= 0.')
  if seed < 0:
    raise ValueError(f'seed={seed!r} must be >= 0.')
  seed, batch_size, step = int(seed), int(batch_size), int(step)
  shards = part.worker_indices
  num_dcs, workers = len(shards), len(shards[0])
  out = np.empty((num_dcs, workers, batch_size), dtype=np.int64)
  start = step * batch_size
  for d in range(num_dcs):
    for w in range(workers):
      shard = shards[d][w]
      n = shard.shape[0]
      if n == 0:
        raise ValueError(f'batch_indices: worker (dc={d}, worker={w}) has an '
                         'empty shard.')
      first, last = divmod(start, n)[0], (start + batch_size - 1) // n
      offset = start - first * n
      if first == last:  # the common case: inside one epoch.
        perm = _epoch_permutation(seed, d, w, first, n)
        out[d, w] = shard[perm[offset:offset + batch_size]]
        continue
      pos, filled = offset, 0
      for epoch in range(first, last + 1):
        perm = _epoch_permutation(seed, d, w, epoch, n)
        take = min(n - pos, batch_size - filled)
        out[d, w, filled:filled + take] = shard[perm[pos:pos + take]]
        filled += take
        pos = 0
  return out
