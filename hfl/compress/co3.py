"""CO3: convert, compress, correct (the seed CO3 paper).

Source: the seed CO3 paper, "How to Attain Communication-Efficient DNN Training?
Convert, Compress, Correct" (fp4 [1,2,1] + GenNorm-designed Huffman code + error
feedback with memory decay gamma = 0.9).

Pipeline for one layer (pytree leaf) ``x``:

1. **Convert** (jit): fit GenNorm (beta, alpha) to the layer by moments
   (:func:`hfl.compress.gennorm.fit_moments`), scale by ``s = p(beta) / alpha``
   (``p`` the tabulated MSE-optimal pre-scale of a unit GenNorm on the grid) and
   round to nearest onto the tiny float grid (:mod:`hfl.compress.floatgrid`; ties to
   even, saturation of finite values to +-max, inf and NaN -> the reserved NaN
   symbol, which decodes to NaN). ``decode`` returns ``level / s``.
2. **Compress** (host, :mod:`hfl.compress.coding`): entropy-code the magnitudes with
   a Huffman code designed from the GenNorm model's level probabilities (``coder=
   'huffman'``, the paper's design) or with ANS (``coder='ans'``, constriction),
   plus one raw sign bit per non-zero finite entry.
3. **Correct**: error feedback with decaying memory ``p = g + gamma e;
   g_hat = Q(p); e <- p - g_hat`` (:func:`co3_ef_step`).

Payload and accounting. The payload that crosses the collective is::

    {'symbols': uint8[shape], 'scale': float32[], 'beta_idx': uint8[]}

i.e. the simulation MOVES one uint8 symbol per entry (fixed width, so it can be
all-gathered with static shapes) while ``wire_bits`` CHARGES the length of the
entropy-coded message that a real link would carry, computed inside jit from the
symbol histogram. The message (:func:`encode_message`) is::

    header: scale (float32, 4 bytes) | beta_idx (uint8, 1 byte)  = HEADER_BYTES = 5
    body:   coder bitstream (coding.huffman_encode / coding.ans_encode)

``beta_idx`` selects the row of the checked-in GenNorm table (p(beta), level
probabilities) from which both ends derive the SAME code; the shape, format and
coder are static configuration known to both ends and are not sent.

* Huffman: ``wire_bits = 8 * (HEADER_BYTES + ceil((sum_k count_k len_k + n_signs) / 8))``,
  EXACTLY the real message length (documented overhead 0; tests/test_co3.py and
  ``python bench/co3.py --bits`` check it against the real bitstream).
* ANS: ``wire_bits = 8 * HEADER_BYTES + 32 * words``, ``words`` the number of
  uint32 words constriction's coder returns, EXACTLY (overhead 0). An ANS stream's
  length depends on the order of the symbols, not only on their histogram (the
  coder starts from state 0, so e.g. an all-zero leaf codes to 0 words, and every
  push rounds the state), so no histogram formula can be exact;
  :func:`ans_stream_words` replays the coder's integer arithmetic inside jit (a
  ``fori_loop`` over the pushes, 64-bit state emulated in uint32 pairs) with the
  fixed-point model read back from constriction (:func:`coding.ans_quantized_model`).
  Cost: 2n sequential steps per leaf of n entries (30 ms for 1M entries on a 2-core
  CPU, docs/benchmarks.md, against 41 ms for constriction's own encoder).

``linear`` is False: payloads are all-gathered and decoded one by one.

Error feedback (decision). The rest of hfl applies plain EF in the caller
(``p = g + e; e <- p - decode``). CO3 needs ``p = g + gamma e``; the compressor's
state therefore carries ``ef_gamma`` (a float32 scalar) and :func:`co3_ef_step`
does the whole correct-convert step. A generic EF loop may instead read
``getattr(state, 'ef_gamma', 1.0)`` and apply ``p = g + ef_gamma * e``: the two are
identical. gamma = 0 disables the memory (e is still returned as the current
error, but never fed back: ``p = g`` exactly, a non-finite e included).
"""

