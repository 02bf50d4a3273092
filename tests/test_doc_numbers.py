"""The hand-written pages quote the archived runs correctly (issue 47).

docs/results.md is generated and checked by tests/test_pages.py; the discussion pages
(docs/co3.md, docs/dgc.md, docs/semisync.md, ...) are written by hand. Here their
results tables are recomputed from the runs in docs/results/runs that they name (plain
json + numpy: paired Δ = run − baseline run of the same seed, mean ± sample std over
seeds, standard error = std / √n), and every docs/results.md section they name must
exist. Each quoted number must equal the recomputed one at the precision it is printed.
"""

import glob
import json
import os
import re

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(REPO, 'docs')
ARCHIVE = os.path.join(DOCS, 'results', 'runs')
HAND_WRITTEN = ['README.md', 'docs/co3.md', 'docs/dgc.md', 'docs/semisync.md',
                'docs/streaming.md', 'docs/bandwidth.md', 'docs/broadcast.md']


def _read(rel):
  with open(os.path.join(REPO, rel), encoding='utf-8') as f:
    return f.read()


def _flat(d, prefix=''):
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flat(v, prefix + k + '.'))
    else:
      out[prefix + k] = v
  return out


def _runs(sweep):
  """[(flat config, summary)] of every finished run of an archived sweep."""
  runs = []
  for path in sorted(glob.glob(os.path.join(ARCHIVE, sweep, '*', 'summary.json'))):
    with open(path, encoding='utf-8') as f:
      summary = json.load(f)
    runs.append((_flat(summary['config']), summary))
  assert runs, f'no archived runs in {sweep}'
  return runs


def _num(text):
  """(value, decimals) of a printed number ('−0.16', '+0.20', '8,800', '17.4')."""
  t = text.strip().replace('−', '-').replace(',', '')
  dec = len(t.split('.')[1]) if '.' in t else 0
  return float(t), dec


def _check(printed, value, what):
  shown, dec = _num(printed)
  assert abs(shown - value) <= 0.5 * 10 ** -dec + 1e-9, (
      f'{what}: the page says {printed.strip()}, the archive gives {value:.6g}')


def _paired(runs, base, metric):
  """per-seed differences (seed order), mean, sample std, standard error."""
  by_seed = {c.get('seed', 0): s for c, s in base}
  seeds = sorted(c.get('seed', 0) for c, _ in runs)
  run_by_seed = {c.get('seed', 0): s for c, s in runs}
  d = np.array([metric(run_by_seed[k]) - metric(by_seed[k]) for k in seeds])
  sd = d.std(ddof=1) if len(d) > 1 else float('nan')
  return seeds, d, d.mean(), sd, sd / np.sqrt(len(d))


def _table_after(text, marker):
  """Rows (lists of cells) of the first markdown table after ``marker``."""
  i = text.index(marker)
  rows = []
  for line in text[i:].splitlines():
    if line.startswith('|'):
      rows.append([c.strip() for c in line.strip().strip('|').split('|')])
    elif rows:
      break
  assert len(rows) > 2, f'no table after {marker!r}'
  return rows[2:]  # skip the header and the separator


def _seeds(cell):
  return [int(x) for x in cell.split(',')]


def _acc(s):
  return 100 * s['final_test_accuracy']


# --- every docs/results.md section a page names exists --------------------------------


def _slug(heading):
  s = re.sub(r'[^\w\- ]', '', heading.lower())
  return s.replace(' ', '-')


def test_results_sections_named_by_the_pages_exist():
  headings = re.findall(r'^#{2,3} (.+)$', _read('docs/results.md'), flags=re.M)
  slugs = {_slug(h) for h in headings}
  named = 0
  for rel in HAND_WRITTEN:
    text = _read(rel)
    for anchor in re.findall(r'results\.md#([\w\-]+)', text):
      named += 1
      assert anchor in slugs, f'{rel}: link to docs/results.md#{anchor}, no such section'
    for name in re.findall(r'section "([^"]+)"|"([^"]+)" section', text):
      name = name[0] or name[1]
      if name == 'How to read':
        name = 'How to read this page'
      named += 1
      assert any(h.startswith(name) for h in headings), (
          f'{rel}: names docs/results.md section "{name}", which does not exist')
  assert named >= 5  # the check reads something


