"""Tests of hfl.report.results on hand-made sweep workdirs.

The fake workdirs sit where the three sweeps put their runs (names written out
by hand from configs/sweeps/*.py) and hold the configs those sweeps produce;
the expected numbers below are computed by hand from the fake curves.
"""

import datetime
import importlib.util
import json
import math
import os

import pytest

from hfl import sweep
from hfl.report import anchors
from hfl.report import results

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PNG_MAGIC = b'\x89PNG\r\n\x1a\n'
NOW = datetime.datetime(2025, 1, 2, 3, 4, tzinfo=datetime.timezone.utc)

# configs/sweeps/compression.py: FIXED, shared with the CO3 sweeps.
FIXED = ('network.lan_bandwidth_gbps=1.0__train.eval_every=10__'
         'train.num_steps=600')
FIXED_OVERRIDES = {'train.num_steps': 600, 'train.eval_every': 10,
                   'network.lan_bandwidth_gbps': 1.0}


def _sparse_overrides(d, seed=None, lan=None):
  o = dict(FIXED_OVERRIDES, **{
      'compression.uplink.name': 'topk', 'compression.downlink.name': 'topk',
      'compression.small': 'bfloat16', 'compression.small_threshold': 16384,
      'compression.uplink.density': d, 'compression.downlink.density': d})
  if seed is not None:
    o['seed'] = seed
  if lan is not None:
    o['network.lan_bandwidth_gbps'] = lan
  return o


def sparse_name(d, seed=None, lan=None):
  """Workdir of a top-k point: over 200 characters, so cut + hashed."""
  readable = ('compression.downlink.density={d}__compression.downlink.name='
              'topk__compression.small=bfloat16__compression.small_threshold='
              '16384__compression.uplink.density={d}__compression.uplink.name='
              'topk__network.lan_bandwidth_gbps={lan}__').format(
                  d=d, lan=1.0 if lan is None else lan)
  name = sweep.run_name(_sparse_overrides(d, seed, lan))
  assert len(readable) > 200 and name.startswith(readable[:200] + '-')
  return name


IDENTITY = 'compression.uplink.name=identity__' + FIXED
# Seeds 1 and 2, and the 100 Mbit/s LAN, of the identity point.
IDENTITY_SEED = ('compression.uplink.name=identity__network.lan_bandwidth_gbps='
                 '1.0__seed={s}__train.eval_every=10__train.num_steps=600')
IDENTITY_SLOW = ('compression.uplink.name=identity__network.lan_bandwidth_gbps='
                 '0.1__train.eval_every=10__train.num_steps=600')
TOPK = 'top-k ρ={}% up/down, bf16 small'
# configs/sweeps/co3_paper.py (SGD) and co3_iid.py (SGD + IID, K = 1).
SGD_OVERRIDES = dict(FIXED_OVERRIDES, **{'optimizer.name': 'sgd',
                                         'optimizer.learning_rate': 0.01})
IID_OVERRIDES = dict(SGD_OVERRIDES, **{'dataset.partition': 'iid',
                                       'sync.k': 1, 'train.eval_every': 25})
# The uncompressed seed-0 points, as in the real workdirs.
IID_IDENTITY = ('compression.uplink.name=identity__dataset.partition=iid__'
                'network.lan_bandwidth_gbps=1.0__optimizer.learning_rate=0.01__'
                'optimizer.name=sgd__seed={s}__sync.k=1__train.eval_every=25__'
                'train.num_steps=600')
HFL_IDENTITY = ('compression.uplink.name=identity__network.lan_bandwidth_gbps='
                '1.0__optimizer.learning_rate=0.01__optimizer.name=sgd__'
                'train.eval_every=10__train.num_steps=600')


def co3_overrides(base, gamma=None, seed=None):
  """A CO3 sweep point: uncompressed (``gamma`` None) or CO3 fp4 at γ."""
  o = dict(base, **({'compression.uplink.name': 'identity'} if gamma is None
                    else {'compression.uplink.name': 'co3',
                          'compression.uplink.fmt': 'fp4',
                          'compression.uplink.gamma': gamma}))
  if seed is not None:
    o['seed'] = seed
  return o


def co3_name(base, gamma=None, seed=None):
  return sweep.run_name(co3_overrides(base, gamma, seed))


# Grid order of configs/sweeps/co3_iid.py (seed always set) and co3_paper.py
# (seed 0 is the default config's, not an override): (gamma, seed).
IID_POINTS = ([(g, s) for s in (0, 1, 2) for g in (None, 0.9)]
              + [(0.0, s) for s in (0, 1, 2)] + [(0.5, 0), (1.0, 0)]
              + [(g, s) for g in (0.5, 1.0) for s in (1, 2)])
HFL_POINTS = ([(None, None)] + [(g, None) for g in (0.0, 0.5, 0.9, 1.0)]
              + [(None, 1), (None, 2), (0.9, 1), (0.9, 2)])
SEMI = {
    'sync': 'sync.strategy=sync__train.eval_every=40',
    'periodic': 'sync.strategy=periodic__train.eval_every=10',
    'semi_sync': 'sync.strategy=semi_sync__train.eval_every=4',
    'progress': 'sync.progress_aware=True__sync.strategy=semi_sync__'
                'train.eval_every=2',
    'adacomm': 'sync.strategy=adacomm__train.eval_every=10',
}


def _config(config_file, **overrides):
  """The resolved config (as config.json stores it) with dotted overrides."""
  spec = importlib.util.spec_from_file_location(
      '_test_cfg', os.path.join(REPO, config_file))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  cfg = module.get_config()
  cfg.update_from_flattened_dict(overrides)
  return json.loads(cfg.to_json())


def _write_run(workdir, config, evals, final_bytes, idle=None, done=True):
  """Writes metrics.jsonl, config.json and (if done) summary.json.

  Args:
    workdir: path.
    config: resolved config.
    evals: list of (round, test_accuracy, sim_time_s).
    final_bytes: (intra_up, intra_down, inter_dc) totals at the end (bytes);
      evaluation i of n logs the fraction (i + 1) / n of them.
    idle: per-DC idle seconds for summary.json.
    done: write summary.json.
  """
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, 'config.json'), 'w') as f:
    json.dump(config, f)
  n = len(evals)
  links = ('intra_up', 'intra_down', 'inter_dc')
  with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
    for i, (rnd, acc, t) in enumerate(evals):
      f.write(json.dumps({
          'step': 4 * rnd, 'round': rnd, 'test_accuracy': acc,
          'test_loss': 1 - acc, 'train_loss': 1 - acc,
          'bytes': {l: b * (i + 1) / n for l, b in zip(links, final_bytes)},
          'sim_time_s': t, 'wall_time_s': 1.0 + i, 'k': 4}) + '\n')
  if not done:
    return
  rnd, _, t = evals[-1]
  summary = {
      'final_test_accuracy': evals[-1][1],
      'best_test_accuracy': max(e[1] for e in evals),
      'final_test_loss': 1 - evals[-1][1],
      'inter_dc_rounds': rnd, 'intra_dc_iterations': 600,
      'bytes': dict(zip(links, final_bytes)), 'sim_time_s': t,
      'wall_time_s': 10.0, 'time_to_target_s': None, 'rounds_to_target': None,
      'target_accuracy': config['train']['target_accuracy'], 'config': config}
  if idle is not None:
    summary['idle_s'] = idle
  with open(os.path.join(workdir, 'summary.json'), 'w') as f:
    json.dump(summary, f)


