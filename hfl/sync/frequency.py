"""Frequency optimisation for heterogeneity-aware semi-synchronous sync (the seed thesis).

Setting. DC ``d`` needs ``t_d`` seconds per intra-DC iteration (compute + intra-DC
communication, from the network model) and ``C_d`` seconds for its share of one
inter-DC synchronisation (WAN bytes / bandwidth + latency). If DC ``d`` runs
``K_d`` intra-DC iterations in a round, the round lasts::

    T(K) = max_d (K_d * t_d + C_d)        [seconds]

and DCs that finish early idle. With one K for all DCs (periodic sync) the fast
DCs idle while the slowest works. Frequency optimisation (the seed thesis,
contribution 2) fixes the round length by the slowest DC running ``K_base``
iterations and lets every faster DC fill that time with more iterations::

    slow = argmax_d (K_base * t_d + C_d)
    T*   = K_base * t_slow + C_slow
    K_d  = min(K_max, max(1, floor((T* - C_d) / t_d)))

Since every DC satisfies ``K_base t_d + C_d <= T*``, every ``K_d >= K_base`` and
the slowest DC runs exactly ``K_base``: the round is no longer than periodic sync
with ``K = K_base``, and no DC idles for a full iteration or more (unless capped
by ``K_max``).

Objective (what :func:`optimal_k_exact` solves exactly, and what the tests check
against a brute-force enumeration)::

    maximise    sum_d K_d                       (total useful local work)
    subject to  K_d * t_d + C_d <= T * (1 + TIME_RTOL)   for every d
                K_d integer in [1, K_max]

with ``T = T*`` above (or an explicit budget). ``TIME_RTOL`` (1e-9) only absorbs
floating-point rounding (so that e.g. a DC exactly 3x faster gets exactly 3x the
iterations); it is part of the stated objective. The constraints are separable and
the objective increasing in every ``K_d``, so the unique maximiser is each DC's
own largest feasible ``K_d``; this is also the maximiser of ``sum_d p_d K_d`` for
any positive data weights ``p_d``, which is why no weights are taken. The closed
form computes the same point by a division, then corrects the floating-point floor
by one step with the exact predicate, so ``optimal_k == optimal_k_exact``.

How the training loop uses it: :mod:`hfl.sync.schedule` calls :func:`optimal_k`
for the ``semi_sync`` strategy once per round (with the current ``K_base``) and
returns ``k_d``; the loop runs ``max(k_d)`` SPMD iterations, masking DC ``d``'s
updates after its ``k_d``-th iteration, and the simulated clock charges
:func:`round_time`.

All functions here are host-side numpy.
"""

from typing import Optional

import numpy as np

# Relative slack on the round-time budget; absorbs floating-point rounding only.
TIME_RTOL = 1e-9


def check_k(k_base, k_max) -> tuple[int, int]:
  """Validates ``1 <= k_base <= k_max`` (integers).

  Args:
    k_base: K_base (``sync.k``).
    k_max: upper bound (``sync.k_max``).

  Returns:
    ``(k_base, k_max)`` as Python ints.

  Raises:
    ValueError: naming ``sync.k`` or ``sync.k_max``.
  """
  if isinstance(k_base, bool) or not isinstance(k_base, (int, np.integer)):
    raise ValueError(f'sync.k (K_base) must be an integer, got {k_base!r}.')
  if isinstance(k_max, bool) or not isinstance(k_max, (int, np.integer)):
    raise ValueError(f'sync.k_max must be an integer, got {k_max!r}.')
  k_base, k_max = int(k_base), int(k_max)
  if k_base < 1:
    raise ValueError(f'sync.k (K_base) must be >= 1, got {k_base}.')
  if k_max < k_base:
    raise ValueError(
        f'sync.k_max ({k_max}) must be >= sync.k (K_base = {k_base}).')
  return k_base, k_max


