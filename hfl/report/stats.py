"""Seed groups and paired statistics over a run table (:func:`hfl.report.runs.run_frame`).

A *group* is the runs whose configs differ only in ``seed`` (and ``workdir``);
fields some runs lack (added to hfl after they ran) do not split a group. Rows
labelled by chosen keys (``--label-by``) group the runs equal in those keys, and
pair each with the baseline run equal in all the others. A group's value is the
mean over its runs, with the sample std (ddof = 1), n and the standard error
std / √n. A *paired* Δ compares a group with a baseline seed by seed (same
initialisation and data order, which removes most of the seed-to-seed spread):
ours − baseline for every seed both have, × ``scale`` (100: accuracy fractions
to points), then mean ± sample std; the same pairing gives each seed's reduction (1 − ours /
baseline), factor (baseline / ours) and relative change (ours / baseline − 1).
"""

import json
import math
from typing import Any, Iterable, NamedTuple, Sequence

import numpy as np
import pandas as pd

from hfl.report import runs as runs_lib

IGNORED = ('seed', 'workdir')


class Stat(NamedTuple):
  """Mean ± sample std (ddof = 1) of n values; std None below 2 values, mean None at 0."""
  mean: float | None
  std: float | None
  n: int

  @property
  def sem(self) -> float | None:  # standard error of the mean, std / √n
    return None if self.std is None else self.std / math.sqrt(self.n)


def stat(values: Iterable[Any]) -> Stat:
  """The :class:`Stat` of the finite values among ``values`` (None / NaN skipped); the
  std of equal values is exactly 0 (pandas' summation can leave ~1e-16)."""
  v = pd.to_numeric(pd.Series(list(values), dtype=object), errors='coerce').astype(float)
  v = v[np.isfinite(v)]
  if v.empty:
    return Stat(None, None, 0)
  std = (0.0 if v.min() == v.max() else float(v.std())) if len(v) > 1 else None
  return Stat(float(v.mean()), std, int(len(v)))


def group_ids(frame: pd.DataFrame, by: Sequence[str] | None = None,
              but: Sequence[str] = IGNORED) -> pd.Series:
  """A group id (str) per run of ``frame``: runs with equal values of the config keys
  ``by`` (a key a run lacks: None) share one; default ``by``: every key all runs have
  but those in ``but``. A run without a config is its own group."""
  configs = list(frame['config'])
  shared = set.intersection(*(set(c) for c in configs if c)) if any(configs) else set()
  keys = sorted(by or (k for k in shared if k not in but))
  ids = [json.dumps([(k, repr(c.get(k))) for k in keys]) if c else f'workdir:{w}'
         for c, w in zip(configs, frame['workdir'])]
  return pd.Series(ids, index=frame.index, name='group')


def summarize(frame: pd.DataFrame, groups: pd.Series) -> pd.DataFrame:
  """One row per group (first-seen order, NaN as None): ``runs`` (row labels of
  ``frame``), ``seeds``, ``workdirs``, and per metric m of
  :data:`hfl.report.runs.METRICS` its mean ``m``, sample std ``m_std`` and count ``m_n``."""
  metrics = list(runs_lib.METRICS)
  values = frame[metrics].apply(pd.to_numeric, errors='coerce').astype(float)
  by = values.groupby(groups, sort=False)
  out = pd.concat([by.mean(), by.std(ddof=1).add_suffix('_std'), by.count().add_suffix('_n')],
                  axis=1)
  members = frame.groupby(groups, sort=False)
  out['runs'] = pd.Series(frame.index, index=frame.index).groupby(groups, sort=False).agg(list)
  out['seeds'] = members['seed'].agg(list)
  out['workdirs'] = members['workdir'].agg(list)
  return out.astype(object).where(out.notna(), None)