@pytest.fixture(name='root')
def fixture_root(tmp_path):
  """A results root with finished, partial and missing runs of all sweeps."""
  root = str(tmp_path / 'workdirs')
  semi = lambda **kw: _config('configs/semisync.py', **kw)
  # Semisync, target 0.85. sync: crosses 0.85 at round 150, t = 150 s.
  _write_run(f'{root}/semisync/{SEMI["sync"]}',
             semi(**{'sync.strategy': 'sync', 'train.eval_every': 40}),
             [(100, 0.80, 100.0), (200, 0.90, 200.0)], (1e6, 1e6, 8e8),
             idle=[0.0, 10.0, 20.0, 30.0])
  # periodic: crosses at round 37.5, t = 60 s; final 0.896 (-0.4 pts).
  _write_run(f'{root}/semisync/{SEMI["periodic"]}',
             semi(**{'sync.strategy': 'periodic', 'train.eval_every': 10}),
             [(25, 0.80, 40.0), (50, 0.90, 80.0), (150, 0.896, 240.0)],
             (1e6, 1e6, 2e8), idle=[1.0, 2.0, 3.0, 4.5])
  # semi_sync: never reaches 0.85; no idle_s in its summary.
  _write_run(f'{root}/semisync/{SEMI["semi_sync"]}',
             semi(**{'sync.strategy': 'semi_sync', 'train.eval_every': 4}),
             [(10, 0.50, 30.0), (20, 0.80, 60.0)], (1e6, 1e6, 1e8))
  # progress-aware: interrupted (no summary.json); adacomm: never started.
  _write_run(f'{root}/semisync/{SEMI["progress"]}',
             semi(**{'sync.strategy': 'semi_sync', 'sync.progress_aware': True,
                     'train.eval_every': 2}),
             [(2, 0.40, 5.0), (4, 0.61, 10.0)], (1e5, 1e5, 1e6), done=False)

  # Compression, target 0.88 (configs/default.py). 1 Gbit/s LAN: seeds 0, 1,
  # 2 of identity, 2 % (seed 2 interrupted), 1 %; 0.3 % seed 0 only; 0.1 %
  # not started. 100 Mbit/s: identity and 2 %, seed 0.
  comp = lambda **kw: _config('configs/default.py',
                              **dict(FIXED_OVERRIDES, **kw))
  sparse = lambda d, **kw: _config('configs/default.py',
                                   **dict(_sparse_overrides(d), **kw))
  ident = lambda **kw: comp(**{'compression.uplink.name': 'identity'}, **kw)
  curve = lambda t1, t2, t3, final: [(10, 0.85, t1), (20, 0.91, t2),
                                     (150, final, t3)]
  # identity: crosses 0.88 at t = 20 s for every seed; up + down = 2000 MB;
  # final 0.90 / 0.89 / 0.91 (mean 0.90, std 0.01).
  for seed, final in ((0, 0.90), (1, 0.89), (2, 0.91)):
    _write_run(f'{root}/compression/'
               + (IDENTITY if seed == 0 else IDENTITY_SEED.format(s=seed)),
               ident(**({'seed': seed} if seed else {})),
               curve(10.0, 30.0, 60.0, final), (1000e6, 1000e6, 5e6))
  # 2 %: 50 MB -> 97.5 %, 40x; t = 3 s (-85 %). Seed 0: 0.897 (-0.3 pts vs
  # identity seed 0), seed 1: 0.884 (-0.6 pts vs 0.89); seed 2 interrupted.
  # Paired: -0.45 ± 0.2121 (n=2); Δ of the means: 0.8905 - 0.90 = -0.95 pts.
  for seed, final in ((0, 0.897), (1, 0.884)):
    _write_run(f'{root}/compression/{sparse_name(0.02, seed or None)}',
               sparse(0.02, **({'seed': seed} if seed else {})),
               curve(2.0, 4.0, 9.0, final), (30e6, 20e6, 5e6))
  _write_run(f'{root}/compression/{sparse_name(0.02, 2)}',
             sparse(0.02, seed=2), [(10, 0.85, 2.0)], (1e6, 1e6, 1e5),
             done=False)
  # 1 %: 20 MB -> 99 %, 100x; t = 2 s (-90 %). Finals 0.893 / 0.889 / 0.895:
  # per seed -0.7 / -0.1 / -1.5 pts; paired -0.7667 ± 0.7024 (n=3).
  for seed, final in ((0, 0.893), (1, 0.889), (2, 0.895)):
    _write_run(f'{root}/compression/{sparse_name(0.01, seed or None)}',
               sparse(0.01, **({'seed': seed} if seed else {})),
               curve(1.0, 3.0, 8.0, final), (12e6, 8e6, 5e6))
  # 0.3 %: 8 MB -> 99.6 %, 250x; never reaches 0.88; seeds 1, 2 not started.
  # Trained before optimizer.shard_state existed (absent from its config).
  old = sparse(0.003)
  del old['optimizer']['shard_state']
  _write_run(f'{root}/compression/{sparse_name(0.003)}', old,
             [(10, 0.70, 1.0), (150, 0.80, 7.0)], (5e6, 3e6, 5e6))
  # 0.1 %: not started.
  # 100 Mbit/s: identity t = 200 s (final as at 1 Gbit/s); 2 % t = 14 s
  # (-93 %), final 0.896 (0.1 pts below the same seed at 1 Gbit/s).
  slow = {'network.lan_bandwidth_gbps': 0.1}
  _write_run(f'{root}/compression/{IDENTITY_SLOW}', ident(**slow),
             curve(100.0, 300.0, 600.0, 0.90), (1000e6, 1000e6, 5e6))
  _write_run(f'{root}/compression/{sparse_name(0.02, lan=0.1)}',
             sparse(0.02, **slow), curve(4.0, 24.0, 50.0, 0.896),
             (30e6, 20e6, 5e6))

  # CO3 in the paper's setting (co3_iid), target 0.88. Every run but γ=0 is
  # at 0.87 (t = 30 s), 0.89 (t = 45 s), so it crosses 0.88 at t = 37.5 s;
  # γ=0 never does. Uplink: uncompressed 1000 MB; γ=0: 125 MB (8×, 4 bits per
  # entry); γ=0.5: 110 MB; γ=0.9: 100 MB (10×, 3.2 bits).
  write_co3_iid(root)
  # CO3 in hfl's setting (co3_paper): the secondary table.
  write_co3_hfl(root)
  return root


