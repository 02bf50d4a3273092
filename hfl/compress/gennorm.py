"""Generalised normal (GenNorm) model of a layer's gradient, for CO3 (the seed CO3 paper).

Density of GenNorm with shape beta > 0 and scale alpha > 0 (Nadarajah 2005, "A
generalized normal distribution", J. Appl. Stat. 32(7), eq. 1; scipy.stats.gennorm)::

    f(x) = beta / (2 alpha Gamma(1/beta)) * exp(-(|x| / alpha)**beta)

beta = 2 is Gaussian (alpha = sqrt(2) sigma), beta = 1 Laplace. Its absolute moments
are ``E|x|^k = alpha^k Gamma((k+1)/beta) / Gamma(1/beta)`` and
``P(|x| <= t) = P(1/beta, (t/alpha)**beta)`` (regularised lower incomplete gamma).

Contents:

* :func:`fit_moments` -- jit-compatible moment estimator: the ratio
  ``r = E[x^2] / E[|x|]^2 = Gamma(1/b) Gamma(3/b) / Gamma(2/b)^2`` is strictly
  decreasing in beta; it is inverted by interpolation in a log-ratio table, then
  ``alpha = E|x| Gamma(1/b) / Gamma(2/b)`` (method of moments, as in the CO3 paper's
  GenNorm fit; cf. Varanasi & Aazhang 1989, JASA 84(408), sec. 2).
* :func:`fit_scipy` -- maximum likelihood via ``scipy.stats.gennorm.fit`` (host,
  offline check only).
* :func:`quant_mse` / :func:`optimal_prescale` -- the mean squared error of rounding
  ``p * X`` (X ~ GenNorm(beta, 1)) to a float grid, measured in X's units,
  ``MSE(p) = E[(Q(p X)/p - X)^2]``, computed in closed form from partial moments
  (scipy.special.gammainc) and minimised over p; p(beta) is the CO3 pre-scale.
  The per-layer scale is ``s = p(beta) / alpha``: ``s * x ~ GenNorm(beta, p(beta))``.
* :func:`level_probs` -- the probability of each grid magnitude for
  ``Y ~ GenNorm(beta, p(beta))`` rounded to nearest; depends on beta ONLY, which is
  why the Huffman code can be tabulated per beta.
* :class:`GenNormTable` -- p(beta) and the level probabilities tabulated over
  :data:`BETA_GRID`, checked in as ``gennorm_tables.npz`` next to this file and
  regenerated with::

      python -m hfl.compress.gennorm --tabulate

  At jit time p(beta) is linearly interpolated (:func:`prescale`) and the code
  table row is the nearest grid beta (:func:`beta_index`).
"""

import argparse
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from scipy import integrate, optimize, special, stats

from hfl.compress import base
from hfl.compress import floatgrid

BETA_MIN = 0.2
BETA_MAX = 3.0
BETA_STEP = 0.05
BETA_GRID = np.round(np.arange(BETA_MIN, BETA_MAX + BETA_STEP / 2, BETA_STEP), 6)
TABLE_FMTS = ((1, 2, 1), (1, 5, 2))
TABLE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                          'gennorm_tables.npz')

# Log moment-ratio table for the estimator (log r is strictly decreasing in beta).
_RATIO_BETAS = np.geomspace(0.05, 20.0, 4096)


def log_moment_ratio(beta):
  """log(E[x^2] / E[|x|]^2) of GenNorm(beta, .) (numpy, float64)."""
  beta = np.asarray(beta, np.float64)
  return (special.gammaln(1 / beta) + special.gammaln(3 / beta)
          - 2 * special.gammaln(2 / beta))


_LOG_RATIOS = log_moment_ratio(_RATIO_BETAS)


class GenNormFit(NamedTuple):
  """Fitted GenNorm parameters (float32 scalars).

  Attributes:
    beta: shape, clipped to the estimator's range.
    alpha: scale, in the units of x; 0 when x has no non-zero finite entry.
  """
  beta: jax.Array
  alpha: jax.Array


