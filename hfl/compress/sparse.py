"""Sparsifying compressors: exact top-k, threshold-estimated top-k and random-k.

All three send ``k`` (value, index) pairs of a flattened leaf of ``size`` entries,
``k = max(1, min(size, round(density * size)))`` (never 0; ``density = 1`` keeps
everything). Payload (static shapes)::

  {'values':  values_dtype[k]   (float32 by default),
   'indices': uint16[k] if size <= 65536 else int32[k]}

so the wire cost is ``k * (bits(values_dtype) + bits(index))`` bits, e.g.
64 bits per kept entry for a large float32 leaf (so a 95% compression ratio is
density ~2.5% with 32-bit indices). Indices within a payload are
distinct, so decoding is a scatter (``set``) into zeros.

References:
  * Top-k sparsification with error feedback: Stich, Cordonnier & Jaggi,
    "Sparsified SGD with Memory", NeurIPS 2018; Aji & Heafield, "Sparse
    Communication for Distributed Gradient Descent", EMNLP 2017.
  * Threshold estimated from a random sample: Lin et al., "Deep Gradient
    Compression", ICLR 2018, Sec. 3 / Appendix (sample 0.1%-1% of the entries,
    top-k on the sample to estimate the threshold).
  * Random-k: Stich et al. 2018 (rand_k operator, Definition 2.1 / Lemma A.1:
    scaling by size/k makes it unbiased).
"""

import math

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from hfl.compress.base import Compressor, EmptyState
from hfl.compress.registry import register

# Threshold variant: sample so that ~this many sample entries exceed the true
# k-th largest magnitude (relative std of the estimate ~ 1/sqrt of it).
_SAMPLE_HITS = 128
_MIN_SAMPLE = 2048
_Z_LOW = 3.0    # threshold rank set this many std above the mean: P(count < k) ~ 1e-3
_Z_HIGH = 4.5   # candidate buffer this many std above the expected count
_WORD = 32      # bits per mask word


def num_kept(size: int, density: float) -> int:
  """Entries kept by a sparsifier: ``max(1, min(size, round(density * size)))``.

  Rounds half up (not Python's banker's rounding).

  Args:
    size: number of entries of the leaf (>= 1).
    density: fraction kept, in (0, 1].

  Returns:
    k, a Python int in [1, size].
  """
  return int(max(1, min(size, math.floor(density * size + 0.5))))


def index_dtype(size: int):
  """uint16 when every index of a ``size``-entry leaf fits (size <= 65536), else int32."""
  return jnp.uint16 if size <= 2**16 else jnp.int32


def _check_density(density):
  if not 0.0 < float(density) <= 1.0:
    raise ValueError(f'density must be in (0, 1], got {density!r}')


def _sparse_decode(payload, size, shape):
  """Scatters ``values`` at ``indices`` into a float32 zero tensor of ``shape``."""
  idx = payload['indices'].astype(jnp.int32)
  vals = payload['values'].astype(jnp.float32)
  return jnp.zeros((size,), jnp.float32).at[idx].set(
      vals, unique_indices=True, mode='drop').reshape(shape)


def _sparse_decode_sum(gathered, size, shape):
  """Sum of W sparse payloads (leading axis W) in one scatter-add into f32 zeros.

  Indices are distinct within a payload but may repeat across payloads, so this
  adds (sparse payloads "build up": their union holds up to W*k non-zeros).
  """
  idx = gathered['indices'].astype(jnp.int32).reshape(-1)
  vals = gathered['values'].astype(jnp.float32).reshape(-1)
  return jnp.zeros((size,), jnp.float32).at[idx].add(vals, mode='drop').reshape(shape)


# ----------------------------------------------------------------------------- exact top-k


def _exact_topk_indices(mag, k):
  """Indices (int32[k]) of the k largest entries of ``mag`` (f32[n]), via lax.top_k."""
  return lax.top_k(mag, k)[1].astype(jnp.int32)


# ------------------------------------------------------------------ threshold-estimate top-k