def _co3_run(root, sweep_name, base, gamma, seed, final, up, done=True):
  """One CO3-sweep run: uncompressed (``gamma`` None) or CO3 fp4 at γ."""
  o = co3_overrides(base, gamma, seed)
  curve = ([(300, 0.80, 30.0), (600, final, 60.0)] if final < 0.88 else
           [(300, 0.87, 30.0), (450, 0.89, 45.0), (600, final, 60.0)])
  if not done:
    curve = [(100, 0.87, 10.0)]
  _write_run(f'{root}/{sweep_name}/{sweep.run_name(o)}',
             _config('configs/default.py', **o), curve, (up, 1000e6, 5e6),
             done=done)


# Final accuracies of the co3_iid runs. Uncompressed: 0.90 / 0.88 / 0.91 (mean
# 0.896667, std 0.015275). γ=0.9: seed 0 0.898 (−0.2 pts vs its seed),
# seed 1 0.884 (+0.4 pts), seed 2 interrupted: paired +0.1 ± 0.4243 (n=2,
# standard error 0.3) although the Δ of the seed means is −0.5667 pts.
# γ=0: 0.85 / 0.86 / 0.85: paired −5, −2, −6 -> −4.3333 ± 2.0817 (n=3).
# γ=0.5: seed 0 0.893 (−0.7, n=1), seeds 1-2 not started. γ=1: not started.
IID_FINALS = {(None, 0): 0.90, (None, 1): 0.88, (None, 2): 0.91,
              (0.9, 0): 0.898, (0.9, 1): 0.884,
              (0.0, 0): 0.85, (0.0, 1): 0.86, (0.0, 2): 0.85, (0.5, 0): 0.893}
CO3_UP = {None: 1000e6, 0.0: 125e6, 0.5: 110e6, 0.9: 100e6, 1.0: 100e6}


def write_co3_iid(root, finals=None):
  """Writes the co3_iid runs of ``finals`` ((γ, seed) -> final accuracy)."""
  finals = IID_FINALS if finals is None else finals
  for (g, seed), final in finals.items():
    _co3_run(root, 'co3_iid', IID_OVERRIDES, g, seed, final, CO3_UP[g])
  if (0.9, 2) not in finals:
    _co3_run(root, 'co3_iid', IID_OVERRIDES, 0.9, 2, 0.0, 1e6, done=False)


def write_co3_hfl(root):
  """co3_paper: uncompressed 0.90 / 0.90 / 0.89; γ=0.9 0.892 / 0.899 / 0.881
  (paired −0.8, −0.1, −0.9 -> −0.6 ± 0.4359, n=3, standard error 0.2517;
  Δ of the means −0.6); γ=0 0.85 (−5); γ=1 0.80 (−10); γ=0.5 not started."""
  for (g, seed), final in {(None, None): 0.90, (None, 1): 0.90,
                           (None, 2): 0.89, (0.9, None): 0.892,
                           (0.9, 1): 0.899, (0.9, 2): 0.881,
                           (0.0, None): 0.85, (1.0, None): 0.80}.items():
    _co3_run(root, 'co3_paper', SGD_OVERRIDES, g, seed, final, CO3_UP[g])


def _sections(root):
  return {s.key: s for s in results.build_sections(root)}


def _by_label(section):
  return {r['label']: r for r in section.records}


def test_sweep_points_land_in_the_expected_workdirs(root):
  data = results.load_sweep_data(results.SWEEPS[0], root,
                                 results.compression_label)
  names = [e.spec.name for e in data.entries]
  assert names == (
      [IDENTITY] + [sparse_name(d) for d in (0.02, 0.01, 0.003, 0.001)]
      + [IDENTITY_SEED.format(s=1), IDENTITY_SEED.format(s=2)]
      + [sparse_name(d, s) for d in (0.02, 0.01, 0.003) for s in (1, 2)]
      + [IDENTITY_SLOW, sparse_name(0.02, lan=0.1)])
  assert len(set(names)) == 15
  assert [e.status for e in data.entries] == (
      ['done'] * 4 + ['pending'] + ['done'] * 3 + ['partial', 'done', 'done',
                                                   'pending', 'pending']
      + ['done'] * 2)
  semi = results.load_sweep_data(results.SWEEPS[1], root,
                                 results.semisync_label)
  assert [e.spec.name for e in semi.entries] == list(SEMI.values())
  assert semi.target == 0.85 and data.target == 0.88


def test_semisync_table(root):
  s = _sections(root)['semisync']
  recs = _by_label(s)
  assert list(recs) == [
      'sync (baseline, K=1)', 'periodic (K=4)',
      'semi_sync (K_base=4, K_d optimised)',
      'semi_sync (K_base=4, K_d optimised) + progress-aware', 'adacomm (K_0=4)']
  base, per = recs['sync (baseline, K=1)'], recs['periodic (K=4)']
  assert base['rounds_to_target'] == pytest.approx(150.0)
  assert base['time_to_target_s'] == pytest.approx(150.0)
  assert per['rounds_to_target'] == pytest.approx(37.5)
  assert per['time_to_target_s'] == pytest.approx(60.0)
  assert per['rounds_reduction'] == pytest.approx(0.75)
  assert per['time_reduction'] == pytest.approx(0.6)
  assert per['delta_points'] == pytest.approx(-0.4)
  assert per['final_acc'] == pytest.approx(0.896)
  assert per['best_acc'] == pytest.approx(0.90)
  assert per['wan_bytes'] == 2e8
  assert per['idle_s'] == [1.0, 2.0, 3.0, 4.5]
  assert per['cells'][4:8] == ['37.5', '75.0%', '60.0 s', '60.0%']
  assert per['cells'][3] == '−0.40 pts'
  assert per['cells'][8] == '200.00 MB'
  assert per['cells'][11] == '1.0 / 2.0 / 3.0 / 4.5'
  semi = recs['semi_sync (K_base=4, K_d optimised)']
  assert semi['rounds_to_target'] is None and semi['rounds_reduction'] is None
  assert semi['cells'][4] == 'never' and semi['cells'][6] == 'never'
  assert semi['cells'][5] == '–' and semi['cells'][11] == '–'
  assert base['cells'][3] == base['cells'][5] == 'baseline'
  assert not recs['adacomm (K_0=4)']['done']
  assert 'not finished' in recs['adacomm (K_0=4)']['cells'][1]
  claims = {c['anchor'].key: c for c in s.claims}
  assert claims['thesis.semisync.rounds_reduction']['met'] is True
  assert claims['thesis.semisync.time_reduction']['met'] is True
  assert claims['thesis.semisync.accuracy_delta']['met'] is True
  assert 'periodic' in claims['thesis.semisync.time_reduction']['ours']
  assert len(s.rows) == 3