# --- docs/co3.md -------------------------------------------------------------------------


def _co3_rows(sweep):
  runs = _runs(sweep)
  base = [(c, s) for c, s in runs if c['compression.uplink.name'] == 'identity']
  def arm(label):
    if label == 'uncompressed':
      return base
    gamma = float(re.fullmatch(r'CO3 fp4, γ = ([\d.]+)', label).group(1))
    return [(c, s) for c, s in runs if c['compression.uplink.name'] == 'co3'
            and c['compression.uplink.gamma'] == gamma]
  return base, arm


@pytest.mark.parametrize('sweep', ['co3_iid', 'co3_paper'])
def test_co3_tables_are_the_archived_runs(sweep):
  base, arm = _co3_rows(sweep)
  up = lambda s: s['bytes']['intra_up']
  base_up = {c.get('seed', 0): up(s) for c, s in base}
  rows = _table_after(_read('docs/co3.md'), f'From `docs/results/runs/{sweep}`')
  assert {r[0] for r in rows} >= {'uncompressed', 'CO3 fp4, γ = 0.9'}
  for row in rows:
    label, seeds, acc, delta, nbytes, factor = row[:6]
    runs = arm(label)
    what = f'co3.md, {sweep}, {label}'
    assert _seeds(seeds) == sorted(c.get('seed', 0) for c, _ in runs), what
    accs = np.array([_acc(s) for _, s in sorted(runs, key=lambda r: r[0].get('seed', 0))])
    m = re.fullmatch(r'([\d.]+)(?: ± ([\d.]+))?%', acc)
    _check(m.group(1), accs.mean(), what + ', accuracy')
    if m.group(2):
      _check(m.group(2), accs.std(ddof=1), what + ', accuracy std')
    per_seed_up = [up(s) for _, s in sorted(runs, key=lambda r: r[0].get('seed', 0))]
    if label == 'uncompressed':
      _check(nbytes.replace(' GB', ''), np.mean(per_seed_up) / 1e9, what + ', bytes')
      continue
    seeds_, d, mean, sd, se = _paired(runs, base, _acc)
    m = re.fullmatch(r'\**([−+\d.]+)(?: ± ([\d.]+))? pts\**(?: \(([^)]*)\))?', delta)
    assert m, f'{what}: paired Δ cell {delta!r}'
    _check(m.group(1), mean, what + ', paired Δ')
    if m.group(2):
      _check(m.group(2), sd, what + ', paired Δ std')
    if m.group(3):
      for printed, v in zip(m.group(3).split(','), d, strict=True):
        _check(printed, v, what + ', per-seed Δ')
    for printed, v in zip(nbytes.replace(' MB', '').split('/'), per_seed_up, strict=True):
      _check(printed, v / 1e6, what + ', uplink MB')
    fac = np.mean([base_up[c.get('seed', 0)] / up(s) for c, s in runs])
    _check(factor.rstrip('×'), fac, what + ', fewer uplink bytes')
    if len(row) > 6:  # bits per entry: 32 × mean bytes / uncompressed mean bytes
      _check(row[6], 32 * np.mean(per_seed_up) / np.mean(list(base_up.values())),
             what + ', bits per entry')


# --- docs/dgc.md -------------------------------------------------------------------------


def _compression_1gbit():
  """The compression sweep's 1 Gbit/s runs, its uncompressed ones, and a function giving
  each run's factor (uncompressed / its intra-DC up + down bytes, same seed)."""
  runs = [(c, s) for c, s in _runs('compression') if c['network.lan_bandwidth_gbps'] == 1.0]
  base = [(c, s) for c, s in runs if c['compression.uplink.name'] == 'identity']
  both = lambda s: s['bytes']['intra_up'] + s['bytes']['intra_down']
  base_both = {c.get('seed', 0): both(s) for c, s in base}
  factors = lambda arm: [base_both[c.get('seed', 0)] / both(s) for c, s in arm]
  return runs, base, factors