def fit_moments(x: jax.Array, beta_range=(BETA_MIN, BETA_MAX)) -> GenNormFit:
  """Moment estimator of (beta, alpha), jit-compatible, finite entries only.

  Args:
    x: float[...] samples (a layer's values). Non-finite entries are ignored.
    beta_range: (lo, hi) clip range for beta (within [0.05, 20]).

  Returns:
    :class:`GenNormFit` of float32 scalars. If no finite non-zero entry exists
    (empty, all zero, all non-finite) beta is ``clip(2, *beta_range)`` and alpha 0.
    Where a plain moment (``sum |x| / n``, ``sum x^2 / n``) overflows or underflows
    (entries beyond ~1e19, whose squares overflow, or below ~1e-19), both are taken
    from the values pre-scaled by a power of two of their max-abs
    (:func:`hfl.compress.base.pow2_scale`; exact): beta is then that of ``x``
    scaled into range (the ratio m2 / m1^2 is scale-free), alpha is scaled back and
    saturates to float32's max; ordinary fits are bitwise the plain ones.
  """
  x = jnp.asarray(x, jnp.float32).reshape(-1)
  finite = jnp.isfinite(x)
  xf = jnp.where(finite, x, 0.0)
  n = jnp.maximum(jnp.sum(finite), 1).astype(jnp.float32)
  m1 = jnp.sum(jnp.abs(xf)) / n
  m2 = jnp.sum(jnp.square(xf)) / n
  # The same moments of x * 2^-k (base.pow2_scale), which neither overflow nor
  # underflow, used where a plain one is not a normal float.
  down, up = base.pow2_scale(jnp.max(jnp.abs(xf), initial=0.0))
  xs = xf * down
  m1s = jnp.sum(jnp.abs(xs)) / n
  m2s = jnp.sum(jnp.square(xs)) / n
  plain = ((m1 >= base.FLOAT32_TINY) & (m2 >= base.FLOAT32_TINY)
           & (m1 <= base.FLOAT32_MAX) & (m2 <= base.FLOAT32_MAX))
  ok = jnp.where(plain, m1 > 0, m1s > 0)
  r1, r2 = jnp.where(plain, m1, m1s), jnp.where(plain, m2, m2s)
  log_r = jnp.log(jnp.where(ok, r2, 1.0)) - 2 * jnp.log(jnp.where(ok, r1, 1.0))
  # jnp.interp needs increasing xp: reverse the decreasing log-ratio table.
  beta = jnp.interp(log_r, jnp.asarray(_LOG_RATIOS[::-1], jnp.float32),
                    jnp.asarray(_RATIO_BETAS[::-1], jnp.float32))
  beta = jnp.clip(jnp.where(ok, beta, 2.0), *beta_range)
  alpha = jnp.where(plain, alpha_from_beta(m1, beta),
                    jnp.minimum(alpha_from_beta(m1s, beta) * up, base.FLOAT32_MAX))
  return GenNormFit(beta.astype(jnp.float32), jnp.where(ok, alpha, 0.0))


def alpha_from_beta(mean_abs: jax.Array, beta: jax.Array) -> jax.Array:
  """alpha = E|x| Gamma(1/beta) / Gamma(2/beta) (jit-compatible, float32)."""
  lg = jax.scipy.special.gammaln
  return (mean_abs * jnp.exp(lg(1 / beta) - lg(2 / beta))).astype(jnp.float32)


def fit_scipy(x: np.ndarray):
  """Maximum-likelihood (beta, alpha) with ``scipy.stats.gennorm.fit(x, floc=0)``.

  Host-side, slow; for offline checks of :func:`fit_moments`.

  Args:
    x: float samples.

  Returns:
    (beta, alpha) floats.
  """
  beta, _, alpha = stats.gennorm.fit(np.asarray(x, np.float64).reshape(-1), floc=0)
  return float(beta), float(alpha)


def _partial(k, lo, hi, beta, alpha):
  """One-sided partial moment int_lo^hi y^k f(y) dy of GenNorm(beta, alpha), y >= 0.

  Substituting t = (y/alpha)^beta gives
  alpha^k Gamma((k+1)/beta) / (2 Gamma(1/beta)) [P((k+1)/b, t_hi) - P((k+1)/b, t_lo)].
  """
  a = (k + 1) / beta
  t_lo = (lo / alpha)**beta
  t_hi = np.where(np.isinf(hi), np.inf, (np.where(np.isinf(hi), 0, hi) / alpha)**beta)
  frac = special.gammainc(a, t_hi) - special.gammainc(a, t_lo)
  return alpha**k * np.exp(special.gammaln(a) - special.gammaln(1 / beta)) / 2 * frac