def test_compression_table(root):
  s = _sections(root)['compression']
  recs = _by_label(s)
  # One row per point of the 1 Gbit/s LAN, seeds grouped.
  assert list(recs) == ['uncompressed'] + [
      TOPK.format(d) for d in ('2', '1', '0.3', '0.1')]
  base = recs['uncompressed']
  assert base['seeds'] == [0, 1, 2] and base['n_total'] == 3
  assert base['final_acc'] == pytest.approx(0.90)
  assert base['final_acc_std'] == pytest.approx(0.01)
  assert base['time_to_target_s'] == pytest.approx(20.0)
  assert base['cells'][2] == '0, 1, 2'
  assert base['cells'][6] == '90.00 ± 1.00%'
  assert base['cells'][7] == base['cells'][8] == 'baseline'
  r2 = recs[TOPK.format('2')]
  assert r2['seeds'] == [0, 1] and r2['n_total'] == 3
  assert r2['intra_bytes'] == 50e6
  assert r2['ratio'] == pytest.approx(0.975)
  assert r2['factor'] == pytest.approx(40.0)
  assert r2['final_acc'] == pytest.approx(0.8905)
  assert r2['final_acc_std'] == pytest.approx(math.sqrt(2) * 0.0065)
  # Δ of the seed means uses the 3-seed baseline mean (0.90) ...
  assert r2['delta_points'] == pytest.approx(-0.95)
  # ... the paired Δ each seed's own uncompressed run.
  assert r2['paired'] == pytest.approx({0: -0.3, 1: -0.6})
  assert r2['paired_delta'] == pytest.approx(-0.45)
  assert r2['paired_std'] == pytest.approx(0.3 / math.sqrt(2))
  assert r2['paired_n'] == 2
  assert r2['time_to_target_s'] == pytest.approx(3.0)
  assert r2['time_reduction'] == pytest.approx(0.85)
  assert r2['cells'][1:3] == ['2%', '0, 1 (2 of 3)']
  assert r2['cells'][5] == '97.50% (40.0×)'
  assert r2['cells'][6:9] == ['89.05 ± 0.92%', '−0.95 pts',
                              '−0.45 ± 0.21 pts (n=2)']
  assert r2['cells'][9:11] == ['3.0 s', '85.0%']
  r1 = recs[TOPK.format('1')]
  assert r1['ratio'] == pytest.approx(0.99)
  assert r1['factor'] == pytest.approx(100)
  assert r1['time_reduction'] == pytest.approx(0.9)
  assert r1['paired'] == pytest.approx({0: -0.7, 1: -0.1, 2: -1.5})
  assert r1['paired_delta'] == pytest.approx(-2.3 / 3)
  assert r1['paired_std'] == pytest.approx(math.sqrt(0.74 / 1.5))
  assert r1['delta_points'] == pytest.approx(-2.3 / 3)
  r03 = recs[TOPK.format('0.3')]
  assert r03['factor'] == pytest.approx(250.0)
  assert r03['paired'] == pytest.approx({0: -10.0}) and r03['paired_std'] is None
  assert r03['cells'][8] == '−10.00 pts (n=1)'
  assert r03['cells'][9] == 'never' and r03['time_reduction'] is None
  r01 = recs[TOPK.format('0.1')]
  assert not r01['done'] and r01['cells'][2] == '*not finished*'
  # 2 % is judged lossless by its paired Δ (−0.45) although the Δ of the means
  # (−0.95) is not; 1 % (paired −0.77) is not.
  best = s.extra['best_lossless']
  assert best['label'] == TOPK.format('2')
  md = s.markdown
  assert ('**Highest compression that loses ≤ 0.5 pts** (by the paired Δ): '
          '**ρ=2%**') in md
  assert ('97.50% fewer intra-DC bytes (40.0×), paired Δ −0.45 ± 0.21 pts '
          '(n=2), standard error 0.15 pts; Δ of the seed means −0.95 pts. '
          'Provisional: 2 of 3 seeds compared so far.') in md
  assert ('- ✓ ρ=2%: −0.45 ± 0.21 pts (n=2), 2 of 3 seeds — per seed: '
          '0: −0.30 pts, 1: −0.60 pts') in md
  assert '- ✗ ρ=1%: −0.77 ± 0.70 pts (n=3) — per seed:' in md
  assert '- ρ=0.1%: not measured yet' in md
  claims = {c['anchor'].key: c for c in s.claims}
  assert claims['thesis.compression.ratio']['met'] is True
  assert claims['dgc.compression_factor']['met'] is False
  assert '40.0×' in claims['dgc.compression_factor']['ours']
  # The best time saving is the 100 Mbit/s pair's (93 % ≥ 92 %).
  assert claims['thesis.compression.time_reduction']['met'] is True
  assert claims['thesis.compression.time_reduction']['ours'] == (
      f'93.0% ({TOPK.format("2")}, 100 Mbit/s LAN)')
  assert s.extra['baseline'] == 'uncompressed'
  assert len(s.rows) == 6  # 4 finished 1 Gbit/s points + the 100 Mbit/s pair
  assert [len(r.runs) for r in s.rows] == [3, 2, 3, 1, 1, 1]


def test_paired_delta_matches_seeds_not_positions(root):
  """Seed 1 of 2 % is compared with seed 1 of identity, whatever the order."""
  data = results.load_sweep_data(results.SWEEPS[0], root,
                                 results.compression_label)
  groups = {(g.label, g.lan): g for g in results.group_seeds(data.entries,
                                                             data.target)}
  base = groups['uncompressed', 1.0]
  g2 = groups[TOPK.format('2'), 1.0]
  shuffled = g2._replace(entries=g2.entries[::-1])
  assert results.paired_deltas(shuffled, base) == pytest.approx(
      {0: -0.3, 1: -0.6})
  # Without seed 1 of the baseline, seed 1 of 2 % has no pair.
  no1 = base._replace(entries=[e for e in base.entries
                               if results._seed(e) != 1])
  assert results.paired_deltas(g2, no1) == pytest.approx({0: -0.3})
  assert results.paired_deltas(g2, None) == {}


