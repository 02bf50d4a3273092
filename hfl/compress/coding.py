"""Host-side lossless coders for CO3 symbols (the CO3 paper's "compress" step).

Symbol alphabet (decided here). A CO3 symbol (see :mod:`hfl.compress.floatgrid`) is
``sign << (e+m) | mag``. The entropy coders code the MAGNITUDE only, over the dense
alphabet ``{0, .., M-1}`` (finite magnitudes) plus ``M`` (the NaN symbol), and every
entry with a non-zero finite magnitude then costs exactly one raw sign bit. Zero
and NaN carry no sign bit: the decoder knows from the magnitude whether a sign
follows, so no ternary "sign(0)" ambiguity arises. For a symmetric
distribution with signs independent of magnitudes this loses nothing:
``H(symbol) = H(mag) + P(mag > 0)`` bits per entry. The unsigned grids (``s = 0``)
have no sign bits.

Coders (both are lossless and bit-exact on round trip; both need ``n``, the number
of entries, which is static and known to the receiver):

* Huffman (the CO3 paper's design): a canonical Huffman code (Huffman 1952, "A
  method for the construction of minimum-redundancy codes", Proc. IRE 40(9);
  canonical assignment as in Schwartz & Kallick 1964) built from MODEL probabilities
  (the GenNorm level probabilities of :mod:`hfl.compress.gennorm`, floored at
  :data:`PROB_FLOOR` so every symbol, NaN included, has a codeword). Bitstream: the
  n magnitude codewords MSB-first, then the raw sign bits of the non-zero finite
  entries in order, zero-padded to a whole byte. Its length is exactly
  ``ceil((sum_k count_k * len_k + n_signs) / 8)`` bytes, which is what CO3's in-jit
  accounting charges.
* ANS (Duda 2013, "Asymmetric numeral systems", arXiv:1311.2540) via
  ``constriction.stream.stack.AnsCoder`` (range ANS, 64-bit state, 32-bit words)
  with a ``Categorical`` model of the same floored model probabilities (no side
  information); sign bits are coded in the same stack with ``Uniform(2)`` (exactly
  1 bit each). Output: the coder's uint32 words, little-endian. Its length depends
  on the ORDER of the symbols, not only on their histogram (the coder starts from
  state 0, where pushing the symbol with cumulative 0 costs nothing; every other
  push rounds ``x -> floor(x / f) 2^P + c + x mod f``), so it is not a function of
  the counts: :func:`ans_quantized_model` reads back the fixed-point model
  (``P = ANS_PRECISION`` = 24 bits, cumulatives ``c`` and frequencies ``f``) that
  constriction codes with, and :func:`ans_reference_words` replays the coder's
  integer arithmetic (word for word, checked against constriction when the model is
  read) so that the in-jit accounting (:func:`hfl.compress.co3.ans_stream_words`)
  can count the exact number of words.

:func:`empirical_entropy` gives the empirical-entropy bound of a stream.
"""

import heapq
from typing import NamedTuple

import numpy as np

from hfl.compress import floatgrid

PROB_FLOOR = 2.0**-20  # Model probability floor (before renormalising).
MAX_CODE_LEN = 32      # Huffman codes are kept at most this long (floor raised if not).
ANS_PRECISION = 24  # Fixed-point precision (bits) of constriction's Categorical and Uniform.
ANS_WORD_BITS = 32  # constriction's DefaultAnsCoder: u32 words, u64 state.


def model_probs(mag_probs: np.ndarray, floor: float = PROB_FLOOR) -> np.ndarray:
  """Dense-alphabet model: ``M`` magnitude probabilities + the NaN symbol, floored.

  Args:
    mag_probs: float[M] magnitude probabilities (e.g. a row of GenNormTable.probs).
    floor: every probability (NaN symbol included) is raised to at least this
      before renormalising.

  Returns:
    float64[M+1] probabilities summing to 1, all >= floor / (1 + (M+1) floor).
  """
  p = np.append(np.asarray(mag_probs, np.float64), 0.0)
  p = np.maximum(np.nan_to_num(p, nan=0.0), floor)
  return p / p.sum()