import functools
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from hfl.compress import base
from hfl.compress import coding
from hfl.compress import ef
from hfl.compress import floatgrid
from hfl.compress import gennorm
from hfl.compress.base import Compressor
from hfl.compress.registry import register

HEADER_BYTES = 5  # float32 scale + uint8 beta index.
FORMATS = {'fp4': (1, 2, 1), 'fp8': (1, 5, 2)}
CODERS = ('huffman', 'ans')


class CO3State(NamedTuple):
  """Per-leaf CO3 state.

  Attributes:
    count: int32[], encode calls so far.
    beta: float32[], the cached GenNorm shape (refit every ``refit_every`` calls).
    ef_gamma: float32[], the decay gamma of the caller's error-feedback memory.
  """
  count: jax.Array
  beta: jax.Array
  ef_gamma: jax.Array


class CO3Codec(NamedTuple):
  """Static, host-side description shared by encoder and decoder of one format.

  Attributes:
    fmt: ``(s, e, m)``.
    coder: 'huffman' or 'ans'.
    grid: the :class:`floatgrid.FloatGrid`.
    table: the :class:`gennorm.GenNormTable`.
    probs: float64[B, M+1] floored model probabilities per beta row (coding.model_probs).
    codes: tuple of B :class:`coding.HuffmanCode`, one per beta row.
    code_lengths: int32[B, M+1] Huffman code lengths (bits).
    ans_cum: uint32[B, M+1] constriction's fixed-point cumulatives per beta row
      (:func:`coding.ans_quantized_model`; empty for Huffman).
    ans_freq: uint32[B, M+1] the matching frequencies (units of 2^-24).
    sign_model: :class:`coding.AnsModel` of the sign bits (``Uniform(2)``; None
      for Huffman).
  """
  fmt: tuple
  coder: str
  grid: floatgrid.FloatGrid
  table: gennorm.GenNormTable
  probs: np.ndarray
  codes: tuple
  code_lengths: np.ndarray
  ans_cum: np.ndarray
  ans_freq: np.ndarray
  sign_model: Optional[coding.AnsModel]


def parse_fmt(fmt) -> tuple:
  """``'fp4'`` / ``'fp8'`` / ``(s, e, m)`` / ``'1,2,1'`` -> ``(s, e, m)`` ints.

  Raises:
    ValueError: anything else (the message lists the accepted forms).
  """
  original = fmt
  if isinstance(fmt, str):
    if fmt in FORMATS:
      return FORMATS[fmt]
    fmt = fmt.strip('[]() ').split(',')
  try:
    out = tuple(int(v) for v in fmt)
  except (TypeError, ValueError):
    out = ()
  if len(out) != 3:
    raise ValueError(f'co3: fmt={original!r} is not a float format; allowed: '
                     f'{", ".join(repr(k) for k in FORMATS)} or "s,e,m" bit counts such as "1,2,1"')
  return out


@functools.lru_cache(maxsize=None)
def make_codec(fmt=(1, 2, 1), coder: str = 'huffman') -> CO3Codec:
  """Builds (and caches) the :class:`CO3Codec` of a format and coder.

  Args:
    fmt: a format accepted by :func:`parse_fmt`.
    coder: 'huffman' or 'ans'.

  Returns:
    The codec.

  Raises:
    ValueError: unknown coder or invalid format.
  """
  if coder not in CODERS:
    raise ValueError(f'co3: coder must be one of {CODERS}, got {coder!r}')
  fmt = parse_fmt(fmt)
  grid = floatgrid.make_grid(fmt)
  table = gennorm.load_table(fmt)
  probs = np.stack([coding.model_probs(row) for row in table.probs])
  codes = tuple(coding.huffman_code(row) for row in probs)
  lengths = np.stack([c.lengths for c in codes]).astype(np.int32)
  cum = freq = np.zeros((0, probs.shape[1]), np.uint32)
  sign_model = None
  if coder == 'ans':
    models = [coding.ans_quantized_model(row) for row in probs]
    cum = np.stack([m.cum for m, _ in models]).astype(np.uint32)
    freq = np.stack([m.freq for m, _ in models]).astype(np.uint32)
    sign_model = models[0][1]
    half = 2**(coding.ANS_PRECISION - 1)
    if (freq.max() >= 2 * half or list(sign_model.cum) != [0, half]
        or list(sign_model.freq) != [half, half]):
      raise RuntimeError(f'co3: unexpected ANS models from constriction (sign model {sign_model}); '
                         'ans_stream_words assumes frequencies < 2^24 and Uniform(2) = 2^23 each')
  return CO3Codec(fmt, coder, grid, table, probs, codes, lengths, cum, freq, sign_model)