def _broadcast_arm(runs, rho, mode='downlink', correction=0.0):
  return [(c, s) for c, s in runs if c['compression.uplink.name'] == 'topk'
          and c.get('compression.broadcast', 'gather') == mode
          and abs(c['compression.uplink.density'] - rho) < 1e-12
          and abs(c.get('compression.broadcast_density', 0.0) - correction) < 1e-12]


def test_dgc_table_is_the_archived_compression_runs():
  runs, base, factors = _compression_1gbit()
  rows = _table_after(_read('docs/dgc.md'), '| arm | density |')
  assert len(rows) >= 3
  for arm, density, seeds, delta, se, verdict, factor in rows:
    mode = re.search(r'`(gather|downlink)`', arm).group(1)
    rho = _num(density.rstrip('%'))[0] / 100
    sel = _broadcast_arm(runs, rho, mode)
    what = f'dgc.md, {mode} {density}'
    assert _seeds(seeds) == sorted(c.get('seed', 0) for c, _ in sel), what
    _, _, mean, sd, se_v = _paired(sel, base, _acc)
    m = re.fullmatch(r'([−+\d.]+) ± ([\d.]+) pts', delta)
    _check(m.group(1), mean, what + ', paired Δ')
    _check(m.group(2), sd, what + ', paired Δ std')
    _check(se, se_v, what + ', standard error')
    met = len(sel) >= 3 and mean - se_v >= -0.5
    assert verdict == ('met' if met else 'not met'), what
    _check(factor.rstrip('×'), np.mean(factors(sel)), what + ', fewer intra-DC bytes')


# --- docs/broadcast.md ------------------------------------------------------------------


def test_broadcast_density_table_is_the_archived_compression_runs():
  runs, base, factors = _compression_1gbit()
  rows = _table_after(_read('docs/broadcast.md'), '| uplink / downlink density |')
  assert len(rows) == 4
  for density, correction, saved, delta in rows:
    rho = _num(density.rstrip('%'))[0] / 100
    own = 0.0 if 'the downlink' in correction else _num(correction.rstrip('%'))[0] / 100
    arm = _broadcast_arm(runs, rho, correction=own)
    what = f'broadcast.md, {density} / {correction}'
    assert len(arm) == 3, what
    ratios = factors(arm)
    m = re.fullmatch(r'([\d.]+)% \(([\d.]+)×\)', saved)
    _check(m.group(1), 100 * np.mean([1 - 1 / r for r in ratios]), what + ', bytes saved')
    _check(m.group(2), np.mean(ratios), what + ', factor')
    _, _, mean, sd, _ = _paired(arm, base, _acc)
    m = re.fullmatch(r'([−+\d.]+) ± ([\d.]+) pts', delta)
    _check(m.group(1), mean, what + ', paired Δ')
    _check(m.group(2), sd, what + ', paired Δ std')


def _curves(sweep):
  """[(flat config, [(step, test accuracy)])] of every finished run of an archived sweep."""
  out = []
  for path in sorted(glob.glob(os.path.join(ARCHIVE, sweep, '*', 'summary.json'))):
    with open(path, encoding='utf-8') as f:
      config = _flat(json.load(f)['config'])
    with open(os.path.join(os.path.dirname(path), 'metrics.jsonl'), encoding='utf-8') as f:
      recs = [json.loads(l) for l in f if 'test_accuracy' in l]
    out.append((config, [(r['step'], r['test_accuracy']) for r in recs]))
  return out