def huffman_lengths(probs: np.ndarray) -> np.ndarray:
  """Huffman code lengths (Huffman 1952), deterministic tie-breaking.

  Ties between equal weights are broken by creation order (leaves by index, then
  merged nodes in merge order), so the same probabilities always give the same code.
  If the longest code exceeds :data:`MAX_CODE_LEN` the probabilities are re-floored
  (x4 each time) until it does not.

  Args:
    probs: float[K] positive weights, K >= 1.

  Returns:
    int64[K] code lengths (>= 1 when K >= 2; [0] when K == 1).

  Raises:
    ValueError: on an empty or non-positive/non-finite weight vector.
  """
  probs = np.asarray(probs, np.float64)
  if probs.ndim != 1 or probs.size == 0:
    raise ValueError('huffman_lengths: need a non-empty 1-D weight vector')
  if not np.all(np.isfinite(probs)) or np.any(probs <= 0):
    raise ValueError('huffman_lengths: weights must be finite and > 0')
  k = probs.size
  if k == 1:
    return np.zeros(1, np.int64)
  floor = probs.min() / probs.sum()
  while True:
    heap = [(float(w), i, (i,)) for i, w in enumerate(probs)]
    heapq.heapify(heap)
    lengths = np.zeros(k, np.int64)
    order = k
    while len(heap) > 1:
      w1, _, s1 = heapq.heappop(heap)
      w2, _, s2 = heapq.heappop(heap)
      members = s1 + s2
      lengths[list(members)] += 1
      heapq.heappush(heap, (w1 + w2, order, members))
      order += 1
    if lengths.max() <= MAX_CODE_LEN:
      return lengths
    floor *= 4
    probs = np.maximum(probs / probs.sum(), floor)


class HuffmanCode(NamedTuple):
  """A canonical prefix code (host numpy).

  Attributes:
    lengths: int64[K] code length per symbol (bits).
    codes: uint64[K] codeword per symbol (right-aligned, MSB sent first).
    max_len: int, longest code length L.
    lj_sorted: uint64[K] codewords left-justified to L bits, increasing (decode).
    sym_sorted: int64[K] the symbols in that order.
  """
  lengths: np.ndarray
  codes: np.ndarray
  max_len: int
  lj_sorted: np.ndarray
  sym_sorted: np.ndarray


def canonical_code(lengths: np.ndarray) -> HuffmanCode:
  """Canonical codewords from code lengths (symbols ordered by (length, index)).

  Args:
    lengths: int[K] lengths satisfying Kraft's inequality with equality (K >= 2).

  Returns:
    :class:`HuffmanCode`.

  Raises:
    ValueError: if the lengths are not a complete prefix code.
  """
  lengths = np.asarray(lengths, np.int64)
  if lengths.size < 2 or lengths.min() < 1:
    raise ValueError('canonical_code: need >= 2 symbols, lengths >= 1')
  if sum(2.0**-int(l) for l in lengths) != 1.0:
    raise ValueError(f'canonical_code: lengths {lengths} are not a complete prefix code')
  order = np.lexsort((np.arange(lengths.size), lengths))
  codes = np.zeros(lengths.size, np.uint64)
  code, prev = 0, int(lengths[order[0]])
  for rank, sym in enumerate(order):
    l = int(lengths[sym])
    if rank:
      code = (code + 1) << (l - prev)
    codes[sym] = code
    prev = l
  max_len = int(lengths.max())
  lj = np.array([int(codes[s]) << (max_len - int(lengths[s])) for s in order], np.uint64)
  return HuffmanCode(lengths, codes, max_len, lj, order.astype(np.int64))


def huffman_code(probs: np.ndarray) -> HuffmanCode:
  """Canonical Huffman code of a probability vector (K >= 2)."""
  return canonical_code(huffman_lengths(probs))


def split_stream(symbols: np.ndarray, grid: floatgrid.FloatGrid):
  """Symbols -> (dense magnitude ids int64[n] in [0, M], sign bits bool[n_signs]).

  Args:
    symbols: uint8[...] CO3 symbols (flattened in C order).
    grid: the float grid.

  Returns:
    ``dense`` (M stands for NaN) and the signs of the entries with
    ``0 < dense < M``, in order.

  Raises:
    ValueError: on a symbol that is not a valid CO3 symbol of ``grid``.
  """
  sym = np.asarray(symbols).reshape(-1).astype(np.int64)
  shift = grid.fmt[1] + grid.fmt[2]
  mag, neg = sym & ((1 << shift) - 1), (sym >> shift) & 1
  big_m = grid.num_mags
  bad = ((mag >= big_m) & (mag != grid.nan_mag)) | (sym >> (shift + 1) != 0)
  bad |= (neg == 1) & ((mag == 0) | (mag == grid.nan_mag) | (grid.fmt[0] == 0))
  if np.any(bad):
    raise ValueError(f'invalid CO3 symbols for fmt {grid.fmt}: {np.unique(sym[bad])[:8]}')
  dense = np.where(mag == grid.nan_mag, big_m, mag)
  has_sign = (dense > 0) & (dense < big_m)
  return dense, neg[has_sign].astype(bool)