def convert(x: jax.Array, beta: jax.Array, codec: CO3Codec):
  """Scales ``x`` by ``s = p(beta)/alpha`` and rounds onto the grid (jit).

  Args:
    x: float32[...] values.
    beta: float32[] GenNorm shape (e.g. from :func:`gennorm.fit_moments`).
    codec: the codec.

  Returns:
    (symbols uint8[...], scale float32[], beta_idx uint8[]). ``scale`` is 1 when
    ``x`` has no non-zero finite entry (then every finite entry is symbol 0) or
    when it would exceed float32's range (entries of ~1e-38 and below); otherwise
    at least :func:`hfl.compress.base.min_scale` of the grid's max, so that every
    symbol decodes to a finite value (entries near float32's max saturate to the
    top level; error feedback keeps the rest). mean|x| is computed overflow-safe
    (:func:`hfl.compress.base.mean_abs`): finite for every finite ``x``.
  """
  x = jnp.asarray(x, jnp.float32)
  finite = jnp.isfinite(x)
  # mean|x| over the finite entries, overflow-safe (base.mean_abs: the plain mean
  # where its sum is a normal float, else pre-scaled by a power of two); alpha can
  # still overflow (Gamma(1/beta) / Gamma(2/beta) > 1 for beta > 1), giving scale 0.
  alpha = gennorm.alpha_from_beta(base.mean_abs(x, where=finite), beta)
  scale = gennorm.prescale(beta, codec.table) / jnp.where(alpha > 0, alpha, 1.0)
  # Raised to base.min_scale, so that decode's level / scale is finite for every
  # level: entries near float32's max then saturate to the top level.
  scale = jnp.where((alpha > 0) & jnp.isfinite(scale),
                    jnp.maximum(scale, base.min_scale(codec.grid.max)), 1.0).astype(jnp.float32)
  sym = floatgrid.quantize(x * scale, codec.grid)
  return sym, scale, gennorm.beta_index(beta, codec.table).astype(jnp.uint8)