def _kth_largest_bits(bits, k):
  """Largest T with ``count(bits >= T) >= k``, by bisection on int32 patterns.

  For non-negative float32 values their int32 bit patterns are ordered like the
  floats, so this is the k-th largest value (as bits) in 31 counting passes,
  with no sort. Entries < 0 (padding marked -1) are never counted.

  Args:
    bits: int32[m], bit patterns of non-negative floats (or -1 for padding).
    k: static int, 1 <= k <= number of non-negative entries.

  Returns:
    int32 scalar.
  """
  def body(_, lohi):
    lo, hi = lohi
    mid = lo + (hi - lo + 1) // 2
    ok = jnp.sum(bits >= mid, dtype=jnp.int32) >= k
    return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid - 1)

  # The carry is built from ``bits`` so that it has the same varying manual axes
  # inside ``jax.shard_map`` (a constant carry would not type-check there).
  lo0 = jnp.zeros_like(bits, shape=())
  lo, _ = lax.fori_loop(0, 31, body, (lo0, lo0 + jnp.int32(0x7f800000)))
  return lo


def _mask_words(mag, thr):
  """Bitmask of ``mag >= thr`` packed 32 entries per uint32 word (entry i -> bit i % 32).

  Built as a fused reduction (no mask of the full size is materialised).

  Args:
    mag: f32[n].
    thr: f32 scalar.

  Returns:
    uint32[ceil(n / 32)].
  """
  n = mag.shape[0]
  n_main = n // _WORD * _WORD
  shifts = jnp.left_shift(jnp.uint32(1), jnp.arange(_WORD, dtype=jnp.uint32))
  parts = []
  if n_main:
    main = mag[:n_main].reshape(-1, _WORD) >= thr
    parts.append(jnp.sum(jnp.where(main, shifts, jnp.uint32(0)), axis=1,
                         dtype=jnp.uint32))
  if n > n_main:
    tail = mag[n_main:] >= thr
    parts.append(jnp.sum(jnp.where(tail, shifts[:n - n_main], jnp.uint32(0)),
                         dtype=jnp.uint32)[None])
  return jnp.concatenate(parts) if len(parts) > 1 else parts[0]


def _select_bit(words, j):
  """Position (int32) of the j-th (0-based) set bit of each uint32 word (binary search)."""
  pos = jnp.zeros(words.shape, jnp.int32)
  for width in (16, 8, 4, 2, 1):
    window = jnp.right_shift(words, pos.astype(jnp.uint32)) & jnp.uint32(
        (1 << width) - 1)
    low = lax.population_count(window).astype(jnp.int32)
    go = j >= low
    j = jnp.where(go, j - low, j)
    pos = jnp.where(go, pos + width, pos)
  return pos


def _threshold_plan(size, k):
  """Static sample size s, sample rank r and candidate buffer B, or None for exact."""
  q = k / size
  s = int(max(_MIN_SAMPLE, math.ceil(_SAMPLE_HITS / q)))
  if 4 * s > size or q > 0.2:
    return None
  mean_hits = q * s
  r = int(min(s, math.ceil(mean_hits + _Z_LOW * math.sqrt(mean_hits) + 1)))
  buf = int(min(size, math.ceil(size * (r + _Z_HIGH * math.sqrt(r) + 1) / s)))
  if buf >= size // 2:
    return None
  return s, r, buf