def join_stream(dense: np.ndarray, signs: np.ndarray, grid: floatgrid.FloatGrid):
  """Inverse of :func:`split_stream`: uint8[n] symbols."""
  big_m = grid.num_mags
  dense = np.asarray(dense, np.int64)
  mag = np.where(dense == big_m, grid.nan_mag, dense)
  has_sign = (dense > 0) & (dense < big_m)
  neg = np.zeros(dense.shape, np.int64)
  neg[has_sign] = np.asarray(signs, np.int64)
  return ((neg << (grid.fmt[1] + grid.fmt[2])) | mag).astype(np.uint8)


def huffman_encode(symbols: np.ndarray, grid: floatgrid.FloatGrid,
                   code: HuffmanCode) -> bytes:
  """Encodes CO3 symbols to bytes: codewords, then sign bits, zero-padded.

  Args:
    symbols: uint8[...] CO3 symbols (C order).
    grid: the float grid.
    code: Huffman code over the dense alphabet (M+1 symbols).

  Returns:
    ``ceil((sum of codeword lengths + n_signs) / 8)`` bytes.
  """
  dense, signs = split_stream(symbols, grid)
  lens = code.lengths[dense]
  cws = code.codes[dense]
  start = np.concatenate([[0], np.cumsum(lens)])
  nbits = int(start[-1])
  bits = np.zeros(nbits + signs.size, np.uint8)
  for j in range(code.max_len):
    sel = lens > j
    shift = (lens[sel] - 1 - j).astype(np.uint64)
    bits[start[:-1][sel] + j] = ((cws[sel] >> shift) & np.uint64(1)).astype(np.uint8)
  bits[nbits:] = signs
  return np.packbits(bits).tobytes()


def huffman_decode(data: bytes, n: int, grid: floatgrid.FloatGrid,
                   code: HuffmanCode) -> np.ndarray:
  """Decodes ``n`` CO3 symbols from :func:`huffman_encode`'s bytes.

  Vectorised: the codeword starting at every bit position is found by a
  searchsorted of the L-bit window in the left-justified canonical codewords; a
  short Python walk then follows the chain of codeword starts.

  Args:
    data: the encoded bytes.
    n: number of symbols (static, known to the receiver).
    grid: the float grid.
    code: the same Huffman code as the encoder.

  Returns:
    uint8[n] symbols.

  Raises:
    ValueError: if the data is too short (truncated) or has trailing bytes.
  """
  if n == 0:
    if data:
      raise ValueError('huffman_decode: trailing data for an empty stream')
    return np.zeros(0, np.uint8)
  bits = np.unpackbits(np.frombuffer(data, np.uint8))
  total = bits.size
  big_l = code.max_len
  padded = np.concatenate([bits, np.zeros(big_l, np.uint8)]).astype(np.uint64)
  win = np.zeros(total, np.uint64)
  for j in range(big_l):
    win = (win << np.uint64(1)) | padded[j:j + total]
  rank = np.searchsorted(code.lj_sorted, win, side='right') - 1
  sym_at = code.sym_sorted[rank]
  nxt = (np.arange(total) + code.lengths[sym_at]).tolist()
  starts = [0] * n
  pos = 0
  for i in range(n):
    if pos >= total:
      raise ValueError('huffman_decode: truncated bitstream')
    starts[i] = pos
    pos = nxt[pos]
  if pos > total:
    raise ValueError('huffman_decode: truncated bitstream')
  dense = sym_at[np.asarray(starts)]
  n_signs = int(np.sum((dense > 0) & (dense < grid.num_mags)))
  if pos + n_signs > total:
    raise ValueError('huffman_decode: truncated sign bits')
  if (pos + n_signs + 7) // 8 != len(data):
    raise ValueError('huffman_decode: trailing bytes after the stream')
  return join_stream(dense, bits[pos:pos + n_signs], grid)


def _ans_models(probs: np.ndarray):
  import constriction  # lazy: constriction  pylint: disable=g-import-not-at-top
  model = constriction.stream.model.Categorical(np.asarray(probs, np.float64),
                                                perfect=False)
  return constriction, model, constriction.stream.model.Uniform(2)