def quant_mse(p, beta: float, grid: floatgrid.FloatGrid):
  """MSE of round-to-nearest of p*X onto ``grid``, in X's units, X ~ GenNorm(beta, 1).

  ``MSE(p) = E[(Q(pX)/p - X)^2] = E[(Q(Y) - Y)^2] / p^2`` with Y ~ GenNorm(beta, p),
  summed over the magnitude cells ``[mid_{k-1}, mid_k)`` (last cell open: saturation)
  as ``c^2 P - 2 c M1 + M2`` from closed-form partial moments.

  Args:
    p: float or float64[K] pre-scales (> 0).
    beta: shape.
    grid: the float grid.

  Returns:
    float64 array like ``p``: the MSE for a unit-scale GenNorm.
  """
  p = np.asarray(p, np.float64)[..., None]
  edges_lo = np.concatenate([[0.0], grid.mids])
  edges_hi = np.concatenate([grid.mids, [np.inf]])
  c = grid.mags
  m0 = _partial(0, edges_lo, edges_hi, beta, p)
  m1 = _partial(1, edges_lo, edges_hi, beta, p)
  m2 = _partial(2, edges_lo, edges_hi, beta, p)
  one_side = np.sum(c**2 * m0 - 2 * c * m1 + m2, axis=-1)
  if grid.fmt[0]:
    err = 2 * one_side
  else:  # Negative half rounds to 0: error is its second moment.
    err = one_side + _partial(2, 0.0, np.inf, beta, p[..., 0])
  return err / p[..., 0]**2


def quant_mse_quad(p: float, beta: float, grid: floatgrid.FloatGrid,
                   with_error: bool = False):
  """:func:`quant_mse` by numerical quadrature (scipy.integrate.quad), for checks.

  Args:
    p: pre-scale (> 0).
    beta: shape.
    grid: the float grid.
    with_error: also return the bound on the quadrature's absolute error: the sum
      of the error estimates ``quad`` returns for the cells (x2 on a signed grid).

  Returns:
    float, or (float, float) with ``with_error``.
  """
  s = grid.fmt[0]
  f = lambda x: stats.gennorm.pdf(x, beta)  # noqa: E731
  edges = np.concatenate([[0.0], grid.mids / p, [np.inf]])
  total = err = 0.0
  for k, c in enumerate(grid.mags):
    val, e = integrate.quad(lambda x, c=c: (c / p - x)**2 * f(x), edges[k], edges[k + 1],
                            limit=200)
    total, err = total + val, err + e
  if s:
    total, err = 2 * total, 2 * err
  else:
    val, e = integrate.quad(lambda x: x**2 * f(x), -np.inf, 0)
    total, err = total + val, err + e
  return (total, err) if with_error else total


def optimal_prescale(beta: float, grid: floatgrid.FloatGrid) -> float:
  """p(beta) = argmin_p MSE(p) for a unit-scale GenNorm(beta) on ``grid``.

  A dense log-spaced search (the float-grid MSE has binade-periodic local minima)
  followed by a bounded scalar refinement (scipy.optimize.minimize_scalar).

  Args:
    beta: shape (> 0).
    grid: the float grid.

  Returns:
    float, the MSE-optimal pre-scale.
  """
  cand = np.geomspace(grid.max * 1e-4, grid.max * 10, 2001)
  mse = quant_mse(cand, beta, grid)
  i = int(np.argmin(mse))
  lo, hi = cand[max(i - 1, 0)], cand[min(i + 1, len(cand) - 1)]
  res = optimize.minimize_scalar(lambda lp: float(quant_mse(np.exp(lp), beta, grid)),
                                 bounds=(np.log(lo), np.log(hi)), method='bounded',
                                 options={'xatol': 1e-9})
  best = float(np.exp(res.x))
  return best if quant_mse(best, beta, grid) <= mse[i] else float(cand[i])