def _threshold_topk_indices(mag, k, key, plan):
  """Exactly k indices of large entries of ``mag``, threshold estimated from a sample.

  Algorithm (DGC-style estimate, then an exact finish on a small buffer):
    1. Sample ``s`` entries uniformly (with replacement); take the sample's r-th
       largest magnitude ``t`` with r chosen ``_Z_LOW`` std above the expected
       number of sample hits, so ``t`` is below the true k-th largest with high
       probability and ``count(mag >= t) >= k``.
    2. Pack the candidate mask ``mag >= t`` into 32-bit words (one fused pass),
       prefix-sum the words' popcounts and extract the first ``B`` candidate
       indices (in index order) by binary search, without ever writing a
       full-size intermediate.
    3. Find the exact k-th largest magnitude among the candidates by bisection
       on float bit patterns and keep the entries above it plus the first ties
       in index order: exactly k indices.
  If the estimate missed (fewer than k or more than B candidates, e.g. an
  all-zero tensor), falls back to exact ``lax.top_k`` (``lax.cond``: only one
  branch runs under jit; under vmap both run). Hence the kept set is always the
  exact top-k set (ties broken by index), only faster.

  Args:
    mag: f32[n] non-negative magnitudes.
    k: static int.
    key: PRNG key for the sample.
    plan: (s, r, B) from ``_threshold_plan``.

  Returns:
    int32[k] distinct indices.
  """
  s, r, buf = plan
  n = mag.shape[0]
  sample = mag[jax.random.randint(key, (s,), 0, n)]
  t_bits = _kth_largest_bits(lax.bitcast_convert_type(sample, jnp.int32), r)
  thr = lax.bitcast_convert_type(t_bits, jnp.float32)
  words = _mask_words(mag, thr)
  pops = lax.population_count(words).astype(jnp.int32)
  ends = jnp.cumsum(pops)
  total = ends[-1]

  def from_candidates():
    slots = jnp.arange(buf, dtype=jnp.int32)
    row = jnp.minimum(jnp.searchsorted(ends, slots, side='right'),
                      words.shape[0] - 1).astype(jnp.int32)
    j = slots - (ends[row] - pops[row])
    idx = row * _WORD + _select_bit(words[row], j)
    valid = slots < total
    idx = jnp.where(valid, idx, 0)
    cbits = jnp.where(valid, lax.bitcast_convert_type(mag[idx], jnp.int32), -1)
    kth = _kth_largest_bits(cbits, k)
    gt = cbits > kth
    eq = cbits == kth
    need = k - jnp.sum(gt, dtype=jnp.int32)
    keep = gt | (eq & (jnp.cumsum(eq.astype(jnp.int32)) <= need))
    chosen = jnp.nonzero(keep, size=k, fill_value=0)[0]
    return idx[chosen]

  def exact():
    return _exact_topk_indices(mag, k)

  return lax.cond((total >= k) & (total <= buf), from_candidates, exact)


def _sparse_layout(shape, density):
  """(shape tuple, size, k kept, index dtype) of a sparse payload; checks density."""
  _check_density(density)
  shape = tuple(int(d) for d in shape)
  size = int(np.prod(shape, dtype=np.int64))
  k = num_kept(size, density)
  return shape, size, k, index_dtype(size)


def topk(shape, density: float = 0.01, threshold_variant: bool = False,
         values_dtype=jnp.float32, **unused) -> Compressor:
  """Top-k by magnitude (biased; use with error feedback).

  Keeps the k entries of largest |x| and their signed values.

  Args:
    shape: the leaf's shape.
    density: fraction of entries kept, in (0, 1]; k as in :func:`num_kept`.
    threshold_variant: if True, estimate the magnitude threshold from a random
      sample (DGC, Lin et al. 2018) and finish exactly on the candidates (see
      ``_threshold_topk_indices``); same kept set as the exact version, faster
      than ``lax.top_k`` on large leaves. Leaves too small for sampling to pay off
      (size < 4 * sample size, or density > 0.2) use the exact path. Uses ``key``.
    values_dtype: dtype of the sent values (float32, bfloat16 or float16).
    **unused: other spec hyper-parameters, ignored.

  Returns:
    Compressor with payload ``{'values': values_dtype[k], 'indices': idx[k]}``;
    indices are uint16 when size <= 65536, else int32. Exact variant: sorted by
    decreasing magnitude; threshold variant: increasing index.

  Raises:
    ValueError: density outside (0, 1].
  """
  del unused
  shape, size, k, idt = _sparse_layout(shape, density)
  plan = _threshold_plan(size, k) if threshold_variant else None

  def encode(x, state, key):
    flat = x.reshape(-1).astype(jnp.float32)
    mag = jnp.abs(flat)
    if k == size:
      idx = jnp.arange(size, dtype=jnp.int32)
    elif plan is None:
      idx = _exact_topk_indices(mag, k)
    else:
      if key is None:
        key = jax.random.PRNGKey(0)
      idx = _threshold_topk_indices(mag, k, key, plan)
    payload = {'values': flat[idx].astype(values_dtype), 'indices': idx.astype(idt)}
    return payload, state

  def decode(payload):
    return _sparse_decode(payload, size, shape)

  def decode_sum(gathered):
    return _sparse_decode_sum(gathered, size, shape)

  name = f"topk{'_thr' if threshold_variant else ''}({density:g})"
  return Compressor(name, shape, EmptyState, encode, decode, decode_sum=decode_sum)