def test_slow_lan_pair_has_its_own_table(root):
  s = _sections(root)['compression']
  assert all(r['lan_gbps'] == 1.0 for r in s.records)
  slow = {r['label']: r for r in s.extra['other_lan']}
  assert list(slow) == ['uncompressed, 100 Mbit/s LAN',
                        f'{TOPK.format("2")}, 100 Mbit/s LAN']
  b, c = slow.values()
  assert b['lan_gbps'] == c['lan_gbps'] == 0.1
  assert b['baseline'] and b['seeds'] == [0]
  assert b['time_to_target_s'] == pytest.approx(200.0)
  assert c['time_to_target_s'] == pytest.approx(14.0)
  assert c['time_reduction'] == pytest.approx(0.93)
  assert c['cells'] == [TOPK.format('2'), '0', '89.60%', '14.0 s', '93.0%',
                        '50.0 s', '50.00 MB']
  md = s.markdown
  main_at, slow_at = md.index('**1 Gbit/s LAN**'), md.index(
      '**100 Mbit/s LAN**')
  assert main_at < slow_at
  slow_table = md[slow_at:md.index('**Missing runs')]
  assert f'| {TOPK.format("2")} | 0 | 89.60% | 14.0 s | 93.0% |' in slow_table
  assert '| uncompressed | 0 | 90.00% | 3.3 min | baseline |' in slow_table
  # Same seed at 1 Gbit/s: identity trained identically, 2 % did not.
  assert ('⚠ Final accuracy differs from the same seed at 1 Gbit/s: '
          f'{TOPK.format("2")}, seed 0: −0.10 pts') in slow_table
  assert (f'at 1 Gbit/s with the same seed(s), {TOPK.format("2")} needs 3.0 s '
          'to 88.00% vs 20.0 s uncompressed (85.0% less time)') in slow_table
  # The main table does not hold the 100 Mbit/s runs.
  main_table = md[main_at:slow_at]
  assert '200.0 s' not in main_table and '3.3 min' not in main_table


def test_compression_settings_and_missing_runs(root):
  s = _sections(root)['compression']
  md = s.markdown
  config_line = next(l for l in md.splitlines() if l.startswith('- **Config**'))
  assert ('overrides common to all runs: `train.eval_every=10`, '
          '`train.num_steps=600`; per run:') in config_line
  assert '`network.lan_bandwidth_gbps`, `seed`' in config_line
  assert 'seeds 0, 1, 2 (per run)' in md
  assert ('LAN (PS NIC) 1.0 Gbit/s (100 Mbit/s for the runs labelled so)'
          in md)
  assert f'- {TOPK.format("2")}, 100 Mbit/s LAN, seed 0: `python main.py' in md
  assert '--config.seed=2' in md
  labels = [m['label'] for m in s.missing]
  assert labels == [f'{TOPK.format("0.1")}, seed 0',
                    f'{TOPK.format("2")}, seed 2',
                    f'{TOPK.format("0.3")}, seed 1',
                    f'{TOPK.format("0.3")}, seed 2']
  assert (f'- {TOPK.format("2")}, seed 2: running or interrupted: step '
          '40/600, round 10, last test accuracy 85.00%') in md
  assert ('- 1 run predates config fields added to hfl later (absent from its '
          '`config.json`; trained by the code of that time): '
          f'`optimizer.shard_state` — {TOPK.format("0.3")}, seed 0.') in md
  assert 'differs from what the sweep file gives now' not in md


def test_co3_sweep_points_land_in_the_expected_workdirs(root):
  iid = results.load_sweep_data(results.SWEEPS[2], root, results.co3_label)
  hfl = results.load_sweep_data(results.SWEEPS[3], root, results.co3_label)
  assert (iid.sweep.name, hfl.sweep.name) == ('co3_iid', 'co3_paper')
  assert [e.spec.name for e in iid.entries] == [
      co3_name(IID_OVERRIDES, g, s) for g, s in IID_POINTS]
  assert [e.spec.name for e in hfl.entries] == [
      co3_name(SGD_OVERRIDES, g, s) for g, s in HFL_POINTS]
  assert iid.entries[0].spec.name == IID_IDENTITY.format(s=0)
  assert hfl.entries[0].spec.name == HFL_IDENTITY
  assert [e.status for e in iid.entries] == (
      ['done'] * 5 + ['partial'] + ['done'] * 4 + ['pending'] * 5)
  assert [e.status for e in hfl.entries] == (
      ['done'] * 2 + ['pending'] + ['done'] * 6)
  for e in iid.entries:
    assert results._get(e.config, 'dataset.partition') == 'iid'
    assert results._get(e.config, 'sync.k') == 1


def test_co3_seed_groups_and_paired_deltas(root):
  data = results.load_sweep_data(results.SWEEPS[2], root, results.co3_label)
  groups = {g.label: g for g in results.group_seeds(data.entries,
                                                    data.target)}
  assert list(groups) == ['uncompressed', 'co3 fp4 γ=0.9', 'co3 fp4 γ=0',
                          'co3 fp4 γ=0.5', 'co3 fp4 γ=1']
  base, g9 = groups['uncompressed'], groups['co3 fp4 γ=0.9']
  assert [results._seed(e) for e in base.entries] == [0, 1, 2]
  assert [results._seed(e) for e in g9.done] == [0, 1]
  assert len(g9.entries) == 3 and g9.row.final_acc.n == 2
  assert results.paired_deltas(g9, base) == pytest.approx({0: -0.2, 1: 0.4})
  assert results.paired_deltas(groups['co3 fp4 γ=0'], base) == pytest.approx(
      {0: -5.0, 1: -2.0, 2: -6.0})
  assert results.paired_deltas(groups['co3 fp4 γ=1'], base) == {}