def test_broadcast_delay_table_is_the_archived_curves():
  """docs/broadcast.md's delay table, recomputed here with plain numpy: the paired Δ at
  the middle and the last evaluation, and where uncompressed's 3-evaluation trailing mean
  first reaches the compressed run's final one."""
  rows = _table_after(_read('docs/broadcast.md'), '| workload (schedule, iterations) |')
  assert len(rows) == 7
  workload = None
  for name, point, mid, final, reached in rows:
    workload = name or workload
    sweep = 'compression' if workload.startswith('Fashion') else 'cifar10_compression'
    curves = [(c, v) for c, v in _curves(sweep)
              if c.get('network.lan_bandwidth_gbps', 1.0) == 1.0]
    m = re.fullmatch(r'top-k ([\d.]+)%, (re-gathered model|compressed broadcast)', point)
    rho, mode = float(m.group(1)) / 100, 'gather' if m.group(2).startswith('re') else 'downlink'
    arm = sorted(_broadcast_arm(curves, rho, mode), key=lambda r: r[0].get('seed', 0))
    base = {c.get('seed', 0): v for c, v in curves if c['compression.uplink.name'] == 'identity'}
    what = f'broadcast.md, {workload}, {point}'
    assert len(arm) == 3, what
    mids, finals, fractions = [], [], []
    for c, v in arm:
      b = base[c.get('seed', 0)]
      acc, b_acc = np.array([a for _, a in v]), np.array([a for _, a in b])
      mids.append(acc[len(acc) // 2] - b_acc[len(acc) // 2])
      finals.append(acc[-1] - b_acc[-1])
      smooth = lambda x: np.array([x[max(0, i - 2):i + 1].mean() for i in range(len(x))])
      hit = np.nonzero(smooth(b_acc) >= smooth(acc)[-1])[0]
      fractions.append(b[hit[0]][0] / b[-1][0] if len(hit) else None)
    _check(mid, 100 * np.mean(mids), what + ', Δ at mid-run')
    _check(final, 100 * np.mean(finals), what + ', final Δ')
    for shown, f in zip(reached.split(', '), fractions):
      if shown == '–':
        assert f is None, what
      else:
        _check(shown, f, what + ', where uncompressed reaches it')


# --- docs/semisync.md: the equal-time tables (seed 0) ------------------------------------

_STRATEGY = {'sync (K = 1)': ('sync', False), 'periodic K = 4': ('periodic', False),
             'semi_sync': ('semi_sync', False),
             'semi_sync + progress-aware K': ('semi_sync', True),
             'AdaComm (τ₀ = 4)': ('adacomm', False)}


@pytest.mark.parametrize('marker,speed', [('**First runs (seed 0, speeds 3× apart', 3.0),
                                          ('**Speeds 10× apart (seed 0', 10.0)])
def test_semisync_equal_time_tables_are_the_archived_runs(marker, speed):
  runs = _runs('semisync_budget')
  rows = _table_after(_read('docs/semisync.md'), marker)
  assert len(rows) == 5
  for label, acc, iters, rounds, r_target, t_target in rows:
    strategy, pa = _STRATEGY[label]
    (s,) = [s for c, s in runs if c['sync.strategy'] == strategy
            and bool(c['sync.progress_aware']) == pa and c['network.dc_speed'][0] == speed
            and c.get('seed', 0) == 0]
    what = f'semisync.md, {speed:g}×, {label}'
    _check(acc.rstrip('%'), _acc(s), what + ', accuracy at the budget')
    _check(iters, s['intra_dc_iterations'], what + ', iterations')
    _check(rounds, s['inter_dc_rounds'], what + ', rounds')
    _check(r_target, s['rounds_to_target'], what + ', rounds to target')
    _check(t_target.rstrip(' s'), s['time_to_target_s'], what + ', time to target')


def test_the_checks_can_fail():
  with pytest.raises(AssertionError):
    _check('−0.47', -0.46, 'a number one step off')
  with pytest.raises(AssertionError):
    _check('2.57', 3.38, 'the old DGC number')
  _check('−0.47', -0.4749, 'rounded')


_SPEED = {'3×': 3.0, '10×': 10.0}


def test_semisync_equal_time_three_seed_table_is_the_archived_runs():
  """docs/semisync.md's table of all three seeds: mean ± sample std of the accuracy at the
  budget, the paired Δ against sync of the same seed, the mean rounds, and the means of
  rounds and simulated time to the target over the seeds that reached it."""
  runs = _runs('semisync_budget')
  rows = _table_after(_read('docs/semisync.md'), '**All three seeds, equal simulated time')
  assert len(rows) == 10
  for speed, label, seeds, acc, delta, rounds, r_target, t_target in rows:
    strategy, pa = _STRATEGY[label]
    pick = lambda st, p: [(c, s) for c, s in runs if c['sync.strategy'] == st
                          and bool(c['sync.progress_aware']) == p
                          and c['network.dc_speed'][0] == _SPEED[speed]]
    arm, base = pick(strategy, pa), pick('sync', False)
    what = f'semisync.md, three seeds, {speed}, {label}'
    assert _seeds(seeds) == sorted(c.get('seed', 0) for c, _ in arm), what
    ordered = [s for _, s in sorted(arm, key=lambda r: r[0].get('seed', 0))]
    accs = np.array([_acc(s) for s in ordered])
    m = re.fullmatch(r'([\d.]+) ± ([\d.]+)%', acc)
    _check(m.group(1), accs.mean(), what + ', accuracy')
    _check(m.group(2), accs.std(ddof=1), what + ', accuracy std')
    if strategy != 'sync':
      _, _, mean, sd, _ = _paired(arm, base, _acc)
      m = re.fullmatch(r'([−+\d.]+) ± ([\d.]+) pts', delta)
      _check(m.group(1), mean, what + ', paired Δ')
      _check(m.group(2), sd, what + ', paired Δ std')
    _check(rounds, np.mean([s['inter_dc_rounds'] for s in ordered]), what + ', rounds')
    reached = [s for s in ordered if s['rounds_to_target'] is not None]
    _check(r_target.split(' (')[0], np.mean([s['rounds_to_target'] for s in reached]),
           what + ', rounds to target')
    _check(t_target.rstrip(' s'), np.mean([s['time_to_target_s'] for s in reached]),
           what + ', time to target')


def test_semisync_lm_progress_aware_paragraph_is_the_archived_runs():
  """docs/semisync.md's LM paragraph on progress-aware K with the cap on K_base only:
  the final validation loss relative to sync's of the same seed (per seed, mean and
  standard error), the rounds (mean ± sample std), the reductions against sync and
  plain semi_sync (K_base = 4), and the loss relative to plain semi_sync's, recomputed
  from the archived runs with plain numpy."""
  text = re.sub(r'\s+', ' ', _read('docs/semisync.md'))
  m = re.search(r'Progress-aware K with the cap on K_base only \(3 runs at \w+\) ends '
                r'([+−][\d.]+)% from sync \(per seed ([+−][\d.]+)%, ([+−][\d.]+)%, '
                r'([+−][\d.]+)%; standard error ([\d.]+)%\), inside the 1% bar. It uses '
                r'(\d+) ± (\d+) rounds, ([\d.]+)% fewer than plain semi_sync.s (\d+) and '
                r'([\d.]+)% fewer than sync.s ([\d,]+)', text)
  assert m, 'the paragraph is not where it was'
  m2 = re.search(r'its final loss is ([\d.]+)%, ([\d.]+)% and ([\d.]+)% above plain '
                 r'semi_sync.s of the same seed \(mean ([\d.]+)%\)', text)
  assert m2, 'the comparison with plain semi_sync is not where it was'
  by_arm = {}
  for c, s in _runs('shakespeare_semisync_work'):
    arm = (c['sync.strategy'], c['sync.k'], bool(c['sync.progress_aware']))
    by_arm.setdefault(arm, {})[c.get('seed', 0)] = s
  sync = next(v for (strategy, _, _), v in by_arm.items() if strategy == 'sync')
  plain, pa = by_arm[('semi_sync', 4, False)], by_arm[('semi_sync', 4, True)]
  seeds = sorted(pa)
  assert seeds == [0, 1, 2]
  loss = lambda runs, k: runs[k]['final_test_loss']
  rel = np.array([100 * (loss(pa, k) / loss(sync, k) - 1) for k in seeds])
  what = 'semisync.md, LM progress-aware'
  _check(m.group(1), rel.mean(), what + ', mean')
  for printed, value in zip(m.group(2, 3, 4), rel):
    _check(printed, value, what + ', per seed')
  _check(m.group(5), rel.std(ddof=1) / np.sqrt(3), what + ', standard error')
  rounds = np.array([pa[k]['inter_dc_rounds'] for k in seeds], float)
  _check(m.group(6), rounds.mean(), what + ', rounds')
  _check(m.group(7), rounds.std(ddof=1), what + ', rounds std')
  plain_rounds = np.mean([plain[k]['inter_dc_rounds'] for k in seeds])
  sync_rounds = np.mean([sync[k]['inter_dc_rounds'] for k in seeds])
  _check(m.group(9), plain_rounds, what + ', plain semi_sync rounds')
  _check(m.group(11), sync_rounds, what + ', sync rounds')
  _check(m.group(8), 100 * (1 - rounds.mean() / plain_rounds), what + ', vs plain semi_sync')
  _check(m.group(10), 100 * (1 - rounds.mean() / sync_rounds), what + ', vs sync')
  vs_plain = np.array([100 * (loss(pa, k) / loss(plain, k) - 1) for k in seeds])
  for printed, value in zip(m2.group(1, 2, 3), vs_plain):
    _check(printed, value, what + ', vs plain semi_sync, per seed')
  _check(m2.group(4), vs_plain.mean(), what + ', vs plain semi_sync, mean')


def test_semisync_cifar_progress_aware_paragraph_is_the_archived_runs():
  """docs/semisync.md's CIFAR-10 paragraph on progress-aware K with the cap on K_base
  only: rounds (mean ± sample std) and their cut against plain semi_sync (K_base = 4),
  the paired Δ against sync (per seed, mean, standard error) and against plain
  semi_sync, recomputed from the archived runs with plain numpy."""
  text = re.sub(r'\s+', ' ', _read('docs/semisync.md'))
  m = re.search(r'It uses (\d+) ± (\d+) rounds, ([\d.]+)% fewer than plain semi_sync.s (\d+), '
                r'but ends ([−+][\d.]+) pts from sync \(per seed ([−+][\d.]+), ([−+][\d.]+), '
                r'([−+][\d.]+); standard error ([\d.]+)\) and ([\d.]+) pts below plain '
                r'semi_sync of the same seed \(([−+][\d.]+), ([−+][\d.]+), ([−+][\d.]+)\)', text)
  assert m, 'the paragraph is not where it was'
  by_arm = {}
  for c, s in _runs('cifar10_semisync_work'):
    arm = (c['sync.strategy'], c['sync.k'], bool(c['sync.progress_aware']),
           c.get('sync.k_max_scope', 'every_dc'))
    by_arm.setdefault(arm, {})[c.get('seed', 0)] = s
  sync = next(v for arm, v in by_arm.items() if arm[0] == 'sync')
  plain = by_arm[('semi_sync', 4, False, 'every_dc')]
  capped = by_arm[('semi_sync', 4, True, 'k_base')]
  seeds = sorted(capped)
  assert seeds == [0, 1, 2]
  what = 'semisync.md, CIFAR-10 progress-aware, K_max on K_base'
  rounds = np.array([capped[k]['inter_dc_rounds'] for k in seeds], float)
  plain_rounds = np.mean([plain[k]['inter_dc_rounds'] for k in seeds])
  _check(m.group(1), rounds.mean(), what + ', rounds')
  _check(m.group(2), rounds.std(ddof=1), what + ', rounds std')
  _check(m.group(3), 100 * (1 - rounds.mean() / plain_rounds), what + ', fewer rounds')
  _check(m.group(4), plain_rounds, what + ', plain semi_sync rounds')
  _, d, mean, _, se = _paired([(dict(seed=k), capped[k]) for k in seeds],
                              [(dict(seed=k), sync[k]) for k in seeds], _acc)
  _check(m.group(5), mean, what + ', paired Δ vs sync')
  for printed, value in zip(m.group(6, 7, 8), d):
    _check(printed, value, what + ', per seed vs sync')
  _check(m.group(9), se, what + ', standard error')
  _, d, mean, _, _ = _paired([(dict(seed=k), capped[k]) for k in seeds],
                             [(dict(seed=k), plain[k]) for k in seeds], _acc)
  _check(m.group(10), -mean, what + ', below plain semi_sync')
  for printed, value in zip(m.group(11, 12, 13), d):
    _check(printed, value, what + ', per seed vs plain semi_sync')