# --------------------------------------------------------------------------------- random-k


def _draws_plan(size, k):
  """Number m of with-replacement draws giving >= k distinct values w.h.p., or None."""
  if k > 0.25 * size:
    return None
  target = min(size - 0.5, k + 6.0 * math.sqrt(k) + 10.0)
  m = math.ceil(-size * math.log1p(-target / size)) + 1
  return int(m)


def _random_k_indices(key, size, k, m):
  """k distinct indices uniformly at random (a uniform k-subset of range(size)).

  Sequential rejection sampling done in parallel: draw m indices with
  replacement, keep the first occurrence of each value, and take the first k
  kept draws in draw order; this is exactly sampling without replacement. If
  the m draws held fewer than k distinct values (probability ~1e-9 by the
  choice of m), falls back to the k smallest of size i.i.d. uniforms. With
  ``m=None`` (dense k) the uniforms are used directly.

  Returns:
    int32[k].
  """
  k_draw, k_fallback = jax.random.split(key)

  def by_uniforms():
    u = jax.random.uniform(k_fallback, (size,))
    return lax.top_k(-u, k)[1].astype(jnp.int32)

  if m is None:
    return by_uniforms()
  draws = jax.random.randint(k_draw, (m,), 0, size, dtype=jnp.int32)
  order = jnp.arange(m, dtype=jnp.int32)
  sv, so = lax.sort((draws, order), num_keys=2)
  first_sorted = jnp.concatenate([jnp.ones((1,), bool), sv[1:] != sv[:-1]])
  first = jnp.zeros((m,), bool).at[so].set(first_sorted, unique_indices=True)
  n_distinct = jnp.sum(first, dtype=jnp.int32)

  def by_draws():
    pos = jnp.nonzero(first, size=k, fill_value=0)[0]
    return draws[pos]

  return lax.cond(n_distinct >= k, by_draws, by_uniforms)


def randk(shape, density: float = 0.01, unbiased: bool = False,
          values_dtype=jnp.float32, **unused) -> Compressor:
  """Random-k: k entries chosen uniformly without replacement (needs ``key``).

  The indices are sent (decode needs no key), so the wire cost equals top-k's.
  With ``unbiased=True`` values are scaled by size/k so E[decode(encode(x))] = x
  (Stich et al. 2018, rand_k); the default (False) sends the raw values, the
  usual choice with error feedback.

  Args:
    shape: the leaf's shape.
    density: fraction kept, in (0, 1]; k as in :func:`num_kept`.
    unbiased: scale the values by size/k.
    values_dtype: dtype of the sent values.
    **unused: other spec hyper-parameters, ignored.

  Returns:
    Compressor with payload ``{'values': values_dtype[k], 'indices': idx[k]}``.

  Raises:
    ValueError: density outside (0, 1].
  """
  del unused
  shape, size, k, idt = _sparse_layout(shape, density)
  m = _draws_plan(size, k)
  scale = size / k if unbiased else 1.0

  def encode(x, state, key):
    flat = x.reshape(-1).astype(jnp.float32)
    if k == size:
      idx = jnp.arange(size, dtype=jnp.int32)
    else:
      idx = _random_k_indices(key, size, k, m)
    vals = flat[idx] * jnp.float32(scale)
    return {'values': vals.astype(values_dtype), 'indices': idx.astype(idt)}, state

  def decode(payload):
    return _sparse_decode(payload, size, shape)

  def decode_sum(gathered):
    return _sparse_decode_sum(gathered, size, shape)

  return Compressor(f'randk({density:g})', shape, EmptyState, encode, decode,
                    decode_sum=decode_sum)


register('topk', topk, ('density', 'threshold_variant'), example={'density': 0.05})
register('randk', randk, ('density',), example={'density': 0.05})