def test_co3_table(root):
  s = _sections(root)['co3']
  recs = _by_label(s)
  # Uncompressed first, then by γ (not in grid order).
  assert list(recs) == ['uncompressed', 'co3 fp4 γ=0', 'co3 fp4 γ=0.5',
                        'co3 fp4 γ=0.9', 'co3 fp4 γ=1']
  base = recs['uncompressed']
  assert base['baseline'] and base['seeds'] == [0, 1, 2]
  assert base['final_acc'] == pytest.approx(2.69 / 3)
  assert base['final_acc_std'] == pytest.approx(math.sqrt(7e-4 / 3))
  assert base['cells'] == ['uncompressed', '0, 1, 2', '89.67 ± 1.53%',
                           'baseline', '1.00 GB', 'baseline', '32.00',
                           '37.5 s']
  g9 = recs['co3 fp4 γ=0.9']
  assert g9['gamma'] == 0.9 and g9['seeds'] == [0, 1] and g9['n_total'] == 3
  assert g9['paired'] == pytest.approx({0: -0.2, 1: 0.4})
  assert g9['paired_delta'] == pytest.approx(0.1)
  assert g9['paired_std'] == pytest.approx(math.sqrt(0.18))
  assert g9['paired_n'] == 2
  # The Δ of the seed means (3-seed baseline mean) would say −0.57 pts.
  assert g9['delta_points'] == pytest.approx(100 * (0.891 - 2.69 / 3))
  assert g9['up_factor'] == pytest.approx(10.0)
  assert g9['bits_per_entry'] == pytest.approx(3.2)
  assert g9['cells'] == ['co3 fp4 γ=0.9', '0, 1 (2 of 3)', '89.10 ± 0.99%',
                         '+0.10 ± 0.42 pts (n=2)', '100.00 MB', '10.0×',
                         '3.20', '37.5 s']
  g0 = recs['co3 fp4 γ=0']
  assert g0['paired_delta'] == pytest.approx(-13 / 3)
  assert g0['paired_std'] == pytest.approx(math.sqrt(13 / 3))
  assert g0['up_factor'] == pytest.approx(8.0)
  assert g0['bits_per_entry'] == pytest.approx(4.0)
  assert g0['cells'][3] == '−4.33 ± 2.08 pts (n=3)'
  assert g0['cells'][7] == 'never'
  g5 = recs['co3 fp4 γ=0.5']
  assert g5['paired'] == pytest.approx({0: -0.7}) and g5['paired_std'] is None
  assert g5['cells'][1:4] == ['0 (1 of 3)', '89.30%', '−0.70 pts (n=1)']
  assert g5['up_factor'] == pytest.approx(1000 / 110)
  assert not recs['co3 fp4 γ=1']['done']
  assert recs['co3 fp4 γ=1']['cells'][1] == '*not finished*'
  assert s.extra['headline']['label'] == 'co3 fp4 γ=0.9'
  assert s.extra['baseline'] == 'uncompressed'
  # Plots: the main table's groups (mean over seeds).
  assert [(r.label, len(r.runs)) for r in s.rows] == [
      ('uncompressed', 3), ('co3 fp4 γ=0', 3), ('co3 fp4 γ=0.5', 1),
      ('co3 fp4 γ=0.9', 2)]


def test_co3_claim_met_on_the_paired_delta(root):
  s = _sections(root)['co3']
  claim, = s.claims
  assert claim['anchor'].key == 'co3.accuracy_delta' and claim['met'] is True
  assert claim['ours'] == ('paired Δ +0.10 ± 0.42 pts (n=2), standard error '
                           '0.30 pts at 10.0× fewer uplink bytes (3.20 '
                           'bits/entry)')
  assert claim['verdict'] == ('met: paired Δ (mean) +0.10 pts ≥ −0.5 pts '
                              '(provisional: 2 of 3 seeds compared)')
  md = s.markdown
  assert ("**The CO3 paper's claim, γ=0.9 ≈ uncompressed accuracy** (by the "
          'paired Δ): paired Δ +0.10 ± 0.42 pts (n=2), standard error 0.30 pts '
          '— within the 0.5-pt no-loss bar, at 10.0× fewer uplink bytes (3.20 '
          'bits per entry); Δ of the seed means −0.57 pts. Provisional: 2 of 3 '
          'seeds compared so far.') in md
  assert ('- ✓ γ=0.9: +0.10 ± 0.42 pts (n=2), 2 of 3 seeds — per seed: '
          '0: −0.20 pts, 1: +0.40 pts') in md
  assert '- ✗ γ=0: −4.33 ± 2.08 pts (n=3) — per seed: 0: −5.00 pts' in md
  assert '- ✗ γ=0.5: −0.70 pts (n=1), 1 of 3 seeds\n' in md
  assert '- γ=1: not measured yet' in md
  assert ('| co3 fp4 γ=0.9 | 0, 1 (2 of 3) | 89.10 ± 0.99% | +0.10 ± 0.42 pts '
          '(n=2) | 100.00 MB | 10.0× | 3.20 | 37.5 s |') in md
  assert 'Not met' not in md


def test_co3_claim_not_met(root):
  """Seed 1 of γ=0.9 at 0.870: paired −0.2, −1.0 -> −0.6 ± 0.5657 (n=2)."""
  write_co3_iid(root, {(0.9, 1): 0.870})
  s = _sections(root)['co3']
  g9 = _by_label(s)['co3 fp4 γ=0.9']
  assert g9['paired'] == pytest.approx({0: -0.2, 1: -1.0})
  assert g9['paired_delta'] == pytest.approx(-0.6)
  assert g9['paired_std'] == pytest.approx(math.sqrt(0.32))
  claim, = s.claims
  assert claim['met'] is False
  assert claim['verdict'] == ('not met: paired Δ (mean) −0.60 pts < −0.5 pts '
                              '(provisional: 2 of 3 seeds compared)')
  assert claim['ours'].startswith('paired Δ −0.60 ± 0.57 pts (n=2), standard '
                                  'error 0.40 pts at 10.0×')
  md = s.markdown
  assert '— beyond the 0.5-pt no-loss bar' in md.split('### hfl')[0]
  assert ('- Not met: accuracy of fp4 + GenNorm Huffman + EF γ=0.9 vs '
          'uncompressed — not met: paired Δ (mean) −0.60 pts') in md


def test_co3_missing_seed_and_unfinished_runs(root):
  """Without the uncompressed seed 1, γ=0.9 is paired on seed 0 only."""
  os.remove(os.path.join(root, 'co3_iid', IID_IDENTITY.format(s=1),
                         'summary.json'))
  s = _sections(root)['co3']
  recs = _by_label(s)
  base, g9 = recs['uncompressed'], recs['co3 fp4 γ=0.9']
  assert base['seeds'] == [0, 2] and base['cells'][1] == '0, 2 (2 of 3)'
  assert base['final_acc'] == pytest.approx(0.905)
  assert g9['paired'] == pytest.approx({0: -0.2})
  assert g9['paired_std'] is None and g9['paired_n'] == 1
  assert g9['cells'][3] == '−0.20 pts (n=1)'
  claim, = s.claims
  assert claim['met'] is True
  assert claim['ours'].startswith('paired Δ −0.20 pts (n=1) at 10.0×')
  assert claim['verdict'].endswith('(provisional: 1 of 3 seeds compared)')
  missing = [m['label'] for m in s.missing]
  assert missing == ['uncompressed, seed 1', 'co3 fp4 γ=0.9, seed 2',
                     'co3 fp4 γ=1, seed 0', 'co3 fp4 γ=0.5, seed 1',
                     'co3 fp4 γ=0.5, seed 2', 'co3 fp4 γ=1, seed 1',
                     'co3 fp4 γ=1, seed 2', 'co3 fp4 γ=0.5, seed 0']
  assert s.missing[-1]['workdir'].endswith(
      '/co3_paper/' + co3_name(SGD_OVERRIDES, 0.5))
  md = s.markdown
  assert ('- co3 fp4 γ=0.9, seed 2: running or interrupted: step 400/600, '
          'round 100, last test accuracy 87.00%') in md
  assert '- co3 fp4 γ=1, seed 0: not started' in md
  # Each table lists its own missing runs under it.
  main_md, hfl_md = md.split("### hfl's setting")
  assert '**Missing runs (7)**' in main_md and '**Missing runs (1)**' in hfl_md
  assert 'co3 fp4 γ=0.5, seed 0: not started' in hfl_md