class AnsModel(NamedTuple):
  """A fixed-point ANS model: symbol k owns ``[cum[k], cum[k] + freq[k])`` of ``2^P``.

  Attributes:
    cum: int64[K] left cumulatives (units of ``2^-ANS_PRECISION``).
    freq: int64[K] frequencies, all >= 1, summing to ``2^ANS_PRECISION``.
  """
  cum: np.ndarray
  freq: np.ndarray


def _push(x: int, cum: int, freq: int, words: list) -> int:
  """One constriction ``AnsCoder.encode_symbol`` on the exact integer state ``x``."""
  if x >> (2 * ANS_WORD_BITS - ANS_PRECISION) >= freq:  # Renormalise: emit the low word.
    words.append(x & ((1 << ANS_WORD_BITS) - 1))
    x >>= ANS_WORD_BITS
  return ((x // freq) << ANS_PRECISION) | (cum + x % freq)


def ans_reference_words(pushes, models) -> list:
  """Replays constriction's stack ANS encoder (exact Python integers).

  Args:
    pushes: sequence of ``(model_index, symbol)`` in PUSH order (for
      :func:`ans_encode`: the sign bits of the entries from last to first, then the
      magnitudes from last to first).
    models: sequence of :class:`AnsModel`.

  Returns:
    list of int, the uint32 words ``AnsCoder.get_compressed()`` returns: the
    renormalisation words, then the final 64-bit state's non-zero words (none for
    state 0, one if it fits in 32 bits, else two, low word first).
  """
  x, words = 0, []
  for mi, sym in pushes:
    m = models[mi]
    x = _push(x, int(m.cum[sym]), int(m.freq[sym]), words)
  while x:
    words.append(x & ((1 << ANS_WORD_BITS) - 1))
    x >>= ANS_WORD_BITS
  return words


def _probe_cum(model, k: int, constriction) -> int:
  coder = constriction.stream.stack.AnsCoder()
  coder.encode_reverse(np.array([k], np.int32), model)
  words = coder.get_compressed()
  return int(words[0]) if words.size else 0


def _check_replay(models, probs, constriction, n: int = 2000):
  """Raises RuntimeError unless :func:`ans_reference_words` reproduces constriction."""
  rng = np.random.default_rng(0)
  dense = rng.integers(0, len(probs), n)
  signs = rng.integers(0, 2, n)
  _, model, bit = _ans_models(probs)
  coder = constriction.stream.stack.AnsCoder()
  coder.encode_reverse(signs.astype(np.int32), bit)
  coder.encode_reverse(dense.astype(np.int32), model)
  got = coder.get_compressed().tolist()
  pushes = [(1, int(b)) for b in signs[::-1]] + [(0, int(d)) for d in dense[::-1]]
  if ans_reference_words(pushes, models) != got:
    raise RuntimeError(
        'constriction\'s AnsCoder no longer matches the replay in hfl.compress.coding '
        f'(precision {ANS_PRECISION} bits, u32 words, u64 state): the in-jit ANS '
        'accounting would be wrong; pin constriction==0.5.0 (requirements.txt) or '
        'update ans_reference_words and hfl.compress.co3.ans_stream_words')


def ans_quantized_model(probs: np.ndarray) -> tuple:
  """The fixed-point models :func:`ans_encode` codes with, read back from constriction.

  constriction quantises ``Categorical(probs, perfect=False)`` to ``P = 24``-bit
  frequencies (every symbol >= 1); the quantised table is not exposed, so it is
  read back: pushing symbol k alone onto an empty coder leaves the state
  ``cum[k]`` (``floor(0 / f) 2^P + cum[k] + 0``), which ``get_compressed`` returns.
  The first call in a process also checks the replay of a random 2,000-entry
  stream (magnitudes and signs) word for word against constriction.

  Args:
    probs: float[K] model probabilities (K >= 2), as given to :func:`ans_encode`.

  Returns:
    ``(magnitude model, sign model)``, two :class:`AnsModel` (the sign model is
    ``Uniform(2)``: frequencies ``2^(P-1)`` each).

  Raises:
    RuntimeError: if constriction's coder does not match the replay (another
      precision or word size).
  """
  constriction, model, bit = _ans_models(probs)
  models = []
  for m, k in ((model, len(probs)), (bit, 2)):
    cum = np.array([_probe_cum(m, s, constriction) for s in range(k)], np.int64)
    models.append(AnsModel(cum, np.diff(np.append(cum, 1 << ANS_PRECISION))))
  if any(np.any(m.freq < 1) for m in models):
    raise RuntimeError('constriction returned a non-increasing cumulative table')
  if not _REPLAY_CHECKED:
    _check_replay(models, probs, constriction)
    _REPLAY_CHECKED.append(True)
  return tuple(models)


_REPLAY_CHECKED = []  # Non-empty once the replay was checked in this process.


def ans_encode(symbols: np.ndarray, grid: floatgrid.FloatGrid,
               probs: np.ndarray) -> bytes:
  """Encodes CO3 symbols with constriction's ANS stack coder.

  Magnitudes use ``Categorical(probs)``, sign bits ``Uniform(2)``; signs are pushed
  first so that the decoder pops the magnitudes first.

  Args:
    symbols: uint8[...] CO3 symbols.
    grid: the float grid.
    probs: float[M+1] model probabilities over the dense alphabet.

  Returns:
    bytes, the coder's uint32 words little-endian (a multiple of 4 bytes).
  """
  dense, signs = split_stream(symbols, grid)
  constriction, model, bit = _ans_models(probs)
  coder = constriction.stream.stack.AnsCoder()
  if signs.size:
    coder.encode_reverse(signs.astype(np.int32), bit)
  if dense.size:
    coder.encode_reverse(dense.astype(np.int32), model)
  return coder.get_compressed().astype('<u4').tobytes()


def ans_decode(data: bytes, n: int, grid: floatgrid.FloatGrid,
               probs: np.ndarray) -> np.ndarray:
  """Decodes ``n`` CO3 symbols from :func:`ans_encode`'s bytes.

  Args:
    data: the encoded bytes.
    n: number of symbols.
    grid: the float grid.
    probs: the encoder's model probabilities.

  Returns:
    uint8[n] symbols.

  Raises:
    ValueError: if ``len(data)`` is not a multiple of 4.
  """
  if len(data) % 4:
    raise ValueError('ans_decode: data length must be a multiple of 4 bytes')
  constriction, model, bit = _ans_models(probs)
  words = np.frombuffer(data, '<u4').astype(np.uint32)
  coder = constriction.stream.stack.AnsCoder(words)
  dense = (coder.decode(model, n) if n else np.zeros(0, np.int32)).astype(np.int64)
  n_signs = int(np.sum((dense > 0) & (dense < grid.num_mags)))
  signs = coder.decode(bit, n_signs) if n_signs else np.zeros(0, np.int32)
  return join_stream(dense, signs, grid)


def model_bits(symbols: np.ndarray, grid: floatgrid.FloatGrid, probs: np.ndarray) -> float:
  """Ideal code length under a model: sum -log2 q(dense) + n_signs (bits)."""
  dense, signs = split_stream(symbols, grid)
  return float(-np.log2(np.asarray(probs, np.float64))[dense].sum() + signs.size)


class Entropy(NamedTuple):
  """Empirical entropy of a symbol stream.

  Attributes:
    n: entries.
    n_signs: entries with a non-zero finite magnitude (each costs one sign bit).
    mag_bits: n * H(empirical magnitude distribution), bits.
    bound_bits: ``mag_bits + n_signs``: the best any i.i.d. magnitude code plus raw
      signs can do without side information, bits.
    symbol_bits: n * H(empirical signed-symbol distribution), bits (for reference;
      equals ``bound_bits`` when signs are fair coins).
  """
  n: int
  n_signs: int
  mag_bits: float
  bound_bits: float
  symbol_bits: float


def _entropy_bits(values: np.ndarray) -> float:
  if values.size == 0:
    return 0.0
  counts = np.bincount(values)
  counts = counts[counts > 0].astype(np.float64)
  return float(-(counts * np.log2(counts / values.size)).sum())


def empirical_entropy(symbols: np.ndarray, grid: floatgrid.FloatGrid) -> Entropy:
  """Empirical entropy of CO3 symbols (see :class:`Entropy`)."""
  dense, signs = split_stream(symbols, grid)
  mag_bits = _entropy_bits(dense)
  sym_bits = _entropy_bits(np.asarray(symbols).reshape(-1).astype(np.int64))
  return Entropy(int(dense.size), int(signs.size), mag_bits, mag_bits + signs.size,
                 sym_bits)