def check_times(t, c) -> tuple[np.ndarray, np.ndarray]:
  """Validates per-DC times (t > 0, c >= 0 seconds, both finite, shape [D]).

  Args:
    t: float [D], seconds per intra-DC iteration.
    c: float [D], seconds of inter-DC communication per round.

  Returns:
    ``(t, c)`` as float64 [D] arrays.

  Raises:
    ValueError: naming the ``network.*`` / ``mesh.num_dcs`` fields involved.
  """
  t = np.asarray(t, dtype=np.float64)
  c = np.asarray(c, dtype=np.float64)
  if t.ndim != 1 or t.size == 0:
    raise ValueError(
        'Per-iteration times t must be a non-empty 1-D array [num_dcs] '
        f'(one per DC; check network.dc_speed), got shape {t.shape}.')
  if c.shape != t.shape:
    raise ValueError(
        f'Inter-DC times c (shape {c.shape}) and per-iteration times t '
        f'(shape {t.shape}) must both have one entry per DC (check '
        'mesh.num_dcs and the length of network.dc_speed).')
  if not np.all(np.isfinite(t)) or np.any(t <= 0):
    raise ValueError(
        f'Per-iteration times t must be finite and > 0 seconds, got {t} '
        '(check network.compute_time_s > 0 and network.dc_speed > 0).')
  if not np.all(np.isfinite(c)) or np.any(c < 0):
    raise ValueError(
        f'Inter-DC communication times c must be finite and >= 0 seconds, '
        f'got {c} (check network.wan_bandwidth_mbps > 0 and '
        'network.wan_latency_s >= 0).')
  return t, c


def round_time(k_d, t, c) -> float:
  """Length of one inter-DC round, ``max_d (K_d t_d + C_d)`` (the seed thesis).

  Args:
    k_d: int [D], intra-DC iterations of each DC in the round.
    t: float [D], seconds per intra-DC iteration of each DC.
    c: float [D], seconds of inter-DC communication of each DC per round.

  Returns:
    The round length in seconds (Python float).

  Raises:
    ValueError: if the times are invalid or ``k_d`` has the wrong shape or
      entries < 1.
  """
  t, c = check_times(t, c)
  k_d = np.asarray(k_d)
  if k_d.shape != t.shape or np.any(k_d < 1):
    raise ValueError(f'k_d must be [num_dcs] integers >= 1, got {k_d}.')
  return float(np.max(k_d * t + c))


def target_round_time(t, c, k_base: int) -> float:
  """``T* = K_base t_slow + C_slow`` with ``slow = argmax_d (K_base t_d + C_d)``.

  Args:
    t: float [D], seconds per intra-DC iteration of each DC.
    c: float [D], seconds of inter-DC communication of each DC per round.
    k_base: iterations of the slowest DC per round (``sync.k``), >= 1.

  Returns:
    T* in seconds (Python float).

  Raises:
    ValueError: on invalid times or ``k_base < 1``.
  """
  t, c = check_times(t, c)
  k_base, _ = check_k(k_base, k_base)
  return float(np.max(k_base * t + c))


def optimal_k(t, c, k_base: int, k_max: int) -> np.ndarray:
  """Closed-form K_d that equalise finish times around the slowest DC.

  Source: the seed thesis' frequency optimisation::

      T* = K_base t_slow + C_slow,  slow = argmax_d (K_base t_d + C_d)
      K_d = min(K_max, max(1, floor((T* - C_d) / t_d)))

  The floor is taken on the exact predicate ``K_d t_d + C_d <= T* (1 +
  TIME_RTOL)`` (one correction step after the division), so the result equals
  :func:`optimal_k_exact` (the maximiser of ``sum_d K_d`` under that constraint;
  see the module docstring). The slowest DC gets exactly ``K_base``; equal
  speeds and communication times give ``K_d = K_base`` for all d.

  Args:
    t: float [D], seconds per intra-DC iteration of each DC (> 0).
    c: float [D], seconds of inter-DC communication of each DC per round (>= 0).
    k_base: iterations of the slowest DC per round (``sync.k``), >= 1.
    k_max: upper bound on any K_d (``sync.k_max``), >= k_base.

  Returns:
    int64 [D], K_d in [K_base, K_max].

  Raises:
    ValueError: on non-positive/non-finite ``t``, negative/non-finite ``c``,
      mismatched shapes, ``k_base < 1`` (``sync.k``) or ``k_max < k_base``
      (``sync.k_max``).
  """
  t, c = check_times(t, c)
  k_base, k_max = check_k(k_base, k_max)
  t_star = float(np.max(k_base * t + c))
  budget = t_star * (1.0 + TIME_RTOL)
  k = np.floor((t_star - c) / t)
  k = np.clip(k, 1, k_max).astype(np.int64)
  # One correction step each way for floating-point error in the division.
  up = (k < k_max) & ((k + 1) * t + c <= budget)
  k = k + up
  down = (k > 1) & (k * t + c > budget)
  k = k - down
  return k