def test_co3_no_claim_without_the_uncompressed_runs(root):
  for seed in (0, 1, 2):
    os.remove(os.path.join(root, 'co3_iid', IID_IDENTITY.format(s=seed),
                           'summary.json'))
  s = _sections(root)['co3']
  g9 = _by_label(s)['co3 fp4 γ=0.9']
  assert g9['done'] and g9['paired'] == {} and g9['up_factor'] is None
  assert g9['cells'][3] == '–' and g9['cells'][5:7] == ['–', '–']
  claim, = s.claims
  assert claim['met'] is None and claim['verdict'].startswith('not measured')
  assert ("**The CO3 paper's claim, γ=0.9 ≈ uncompressed accuracy** (by the "
          'paired Δ): not measured yet') in s.markdown
  assert ('- ⚠ the uncompressed runs of this sweep have not finished'
          in s.markdown.split('### hfl')[0])


def test_co3_hfl_setting_table(root):
  s = _sections(root)['co3']
  md = s.markdown
  main_at = md.index("### The CO3 paper's setting: synchronous PS over IID "
                     'shards')
  hfl_at = md.index("### hfl's setting: hierarchical PS, non-IID (Dirichlet "
                    'α = 0.5) shards, periodic K = 4')
  claims_at = md.index('**Published vs ours**')
  assert main_at < hfl_at < claims_at
  assert 'sweep file `configs/sweeps/co3_iid.py`' in md[main_at:hfl_at]
  assert 'sweep file `configs/sweeps/co3_paper.py`' in md[hfl_at:]
  recs = {r['label']: r for r in s.extra['hfl_setting']}
  assert list(recs) == ['uncompressed', 'co3 fp4 γ=0', 'co3 fp4 γ=0.5',
                        'co3 fp4 γ=0.9', 'co3 fp4 γ=1']
  # Its baseline is its own uncompressed runs (0.90 / 0.90 / 0.89).
  assert recs['uncompressed']['final_acc'] == pytest.approx(2.69 / 3)
  g9 = recs['co3 fp4 γ=0.9']
  assert g9['seeds'] == [0, 1, 2]
  assert g9['paired'] == pytest.approx({0: -0.8, 1: -0.1, 2: -0.9})
  assert g9['paired_delta'] == pytest.approx(-0.6)
  assert g9['paired_std'] == pytest.approx(math.sqrt(0.19))
  assert g9['delta_points'] == pytest.approx(-0.6)
  assert recs['co3 fp4 γ=0']['paired'] == pytest.approx({0: -5.0})
  assert recs['co3 fp4 γ=1']['paired'] == pytest.approx({0: -10.0})
  assert not recs['co3 fp4 γ=0.5']['done']
  table = md[hfl_at:claims_at]
  assert ('| co3 fp4 γ=0.9 | 0, 1, 2 | 89.07 ± 0.91% | −0.60 ± 0.44 pts (n=3) '
          '| 100.00 MB | 10.0× | 3.20 | 37.5 s |') in table
  assert ("**γ=0.9 in this setting** (context, not the verdict on the CO3 "
          "paper's claim): paired Δ −0.60 ± 0.44 pts (n=3), standard error "
          '0.25 pts — beyond the 0.5-pt no-loss bar') in table
  # No verdict of its own: the one claim is the paper setting's, met.
  assert len(s.claims) == 1 and s.claims[0]['met'] is True
  assert 'Not met' not in md


def test_missing_runs_and_anchors_on_the_page(root, tmp_path):
  out = str(tmp_path / 'docs')
  written = results.write_results(root, out, now=NOW)
  text = open(written['results.md'], encoding='utf-8').read()
  # 44 runs (5 semisync, 15 compression, 15 co3_iid, 9 co3_paper), 13 missing.
  assert 'Incomplete: 31 of 44 runs have finished.' in text
  # Table rows: 2 semisync, 0.1 % (no seed finished), CO3 γ=1 (paper's
  # setting) and γ=0.5 (hfl's).
  assert text.count('| *not finished* |') == 5
  for name in (SEMI['progress'], SEMI['adacomm'],
               co3_name(IID_OVERRIDES, 1.0, 0), co3_name(IID_OVERRIDES, 0.9, 2),
               co3_name(SGD_OVERRIDES, 0.5), sparse_name(0.001),
               sparse_name(0.02, 2), sparse_name(0.003, 1),
               sparse_name(0.003, 2)):
    assert name in text
  assert 'not started' in text
  assert 'step 16/600, round 4, last test accuracy 61.00%' in text
  for claim in ('up to 66%', 'up to 43%', 'up to 92%', '≈ 95%', '270–600×',
                'no loss (Δ ≈ 0 pts)', 'arXiv:2203.09044',
                'Deep Gradient Compression'):
    assert claim in text, claim
  assert 'python -m hfl.sweep --sweep=configs/sweeps/semisync.py' in text
  assert '--config.sync.progress_aware=True' in text
  assert '4 DCs × 2 workers' in text and '2 DCs × 4 workers' in text
  assert 'LAN (PS NIC) 1.0 Gbit/s' in text
  assert 'Not met' in text
  assert '## How to read this page' in text
  assert 'Generated 2025-01-02 03:04 UTC' in text


def test_anchors_cover_design_section_6():
  text = open(os.path.join(os.path.dirname(REPO), 'shared', 'DESIGN.md'),
              encoding='utf-8').read() if os.path.exists(os.path.join(
                  os.path.dirname(REPO), 'shared', 'DESIGN.md')) else ''
  keys = {a.key for a in anchors.ANCHORS}
  for k in ('thesis.semisync.rounds_reduction',
            'thesis.semisync.time_reduction',
            'thesis.compression.ratio', 'thesis.compression.time_reduction',
            'dgc.compression_factor', 'co3.accuracy_delta'):
    assert k in keys
  assert anchors.get('thesis.semisync.rounds_reduction').value == 0.66
  assert anchors.get('thesis.semisync.time_reduction').value == 0.43
  assert anchors.get('thesis.compression.ratio').value == 0.95
  assert anchors.get('thesis.compression.time_reduction').value == 0.92
  dgc = anchors.get('dgc.compression_factor')
  assert (dgc.value, dgc.value_high) == (270.0, 600.0)
  for a in anchors.ANCHORS:
    assert a.citation.reference and a.claim
    if text:  # Every claim is quoted from DESIGN section 6.
      assert a.claim.split(':')[-1].split(';')[0].strip()[:20] in text, a.key
  with pytest.raises(KeyError):
    anchors.get('nope')