def level_probs(beta: float, p: float, grid: floatgrid.FloatGrid) -> np.ndarray:
  """Probability of each magnitude index for Y ~ GenNorm(beta, p) rounded to nearest.

  Args:
    beta: shape.
    p: scale of Y (for CO3, p = p(beta), since s * x ~ GenNorm(beta, p(beta))).
    grid: the float grid.

  Returns:
    float64[M] probabilities of the magnitudes (sum 1; ties have measure 0).
  """
  edges = np.concatenate([[0.0], grid.mids, [np.inf]])
  cdf = special.gammainc(1 / beta, (edges[:-1] / p)**beta)  # P(|Y| <= t).
  cdf = np.append(cdf, 1.0)
  probs = np.diff(cdf)
  if not grid.fmt[0]:  # Unsigned: the negative half lands on 0.
    probs = 0.5 * probs
    probs[0] += 0.5
  return probs


class GenNormTable(NamedTuple):
  """p(beta) and level probabilities tabulated over the beta grid (host numpy).

  Attributes:
    fmt: the grid format.
    beta_grid: float64[B] shapes.
    prescale: float64[B] p(beta).
    probs: float64[B, M] magnitude probabilities under GenNorm(beta, p(beta)).
  """
  fmt: tuple
  beta_grid: np.ndarray
  prescale: np.ndarray
  probs: np.ndarray


def tabulate(fmt, beta_grid=BETA_GRID) -> GenNormTable:
  """Computes the :class:`GenNormTable` of ``fmt`` (host, scipy; ~1 s per format)."""
  grid = floatgrid.make_grid(fmt)
  beta_grid = np.asarray(beta_grid, np.float64)
  pre = np.array([optimal_prescale(b, grid) for b in beta_grid])
  probs = np.stack([level_probs(b, p, grid) for b, p in zip(beta_grid, pre)])
  return GenNormTable(tuple(int(v) for v in fmt), beta_grid, pre, probs)


def _key(fmt):
  return 'fmt_' + '_'.join(str(int(v)) for v in fmt)


def save_tables(path=TABLE_PATH, fmts=TABLE_FMTS):
  """Writes the tables of ``fmts`` to an .npz (what ``--tabulate`` runs)."""
  arrays = {'beta_grid': BETA_GRID}
  for fmt in fmts:
    t = tabulate(fmt)
    arrays[_key(fmt) + '_prescale'] = t.prescale
    arrays[_key(fmt) + '_probs'] = t.probs
  np.savez(path, **arrays)
  return path


_CACHE = {}


def load_table(fmt) -> GenNormTable:
  """The table of ``fmt``: from the checked-in .npz if present, else computed.

  Args:
    fmt: ``(s, e, m)``.

  Returns:
    :class:`GenNormTable` (cached per process).
  """
  fmt = tuple(int(v) for v in fmt)
  if fmt not in _CACHE:
    table = None
    if os.path.exists(TABLE_PATH):
      with np.load(TABLE_PATH) as z:
        if _key(fmt) + '_prescale' in z and np.array_equal(z['beta_grid'], BETA_GRID):
          table = GenNormTable(fmt, z['beta_grid'], z[_key(fmt) + '_prescale'],
                               z[_key(fmt) + '_probs'])
    _CACHE[fmt] = table if table is not None else tabulate(fmt)
  return _CACHE[fmt]


def prescale(beta: jax.Array, table: GenNormTable) -> jax.Array:
  """p(beta) by linear interpolation in the table (jit-compatible, float32)."""
  return jnp.interp(beta, jnp.asarray(table.beta_grid, jnp.float32),
                    jnp.asarray(table.prescale, jnp.float32))


def beta_index(beta: jax.Array, table: GenNormTable) -> jax.Array:
  """Index of the nearest tabulated beta (jit-compatible, int32)."""
  b0 = float(table.beta_grid[0])
  step = float(table.beta_grid[1] - table.beta_grid[0])
  i = jnp.round((beta - b0) / step).astype(jnp.int32)
  return jnp.clip(i, 0, len(table.beta_grid) - 1)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--tabulate', action='store_true',
                      help=f'write {os.path.basename(TABLE_PATH)} for {TABLE_FMTS}')
  args = parser.parse_args(argv)
  if args.tabulate:
    path = save_tables()
    for fmt in TABLE_FMTS:
      t = load_table(fmt)
      print(fmt, 'p(beta) at beta=0.5,1,2:',
            [round(float(np.interp(b, t.beta_grid, t.prescale)), 5) for b in (0.5, 1, 2)])
    print('wrote', path)
  else:
    parser.print_help()


if __name__ == '__main__':
  main()