def optimal_k_exact(t, c, k_base: int, k_max: int,
                    budget_s: Optional[float] = None) -> np.ndarray:
  """Exact integer search: maximise ``sum_d K_d`` s.t. the round fits a budget.

  Solves, by enumerating ``K = 1..K_max`` for every DC::

      maximise    sum_d K_d
      subject to  K_d t_d + C_d <= T (1 + TIME_RTOL),  K_d in {1, ..., K_max}

  with ``T = budget_s`` or, by default, ``T = T* = max_d (K_base t_d + C_d)``.
  The constraints are separable and the objective increases in each K_d, so the
  unique optimum is each DC's largest feasible K_d (the same point maximises
  ``sum_d p_d K_d`` for any weights ``p_d > 0``). Cost O(D K_max).

  Args:
    t: float [D], seconds per intra-DC iteration of each DC (> 0).
    c: float [D], seconds of inter-DC communication of each DC per round (>= 0).
    k_base: iterations of the slowest DC per round (``sync.k``), >= 1; defines
      T* when ``budget_s`` is None.
    k_max: upper bound on any K_d (``sync.k_max``), >= k_base.
    budget_s: optional round-time budget T in seconds, replacing T*.

  Returns:
    int64 [D], the optimal K_d.

  Raises:
    ValueError: as :func:`optimal_k`, and if ``budget_s`` is not finite or is
      too short for some DC to run even one iteration (infeasible).
  """
  t, c = check_times(t, c)
  k_base, k_max = check_k(k_base, k_max)
  if budget_s is None:
    budget_s = float(np.max(k_base * t + c))
  elif not np.isfinite(budget_s):
    raise ValueError(f'budget_s must be finite seconds, got {budget_s!r}.')
  budget = float(budget_s) * (1.0 + TIME_RTOL)
  ks = np.arange(1, k_max + 1, dtype=np.int64)                  # [K_max]
  feasible = ks[None, :] * t[:, None] + c[:, None] <= budget    # [D, K_max]
  if not np.all(feasible[:, 0]):
    bad = np.flatnonzero(~feasible[:, 0]).tolist()
    raise ValueError(
        f'Round-time budget {budget_s} s is too short for DC(s) {bad} to run '
        'one intra-DC iteration plus the inter-DC communication.')
  # Feasibility is monotone in k, so the largest feasible k is the count.
  return feasible.sum(axis=1).astype(np.int64)


def floor_k(k_d, ratio: float, k_max: int) -> np.ndarray:
  """Raises every K_d to at least ``ceil(ratio * max_e K_e)`` (``sync.k_min_ratio``).

  A lower bound on the local steps of slow DCs in semi-synchronous sync: with
  ``ratio`` = r, no DC runs fewer than a fraction r of the fastest DC's
  iterations, at the cost of a longer round (the slow DCs set T = max_d(K_d t_d +
  C_d), the fast ones idle). r = 0 leaves ``k_d`` unchanged; r = 1 gives every DC
  max_e K_e (periodic sync with that K).

  Args:
    k_d: int [D], the planned K_d (e.g. :func:`optimal_k`).
    ratio: r in [0, 1].
    k_max: upper bound of any K_d (``sync.k_max``).

  Returns:
    int64 [D]: ``min(k_max, max(K_d, ceil(r * max_e K_e - 1e-9)))``.
  """
  k = np.asarray(k_d, np.int64)
  if ratio <= 0:
    return k
  low = int(np.ceil(float(ratio) * int(k.max()) - 1e-9))
  return np.minimum(np.maximum(k, low), k_max).astype(np.int64)