def _ans_push(carry, active, cum, freq):
  """One ``AnsCoder.encode_symbol`` on the uint32 pair ``(hi, lo)`` = the 64-bit state.

  ``freq < 2^24`` (so every partial remainder below fits in 32 bits); the words
  emitted are counted in ``carry[2]``. Inactive pushes leave the carry unchanged.
  """
  hi, lo, words = carry
  renorm = (hi >> (coding.ANS_WORD_BITS - coding.ANS_PRECISION)) >= freq  # x >> 40 >= f
  words = words + (active & renorm).astype(jnp.int32)
  lo = jnp.where(renorm, hi, lo)  # x >>= 32
  hi = jnp.where(renorm, jnp.uint32(0), hi)
  q_hi, rem = hi // freq, hi % freq  # Long division of x by f, one byte at a time.
  q_lo = jnp.uint32(0)
  for shift in (24, 16, 8, 0):
    t = (rem << 8) | ((lo >> shift) & 0xFF)
    q_lo, rem = (q_lo << 8) | (t // freq), t % freq
  # x' = (x // f) << 24 | (cum + x % f); x // f < 2^40 after renormalising.
  new_hi = (q_hi << 24) | (q_lo >> 8)
  new_lo = ((q_lo & 0xFF) << 24) | (cum + rem)
  return (jnp.where(active, new_hi, carry[0]), jnp.where(active, new_lo, carry[1]), words)


def _bit_push(carry, active, bit):
  """:func:`_ans_push` of a sign bit (``Uniform(2)``: ``freq = 2^23``, ``cum = bit 2^23``).

  With ``f = 2^23`` the push inserts ``bit`` at bit 23 of the state:
  ``x' = (x >> 23) << 24 | bit << 23 | x mod 2^23``; renormalises when ``x >= 2^63``.
  """
  hi, lo, words = carry
  renorm = hi >= jnp.uint32(1 << 31)
  words = words + (active & renorm).astype(jnp.int32)
  lo = jnp.where(renorm, hi, lo)
  hi = jnp.where(renorm, jnp.uint32(0), hi)
  new_hi = (hi << 1) | (lo >> 31)
  new_lo = ((lo >> 23) << 24) | (bit << 23) | (lo & jnp.uint32((1 << 23) - 1))
  return (jnp.where(active, new_hi, carry[0]), jnp.where(active, new_lo, carry[1]), words)


def ans_stream_words(dense: jax.Array, neg: jax.Array, beta_idx: jax.Array,
                     codec: CO3Codec) -> jax.Array:
  """uint32 words of :func:`coding.ans_encode`'s output for these symbols (jit, exact).

  Replays the pushes of ``ans_encode`` (the sign bits of the entries from last to
  first, then the magnitudes from last to first) with constriction's arithmetic
  (:func:`coding.ans_reference_words`; rANS, Duda 2013): 2n ``fori_loop`` steps.

  Args:
    dense: int32[n] dense magnitude ids (``M`` = NaN).
    neg: int32[n] sign bits (used where ``0 < dense < M`` on a signed grid).
    beta_idx: uint8[] row of the model table.
    codec: an ANS codec.

  Returns:
    int32[] words (renormalisation words + the final state's non-zero words).
  """
  grid = codec.grid
  if dense.shape[0] == 0:
    return jnp.int32(0)  # constriction returns no words for an empty stream.
  dense, neg = dense[::-1], neg[::-1]
  idx = beta_idx.astype(jnp.int32)
  cum = jnp.asarray(codec.ans_cum)[idx][dense]
  freq = jnp.asarray(codec.ans_freq)[idx][dense]
  carry = (jnp.uint32(0), jnp.uint32(0), jnp.int32(0))
  if grid.fmt[0]:
    has_sign = (dense > 0) & (dense < grid.num_mags)
    neg = neg.astype(jnp.uint32)
    carry = jax.lax.fori_loop(
        0, dense.shape[0], lambda i, c: _bit_push(c, has_sign[i], neg[i]), carry)
  hi, lo, words = jax.lax.fori_loop(
      0, dense.shape[0], lambda i, c: _ans_push(c, jnp.bool_(True), cum[i], freq[i]),
      carry)
  return words + jnp.where(hi > 0, 2, jnp.where(lo > 0, 1, 0))


def stream_bits(symbols: jax.Array, beta_idx: jax.Array, codec: CO3Codec) -> jax.Array:
  """Bits of the coded message of one payload (jit), header included: EXACTLY
  ``8 * len(encode_message(payload))`` for both coders (module docstring).

  Args:
    symbols: uint8[...] CO3 symbols.
    beta_idx: uint8[] row of the code table.
    codec: the codec.

  Returns:
    int32[] bits, header (scale, beta index) included (exact: :func:`co3` refuses
    leaves whose message could reach 2^31 bits).
  """
  grid = codec.grid
  big_m = grid.num_mags
  mag, neg = floatgrid.split_symbols(symbols, grid)
  dense = jnp.where(mag == grid.nan_mag, big_m, mag).reshape(-1).astype(jnp.int32)
  if codec.coder == 'ans':
    words = ans_stream_words(dense, neg.reshape(-1).astype(jnp.int32), beta_idx, codec)
    return (8 * HEADER_BYTES + coding.ANS_WORD_BITS * words).astype(jnp.int32)
  counts = jnp.bincount(dense, length=big_m + 1)
  n_signs = (jnp.sum(counts[1:big_m]) if grid.fmt[0] else 0)
  idx = beta_idx.astype(jnp.int32)
  body = jnp.sum(counts * jnp.asarray(codec.code_lengths)[idx]) + n_signs
  nbytes = (body + 7) // 8 + HEADER_BYTES
  return (8 * nbytes).astype(jnp.int32)


def max_entries() -> int:
  """The largest leaf (entries) whose :func:`max_message_bits` is below 2^31."""
  n = (2**31 - 8 * HEADER_BYTES - 96) // (coding.MAX_CODE_LEN + 1)
  while max_message_bits(n + 1) < 2**31:
    n += 1
  while max_message_bits(n) >= 2**31:
    n -= 1
  return n


def max_message_bits(size: int) -> int:
  """Upper bound of the coded message of a ``size``-entry leaf (bits, Python int):
  every entry on the longest Huffman codeword (``coding.MAX_CODE_LEN`` bits, more
  than ANS's at most ``coding.ANS_PRECISION`` bits per symbol) plus a sign bit,
  rounded up to words, plus the header; valid for both coders."""
  return 8 * HEADER_BYTES + 32 * (-(-(size * (coding.MAX_CODE_LEN + 1) + 64) // 32))


def co3(shape, fmt=(1, 2, 1), gamma: float = 0.9, coder: str = 'huffman',
        refit_every: int = 1) -> Compressor:
  """The CO3 compressor for one leaf.

  Args:
    shape: the leaf's shape.
    fmt: float format: ``(s, e, m)`` or 'fp4' (= (1,2,1), 11 levels) or 'fp8'
      (= (1,5,2), fp8 E5M2, 247 levels).
    gamma: error-feedback memory decay in [0, 1] (0.9 in the CO3 paper), carried in
      ``state.ef_gamma`` for :func:`co3_ef_step`.
    coder: 'huffman' (GenNorm-designed canonical Huffman) or 'ans' (constriction).
    refit_every: the GenNorm shape beta (hence the code table row) is re-estimated
      every this many ``encode`` calls (1 = every call); alpha, hence the scale,
      is re-estimated on every call.

  Returns:
    A :class:`hfl.compress.base.Compressor` with ``state = CO3State``, payload
    ``{'symbols': uint8[shape], 'scale': f32[], 'beta_idx': uint8[]}`` and
    ``wire_bits`` = the entropy-coded message length (module docstring).

  Raises:
    ValueError: invalid fmt, coder, gamma or refit_every, or a leaf whose coded
      message could reach 2^31 bits (:func:`max_message_bits`).
  """
  shape = tuple(int(d) for d in shape)
  codec = make_codec(parse_fmt(fmt), coder)
  gamma = float(gamma)
  if not 0.0 <= gamma <= 1.0:
    raise ValueError(f'co3: gamma must be in [0, 1], got {gamma}')
  if int(refit_every) != refit_every or refit_every < 1:
    raise ValueError(f'co3: refit_every must be an int >= 1, got {refit_every}')
  refit_every = int(refit_every)
  size = int(np.prod(shape, dtype=np.int64))
  if max_message_bits(size) >= 2**31:
    raise ValueError(f'co3: a leaf of {size} entries (shape {shape}) is too large: its '
                     'coded message could reach 2^31 bits, beyond the exact int32 bit '
                     f'count; CO3 takes leaves of at most '
                     f'{max_entries()} entries')
  s, e, m = codec.fmt
  name = f'co3(fp{s + e + m}[{s},{e},{m}],{coder},gamma={gamma:g})'

  def init():
    return CO3State(jnp.zeros((), jnp.int32), jnp.float32(2.0), jnp.float32(gamma))

  def encode(x, state, key):
    del key  # Deterministic rounding.
    x = jnp.asarray(x, jnp.float32).reshape(shape)
    refit = state.count % refit_every == 0
    beta = jax.lax.cond(refit, lambda: gennorm.fit_moments(x).beta,
                        lambda: state.beta.astype(jnp.float32))
    sym, scale, bidx = convert(x, beta, codec)
    new_state = CO3State(state.count + 1, beta, state.ef_gamma)
    return {'symbols': sym, 'scale': scale, 'beta_idx': bidx}, new_state

  def decode(payload):
    vals = floatgrid.dequantize(payload['symbols'], codec.grid)
    return vals / payload['scale'].astype(jnp.float32)

  def wire_bits(payload):
    return stream_bits(payload['symbols'], payload['beta_idx'], codec)

  return Compressor(name, shape, init, encode, decode, wire_bits, linear=False)


def co3_ef_step(compressor: Compressor, g: jax.Array, e: jax.Array, state: CO3State,
                key: jax.Array, gamma: Optional[float] = None):
  """One CO3 "correct + convert" step with decaying error feedback (jit).

  ``p = g + gamma e; payload = encode(p); g_hat = decode(payload); e' = p - g_hat``
  (the CO3 paper's "correct" step). With gamma = 1 this is plain EF (Stich et
  al. 2018), with gamma = 0 there is no memory: ``p = g`` exactly, even where
  ``e`` is non-finite (:func:`hfl.compress.ef.feed_back`).

  Args:
    compressor: a CO3 (or any) :class:`Compressor`.
    g: float32[shape] the gradient (or pseudo-gradient) to send.
    e: float32[shape] the error memory (zeros initially).
    state: the compressor state.
    key: PRNG key (unused by CO3, passed through).
    gamma: memory decay; default ``state.ef_gamma`` (1.0 if the state has none).

  Returns:
    (payload, g_hat float32[shape], e_new float32[shape], new_state).
  """
  if gamma is None:
    gamma = getattr(state, 'ef_gamma', 1.0)
  p = ef.feed_back(jnp.asarray(g, jnp.float32), jnp.asarray(e, jnp.float32), gamma)
  payload, state = compressor.encode(p, state, key)
  g_hat = compressor.decode(payload)
  return payload, g_hat, p - g_hat, state


def encode_message(payload, codec: CO3Codec) -> bytes:
  """Host: the real wire message of one payload (header + entropy-coded body).

  Args:
    payload: a CO3 payload (arrays, host or device).
    codec: the codec the payload was produced with.

  Returns:
    bytes; ``8 * len`` equals ``wire_bits`` exactly for Huffman.
  """
  sym = np.asarray(payload['symbols'], np.uint8).reshape(-1)
  idx = int(np.asarray(payload['beta_idx']))
  header = (np.asarray(payload['scale'], '<f4').reshape(()).tobytes()
            + bytes([idx]))
  if codec.coder == 'huffman':
    body = coding.huffman_encode(sym, codec.grid, codec.codes[idx])
  else:
    body = coding.ans_encode(sym, codec.grid, codec.probs[idx])
  return header + body


def decode_message(data: bytes, shape, codec: CO3Codec) -> dict:
  """Host: inverse of :func:`encode_message` (bit-exact payload).

  Args:
    data: the message bytes.
    shape: the leaf shape (static configuration).
    codec: the codec.

  Returns:
    payload dict of numpy arrays.

  Raises:
    ValueError: on a short header, bad beta index or corrupt body.
  """
  if len(data) < HEADER_BYTES:
    raise ValueError('co3: message shorter than its header')
  scale = np.frombuffer(data[:4], '<f4')[0].astype(np.float32)
  idx = data[4]
  if idx >= len(codec.codes):
    raise ValueError(f'co3: beta index {idx} out of range')
  n = int(np.prod(shape))
  if codec.coder == 'huffman':
    sym = coding.huffman_decode(data[HEADER_BYTES:], n, codec.grid, codec.codes[idx])
  else:
    sym = coding.ans_decode(data[HEADER_BYTES:], n, codec.grid, codec.probs[idx])
  return {'symbols': sym.reshape(shape), 'scale': np.float32(scale),
          'beta_idx': np.uint8(idx)}


register('co3', co3, ('fmt', 'gamma', 'coder', 'refit_every'),
         example={'fmt': 'fp4', 'gamma': 0.9})
