"""The Streaming DiLoCo table of issue 14 from the runs of a sweep root (Markdown).

  python3 docs/results/streaming_table.py workdirs/shakespeare_streaming

One row per arm of ``configs/sweeps/shakespeare_streaming.py`` (runs that differ
only in ``seed``, hfl.report.stats.group_ids): mean ± sample std over the finished
seeds of the final validation loss, total WAN bytes, peak WAN bytes per sync event,
exposed WAN time, compute utilisation and the WAN bandwidth the cost model needs
for 95% (``summary.json``, hfl.train.wan_summary; ``none suffices`` where the
finished runs' summaries hold null, e.g. data parallel's per-iteration latency
alone exceeds 5% of the time); then, for each arm, the
ratios the issue's goal names against data parallel (``sync.strategy = sync``)
and DiLoCo (``sync.k > 1``, one fragment): peak bandwidth (the 95% figure) and
peak bytes per event, and the relative loss increase. Arms with no finished run
print as ``missing``; nothing is computed from unfinished runs.
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
if REPO not in sys.path:
  sys.path.insert(0, REPO)

# pylint: disable=g-import-not-at-top,wrong-import-position
from hfl import metrics as metrics_lib
from hfl import report
from hfl.report import stats, tables
# pylint: enable=g-import-not-at-top,wrong-import-position

FIELDS = [  # (column, summary.json key, unit of hfl.report.tables' formats)
    ('final val loss (nats/char)', 'final_test_loss', None),
    ('WAN bytes', 'bytes.inter_dc', 'bytes'),
    ('peak WAN bytes / sync', 'peak_wan_bytes_per_sync', 'bytes'),
    ('exposed WAN time', 'exposed_wan_s', 's'),
    ('compute utilisation', 'compute_utilisation', 'fraction'),
    ('WAN Mbit/s for 95%', 'wan_mbps_for_95pct_utilisation', None),
    ('same, latency 0', 'wan_mbps_for_95pct_without_latency', None),
]


def arm(config: dict) -> str:
  """'data parallel', 'DiLoCo' or 'Streaming DiLoCo' for a flattened config."""
  if config.get('sync.strategy') == 'sync':
    return 'data parallel'
  return 'Streaming DiLoCo' if config.get('sync.fragments', 1) > 1 else 'DiLoCo'


NONE_SUFFICES = 'none suffices'  # finished runs whose summary holds null (hfl.train.wan_summary)


def _fmt(st: stats.Stat, unit: str | None, finished: int = 0) -> str:
  if st.mean is None:
    return NONE_SUFFICES if finished and unit is None else 'missing'
  if unit is None:
    return f'{st.mean:.4g}' + (f' ± {st.std:.2g}' if st.std else '')
  return tables.fmt_stat(st, unit)


def rows(frame) -> dict:
  """{arm: {summary key: Stat}} over the finished runs of ``frame`` (hfl.report.load)."""
  out = {}
  groups = stats.group_ids(frame)
  for gid in dict.fromkeys(groups):
    members = frame[groups == gid]
    finished = [r for r in members['run'] if r.finished]
    name = arm(members.iloc[0]['config'])
    out[name] = {key: stats.stat(metrics_lib.value(r.summary, key) for r in finished)
                 for _, key, _ in FIELDS}
    out[name]['runs'] = (len(finished), len(members))
  return out


def ratio(a: stats.Stat, b: stats.Stat, a_finished: int = 0) -> str:
  """a / b of the means; ∞ when a's finished runs need more than any bandwidth."""
  if a.mean is None and a_finished and b.mean:
    return '∞ (no bandwidth suffices for the first)'
  return 'missing' if not (a.mean and b.mean) else f'{a.mean / b.mean:.1f}×'


def markdown(by_arm: dict) -> str:
  """The table and the goal's ratios as Markdown."""
  names = [n for n in ('data parallel', 'DiLoCo', 'Streaming DiLoCo') if n in by_arm]
  lines = tables.markdown_table(
      ['arm', 'finished runs', *(c for c, _, _ in FIELDS)],
      [[n, '{}/{}'.format(*by_arm[n]['runs']),
        *(_fmt(by_arm[n][k], u, by_arm[n]['runs'][0]) for _, k, u in FIELDS)]
       for n in names])
  dp, dl, st = (by_arm.get(n) for n in ('data parallel', 'DiLoCo', 'Streaming DiLoCo'))
  if st and dp and dl:
    bw, bw0, peak, loss = ('wan_mbps_for_95pct_utilisation',
                           'wan_mbps_for_95pct_without_latency', 'peak_wan_bytes_per_sync',
                           'final_test_loss')
    rel = (None if not (st[loss].mean and dp[loss].mean)
           else st[loss].mean / dp[loss].mean - 1)
    lines += ['', f'- WAN bandwidth for 95%: data parallel / streaming = '
              f'{ratio(dp[bw], st[bw], dp["runs"][0])} (goal ≥ 100×); DiLoCo / streaming = '
              f'{ratio(dl[bw], st[bw], dl["runs"][0])} (goal ≥ P×); with latency 0: '
              f'{ratio(dp[bw0], st[bw0], dp["runs"][0])} and '
              f'{ratio(dl[bw0], st[bw0], dl["runs"][0])}',
              f'- peak WAN bytes per sync: data parallel / streaming = '
              f'{ratio(dp[peak], st[peak])}; DiLoCo / streaming = {ratio(dl[peak], st[peak])}',
              '- final validation loss, streaming vs data parallel: '
              + ('missing' if rel is None else f'{100 * rel:+.2f}% (goal ≤ +1%)')]
  return '\n'.join(lines) + '\n'


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('root', help='the sweep root (workdirs below it)')
  args = parser.parse_args(argv)
  print(markdown(rows(report.load([args.root]))), end='')


if __name__ == '__main__':
  main()