def test_plots_written_and_regenerated_from_scratch(root, tmp_path):
  out = tmp_path / 'docs'
  (out / 'results').mkdir(parents=True)
  (out / 'results' / 'stale.png').write_bytes(PNG_MAGIC)
  (out / 'results' / 'keep.txt').write_text('not ours')
  written = results.write_results(root, str(out), now=NOW)
  names = sorted(os.path.basename(p) for p in written['plots'])
  expected = sorted(
      [f'{k}_{a}' for k in ('semisync', 'compression', 'co3')
       for a in ('accuracy_vs_sim_time.png', 'accuracy_vs_bytes.png',
                 'accuracy_vs_inter_dc_rounds.png')]
      + ['compression_accuracy_vs_ratio.png'])
  assert names == expected
  assert sorted(os.listdir(out / 'results')) == sorted(expected + ['keep.txt'])
  for p in written['plots']:
    with open(p, 'rb') as f:
      assert f.read(8) == PNG_MAGIC
  text = (out / 'results.md').read_text(encoding='utf-8')
  for n in expected:
    assert f'](results/{n})' in text
  # Compression and CO3 lines are seed means; semisync has one seed.
  assert text.count('**Plots** (one line per finished point: mean over its '
                    'finished seeds') == 2
  assert text.count('**Plots** (one line per finished run;') == 1


def test_empty_root_lists_everything_as_missing(tmp_path):
  written = results.write_results(str(tmp_path / 'none'),
                                  str(tmp_path / 'out'), now=NOW)
  text = open(written['results.md'], encoding='utf-8').read()
  assert 'Incomplete: 0 of 44 runs have finished.' in text
  # Every run listed once (each CO3 table has its own uncompressed runs).
  assert text.count('not started') == 44
  # Rows: 5 semisync, 5 + 2 compression (seed groups), 5 + 5 CO3.
  assert text.count('| *not finished* |') == 22
  assert written['plots'] == []
  assert text.count('*No plots yet') == 3
  assert 'not measured' in text


def test_cli(root, tmp_path, monkeypatch):
  calls = []
  monkeypatch.setattr(results.sweep_lib, 'run_sweep',
                      lambda base, grid, r, **kw: calls.append(r) or
                      results.sweep_lib.SweepResult([], [], [], [], [], None))
  out = str(tmp_path / 'o1')
  assert results.main(['--no-run', '--root', root, '--out', out]) == 0
  assert calls == [] and os.path.exists(os.path.join(out, 'results.md'))
  assert results.main(['--root', root, '--out', str(tmp_path / 'o2')]) == 0
  assert calls == [os.path.join(root, n)
                   for n in ('compression', 'semisync', 'co3_iid',
                             'co3_paper')]


def test_formatting_helpers():
  assert results.reduction(60.0, 150.0) == pytest.approx(0.6)
  assert results.reduction(None, 1.0) is None
  assert results.reduction(1.0, 0.0) is None
  assert results.fmt_reduction(-0.25) == '−25.0%'
  assert results.fmt_factor(math.inf) == '∞×'
  assert results.fmt_factor(1234.0) == '1234×'
  assert results.fmt_to_target(None, str) == 'never'
  assert results.fmt_points(0.123) == '+0.12 pts'


def test_monotonicity_note_flags_a_denser_density_failing_within_the_noise():
  from hfl.report import results as res  # pylint: disable=g-import-not-at-top
  best = dict(density=0.003, paired_delta=-0.44, paired_std=0.24, paired_n=3)
  worse = dict(density=0.01, paired_delta=-0.51, paired_std=0.07, paired_n=3)
  ok = dict(density=0.02, paired_delta=-0.35, paired_std=0.58, paired_n=3)
  note = res._monotonicity_note([ok, worse, best], best)
  assert len(note) == 2 and 'ρ=1% fails' in note[1] and '0.07 pts' in note[1]
  assert 'less than the larger standard error (0.14 pts)' in note[1]
  far = dict(worse, paired_delta=-2.0)
  assert 'more than their standard errors' in res._monotonicity_note([far, best], best)[1]
  assert res._monotonicity_note([ok, best], best) == []


def test_launching_the_sweeps_first_says_how_many_runs_are_missing(tmp_path, caplog,
                                                                    monkeypatch):
  root = str(tmp_path / 'workdirs')
  todo = {}
  for s in results.SWEEPS:
    base, grid = sweep.load_sweep(os.path.join(REPO, s.path))
    todo[s.name] = [r.workdir for r in sweep.make_runs(
        sweep.resolve_base(base, os.path.join(root, s.name), write=False), grid,
        os.path.join(root, s.name))]
  done = todo['semisync'].pop(0)  # one finished run is not missing
  os.makedirs(done)
  open(os.path.join(done, 'summary.json'), 'w').close()
  launched = []
  monkeypatch.setattr(results.sweep_lib, 'run_sweep',
                      lambda base, grid, r, **kw: launched.append(
                          (r, [m.getMessage() for m in caplog.records])))
  caplog.set_level('INFO')
  results.run_sweeps(root)
  counts = ', '.join(f'{k}: {len(v)}' for k, v in todo.items())
  line = (f'{sum(len(v) for v in todo.values())} runs missing ({counts}) under {root}: '
          'launching them now (each one trains); pass --no-run to render the page from '
          'the runs that exist.')
  assert [r for r, _ in launched] == [os.path.join(root, n) for n in todo]
  assert launched[0][1] == [line]  # said once, before the first launch


def test_results_cli_on_ctrl_c_prints_one_line(tmp_path, capsys, monkeypatch):
  def interrupted_sweeps(*args, **kwargs):
    raise KeyboardInterrupt
  monkeypatch.setattr(results, 'run_sweeps', interrupted_sweeps)
  try:
    assert results.main(['--root', str(tmp_path), '--out', str(tmp_path / 'o')]) == 130
  finally:
    sweep._STOPPING.clear()  # pylint: disable=protected-access
  err = capsys.readouterr().err
  assert err.startswith('interrupted: ') and err.count('\n') == 1
  assert not os.path.exists(tmp_path / 'o')