def drop_repeats(frame: pd.DataFrame, groups: pd.Series, pairs: pd.Series | None = None
                 ) -> tuple[pd.DataFrame, pd.Series, pd.Series | None, dict]:
  """``frame``, ``groups``, ``pairs`` without runs repeating one of their group with the same
  config and seed (``pairs`` with ``--label-by``): a copy, a rerun or a run resumed with changes
  adds no sample; kept: the first not changed on resume. And {group: [(left out, kept)]}."""
  same = pd.Series([json.dumps([g, repr(i)]) for g, i in zip(
      groups, frame['seed'] if pairs is None else pairs)], index=frame.index)
  changed = frame['changed'].astype(bool)
  repeats = same[[*frame.index[~changed], *frame.index[changed]]].duplicated().reindex(
      frame.index)
  first = same.map(pd.Series(frame['workdir'][~repeats].values, index=same[~repeats].values))
  left = pd.Series(list(zip(frame['workdir'], first)), index=frame.index)[repeats]
  return (frame[~repeats], groups[~repeats], None if pairs is None else pairs[~repeats],
          left.groupby(groups[repeats]).agg(list).to_dict())


def group_stat(summary: pd.DataFrame, group: str, metric: str) -> Stat:
  """The :class:`Stat` of ``metric`` in one row of :func:`summarize`."""
  get = lambda c: summary.at[group, c]
  return Stat(get(metric), get(f'{metric}_std'), int(get(f'{metric}_n') or 0))


COMPARISONS = ('delta', 'reduction', 'factor', 'change')


def compare(kind: str, ours: float, base: float, scale: float = 1.0) -> float | None:
  """One seed's comparison of ``ours`` with its ``base`` run: ``delta`` scale × (ours −
  base); ``reduction`` 1 − ours / base; ``factor`` base / ours; ``change`` ours / base − 1.
  None where it is undefined (a ratio to a base ≤ 0, a factor of ours ≤ 0) or an input
  is not finite (e.g. a bandwidth no value suffices for)."""
  if kind not in COMPARISONS:
    raise ValueError(f'unknown comparison {kind!r}; allowed: {", ".join(COMPARISONS)}')
  if not (math.isfinite(ours) and math.isfinite(base)):
    return None
  if kind == 'delta':
    return scale * (ours - base)
  if kind == 'factor':
    return base / ours if ours > 0 else None
  if base <= 0:
    return None
  return 1.0 - ours / base if kind == 'reduction' else ours / base - 1.0


def paired(frame: pd.DataFrame, groups: pd.Series, group: str, base: str,
           metric: str = 'final_acc', scale: float = 100.0,
           pairs: pd.Series | None = None, kind: str = 'delta') -> tuple[Stat, dict]:
  """The paired comparison of ``metric``, ``group`` vs ``base``: (its :class:`Stat`,
  {seed: value}); ``kind`` (:func:`compare`): the Δ (default), or the reduction, factor
  or relative change of each seed's run against the baseline run of the same seed.

  ``pairs``: per run, what pairs it with a baseline run (default its ``seed``; rows of
  chosen keys pair on the others, :func:`group_ids`; the dict is then keyed by those).
  Only seeds with a value on both sides count; a seed twice in a group keeps its first
  run (:func:`hfl.report.tables.build_table` leaves such repeats out first, naming them).
  """
  def by_seed(g):
    rows = frame.loc[groups == g]
    s = rows[metric].set_axis(rows['seed'] if pairs is None else pairs[groups == g])
    s = s[~s.index.duplicated()]
    return pd.to_numeric(s, errors='coerce').astype(float)
  ours, base_ = by_seed(group), by_seed(base)
  both = sorted(set(ours.dropna().index) & set(base_.dropna().index))
  d = {k: compare(kind, float(ours[k]), float(base_[k]), scale) for k in both}
  d = {k: v for k, v in d.items() if v is not None}
  return stat(d.values()), d


def reduction(ours: float | None, base: float | None) -> float | None:
  """1 − ours / base; None when either is missing or base ≤ 0."""
  return None if ours is None or base is None or base <= 0 else 1.0 - ours / base


def factor(ours: float | None, base: float | None) -> float | None:
  """base / ours (∞ for ours = 0); None when either is missing."""
  return None if ours is None or base is None else math.inf if ours == 0 else base / ours
