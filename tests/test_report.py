"""Tests of hfl.report (runs, seed groups, paired statistics, tables, plots, CLI),
hfl.metrics' time-to-target and byte formatter, and hfl.sweep, on workdirs they write."""

import csv
import errno
import glob
import io
import importlib.util
import json
import logging
import math
import os
import re
import shlex
import shutil
import subprocess
import sys

import ml_collections
import numpy as np
import pytest

from hfl import metrics
from hfl import report
from hfl import sweep
from hfl.report import __main__ as report_cli
from hfl.report import plots
from hfl.report import runs as runs_lib
from hfl.report import stats
from hfl.report import tables

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PNG_MAGIC = b'\x89PNG\r\n\x1a\n'
MB = 10**6


def _default_config() -> ml_collections.ConfigDict:
  spec = importlib.util.spec_from_file_location(
      '_default_cfg', os.path.join(REPO, 'configs', 'default.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def _config(**overrides) -> dict:
  """Resolved config (as JSON would store it) with dotted-key overrides."""
  cfg = _default_config()
  cfg.update_from_flattened_dict(overrides)
  return json.loads(cfg.to_json())


def _write_run(workdir, config, evals, summary=None, config_json=False):
  """Writes a workdir in the formats hfl/train.py writes.

  Args:
    workdir: path.
    config: resolved config dict.
    evals: list of (round, acc, sim_time_s, (intra_up, intra_down, inter_dc)).
    summary: summary.json overrides; None writes no summary.json.
    config_json: also write config.json (and leave config out of summary).
  """
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
    for i, (rnd, acc, t, (up, down, inter)) in enumerate(evals):
      f.write(json.dumps({
          'step': 4 * rnd, 'round': rnd, 'test_accuracy': acc,
          'test_loss': 1.0 - acc, 'train_loss': 1.0 - acc,
          'bytes': {'intra_up': up, 'intra_down': down, 'inter_dc': inter},
          'sim_time_s': t, 'wall_time_s': 2.0 * (i + 1), 'k': 4}) + '\n')
  if config_json:
    with open(os.path.join(workdir, 'config.json'), 'w') as f:
      json.dump(config, f)
  if summary is not None:
    rnd, _, t, (up, down, inter) = evals[-1]
    s = {
        'final_test_accuracy': evals[-1][1],
        'best_test_accuracy': max(e[1] for e in evals),
        'inter_dc_rounds': rnd, 'intra_dc_iterations': 4 * rnd,
        'bytes': {'intra_up': up, 'intra_down': down, 'inter_dc': inter},
        'sim_time_s': t, 'wall_time_s': 2.0 * len(evals),
        # Deliberately not the interpolated values: the report recomputes.
        'time_to_target_s': 999.0, 'rounds_to_target': 999,
    }
    if not config_json:
      s['config'] = config
    s.update(summary)
    with open(os.path.join(workdir, 'summary.json'), 'w') as f:
      json.dump(s, f)
  return str(workdir)


def _bytes(r, up, down, inter):
  return (up * r * MB, down * r * MB, inter * r * MB)


@pytest.fixture
def runs(tmp_path):
  """Four workdirs: periodic/identity x 2 seeds, periodic/topk, sync/identity."""
  a0 = _write_run(tmp_path / 'a0', _config(**{'sync.strategy': 'periodic', 'seed': 0}),
                  [(1, 0.50, 10.0, _bytes(1, 100, 100, 50)),
                   (2, 0.80, 20.0, _bytes(2, 100, 100, 50)),
                   (3, 0.90, 30.0, _bytes(3, 100, 100, 50))], summary={})
  a1 = _write_run(tmp_path / 'a1', _config(**{'sync.strategy': 'periodic', 'seed': 1}),
                  [(1, 0.60, 10.0, _bytes(1, 100, 100, 50)),
                   (2, 0.85, 20.0, _bytes(2, 100, 100, 50)),
                   (3, 0.95, 30.0, _bytes(3, 100, 100, 50))], summary={})
  b = _write_run(tmp_path / 'b', _config(**{'sync.strategy': 'periodic',
                                            'compression.uplink.name': 'topk'}),
                 [(1, 0.40, 10.0, _bytes(1, 10, 20, 50)),
                  (2, 0.60, 20.0, _bytes(2, 10, 20, 50)),
                  (3, 0.70, 30.0, _bytes(3, 10, 20, 50))], summary={}, config_json=True)
  c = _write_run(tmp_path / 'c', _config(**{'sync.strategy': 'sync'}),
                 [(4, 0.90, 5.0, _bytes(4, 100, 100, 50)),
                  (8, 0.92, 9.0, _bytes(8, 100, 100, 50))], summary={})
  return [a0, a1, b, c]


# ---------------------------------------------------------------------------
# hfl.metrics: time to target, byte formatter


def _m(acc, t, rnd=None):
  return {'test_accuracy': acc, 'sim_time_s': t, 'round': rnd,
          'bytes': {'intra_up': t, 'intra_down': 2 * t, 'inter_dc': 0}}


def test_time_to_target_interpolates_between_bracketing_evals():
  records = [_m(0.5, 10, 1), _m(0.8, 20, 2), _m(0.9, 30, 3), _m(0.95, 40, 4)]
  # 0.88 lies between 0.8 (t=20) and 0.9 (t=30): 20 + 0.08 / 0.1 * 10 = 28.
  assert metrics.time_to_target(records, 0.88, 'sim_time_s') == pytest.approx(28)
  assert metrics.time_to_target(records, 0.88, 'round') == pytest.approx(2.8)
  assert metrics.time_to_target(records, 0.88, 'bytes.total') == pytest.approx(84)
  assert metrics.time_to_target(records, 0.9, 'sim_time_s') == pytest.approx(30)
  # The one rule the training loop applies to each crossing (hfl.train.record_eval
  # calls metrics.crossing): same numbers on the bracketing pair.
  assert metrics.crossing(records[1], records[2], 0.88, 'sim_time_s') == pytest.approx(28)
  assert metrics.crossing(None, records[2], 0.88, 'round') == 3


def test_time_to_target_edge_cases():
  records = [_m(0.5, 10), _m(0.8, 20)]
  assert metrics.time_to_target(records, 0.88) is None
  assert metrics.time_to_target([], 0.88) is None
  # Already above target at the first evaluation: its x, no extrapolation.
  assert metrics.time_to_target([_m(0.9, 7)], 0.88) == 7
  # First crossing counts even if accuracy drops again later.
  dip = [_m(0.5, 10), _m(0.9, 20), _m(0.7, 30), _m(0.95, 40)]
  assert metrics.time_to_target(dip, 0.88) == pytest.approx(19.5)
  # Non-finite accuracy is skipped; bracketing uses finite neighbours.
  nan = [_m(0.5, 10), _m(math.nan, 15), _m(1.0, 20)]
  assert metrics.time_to_target(nan, 0.75) == pytest.approx(15)
  assert metrics.time_to_target(records, 0.5, 'nope') is None


def test_one_byte_formatter_in_decimal_units():
  assert metrics.format_bytes(999) == '999 B'
  assert metrics.format_bytes(1000) == '1.00 kB'
  assert metrics.format_bytes(1.5e6) == '1.50 MB'
  assert metrics.format_bytes(12.14e9) == '12.14 GB'
  assert metrics.format_bytes(2e12) == '2.00 TB'
  assert metrics.format_bytes(1.5e6, digits=1) == '1.5 MB'
  assert metrics.format_bytes(3e5, unit=metrics.byte_unit(2e6)) == '0.30 MB'
  assert metrics.format_bytes(None) == '–'
  assert tables.format_seconds(30) == '30.0 s'
  assert tables.format_seconds(600) == '10.0 min'
  assert tables.format_seconds(36000) == '10.00 h'


# ---------------------------------------------------------------------------
# Loading: workdirs, and directories with workdirs below them


def test_load_run_reads_workdir(runs):
  r = runs_lib.load_run(runs[0])
  assert r.finished and r.name == 'a0'
  assert r.config['sync']['strategy'] == 'periodic'
  assert [m['step'] for m in r.metrics] == [4, 8, 12]
  # Config from config.json when summary has none.
  assert runs_lib.load_run(runs[2]).config['compression']['uplink']['name'] == 'topk'


def test_load_run_names_a_file_that_is_not_json(tmp_path, runs):
  bad = tmp_path / 'bad'
  shutil.copytree(runs[0], bad)
  (bad / 'summary.json').write_text('garbage')
  with pytest.raises(ValueError, match=f"{bad / 'summary.json'} is not valid JSON"):
    runs_lib.load_run(str(bad))


def test_load_run_tolerates_resume_duplicates_and_torn_line(tmp_path):
  d = tmp_path / 'w'
  d.mkdir()
  lines = [{'step': 4, 'test_accuracy': 0.1}, {'step': 8, 'test_accuracy': 0.2},
           {'step': 8, 'test_accuracy': 0.3}, {'step': 12, 'test_accuracy': 0.4}]
  text = ''.join(json.dumps(x) + '\n' for x in lines) + '{"step": 16, "te'
  (d / 'metrics.jsonl').write_text(text)
  r = runs_lib.load_run(str(d))
  assert not r.finished and r.config == {} and r.summary == {}
  assert [(m['step'], m['test_accuracy']) for m in r.metrics] == [
      (4, 0.1), (8, 0.3), (12, 0.4)]
  with pytest.raises(FileNotFoundError):
    runs_lib.load_run(str(tmp_path / 'missing'))


def test_a_damaged_config_json_next_to_a_summary_with_the_config_is_left_out(runs, tmp_path):
  """The summary holds the config, but config.json beside it is damaged: left out and
  named (file, what is wrong), as the sweep refuses it; it used to be read silently."""
  (tmp_path / 'a0' / 'config.json').write_text('{"seed": 0,')
  (tmp_path / 'c' / 'config.json').write_text('"periodic"')
  frame = report.load([str(tmp_path)])
  assert list(frame['name']) == ['a1', 'b']
  why = dict(frame.attrs['unreadable'])
  assert why[runs[0]].startswith(f'{runs[0]}/config.json is not valid JSON (Expecting')
  assert why[runs[3]] == (f'{runs[3]}/config.json is not a JSON object (it holds "periodic"); '
                          'fix or remove that run')


@pytest.mark.parametrize('update, why', [
    (None, 'lacks final_test_accuracy (a number every finished run writes)'),
    ({'final_test_accuracy': '0.9'}, 'final_test_accuracy is "0.9" where a number belongs'),
    ({'final_test_accuracy': [0.9]}, 'final_test_accuracy is [0.9] where a number belongs'),
    ({'final_test_accuracy': None}, 'final_test_accuracy is null where a number belongs'),
    ({'best_test_accuracy': True, 'final_test_loss': {}, 'compute_s': None},
     'best_test_accuracy is true where a number or null belongs; final_test_loss is {} where a '
     'number or null belongs'),
    ({'bytes': {'intra_up': 1, 'intra_down': '2'}},
     'bytes.intra_down is "2" where a number or null belongs'),
    ({'intra_dc_iterations': 'n/a', 'bytes': 3}, 'bytes is 3 where an object of numbers per '
     'link belongs; intra_dc_iterations is "n/a" where a number or null belongs'),
    ({'final_test_accuracy': math.nan}, 'final_test_accuracy is NaN where a fraction in [0, 1] '
     'belongs'),
    ({'final_test_accuracy': 57.0, 'best_test_accuracy': -1}, 'final_test_accuracy is 57.0 '
     'where a fraction in [0, 1] belongs; best_test_accuracy is -1 where a fraction in [0, 1] '
     'or null belongs'),
    ({'inter_dc_rounds': -2, 'bytes': {'intra_up': -5, 'inter_dc': 1}, 'sim_time_s': -math.inf},
     'inter_dc_rounds is -2 where a finite number ≥ 0 or null belongs; bytes.intra_up is -5 '
     'where a finite number ≥ 0 or null belongs; sim_time_s is -Infinity where a finite number '
     '≥ 0 or null belongs')])
def test_a_summary_without_a_finished_runs_numbers_is_left_out(runs, tmp_path, update, why):
  """A summary.json of {} or with a field the report reads that is no number used to be an
  unfinished run or a '–' cell: left out, naming the fields and what they must hold. So
  is a number that is not finite (NaN, Infinity: the row used to show the other seeds'
  value alone) or out of its range (an accuracy in percent, negative bytes or seconds). The
  summaries real runs write pass (finished ones in docs/results; LM, unfinished, minimal
  ones of older runs or a fake main.py: the other tests)."""
  path = tmp_path / 'c' / 'summary.json'
  path.write_text(json.dumps({} if update is None else {**json.loads(path.read_text()),
                                                          **update}))
  frame = report.load([str(tmp_path)])
  assert list(frame['name']) == ['a0', 'a1', 'b']
  (d, reason), = frame.attrs['unreadable']
  assert d == runs[3] and reason.startswith(f'{path}: {why}'), reason
  assert reason.endswith('; delete that summary.json and rerun main.py on the workdir to '
                         'rebuild it from metrics.jsonl and the last checkpoint, or remove that run')
  for p in glob.glob(os.path.join(REPO, 'docs', 'results', 'runs', '*', '*', 'summary.json')):
    with open(p, encoding='utf-8') as f:
      s = json.load(f)
    assert runs_lib.summary_problem(s, runs_lib.target_of(runs_lib.flatten(s['config'])).metric
                                    ) is None, p


def test_a_summary_json_directory_or_config_string_not_json_is_left_out_and_named(runs,
                                                                                    tmp_path):
  """summary.json a directory (main.py refuses that workdir) used to be an unfinished run;
  a config string that is not JSON was named by the decoder's message alone."""
  (tmp_path / 'c' / 'summary.json').unlink()
  (tmp_path / 'c' / 'summary.json').mkdir()
  path = tmp_path / 'a1' / 'summary.json'
  path.write_text(json.dumps({**json.loads(path.read_text()), 'config': 'seed: 1'}))
  frame = report.load([str(tmp_path)])
  assert list(frame['name']) == ['a0', 'b']
  why = dict(frame.attrs['unreadable'])
  assert why[runs[3]] == (f'{runs[3]}/summary.json is a directory, not a JSON file; fix or '
                          'remove that run')
  assert why[runs[1]].startswith(f'{path}: config is a string that is not valid JSON (Expecting '
                                 'value: line 1 column 1 (char 0)); fix or remove that run')


def test_find_runs_below_a_sweep_root(tmp_path, runs):
  """Issue 18 (5): a sweep root (workdirs below it) is found, not refused."""
  root = tmp_path
  (root / 'report').mkdir()  # a report directory: not a workdir
  (root / 'a0' / 'checkpoints' / '1').mkdir(parents=True)  # nothing below a workdir
  (root / 'a0' / 'checkpoints' / '1' / 'metrics.jsonl').write_text('')
  assert runs_lib.find_runs([str(root)]) == [str(root / n) for n in ('a0', 'a1', 'b', 'c')]
  assert runs_lib.find_runs([runs[3], str(root)]) == [runs[3]] + runs[:3]
  assert runs_lib.find_runs([str(root)], exclude=[str(root / 'b')]) == [runs[0], runs[1], runs[3]]
  with pytest.raises(FileNotFoundError, match='no training workdir'):
    runs_lib.find_runs([str(root / 'report')])
  # A run reached twice (the same path, a parent, another spelling) is one run, not an error.
  everything = runs_lib.find_runs([str(root)])
  assert runs_lib.find_runs([runs[0], runs[0] + os.sep]) == [runs[0]]
  assert runs_lib.find_runs([str(root), runs[0]]) == everything
  with pytest.raises(FileNotFoundError, match='not a directory'):
    runs_lib.find_runs([str(root / 'nope')])


# ---------------------------------------------------------------------------
# Seed groups and paired statistics


def test_stat_and_reductions_by_hand():
  st = stats.stat([0.90, 0.95, None, math.nan])
  assert (st.mean, st.n) == (pytest.approx(0.925), 2)
  assert st.std == pytest.approx(math.sqrt(2 * 0.025**2))
  assert st.sem == pytest.approx(st.std / math.sqrt(2))
  assert stats.stat([0.5]) == stats.Stat(0.5, None, 1) and stats.stat([]).mean is None
  assert stats.reduction(25.0, 100.0) == 0.75 and stats.reduction(1.0, 0.0) is None
  assert stats.factor(25.0, 100.0) == 4.0 and math.isinf(stats.factor(0.0, 1.0))


def _seed_runs(tmp_path, finals, comp='identity', prefix='r'):
  """One workdir per seed (seed -> final accuracy); None writes an unfinished run."""
  out = []
  for seed, final in finals.items():
    cfg = _config(**{'seed': seed, 'compression.uplink.name': comp})
    evals = [(1, 0.5, 1.0, _bytes(1, 10, 10, 1)), (2, final or 0.6, 2.0, _bytes(2, 10, 10, 1))]
    out.append(_write_run(tmp_path / f'{prefix}{seed}', cfg, evals,
                          summary=None if final is None else {}, config_json=True))
  return out


def test_paired_deltas_match_seeds_not_positions(tmp_path):
  """Paired Δ by hand: seeds 0, 1, 2 vs a baseline with seeds 2, 0 (seed 1 missing)."""
  base = _seed_runs(tmp_path, {2: 0.80, 0: 0.90}, prefix='base')
  ours = _seed_runs(tmp_path, {0: 0.87, 1: 0.70, 2: 0.81}, comp='topk', prefix='top')
  frame = report.load([str(tmp_path)])
  groups = stats.group_ids(frame)
  assert groups.nunique() == 2
  gid = lambda workdir: groups[frame['workdir'] == workdir].iloc[0]
  g_ours, g_base = gid(ours[0]), gid(base[0])
  st, per_seed = stats.paired(frame, groups, g_ours, g_base)
  # Seed 0: 87 - 90 = -3; seed 2: 81 - 80 = +1; seed 1 has no baseline.
  assert per_seed == {0: pytest.approx(-3.0), 2: pytest.approx(1.0)}
  assert st.mean == pytest.approx(-1.0) and st.n == 2
  assert st.std == pytest.approx(math.sqrt(8.0)) and st.sem == pytest.approx(2.0)


def test_unfinished_runs_in_groups(tmp_path):
  """An unfinished run counts with its last evaluation (and is said to be unfinished)."""
  _seed_runs(tmp_path, {0: 0.9, 1: None})
  frame = report.load([str(tmp_path)])
  assert list(frame['finished']) == [True, False]
  table = tables.build_table(frame)
  assert len(table) == 1
  assert table.iloc[0]['final_acc'] == pytest.approx((0.9 + 0.6) / 2)
  assert table.iloc[0]['bytes.total'] == 42 * MB
  target = frame.attrs['target']
  assert '| 2 (1 unfinished) |' in tables.to_markdown(table, target)
  assert list(csv.DictReader(io.StringIO(tables.to_csv(table, target))))[0]['n_unfinished'] == '1'


def test_a_repeated_run_is_left_out_and_named_not_counted_as_a_seed(tmp_path):
  """A copy of a run (same config and seed) is no new sample: the row's n, mean and std
  are over distinct seeds; the repeat is named under the table and in the CSV."""
  for name, acc in (('a', 0.8), ('b', 0.8)):  # b: a copy of a
    _write_run(str(tmp_path / name), _config(seed=0), [(25, acc, 1.0, (1, 1, 1))], summary={})
  _write_run(str(tmp_path / 'c'), _config(seed=1), [(25, 0.6, 1.0, (1, 1, 1))], summary={})
  _write_run(str(tmp_path / 'topk'), _config(seed=0, **{'compression.uplink.name': 'topk'}),
             [(25, 0.7, 1.0, (1, 1, 1))], summary={})
  frame = report.load([str(tmp_path)])
  for label_by in (None, ['compression.uplink.name']):
    table = tables.build_table(frame, label_by=label_by)
    row = table.loc[[g for g in table.index if len(table.at[g, 'runs']) == 2][0]]
    assert row['workdirs'] == [str(tmp_path / 'a'), str(tmp_path / 'c')]
    assert row['final_acc'] == pytest.approx(0.7) and row['final_acc_n'] == 2
    assert row['final_acc_std'] == pytest.approx(math.sqrt(0.02))  # not over 0.8, 0.8, 0.6
    assert row['repeats'] == [(str(tmp_path / 'b'), str(tmp_path / 'a'))]
    topk = table.set_index('label').loc[[l for l in table['label'] if 'topk' in l][0]]
    assert topk['paired_n'] == 1 and topk['paired_delta'] == pytest.approx(-10.0)
    target = frame.attrs['target']
    assert (f"the same config and seed (a copy or a rerun adds no sample): `{tmp_path / 'b'}` "
            f"(repeats `{tmp_path / 'a'}`)." in tables.to_markdown(table, target))
    rows = list(csv.DictReader(io.StringIO(tables.to_csv(table, target))))
    assert sorted(r['repeats_left_out'] for r in rows) == ['', f"{tmp_path / 'b'}={tmp_path / 'a'}"]


def test_a_label_by_row_pooling_different_configs_is_named(tmp_path):
  """--label-by seed over a K sweep pools K = 1 and 4 in one row: its ± is over K, not
  seeds. The note under the table says which keys vary in the row."""
  for k in (1, 4):
    _write_run(str(tmp_path / f'k{k}'), _config(seed=0, **{'sync.k': k}),
               [(25, 0.8, 1.0, (1, 1, 1))], summary={})
  frame = report.load([str(tmp_path)])
  table = tables.build_table(frame, label_by=['seed'])
  assert list(table['pooled']) == [{'sync.k': ['1', '4']}]
  assert ('Rows pooling runs of different configs (their mean ± std is over these, not over '
          'seeds alone): `seed=0` (sync.k: 1, 4).' in tables.to_markdown(table, frame.attrs['target']))
  assert list(tables.build_table(frame)['pooled']) == [{}, {}]


def test_runs_of_different_data_sets_are_refused(tmp_path):
  _write_run(str(tmp_path / 'fmnist'), _config(), [(25, 0.8, 1.0, (1, 1, 1))], summary={})
  _write_run(str(tmp_path / 'lm'), _config(**{'dataset.name': 'shakespeare'}),
             [(25, 0.5, 1.0, (1, 1, 1))], summary={})
  with pytest.raises(ValueError, match=r'different data sets.* \(fashion_mnist: 1 runs, e\.g\. '
                     r'.*fmnist; shakespeare: 1 runs.*separately'):
    report.load([str(tmp_path)])
  assert len(report.load([str(tmp_path / 'lm')])) == 1


def test_rows_group_seeds_and_match_hand_computed_values(runs):
  frame = report.load(runs, target=0.88)
  t = tables.build_table(frame, label_by=['sync.strategy', 'compression.uplink.name'])
  assert list(t['label']) == ['periodic, up=identity', 'periodic, up=topk', 'sync, up=identity']
  a, b, c = (t.iloc[i] for i in range(3))
  assert a['seeds'] == [0, 1]
  # Seeds: final 0.90, 0.95; time to target 28 (seed 0), 23 (seed 1).
  assert a['final_acc'] == pytest.approx(0.925)
  assert a['final_acc_std'] == pytest.approx(math.sqrt(2 * 0.025**2))
  assert a['time_to_target_s'] == pytest.approx(25.5)
  assert a['time_to_target_s_std'] == pytest.approx(math.sqrt(12.5))
  assert a['rounds_to_target'] == pytest.approx(2.55) and a['time_to_target_s_n'] == 2
  assert a['bytes.intra_up'] == 300 * MB and a['bytes.total'] == 750 * MB
  assert b['time_to_target_s'] is None and b['rounds_to_target_n'] == 0
  assert c['time_to_target_s'] == 5.0 and c['time_to_target_s_std'] is None
  # Compression vs the closest identity row (periodic for b, itself for c).
  assert b['baseline'] == 'periodic, up=identity'
  assert b['compression_ratio'] == pytest.approx(1 - 240 / 750)
  assert b['compression_factor'] == pytest.approx(750 / 240)
  # Paired Δ vs the baseline's seed 0 (b has seed 0 only): 70 - 90 = -20 pts.
  assert b['paired_delta'] == pytest.approx(-20.0) and b['paired_n'] == 1
  assert c['baseline'] == 'sync, up=identity' and c['compression_ratio'] == pytest.approx(0.0)


def test_labels_tell_apart_keys_with_the_same_short_name():
  """The uplink's and downlink's density are both 'density': a label names their links."""
  flat = {'compression.uplink.name': 'topk', 'compression.uplink.density': 0.02,
          'compression.downlink.name': 'topk', 'compression.downlink.density': 0.01,
          'sync.k': 4}
  keys = ['compression.uplink.name', 'compression.downlink.name',
          'compression.uplink.density', 'compression.downlink.density', 'sync.k']
  assert tables.make_labels([flat], ['a'], label_by=keys) == [
      'up=topk, down=topk, uplink.density=0.02, downlink.density=0.01, k=4']


def test_label_by_seed_gives_a_row_per_seed(runs):
  """Issue 18 (5), and a fresh-user check: --label-by seed groups the runs by seed (one row
  per seed, whatever else differs), as the README says; it used to give a row per run."""
  frame = report.load(runs)
  t = tables.build_table(frame, label_by=['seed'])
  assert list(t['label']) == ['seed=0', 'seed=1'] and list(t['runs'].map(len)) == [3, 1]
  assert t.iloc[0]['workdirs'] == [runs[0], runs[2], runs[3]]
  assert t.iloc[0]['final_acc'] == pytest.approx((0.90 + 0.70 + 0.92) / 3)
  # Baseline seed=0 (all rows uncompressed: the most bytes); a1 pairs with a0: 95 − 90.
  assert t.iloc[1]['baseline'] == 'seed=0' and t.iloc[1]['paired_delta'] == pytest.approx(5.0)
  assert t.iloc[1]['paired_n'] == 1
  t = tables.build_table(frame, label_by=['sync.strategy', 'seed'])
  assert list(t['label']) == ['periodic, seed=0', 'periodic, seed=1', 'sync, seed=0']
  assert list(t['runs'].map(len)) == [2, 1, 1]


def test_label_by_groups_the_runs_equal_in_its_keys_and_pairs_on_the_others(tmp_path):
  """--label-by compression.uplink.name over a K x compressor x seed grid: one row per
  compressor (mean over its Ks and seeds), its paired Δ run by run on K and seed."""
  finals = {('identity', 1, 0): 0.90, ('identity', 1, 1): 0.92, ('identity', 4, 0): 0.86,
            ('identity', 4, 1): 0.88, ('topk', 1, 0): 0.89, ('topk', 1, 1): 0.90,
            ('topk', 4, 0): 0.80, ('topk', 4, 1): 0.85}
  for (comp, k, seed), acc in finals.items():
    _write_run(tmp_path / f'{comp}_k{k}_s{seed}',
               _config(**{'compression.uplink.name': comp, 'sync.k': k, 'seed': seed}),
               [(1, acc, 1.0, _bytes(1, 10 if comp == 'topk' else 100, 100, 1))], summary={})
  t = tables.build_table(report.load([str(tmp_path)]), label_by=['compression.uplink.name'])
  t = t.set_index('label')
  assert list(t.index) == ['up=identity', 'up=topk'] and list(t['runs'].map(len)) == [4, 4]
  assert t.at['up=topk', 'final_acc'] == pytest.approx(0.86)
  assert t.at['up=topk', 'baseline'] == 'up=identity'
  assert t.at['up=topk', 'compression_ratio'] == pytest.approx(1 - 111 / 201)
  # Per (K, seed): 89 − 90, 90 − 92, 80 − 86, 85 − 88 = −1, −2, −6, −3 pts.
  assert t.at['up=topk', 'paired_delta'] == pytest.approx(-3.0)
  assert t.at['up=topk', 'paired_n'] == 4
  assert t.at['up=topk', 'paired_std'] == pytest.approx(math.sqrt(14 / 3))


def test_rows_per_seed_compare_with_the_same_seed(tmp_path):
  _seed_runs(tmp_path, {0: 0.80, 1: 0.90}, prefix='id')
  _seed_runs(tmp_path, {0: 0.85, 1: 0.70}, comp='topk', prefix='tk')
  t = tables.build_table(report.load([str(tmp_path)]),
                         label_by=['seed', 'compression.uplink.name'])
  rows = {r['label']: r for _, r in t.iterrows()}
  assert rows['seed=1, up=topk']['baseline'] == 'seed=1, up=identity'
  assert rows['seed=1, up=topk']['paired_delta'] == pytest.approx(-20.0)
  assert rows['seed=0, up=topk']['paired_delta'] == pytest.approx(5.0)


def test_sweeping_only_seed(tmp_path):
  """A seed-only sweep: one row (mean ± std) by default, one per seed by seed."""
  _seed_runs(tmp_path, {0: 0.80, 1: 0.90, 2: 0.85})
  frame = report.load([str(tmp_path)])
  assert len(tables.build_table(frame)) == 1
  assert list(tables.build_table(frame, label_by=['seed'])['label']) == [
      'seed=0', 'seed=1', 'seed=2']


def test_explicit_baseline_and_auto_labels(runs):
  frame = report.load(runs)
  t = tables.build_table(frame, baseline='sync, up=identity')
  assert list(t['label']) == ['periodic, up=identity', 'periodic, up=topk', 'sync, up=identity']
  # sync run totals 8 * 250 MB = 2000 MB.
  assert t.iloc[1]['compression_ratio'] == pytest.approx(1 - 240 / 2000)
  with pytest.raises(ValueError, match='not a label'):
    tables.build_table(frame, baseline='nope')


def test_schema_difference_does_not_split_a_group(tmp_path):
  """A run trained before a config field existed still joins its seeds."""
  old = _config(seed=1)
  del old['optimizer']['shard_state']
  _write_run(tmp_path / 'new', _config(seed=0), [(1, 0.8, 1.0, (1, 1, 1))], summary={})
  _write_run(tmp_path / 'old', old, [(1, 0.9, 1.0, (1, 1, 1))], summary={})
  table = tables.build_table(report.load([str(tmp_path)]))
  assert len(table) == 1 and table.iloc[0]['seeds'] == [0, 1]


# ---------------------------------------------------------------------------
# Rendering, plots and the CLI


def test_markdown_and_csv(runs, tmp_path):
  out = tmp_path / 'out'
  written = report.write_report(runs, str(out), target=0.88)
  md = (out / 'results.md').read_text()
  assert written['results.md'] == str(out / 'results.md')
  lines = {l.split(' | ')[0].lstrip('| '): l for l in md.splitlines() if l.startswith('| ')}
  assert '92.50 ± 3.54%' in lines['periodic, up=identity']
  assert '25.5 s ± 3.5 s' in lines['periodic, up=identity']
  assert '300.00 MB' in lines['periodic, up=identity']
  assert 'never' in lines['periodic, up=topk']
  assert '68.0% (3.1×)' in lines['periodic, up=topk']
  assert '−20.00 pts (n=1)' in lines['periodic, up=topk']
  with open(out / 'results.csv') as f:
    recs = {r['label']: r for r in csv.DictReader(f)}
  a = recs['periodic, up=identity']
  assert a['n_runs'] == '2' and a['seeds'] == '0;1'
  assert float(a['time_to_target_s_mean']) == pytest.approx(25.5)
  assert float(a['bytes_inter_dc_mean']) == 150 * MB
  b = recs['periodic, up=topk']
  assert b['time_to_target_s_mean'] == '' and b['rounds_to_target_mean'] == ''  # numeric
  assert b['n_reached_target'] == '0'
  assert float(b['compression_ratio']) == pytest.approx(0.68)
  assert float(b['paired_delta']) == pytest.approx(-20.0)
  assert recs['sync, up=identity']['final_test_accuracy_std'] == ''
  notes = md.split('## Notes')[1]
  assert '{' not in notes  # every placeholder filled
  assert 'Baseline: `periodic, up=identity`, `sync, up=identity` (the closest' in notes


def test_partial_seed_success_is_reported(tmp_path):
  _write_run(tmp_path / 's0', _config(seed=0), [(1, 0.5, 1.0, (1, 1, 1)),
                                                (2, 0.9, 3.0, (2, 2, 2))], summary={})
  _write_run(tmp_path / 's1', _config(seed=1), [(1, 0.5, 1.0, (1, 1, 1)),
                                                (2, 0.6, 3.0, (2, 2, 2))], summary={})
  table = tables.build_table(report.load([str(tmp_path)], target=0.88))
  assert len(table) == 1 and table.iloc[0]['time_to_target_s_n'] == 1
  assert '(1/2 reached)' in tables.to_markdown(table, runs_lib.Target('test_accuracy', True, 0.88))


def test_plots_are_written(runs, tmp_path):
  frame = report.load(runs)
  curves = [plots.Curves(r.name, [r.metrics]) for r in frame['run']]
  paths = plots.write_plots(curves, str(tmp_path / 'p'), target=0.88, prefix='x_')
  assert sorted(os.path.basename(p) for p in paths) == [
      'x_accuracy_vs_bytes.png', 'x_accuracy_vs_inter_dc_rounds.png',
      'x_accuracy_vs_sim_time.png']
  for p in paths:
    with open(p, 'rb') as f:
      data = f.read()
    assert data.startswith(PNG_MAGIC) and len(data) > 5000


def test_mean_curve_interpolates_common_range():
  x, y, sd = plots.mean_curve([(np.array([0., 2.]), np.array([0., 1.])),
                               (np.array([1., 3.]), np.array([1., 1.]))])
  np.testing.assert_allclose(x, [1., 2.])
  np.testing.assert_allclose(y, [0.75, 1.0])
  assert sd is not None and sd[1] == 0


def test_cli(runs, tmp_path, capsys):
  out = tmp_path / 'cli'
  rc = report_cli.main([*runs, '--out', str(out), '--target', '0.85',
                        '--label-by', 'sync.strategy,compression.uplink.name'])
  assert rc == 0
  assert (out / 'results.md').exists() and (out / 'results.csv').exists()
  assert (out / 'accuracy_vs_bytes.png').stat().st_size > 0
  assert 'results.md' in capsys.readouterr().out
  with open(out / 'results.csv') as f:
    rec = next(csv.DictReader(f))
  # Target 0.85: seed 0 at 20 + 0.05/0.1*10 = 25, seed 1 at 20.
  assert float(rec['time_to_target_s_mean']) == pytest.approx(22.5)
  assert report_cli.main([str(tmp_path / 'nope'), '--out', str(out)]) == 2
  assert report_cli.main([*runs[:2]]) == 2  # several DIRs need --out
  capsys.readouterr()
  # Bad input, refused with the reason (an accuracy target in percent; an unknown key).
  assert report_cli.main([*runs, '--out', str(tmp_path / 'bad'), '--target', '88']) == 2
  assert capsys.readouterr().err == ('error: --target=88.0 must be an accuracy fraction in '
                                     '(0, 1], e.g. 0.88\n')
  assert report_cli.main([*runs, '--out', str(tmp_path / 'bad'), '--label-by', 'sync.kk']) == 2
  err = capsys.readouterr().err
  assert err.startswith('error: --label-by sync.kk: no run has this config key (e.g. seed, ')
  assert not (tmp_path / 'bad').exists()


def test_comparisons_of_runs_stopped_at_other_iterations_are_marked(tmp_path):
  """An unfinished run's compression and Δ vs a baseline that ran longer are marked (†)
  with a note naming the iterations compared, in Markdown and CSV; values are kept."""
  evals = [(r, 0.5 + 0.1 * r, float(r), _bytes(r, 10, 10, 1)) for r in (1, 2, 3)]
  _write_run(tmp_path / 'base', _config(), evals, summary={})  # 3 rounds: iteration 12
  _write_run(tmp_path / 'topk', _config(**{'compression.uplink.name': 'topk'}),
             evals[:2], config_json=True)  # unfinished at iteration 8
  frame = report.load([str(tmp_path)])
  table = tables.build_table(frame).set_index('label')
  assert table.at['up=topk', 'iterations'] == '8 vs 12'
  assert table.at['up=identity', 'iterations'] is None
  assert table.at['up=topk', 'compression_ratio'] == pytest.approx(1 - 42 / 63)  # kept
  md = tables.to_markdown(table.reset_index(), frame.attrs['target'])
  row = next(l for l in md.splitlines() if l.startswith('| up=topk |'))
  assert '33.3% (1.5×) †' in row and '−10.00 pts (n=1) †' in row
  assert md.count('†') == 3 and ("† Compares runs stopped at other iterations than their "
                                 "baseline's (intra-DC iterations; unfinished, or of another "
                                 'length): `up=topk` 8 vs `up=identity` 12. Report again once '
                                 'the unfinished runs finish.') in md
  assert md.index('† Compares') < md.index('## Notes')  # printed by the CLI with the table
  recs = {r['label']: r for r in csv.DictReader(io.StringIO(
      tables.to_csv(table.reset_index(), frame.attrs['target'])))}
  assert recs['up=topk']['compared_iterations'] == '8 vs 12'
  assert recs['up=identity']['compared_iterations'] == ''
  # Finished, or stopped at the same iteration: nothing to mark.
  _write_run(tmp_path / 'topk', _config(**{'compression.uplink.name': 'topk'}), evals,
             config_json=True)
  table = tables.build_table(report.load([str(tmp_path)]))
  assert list(table['iterations']) == [None, None]
  assert '†' not in tables.to_markdown(table, frame.attrs['target'])


def test_finished_runs_of_other_lengths_are_marked_and_a_row_mixing_them_named(tmp_path):
  """Finished runs of 8 and 12 iterations used to be compared unmarked: † as for an
  unfinished run; a row (--label-by seed) holding both is named under the table."""
  evals = [(r, 0.5 + 0.1 * r, float(r), _bytes(r, 10, 10, 1)) for r in (1, 2, 3)]
  _write_run(tmp_path / 'base', _config(), evals, summary={})  # iteration 12
  _write_run(tmp_path / 'topk', _config(**{'compression.uplink.name': 'topk'}), evals[:2],
             summary={})  # finished at iteration 8
  _write_run(tmp_path / 'base1', _config(seed=1), evals, summary={})
  frame = report.load([str(tmp_path)])
  target = frame.attrs['target']
  table = tables.build_table(frame).set_index('label')
  assert table.at['up=topk', 'iterations'] == '8 vs 12'
  assert list(table['mixed_iterations']) == [None, None]
  md = tables.to_markdown(table.reset_index(), target)
  assert md.count('†') == 3 and ("(intra-DC iterations; unfinished, or of another length): "
                                 '`up=topk` 8 vs `up=identity` 12.\n') in md
  assert 'Report again' not in md and 'Rows whose runs' not in md
  table = tables.build_table(frame, label_by=['seed'])
  assert list(table['label']) == ['seed=0', 'seed=1']
  assert list(table['mixed_iterations']) == ['8;12', None]
  assert list(table['iterations']) == ['8;12 vs 12', None]  # baseline seed=1: the most bytes
  md = tables.to_markdown(table, target)
  assert ('Rows whose runs stopped at different iterations (intra-DC; their mean mixes run '
          'lengths): `seed=0` 8;12.') in md.split('## Notes')[0]
  recs = list(csv.DictReader(io.StringIO(tables.to_csv(table, target))))
  assert [r['mixed_iterations'] for r in recs] == ['8;12', '']


def test_an_unreadable_run_is_left_out_and_the_report_is_incomplete(runs, tmp_path, capsys,
                                                                     caplog):
  """A summary.json that is not a JSON object: the other runs are reported, the bad one
  is named with its reason (results.md, stdout, stderr), exit status 1."""
  (tmp_path / 'c' / 'summary.json').write_text('{"final_test_accuracy": 0.9,')  # cut short
  (tmp_path / 'b' / 'config.json').write_text('[]')
  out = tmp_path / 'out'
  with caplog.at_level(logging.WARNING):
    assert report_cli.main([str(tmp_path), '--out', str(out), '--no-plots']) == 1
  std = capsys.readouterr()
  md = (out / 'results.md').read_text()
  for d, why in ((runs[3], f"{runs[3]}/summary.json is not valid JSON (Expecting"),
                 (runs[2], f'{runs[2]}/config.json is not a JSON object (it holds [])')):
    assert f'- `{d}`: {why}' in md and f'- `{d}`: {why}' in std.out
    assert any(r.getMessage().startswith(f'{d}: left out of the report, unreadable: {why}')
               for r in caplog.records)
  assert '**Incomplete report:** 2 run(s) left out, unreadable' in md.split('## Notes')[0]
  assert std.err == (f'incomplete report: 2 run(s) left out, unreadable (named above and in '
                     f'{out / "results.md"}): {runs[2]}, {runs[3]}\n')
  with open(out / 'results.csv') as f:
    assert sum(int(r['n_runs']) for r in csv.DictReader(f)) == 2  # a0, a1
  written = report.write_report([str(tmp_path)], str(out), plots=False)
  assert isinstance(written, report.Written) and [d for d, _ in written.unreadable] == runs[2:]
  # A complete report: exit 0, no such note. No readable run: exit 2, nothing rewritten.
  assert report_cli.main([*runs[:2], '--out', str(tmp_path / 'ok'), '--no-plots']) == 0
  assert 'Incomplete' not in (tmp_path / 'ok' / 'results.md').read_text()
  for name in ('a0', 'a1'):
    (tmp_path / name / 'summary.json').write_text('null')
  capsys.readouterr()
  assert report_cli.main([str(tmp_path), '--out', str(out), '--no-plots']) == 2
  assert capsys.readouterr().err.startswith(f'error: no readable training run: {runs[0]}: '
                                            f'{runs[0]}/summary.json is not a JSON object (it '
                                            'holds null)')
  assert (out / 'results.md').read_text() == md
  assert not list(out.glob('*.tmp'))


def test_expected_runs_the_report_lacks_are_named_under_the_table(runs, tmp_path):
  """Given the expected workdirs (a sweep's), the runs with nothing to report (failed, not
  started) used to be left out silently; now results.md names them, and Written.missing."""
  out, never = tmp_path / 'out', str(tmp_path / 'never')
  written = report.write_report(runs[:2], str(out), plots=False,
                                expected=[runs[0], runs[1] + os.sep, runs[2], never])
  assert written.missing == [runs[2], never] and written.unreadable == []
  md = (out / 'results.md').read_text()
  assert (f'**Incomplete report:** 2 expected run(s) missing, not finished (failed or not '
          f'started): `{runs[2]}`, `{never}`\n') in md.split('## Notes')[0]
  written = report.write_report(runs[:2], str(out), plots=False)
  assert written.missing == [] and 'missing' not in (out / 'results.md').read_text()


def test_the_cli_on_a_sweep_root_names_the_runs_its_sweep_json_lists_but_lacks(tmp_path):
  """python -m hfl.report ROOT used to drop the sweep report's "missing" note: it reads
  ROOT/sweep.json too, names the runs it has none of, and exits 1 (incomplete)."""
  root = tmp_path / 'sweep'
  _write_run(str(root / 'seed=0'), _config(seed=0), [(25, 0.8, 1.0, (1, 1, 1))], summary={})
  (root / sweep.MANIFEST).write_text(json.dumps({'runs': [{'name': 'seed=0'},
                                                          {'name': 'seed=1'}]}))
  assert sweep.manifest_runs(str(root)) == ['seed=0', 'seed=1']
  assert report_cli.main([str(root), '--no-plots']) == 1
  assert (f"expected run(s) missing, not finished (failed or not started): `{root / 'seed=1'}`"
          in (root / 'report' / 'results.md').read_text())
  (root / sweep.MANIFEST).write_text(json.dumps({'runs': [{'name': 'seed=0'}]}))
  assert report_cli.main([str(root), '--no-plots']) == 0
  assert 'missing' not in (root / 'report' / 'results.md').read_text()


def test_no_plots_removes_the_plots_of_an_earlier_report(runs, tmp_path):
  """--no-plots used to leave an earlier report's PNGs next to the new results.md: the
  report's own plot files are removed (one stderr line), nothing else."""
  out = tmp_path / 'out'
  out.mkdir()
  ours = ['accuracy_vs_sim_time.png', 'accuracy_vs_bytes.png', 'loss_vs_inter_dc_rounds.png']
  others = ['accuracy_vs_wan_bytes.png', 'x_accuracy_vs_bytes.png', 'accuracy_vs_bytes.png.bak',
            'notes.txt']
  for name in ours + others:
    (out / name).write_bytes(PNG_MAGIC)
  (out / 'loss_vs_bytes.png').mkdir()  # not a file: kept
  p = subprocess.run([sys.executable, '-m', 'hfl.report', str(tmp_path), '--out', str(out),
                      '--no-plots'], env=_env(), capture_output=True, text=True, timeout=120,
                     check=False)
  assert p.returncode == 0, p.stderr
  assert sorted(os.listdir(out)) == sorted(others + ['loss_vs_bytes.png', 'results.csv',
                                                     'results.md'])
  said = [l for l in p.stderr.splitlines() if 'earlier report' in l]
  assert said == ['INFO removed the plots of an earlier report, stale next to results.md: '
                  + ', '.join(str(out / n) for n in ours)], p.stderr


def test_a_directory_with_neither_config_nor_summary_is_not_a_run(tmp_path, capsys):
  """metrics.jsonl alone (hfl.train writes config.json first) is not a run: below a
  DIR it is skipped and named (the K sweep keeps one baseline), named as a DIR it is
  refused."""
  for k, inter in ((1, 20), (4, 5)):
    _write_run(tmp_path / f'k{k}', _config(**{'sync.k': k}),
               [(1, 0.8, 1.0, _bytes(1, 10, 10, inter))], summary={})
  stray = tmp_path / 'stray'
  stray.mkdir()
  shutil.copy(tmp_path / 'k1' / 'metrics.jsonl', stray / 'metrics.jsonl')
  out = tmp_path / 'out'
  assert report_cli.main([str(tmp_path), '--out', str(out), '--no-plots']) == 0
  md = (out / 'results.md').read_text()
  assert 'Baseline: `k=1` (the closest' in md and '| stray |' not in md
  assert (f'Skipped (not a training run: metrics.jsonl but neither config.json nor '
          f'summary.json): `{stray}`') in md.split('## Notes')[0]
  with open(out / 'results.csv') as f:
    assert [r['label'] for r in csv.DictReader(f)] == ['k=1', 'k=4']
  capsys.readouterr()
  assert report_cli.main([str(tmp_path / 'k1'), str(stray), '--out', str(tmp_path / 'o2')]) == 2
  assert capsys.readouterr().err == (f'error: {stray}: not a training run: metrics.jsonl but '
                                     'neither config.json nor summary.json\n')
  assert not (tmp_path / 'o2').exists()
  shutil.copytree(stray, tmp_path / 'only' / 's')
  with pytest.raises(ValueError, match=r'^no readable training run: .*s: not a training run'):
    report.load([str(tmp_path / 'only')])


@pytest.mark.parametrize('value, problem', [
    ('', 'must not be empty'), ('sync.k,,seed', "'sync.k,,seed' has an empty key"),
    ('seed,', "'seed,' has an empty key"),
    ('sync.k,sync.k', "'sync.k,sync.k' names a key twice")])
def test_cli_refuses_an_empty_label_by(runs, tmp_path, capsys, value, problem):
  with pytest.raises(SystemExit) as e:
    report_cli.main([*runs, '--out', str(tmp_path / 'o'), f'--label-by={value}'])
  assert e.value.code == 2 and not (tmp_path / 'o').exists()
  assert (f'error: argument --label-by/--label_by: {problem}: give comma-separated config keys, '
          'e.g. sync.strategy,compression.uplink.name or seed') in capsys.readouterr().err
  assert report_cli.parse_args(['d', '--label-by', ' seed , sync.k ']).label_by == ['seed', 'sync.k']


def _env():
  return dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get('PYTHONPATH', ''))


def test_report_cli_on_a_sweep_root_from_another_directory(runs, tmp_path):
  """Issue 18 (5): `python3 -m hfl.report ROOT` from any directory finds the runs below
  ROOT and writes ROOT/report (relative paths are the caller's)."""
  cwd = tmp_path.parent
  rel = os.path.relpath(tmp_path, cwd)
  p = subprocess.run([sys.executable, '-m', 'hfl.report', rel, '--no-plots'], cwd=cwd,
                     env=_env(), capture_output=True, text=True, timeout=120, check=False)
  assert p.returncode == 0, p.stderr
  lines = p.stdout.splitlines()
  assert lines[-2:] == [os.path.join(rel, 'report', 'results.md'),
                        os.path.join(rel, 'report', 'results.csv')]
  with open(tmp_path / 'report' / 'results.md') as f:  # the table, printed first
    table = f.read().partition('\n## Notes')[0].rstrip('\n')
  assert '| label | runs |' in table
  assert p.stdout == table + '\n\n' + '\n'.join(lines[-2:]) + '\n'
  with open(tmp_path / 'report' / 'results.csv') as f:
    assert sum(int(r['n_runs']) for r in csv.DictReader(f)) == 4
  # Once the report exists, it is not taken for a workdir on the next call.
  p = subprocess.run([sys.executable, '-m', 'hfl.report', rel, '--no-plots'], cwd=cwd,
                     env=_env(), capture_output=True, text=True, timeout=120, check=False)
  assert p.returncode == 0, p.stderr


def test_no_import_cycle_and_no_jax_in_reports():
  """hfl.report imports neither hfl.sweep (which imports hfl.report) nor JAX."""
  code = ('import sys, hfl.report, hfl.report.plots; '
          'bad = [m for m in ("hfl.sweep", "jax", "hfl.train") if m in sys.modules]; '
          'print(bad); sys.exit(bool(bad))')
  p = subprocess.run([sys.executable, '-c', code], cwd=REPO, capture_output=True, text=True,
                     timeout=120, check=False)
  assert p.returncode == 0, p.stdout + p.stderr
  p = subprocess.run([sys.executable, '-c', 'import sys, hfl.sweep; '
                      'sys.exit("hfl.report" in sys.modules)'], cwd=REPO, timeout=120,
                     check=False)
  assert p.returncode == 0


# ---------------------------------------------------------------------------
# Sweep


GRID = {'sync.strategy': ['sync', 'periodic'],
        'compression.uplink.name': ['identity', 'topk'],
        'seed': [0, 1]}


def fake_curve(overrides, n=20):
  """A plausible training curve for a config (used by the fake runner)."""
  strategy = overrides.get('sync.strategy', 'periodic')
  comp = overrides.get('compression.uplink.name', 'identity')
  seed = overrides.get('seed', 0)
  k = 1 if strategy == 'sync' else 4
  per_round_s = k * 0.05 + 0.02 + (0.01 if comp == 'identity' else 0.001)
  up = 400_000 if comp == 'identity' else 8_000
  evals = []
  for i in range(1, n + 1):
    rnd = i * 25
    steps = rnd * k
    acc = 0.92 - 0.5 * math.exp(-steps / (300 if comp == 'identity' else 380))
    acc -= 0.004 * seed
    evals.append((rnd, acc, rnd * per_round_s,
                  (steps * 8 * up, steps * 8 * up, rnd * 2 * 400_000)))
  return evals


class FakeRunner:
  """Writes a workdir like main.py; crashes on the names in ``crash``."""

  def __init__(self, crash=(), interrupt=()):
    self.calls = []
    self.crash, self.interrupt = set(crash), set(interrupt)

  def __call__(self, spec):
    self.calls.append(spec.name)
    assert spec.command[2].startswith('--config=')
    assert f'--workdir={spec.workdir}' in spec.command
    if spec.name in self.crash:
      raise RuntimeError('boom')
    evals = fake_curve(spec.overrides)
    if spec.name in self.interrupt:  # Metrics so far, no summary.
      _write_run(spec.workdir, _config(**spec.overrides), evals[:3])
      return 1
    _write_run(spec.workdir, _config(**spec.overrides), evals, summary={})
    return 0


def test_run_names_are_deterministic():
  a = sweep.run_name({'seed': 0, 'sync.strategy': 'sync'})
  assert a == sweep.run_name({'sync.strategy': 'sync', 'seed': 0})
  assert a == 'seed=0__sync.strategy=sync'
  assert sweep.run_name({}) == 'base'
  odd = sweep.run_name({'sync.faults': '1:10-12'})
  assert '/' not in odd and ':' not in odd
  assert odd != sweep.run_name({'sync.faults': '1-10-12'})
  assert len(sweep.run_name({'x': 'y' * 500})) < 255
  r1 = sweep.make_runs('c.py', GRID, '/r')
  r2 = sweep.make_runs('c.py', GRID, '/r')
  assert [r.name for r in r1] == [r.name for r in r2] and len(r1) == 8
  assert len({r.name for r in r1}) == 8
  assert '--config.compression.uplink.name=topk' in r1[2].command


def test_expand_grid():
  assert sweep.expand_grid(None) == [{}]
  pts = sweep.expand_grid({'a': [1, 2], 'b': 'x', 'c': (1.0, 0.5)})
  assert pts == [{'a': 1, 'b': 'x', 'c': (1.0, 0.5)},
                 {'a': 2, 'b': 'x', 'c': (1.0, 0.5)}]
  pts = sweep.expand_grid([{'a': [1, 2]}, {'a': [2, 3]}])
  assert pts == [{'a': 1}, {'a': 2}, {'a': 3}]
  assert sweep.flag_value((1.0, 0.5)) == '(1.0, 0.5)'
  assert sweep.flag_value(True) == 'True'


def test_sweep_resumes_only_unfinished_runs(tmp_path):
  root = str(tmp_path / 'sweep')
  names = [r.name for r in sweep.make_runs('x', GRID, root)]
  crash, interrupt = names[1], names[5]
  runner = FakeRunner(crash=[crash], interrupt=[interrupt])
  res = sweep.run_sweep('configs/default.py', GRID, root, runner=runner,
                        out=lambda s: None)
  assert len(runner.calls) == 8
  assert sorted(res.failed) == sorted([crash, interrupt])
  assert len(res.ran) == 6 and res.skipped == []
  assert os.path.exists(os.path.join(root, 'report', 'results.md'))
  assert os.path.exists(os.path.join(root, 'sweep.json'))

  runner2 = FakeRunner()
  res2 = sweep.run_sweep('configs/default.py', GRID, root, runner=runner2,
                         out=lambda s: None)
  assert runner2.calls == [crash, interrupt]
  assert len(res2.skipped) == 6 and res2.failed == []
  with open(os.path.join(root, 'report', 'results.csv')) as f:
    recs = list(csv.DictReader(f))
  assert len(recs) == 4 and all(r['n_runs'] == '2' for r in recs)
  assert {r['label'] for r in recs} == {
      'sync, up=identity', 'sync, up=topk', 'periodic, up=identity',
      'periodic, up=topk'}

  runner3 = FakeRunner()
  res3 = sweep.run_sweep('configs/default.py', GRID, root, runner=runner3,
                         out=lambda s: None)
  assert runner3.calls == [] and len(res3.skipped) == 8

  # A finished run whose metrics log became unreadable: the report leaves it out, and
  # the sweep's summary line says the report is incomplete.
  with open(os.path.join(root, crash, 'metrics.jsonl'), 'wb') as f:
    f.write(b'\xff\xfe not json\n')
  lines = []
  res4 = sweep.run_sweep('configs/default.py', GRID, root, runner=FakeRunner(),
                         out=lines.append)
  assert [d for d, _ in res4.report.unreadable] == [os.path.join(root, crash)]
  assert lines[-1].endswith('(incomplete: 1 run(s) unreadable, named there)'), lines
  # A damaged summary.json is not a finished run: the sweep runs it again (main.py
  # then says how to repair it), instead of skipping it and exiting 0.
  with open(os.path.join(root, crash, 'summary.json'), 'w') as f:
    f.write('{"final_te')
  assert sweep.run_status(os.path.join(root, crash)) == 'partial'
  runner5 = FakeRunner()
  sweep.run_sweep('configs/default.py', GRID, root, runner=runner5, out=lambda s: None)
  assert runner5.calls == [crash]


def test_sweep_refuses_finished_runs_of_another_config_and_extends_longer_ones(tmp_path):
  """A finished run is skipped only if the sweep would give it the same config now:
  another base config is refused before anything runs (nothing rewritten), a
  longer train.num_steps re-runs every finished point (main.py extends them)."""
  root = str(tmp_path / 'sweep')
  sweep.run_sweep('configs/default.py', GRID, root, runner=FakeRunner(), report=False,
                  out=lambda s: None)
  manifest = open(os.path.join(root, 'sweep.json')).read()
  runner = FakeRunner()
  with pytest.raises(ValueError, match=r"run '.*' \(nothing was launched\).*different config "
                     r"\(.*model\.name: 'cnn' -> 'mlp'.*another --root"):
    sweep.run_sweep('configs/smoke.py', GRID, root, runner=runner, out=lambda s: None)
  assert runner.calls == [] and open(os.path.join(root, 'sweep.json')).read() == manifest
  longer = _default_config()
  longer.train.num_steps += 100
  runner = FakeRunner()
  res = sweep.run_sweep(longer, GRID, root, runner=runner, report=False, out=lambda s: None)
  assert len(runner.calls) == 8 and res.skipped == []
  res = sweep.run_sweep('configs/default.py', GRID, root, runner=FakeRunner(), report=False,
                        out=lambda s: None)
  assert len(res.skipped) == 8


def test_finished_runs_need_no_data_but_runs_to_launch_do(tmp_path):
  """The data path is checked for the runs a sweep launches, not for finished ones,
  which are only compared with their workdirs (a report rebuilt without the data)."""
  data, root = tmp_path / 'data', str(tmp_path / 'sweep')
  data.mkdir()
  grid = {'dataset.data_dir': str(data), 'seed': [0, 1]}
  sweep.run_sweep('configs/default.py', grid, root, runner=FakeRunner(), report=False,
                  out=lambda s: None)
  data.rmdir()
  res = sweep.run_sweep('configs/default.py', grid, root, runner=FakeRunner(), report=False,
                        out=lambda s: None)
  assert len(res.skipped) == 2 and res.ran == []
  runner = FakeRunner()
  with pytest.raises(ValueError) as e:
    sweep.run_sweep('configs/default.py', dict(grid, seed=[0, 1, 2]), root, runner=runner,
                    out=lambda s: None)
  new = sweep.run_name(dict(grid, seed=2))
  assert str(e.value).startswith(f"run {new!r} (nothing was launched): dataset.data_dir="
                                 f"'{data}' does not exist")
  assert runner.calls == []


def test_sweep_max_runs_and_parallel(tmp_path):
  root = str(tmp_path / 's')
  runner = FakeRunner()
  res = sweep.run_sweep('configs/default.py', GRID, root, runner=runner,
                        max_runs=3, report=False, out=lambda s: None)
  assert len(runner.calls) == 3 and len(res.not_run) == 5
  res = sweep.run_sweep('configs/default.py', GRID, root, runner=runner,
                        parallel=3, report=False, out=lambda s: None)
  assert len(runner.calls) == 8 and len(res.ran) == 5


def _tree(root) -> dict:
  """Every file under ``root``: relative path -> bytes."""
  out = {}
  for d, _, files in os.walk(root):
    for f in files:
      with open(os.path.join(d, f), 'rb') as fh:
        out[os.path.relpath(os.path.join(d, f), root)] = fh.read()
  return out


def test_a_sweep_root_refuses_another_grid_before_writing(tmp_path, capsys):
  """A second, different grid on a root used to overwrite its sweep.json and report
  unwarned; now refused (API, dry run, CLI) before anything is written or launched."""
  root = str(tmp_path / 's')
  sweep.run_sweep('configs/default.py', GRID, root, runner=FakeRunner(), max_runs=2,
                  out=lambda s: None)
  before = _tree(root)
  assert 'sweep.json' in before and any(p.startswith('report') for p in before)
  dropped = [r.name for r in sweep.make_runs('x', GRID, root) if r.overrides['seed'] == 1]
  runner = FakeRunner()
  for kw in ({}, {'dry_run': True}):
    with pytest.raises(ValueError) as e:
      sweep.run_sweep('configs/default.py', dict(GRID, seed=[0]), root, runner=runner,
                      out=lambda s: None, **kw)
    msg = str(e.value)
    assert msg.startswith(f'the sweep root {os.path.abspath(root)} holds another sweep: its '
                          'sweep.json lists 4 run(s) this grid does not have ('), msg
    assert all(n in msg for n in dropped) and 'nothing was written or launched' in msg
    assert 'give this one a new --root, or rerun the recorded grid' in msg
  assert runner.calls == [] and _tree(root) == before
  capsys.readouterr()
  assert sweep.main(['--config', 'configs/default.py', '--grid', 'sync.k=1,2',
                     '--root', root]) == 2
  err = capsys.readouterr().err
  assert err.startswith(f'error: the sweep root {os.path.abspath(root)} holds another sweep: '
                        'its sweep.json lists 8 run(s)') and err.count('\n') == 1, err
  assert ' and 3 more)' in err and _tree(root) == before


def test_a_sweep_root_resumes_and_grows_its_grid(tmp_path):
  """The same grid resumes (--max_runs at a time); a larger one (more seeds) adds runs
  and sweep.json then lists them all, so the first grid now lacks some: refused."""
  root = str(tmp_path / 's')
  runner = FakeRunner()
  sweep.run_sweep('configs/default.py', GRID, root, runner=runner, max_runs=3, report=False,
                  out=lambda s: None)
  res = sweep.run_sweep('configs/default.py', GRID, root, runner=runner, max_runs=2,
                        report=False, out=lambda s: None)
  assert len(runner.calls) == 5 and len(res.skipped) == 3 and len(res.not_run) == 3
  bigger = dict(GRID, seed=[0, 1, 2])
  res = sweep.run_sweep('configs/default.py', bigger, root, runner=runner, report=False,
                        out=lambda s: None)
  assert len(res.skipped) == 5 and len(res.ran) == 7 and res.failed == []
  with open(os.path.join(root, 'sweep.json')) as f:
    listed = [r['name'] for r in json.load(f)['runs']]
  assert listed == [r.name for r in sweep.make_runs('x', bigger, root)]
  assert set(listed) > {r.name for r in sweep.make_runs('x', GRID, root)}
  with pytest.raises(ValueError, match=r'holds another sweep: its sweep\.json lists 4 run'):
    sweep.run_sweep('configs/default.py', GRID, root, runner=runner, out=lambda s: None)


def test_a_sweep_root_with_an_unreadable_manifest_is_refused(tmp_path):
  root = tmp_path / 's'
  root.mkdir()
  (root / 'sweep.json').write_text('{"runs": [')
  runner = FakeRunner()
  with pytest.raises(ValueError, match=rf'^{re.escape(str(root))}/sweep\.json is not a readable '
                     r'sweep manifest \(JSONDecodeError: .*\).*new --root'):
    sweep.run_sweep('configs/default.py', GRID, str(root), runner=runner, out=lambda s: None)
  assert runner.calls == [] and os.listdir(root) == ['sweep.json']


def test_a_root_that_is_a_workdir_or_holds_runs_of_no_sweep_is_refused(tmp_path, capsys):
  """A --root that is itself a training workdir, or holds workdirs no sweep.json lists
  (e.g. earlier single runs), used to be accepted: the report of the root mixed them with
  the sweep's runs. Now refused, one line, before anything is written or launched; an
  empty root, a new one, a resume (its sweep.json lists the runs) and records of the
  grid's points copied there (docs/results/runs, no sweep.json) still work."""
  evals = fake_curve({})[:2]
  runner = FakeRunner()
  for entry in ('summary.json', 'config.json', 'checkpoints'):  # ROOT is a workdir
    root = tmp_path / f'w_{entry}'
    _write_run(root, _config(), evals, summary={}, config_json=True)
    for other in {'summary.json', 'config.json'} - {entry}:
      (root / other).unlink()
    (root / 'metrics.jsonl').unlink()
    if entry == 'checkpoints':
      (root / 'checkpoints' / '12').mkdir(parents=True)
    before = _tree(root)
    for kw in ({}, {'dry_run': True}):
      with pytest.raises(ValueError, match=rf'^--root={re.escape(str(root))} is a training '
                         rf"run's workdir \(it holds {entry}\), not a sweep root; nothing was "
                         'written or launched. Give the sweep an empty or new --root'):
        sweep.run_sweep('configs/default.py', GRID, str(root), runner=runner,
                        out=lambda s: None, **kw)
    assert _tree(root) == before
  capsys.readouterr()
  assert sweep.main(['--config', 'configs/default.py', '--grid', 'seed=0,1',
                     '--root', str(tmp_path / 'w_summary.json')]) == 2
  err = capsys.readouterr().err
  assert err.startswith(f"error: --root={tmp_path / 'w_summary.json'} is a training run's "
                        'workdir') and err.count('\n') == 1, err
  # A root inside another sweep's root or inside a workdir (its tb/, checkpoints/).
  for outer, holds in ((tmp_path / 'w_summary.json', None), (tmp_path / 'outer', 'sweep.json')):
    if holds:
      outer.mkdir()
      (outer / holds).write_text('{"runs": []}')
    else:
      (outer / 'metrics.jsonl').write_text('')
      holds = 'metrics.jsonl'
    inner = outer / 'sub' / 'sweep'
    with pytest.raises(ValueError, match=rf'^--root={re.escape(str(inner))} is inside '
                       rf'{re.escape(str(outer))}, which holds {holds} \(a '):
      sweep.run_sweep('configs/default.py', GRID, str(inner), runner=runner,
                      out=lambda s: None)
    assert not os.path.exists(outer / 'sub')
  # Workdirs below the root that no sweep.json lists, at any depth (the report finds them).
  root = tmp_path / 'mixed'
  strays = ['a/deep/run', 'old1', 'old2', 'old3', 'old4', 'seed=9', 'z']
  for name in strays:
    _write_run(root / name, _config(), evals)
  (root / 'notes').mkdir()
  (root / 'notes' / 'todo.txt').write_text('not a run')
  before = _tree(root)
  with pytest.raises(ValueError) as e:
    sweep.run_sweep('configs/default.py', {'seed': [0, 1]}, str(root), runner=runner,
                    out=lambda s: None)
  assert str(e.value) == (
      f'the sweep root {root} holds 7 training workdir(s) (a/deep/run, old1, old2, old3, old4 and '
      "2 more) that are no point of this grid: runs not launched by a sweep on this root, which "
      "a report of it would mix with this sweep's; nothing was written or launched. Give the "
      'sweep an empty or new --root.')
  assert runner.calls == [] and _tree(root) == before
  assert sweep.main(['--config', 'configs/default.py', '--grid', 'seed=0,1',
                     '--root', str(root)]) == 2
  err = capsys.readouterr().err
  assert err.startswith(f'error: the sweep root {root} holds 7 training') and err.count('\n') == 1
  # Records of the grid's points copied to a root without sweep.json: skipped, not refused.
  root = tmp_path / 'copied'
  _write_run(root / 'seed=0', _config(seed=0), evals, summary={}, config_json=True)
  res = sweep.run_sweep('configs/default.py', {'seed': [0, 1]}, str(root), runner=runner,
                        out=lambda s: None)
  assert res.skipped == ['seed=0'] and res.ran == ['seed=1']
  # An empty root, a resume of its sweep, and that sweep's root with a stray run added.
  root = tmp_path / 'empty'
  root.mkdir()
  (root / 'notes').mkdir()
  assert len(sweep.run_sweep('configs/default.py', {'seed': [0, 1]}, str(root), max_runs=1,
                             runner=runner, report=False, out=lambda s: None).ran) == 1
  res = sweep.run_sweep('configs/default.py', {'seed': [0, 1]}, str(root), runner=runner,
                        out=lambda s: None)
  assert res.skipped == ['seed=0'] and res.ran == ['seed=1']
  _write_run(root / 'mine', _config(), evals, summary={})
  with pytest.raises(ValueError, match=r'holds 1 training workdir\(s\) \(mine\) that are no '
                     r'point of this grid nor listed in its sweep\.json: '):
    sweep.run_sweep('configs/default.py', {'seed': [0, 1]}, str(root), runner=runner,
                    out=lambda s: None)


def test_a_full_disk_writing_the_manifest_or_the_report_is_one_line(tmp_path, capsys,
                                                                   monkeypatch):
  """No space left writing sweep.json, or the report after the runs, used to end the sweep
  in a traceback; now one line naming the file, what is intact and what to do, exit 2."""
  real_replace, full = os.replace, set()
  def replace(src, dst, *args, **kwargs):
    if os.path.basename(dst) in full:
      raise OSError(errno.ENOSPC, 'No space left on device')
    return real_replace(src, dst, *args, **kwargs)
  monkeypatch.setattr(os, 'replace', replace)
  runner = FakeRunner()
  monkeypatch.setattr(sweep, 'subprocess_runner', runner)
  root = tmp_path / 's'
  argv = ['--config', 'configs/default.py', '--grid', 'seed=0,1', '--root', str(root)]
  full.add('sweep.json')
  capsys.readouterr()
  assert sweep.main(argv) == 2
  assert capsys.readouterr().err == (
      f'error: no space left on device (ENOSPC) while writing {root}/sweep.json; no sweep.json '
      'was written; nothing was launched; free space there, then rerun the same command\n')
  assert runner.calls == [] and not (root / 'sweep.json').exists()
  full.clear()
  full.add('results.md')
  assert sweep.main(argv) == 2
  assert capsys.readouterr().err == (
      f'error: no space left on device (ENOSPC) while writing {root}/report/results.md; no '
      f'results.md was written; the runs are intact (2 of 2 finished); {root}/report may be '
      'partly written; free space there, then rerun the same command\n')
  assert runner.calls == ['seed=0', 'seed=1'] and not list(root.glob('**/*.tmp'))
  full.clear()
  assert sweep.main(argv) == 0 and (root / 'report' / 'results.md').exists()
  assert runner.calls == ['seed=0', 'seed=1']


def test_a_summary_without_a_finished_runs_numbers_is_run_again(tmp_path, caplog):
  """A summary.json of {} (or lacking the headline number) counted as done for the sweep,
  which skipped it, while the report left it out: now run_status checks it as the report
  does, so the sweep runs it again; if the run leaves it so (main.py reports the finished
  run it holds), the failure names the file, what is wrong and the fix."""
  root = tmp_path / 's'
  grid = {'seed': [0, 1]}
  sweep.run_sweep('configs/default.py', grid, str(root), runner=FakeRunner(), report=False,
                  out=lambda s: None)
  path = root / 'seed=0' / 'summary.json'
  good = json.loads(path.read_text())
  for bad in ({}, {k: v for k, v in good.items() if k != 'final_test_accuracy'},
              dict(good, final_test_accuracy=91.0)):
    path.write_text(json.dumps(bad))
    assert sweep.run_status(str(root / 'seed=0')) == 'partial'
    assert sweep.run_status(str(root / 'seed=1')) == 'done'
  path.write_text('{}')
  runner = FakeRunner()
  res = sweep.run_sweep('configs/default.py', grid, str(root), runner=runner, report=False,
                        out=lambda s: None)
  assert runner.calls == ['seed=0'] and res.ran == ['seed=0'] and res.skipped == ['seed=1']
  assert sweep.run_status(str(root / 'seed=0')) == 'done'
  path.write_text('{}')
  caplog.set_level('ERROR')
  res = sweep.run_sweep('configs/default.py', grid, str(root), runner=lambda spec: 1,
                        report=False, out=lambda s: None)
  assert res.failed == ['seed=0']
  assert [r.getMessage() for r in caplog.records] == [
      f'run seed=0 did not finish (exit status 1, {path}: lacks final_test_accuracy (a number '
      'every finished run writes); delete that summary.json and rerun main.py on the workdir '
      'to rebuild it from metrics.jsonl and the last checkpoint, or remove that run)']


def test_the_summary_line_and_report_name_failed_and_not_started_runs(tmp_path):
  """The sweep's last line gave counts alone and the report left out the failed and not
  started runs silently; now both name them (a few, and how many more)."""
  root = str(tmp_path / 's')
  names = [r.name for r in sweep.make_runs('x', GRID, root)]
  lines = []
  res = sweep.run_sweep('configs/default.py', GRID, root, runner=FakeRunner(crash=[names[1]]),
                        max_runs=2, out=lines.append)
  assert res.failed == [names[1]] and res.not_run == names[2:]
  assert lines == [
      f'sweep {root}: 8 runs, 0 skipped (done), 1 finished now, 1 failed ({names[1]}), 6 left '
      f'by --max_runs ({", ".join(names[2:7])} and 1 more); report in {root}/report '
      '(incomplete: 7 run(s) failed or not started, named there)']
  md = open(os.path.join(root, 'report', 'results.md')).read()
  assert ('**Incomplete report:** 7 expected run(s) missing, not finished (failed or not '
          'started): ' + ', '.join(f'`{root}/{n}`' for n in names[1:])) in md
  lines.clear()
  sweep.run_sweep('configs/default.py', GRID, root, runner=FakeRunner(), out=lines.append)
  assert lines == [f'sweep {root}: 8 runs, 1 skipped (done), 7 finished now, 0 failed, 0 left '
                   f'by --max_runs; report in {root}/report']
  assert 'Incomplete' not in open(os.path.join(root, 'report', 'results.md')).read()


def test_a_value_given_twice_in_a_grid_is_refused(tmp_path, capsys):
  """seed=1,1,2 used to run 2 points silently; now an error naming key and value."""
  with pytest.raises(ValueError, match=r"^--grid 'seed=1,1,2': key 'seed' lists the value 1 twice"):
    sweep.parse_grid(['seed=1,1,2'])
  with pytest.raises(ValueError, match=r"'network\.dc_speed' lists the value \(1\.0, 2\.0\) twice"):
    sweep.parse_grid(['network.dc_speed=(1.0,2.0),(1.0, 2.0)'])
  assert sweep.parse_grid(['seed=1,1.0']) == {'seed': [1, 1.0]}  # two runs: seed=1, seed=1.0
  with pytest.raises(ValueError, match=r"^grid key 'seed' lists the value 1 twice"):
    sweep.expand_grid({'sync.k': [1, 2], 'seed': [1, 2, 1]})
  with pytest.raises(ValueError, match=r"^grid key 'sync\.strategy' lists the value 'sync'"):
    sweep.expand_grid([{'seed': 0}, {'sync.strategy': ['sync', 'sync']}])
  root = tmp_path / 'r'
  capsys.readouterr()
  assert sweep.main(['--config', 'configs/default.py', '--grid', 'seed=1,1,2',
                     '--root', str(root)]) == 2
  assert capsys.readouterr().err == ("error: --grid 'seed=1,1,2': key 'seed' lists the value 1 "
                                     'twice (each point runs once); list each value once\n')
  sweep_file = tmp_path / 'dup_sweep.py'
  sweep_file.write_text('def get_sweep():\n  return "configs/default.py", {"seed": [0, 0]}\n')
  assert sweep.main(['--sweep', str(sweep_file), '--root', str(root)]) == 2
  assert "error: grid key 'seed' lists the value 0 twice" in capsys.readouterr().err
  assert not root.exists()



def test_a_damaged_config_json_under_a_sweep_root_reads_as_sentences(tmp_path):
  """The refusal of a finished run with a damaged config.json ran two sentences together
  ('... use a new --workdir A sweep root ...'); one that already ends in '.' gets no second."""
  root = str(tmp_path / 's')
  sweep.run_sweep('configs/default.py', {'seed': [0]}, root, runner=FakeRunner(), report=False,
                  out=lambda s: None)
  (tmp_path / 's' / 'seed=0' / 'config.json').write_text('{"se')
  for base, ends in (('configs/default.py', 'restore it, or use a new --workdir'),
                     ('configs/smoke.py', 'or the same config to resume')):
    with pytest.raises(ValueError) as e:
      sweep.run_sweep(base, {'seed': [0]}, root, runner=FakeRunner(), out=lambda s: None)
    msg = str(e.value)
    assert msg.startswith("run 'seed=0' (nothing was launched): ") and '..' not in msg, msg
    assert f'{ends}. A sweep root holds one sweep: give this one another --root.' in msg, msg
    (tmp_path / 's' / 'seed=0' / 'config.json').unlink(missing_ok=True)  # then: summary's


def test_a_grid_axis_without_values_is_refused(tmp_path, capsys):
  """'seed': [] in a sweep file used to give 0 runs and exit 0."""
  for grid in ({'sync.k': [1, 2], 'seed': []}, [{'seed': 0}, {'seed': []}]):
    with pytest.raises(ValueError, match=r"^grid key 'seed' has no values \(\[\]\): a grid "
                       'axis needs at least one value'):
      sweep.expand_grid(grid)
  sweep_file = tmp_path / 'empty_axis.py'
  sweep_file.write_text('def get_sweep():\n  return "configs/default.py", {"seed": []}\n')
  root = tmp_path / 'r'
  assert sweep.main(['--sweep', str(sweep_file), '--root', str(root), '--dry_run']) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: grid key 'seed' has no values") and err.count('\n') == 1, err
  assert not root.exists()


@pytest.mark.parametrize('body, needles', [
    ('def get_sweep():\n  raise KeyError("no such sweep")\n',
     ['get_sweep() raised KeyError: ', 'no such sweep']),
    ('def get_sweep(:\n  pass\n', ['importing it raised SyntaxError: ', 'line 1']),
    ('import no_such_module_hfl\n', ['importing it raised ModuleNotFoundError: ',
                                     "No module named 'no_such_module_hfl'"])])
def test_a_sweep_file_that_fails_is_one_error_line(tmp_path, capsys, body, needles):
  """A sweep file whose import or get_sweep() raised used to end in a traceback (exit 1)."""
  sweep_file = tmp_path / 'bad_sweep.py'
  sweep_file.write_text(body)
  root = tmp_path / 'r'
  assert sweep.main(['--sweep', str(sweep_file), '--root', str(root), '--dry_run']) == 2
  err = capsys.readouterr().err
  assert err.startswith(f'error: sweep file {sweep_file}: ') and err.count('\n') <= 2, err
  for n in needles:
    assert n in err, (n, err)
  assert 'Traceback' not in err and not root.exists()


@pytest.mark.parametrize('body, needles', [
    ('import sys\ndef get_sweep():\n  sys.exit(0)\n', ['get_sweep() called sys.exit(0)']),
    ('import sys\nsys.exit(0)\n', ['importing it called sys.exit(0)']),
    ('def get_sweep():\n  return "ab"\n', ["get_sweep() returned str 'ab'; expected"]),
    ('def get_sweep():\n  return {"seed": [0, 1]}\n', ["returned dict {'seed': [0, 1]}; "]),
    ('def get_sweep():\n  return "configs/default.py", {}, None\n', ['returned tuple (']),
    ('def get_sweep():\n  return 42, {"seed": [0]}\n', ["returned tuple (42, {'seed': [0]})"]),
    ('def get_sweep():\n  return "configs/default.py", {1: [0, 1]}\n',
     ["{1: [0, 1]}) (grid key 1 is not a string)"]),
    ('def get_sweep():\n  return "configs/default.py", [{"seed": [0]}, 5]\n', ['got int)']),
    ('def get_sweep():\n  return "configs/default.py", 0\n', ["('configs/default.py', 0) ("])])
def test_a_sweep_file_that_exits_or_returns_no_base_and_grid_is_one_error_line(
    tmp_path, capsys, body, needles):
  """sys.exit(0) in a sweep file used to end the sweep silently (exit status 0); a value of
  get_sweep() that is no (base, grid) pair was blamed on get_sweep() raising, or failed
  later without naming the file ('ab': base config not found: .../a)."""
  sweep_file = tmp_path / 'bad_sweep.py'
  sweep_file.write_text(body)
  root = tmp_path / 'r'
  assert sweep.main(['--sweep', str(sweep_file), '--root', str(root), '--dry_run']) == 2
  err = capsys.readouterr().err
  assert err.startswith(f'error: sweep file {sweep_file}: ') and err.count('\n') == 1, err
  allowed = ("; expected (base, grid): base a config path ('configs/x.py' or 'path:arg') or "
             'an ml_collections.ConfigDict, grid {dotted.key: [options...]}, a list of such '
             'dicts, or None\n')
  for n in needles + ([] if 'sys.exit' in body else [allowed]):
    assert n in err, (n, err)
  assert 'raised' not in err.partition(str(sweep_file))[2] and not root.exists()


def test_every_shipped_sweep_file_and_each_base_and_grid_shape_loads(tmp_path):
  """The check of get_sweep()'s value refuses none of configs/sweeps/ nor of :data:`FORMAT`."""
  paths = [p for p in glob.glob(os.path.join(REPO, 'configs', 'sweeps', '*.py'))
           if 'def get_sweep' in open(p, encoding='utf-8').read()]
  assert len(paths) >= 20
  for path in paths:
    base, grid = sweep.load_sweep(path)
    assert os.path.isfile(base.partition(':')[0]) and sweep.expand_grid(grid), path
  sweep_file = tmp_path / 'ok_sweep.py'
  for value, n in (('"configs/default.py", None', 1), ('["configs/default.py", []]', 1),
                   ('"configs/default.py", {}', 1), ('ml_collections.ConfigDict(), {"seed": 1}', 1),
                   ('{"seed": 0}, [{"seed": [0, 1]}, {"sync.k": 2, "seed": (1, 2)}]', 3)):
    sweep_file.write_text(f'import ml_collections\ndef get_sweep():\n  return {value}\n')
    assert len(sweep.expand_grid(sweep.load_sweep(str(sweep_file))[1])) == n, value


def test_ctrl_c_while_loading_a_sweep_file_says_nothing_was_launched(tmp_path, capsys):
  """It used to say 'the running training jobs were stopped'."""
  sweep_file = tmp_path / 'slow_sweep.py'
  sweep_file.write_text('def get_sweep():\n  raise KeyboardInterrupt\n')
  try:
    assert sweep.main(['--sweep', str(sweep_file), '--root', str(tmp_path / 'r')]) == 130
  finally:
    sweep._STOPPING.clear()  # pylint: disable=protected-access
  assert capsys.readouterr().err == 'interrupted: nothing was launched.\n'
  assert not (tmp_path / 'r').exists()


def test_a_grid_flag_replaces_the_sweep_files_axis_visibly(tmp_path, capsys):
  """--sweep FILE --grid seed=1 reruns one seed of the file's sweep: the --grid axis replaces
  the file's (one line says so), and on the sweep's recorded root the narrowed grid is
  still refused before anything is written."""
  sweep_file = tmp_path / 'seeds.py'
  sweep_file.write_text('def get_sweep():\n  return "configs/default.py", '
                        '{"sync.k": [2, 4], "seed": [0, 1, 2]}\n')
  root = str(tmp_path / 'r')
  capsys.readouterr()
  assert sweep.main(['--sweep', str(sweep_file), '--grid', 'seed=1', '--root', root,
                     '--dry_run']) == 0
  out = capsys.readouterr().out.splitlines()
  assert out[0] == "--grid seed replaces the sweep file's values: [0, 1, 2] -> [1]", out
  assert out[1].startswith('2 runs (0 done, 2 to run)')
  assert sweep.main(['--sweep', str(sweep_file), '--grid', 'sync.k=8', '--grid', 'train.num_'
                     'steps=100', '--root', root, '--dry_run']) == 0
  out = capsys.readouterr().out.splitlines()  # a new key adds an axis: no replacement line
  assert out[0] == "--grid sync.k replaces the sweep file's values: [2, 4] -> [8]", out
  assert out[1].startswith('3 runs (')
  base, grid = sweep.load_sweep(str(sweep_file))
  sweep.run_sweep(base, grid, root, runner=FakeRunner(), report=False, out=lambda s: None)
  before = _tree(root)
  assert sweep.main(['--sweep', str(sweep_file), '--grid', 'seed=1', '--root', root]) == 2
  err = capsys.readouterr().err
  assert 'holds another sweep: its sweep.json lists 4 run(s) this grid does not have' in err
  assert _tree(root) == before
  with pytest.raises(SystemExit) as e:
    sweep.parse_args(['--help'])
  assert e.value.code == 0 and 'replacing the values of a KEY the file has' in capsys.readouterr().out

@pytest.mark.parametrize('argv, message', [
    (['--parallel', '0'], '--parallel=0 must be >= 1'),
    (['--max_runs', '0'], '--max_runs=0 must be >= 1'),
    (['--root_is_file'], 'exists and is not a directory'),
    (['--dry_run', '--root='], "--root='' is empty"),  # used to sweep into the caller's dir
    # Checked before any run starts (each would fail to start its interpreter).
    (['--python', '/nonexistent/python'], "--python='/nonexistent/python' is not an "
     'executable file (nor a command on PATH)')])
def test_sweep_cli_refuses_bad_counts_and_a_file_root(tmp_path, capsys, argv, message):
  f = tmp_path / 'f'
  f.write_text('x')
  root = str(f) if argv == ['--root_is_file'] else str(tmp_path / 'r')
  argv = [] if argv == ['--root_is_file'] else argv
  with pytest.raises(SystemExit) as e:
    sweep.main(['--config', 'configs/smoke.py', '--root', root] + argv)
  assert e.value.code == 2 and message in capsys.readouterr().err
  assert f.read_text() == 'x' and not (tmp_path / 'r').exists()


def test_report_cli_refuses_an_out_that_is_a_file(tmp_path, capsys):
  from hfl.report import __main__ as report_cli
  f = tmp_path / 'f'
  f.write_text('x')
  assert report_cli.main([str(tmp_path), '--out', str(f)]) == 2
  assert 'exists and is not a directory' in capsys.readouterr().err and f.read_text() == 'x'
  # Below a file: used to load every run, then end in a NotADirectoryError traceback.
  assert report_cli.main([str(tmp_path), '--out', str(f / 'sub')]) == 2
  assert f'cannot be created: {f} is a file' in capsys.readouterr().err


def test_a_metrics_step_not_a_number_leaves_the_run_out_named(runs, tmp_path):
  """A record with step "4" used to end the report in a TypeError traceback."""
  with open(tmp_path / 'a1' / 'metrics.jsonl', 'a', encoding='utf-8') as f:
    f.write('{"step": "4", "test_accuracy": 0.5}\n')
  frame = report.load([str(tmp_path)])
  assert 'a1' not in list(frame['name'])
  assert dict(frame.attrs['unreadable'])[runs[1]] == (
      f'{runs[1]}/metrics.jsonl: a record has step "4", not a number; fix or remove that run')


def test_report_cli_an_out_file_that_cannot_be_written_is_one_line(runs, tmp_path, capsys):
  """A directory where results.csv belongs (or a full disk) used to end in a traceback."""
  out = tmp_path / 'out'
  (out / 'results.csv').mkdir(parents=True)
  assert report_cli.main([str(runs[0]), '--out', str(out), '--no-plots']) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1].startswith('error: ') and 'results.csv' in err[-1], err
  assert err[-1].endswith('; the report in --out may be partly written'), err


def test_report_cli_refuses_an_out_that_holds_runs(runs, tmp_path, capsys):
  """--out DIR used to say DIR holds no workdir (the report skips its output directory);
  --out DIR/a0 left a0 out unsaid."""
  for out, hidden in ((tmp_path, runs[:3]), (runs[1], runs[1:2])):
    assert report_cli.main([str(tmp_path), '--out', str(out), '--no-plots']) == 2
    assert capsys.readouterr().err == (
        f'error: --out={out} must not hold the runs reported (the report does not search its '
        f'output directory; here {", ".join(hidden)}); give another --out, e.g. '
        f'{tmp_path / "report"} (the default)\n')
  assert not list(tmp_path.glob('**/results.*')) and not (tmp_path / 'report').exists()
  assert report_cli.main([runs[0], str(tmp_path), '--out', runs[1]]) == 2
  assert capsys.readouterr().err.endswith(f'e.g. {runs[0]}/report\n')
  assert report_cli.main([runs[0], '--out', str(tmp_path), '--no-plots']) == 0  # not searched
  assert (tmp_path / 'results.md').is_file()
  assert report_cli.main([str(tmp_path), '--no-plots']) == 0  # the default: DIR/report
  assert report_cli.main([str(tmp_path), '--no-plots']) == 0  # ... again, beside its report
  assert (tmp_path / 'report' / 'results.md').is_file()


def test_dry_run_lists_grid_and_runs_nothing(tmp_path):
  root = tmp_path / 'dry'
  lines = []
  runner = FakeRunner()
  res = sweep.run_sweep('configs/default.py', GRID, str(root), runner=runner,
                        dry_run=True, out=lines.append)
  assert runner.calls == [] and not root.exists()
  text = '\n'.join(lines)
  assert text.startswith('8 runs')
  assert text.splitlines()[1].startswith('varying: compression.uplink.name, seed, sync.strategy (')
  for r in res.runs:
    assert r.name in text
  assert len(res.not_run) == 8
  # Every listed command pastes into a shell as the run's own argv, a tuple value included.
  tuple_grid = {'network.dc_speed': [(3.0, 1.0), (2.0, 1.0)]}
  lines = []
  res = sweep.run_sweep('configs/default.py', tuple_grid, str(root), runner=runner,
                        dry_run=True, out=lines.append)
  commands = [shlex.split(l) for l in '\n'.join(lines).splitlines() if l.startswith('    ')]
  assert commands == [r.command for r in res.runs]
  assert '(3.0, 1.0)' in ' '.join(commands[0]) and runner.calls == []


def test_sweep_cli_dry_run_with_example(tmp_path, capsys):
  rc = sweep.main(['--sweep', os.path.join(REPO, 'configs/sweeps/example.py'),
                   '--root', str(tmp_path / 'ex'), '--dry_run'])
  assert rc == 0
  out = capsys.readouterr().out
  assert out.startswith('12 runs') and out.count('[pending]') == 12
  assert sweep.main(['--sweep', str(tmp_path / 'nope.py'),
                     '--root', str(tmp_path)]) == 2


def test_configdict_base_is_written_and_loads(tmp_path):
  cfg = _default_config()
  root = tmp_path / 'cd'
  arg = sweep.resolve_base(cfg, str(root))
  spec = importlib.util.spec_from_file_location('_written', arg)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  back = module.get_config()
  assert back.network.dc_speed == (1.0, 1.0)
  assert back.to_dict() == cfg.to_dict()


def test_subprocess_runner_logs_and_returns_status(tmp_path):
  spec = sweep.RunSpec('r', str(tmp_path / 'r'), {},
                       [sys.executable, '-c', 'print("hello")'])
  assert sweep.subprocess_runner(spec) == 0
  assert 'hello' in (tmp_path / 'r' / 'train.log').read_text()


@pytest.mark.parametrize('grid,problem', [
    ({'seed': [0, 1], 'optimizer.learnin_rate': [0.1]},
     "run 'optimizer.learnin_rate=0.1__seed=0' (nothing was launched): unknown config field "
     "'optimizer.learnin_rate'; did you mean 'optimizer.learning_rate'?"),
    ({'seed': [0, 1], 'optimizer.learning_rate': [0.1, -0.1]},
     "run 'optimizer.learning_rate=-0.1__seed=0' (nothing was launched): "
     'optimizer.learning_rate=-0.1 must be > 0'),
    ({'sync.k': ['4']}, "run 'sync.k=4' (nothing was launched): sync.k='4' has type str; "
     'the field takes int'),
    ({'optimizer.learning_rate': [float('inf')]}, "run 'optimizer.learning_rate=inf' (nothing "
     'was launched): optimizer.learning_rate=inf must be a finite number (inf and nan are '
     'never allowed in a config)'),
    ({'compression.uplink.name': ['topk'], 'compression.uplink.density': [2.0]},
     "run 'compression.uplink.density=2.0__compression.uplink.name=topk' (nothing was "
     "launched): compression.uplink.density=2.0: density must be a number in (0, 1] "
     '(fraction of entries kept)'),
    # What only hfl.setup.setup used to check (built objects, the data path).
    ({'network.wan_bandwidth_mbps': [100.0, -5.0]}, "run 'network.wan_bandwidth_mbps=-5.0' "
     '(nothing was launched): network.wan_bandwidth_mbps=-5.0 must be finite and > 0.'),
    ({'sync.outer.name': ['bogus']}, "run 'sync.outer.name=bogus' (nothing was launched): "
     "sync.outer.name must be one of ('avg', 'sgd', 'nesterov'), got 'bogus'."),
    ({'dataset.data_dir': ['/nonexistent']},
     f"run {sweep.run_name({'dataset.data_dir': '/nonexistent'})!r} (nothing was launched): "
     "dataset.data_dir='/nonexistent' does not exist; pass the path of the files of "
     "dataset.name='fashion_mnist' (the README's dataset.data_dir row says what it holds)"),
])
def test_sweep_checks_every_config_before_launching(tmp_path, capsys, grid, problem):
  root = tmp_path / 'bad'
  runner = FakeRunner()
  with pytest.raises(ValueError) as e:
    sweep.run_sweep('configs/default.py', grid, str(root), runner=runner, out=lambda s: None)
  assert str(e.value) == problem
  assert runner.calls == [] and not root.exists()
  with pytest.raises(ValueError):  # a dry run checks too
    sweep.run_sweep('configs/default.py', grid, str(root), dry_run=True, out=lambda s: None)
  cfg = _default_config()  # a ConfigDict base: nothing written either (no base_config.py)
  with pytest.raises(ValueError):
    sweep.run_sweep(cfg, grid, str(root), runner=runner, out=lambda s: None)
  assert runner.calls == [] and not root.exists()
  # The CLI: one line, exit status 2.
  sweep_file = tmp_path / 'bad_sweep.py'
  sweep_file.write_text('inf = float("inf")\n'  # repr(inf) is 'inf'
                        f'def get_sweep():\n  return "configs/default.py", {grid!r}\n')
  capsys.readouterr()
  assert sweep.main(['--sweep', str(sweep_file), '--root', str(root)]) == 2
  assert capsys.readouterr().err == f'error: {problem}\n'
  assert not root.exists()


def test_sweep_warns_about_points_that_train_the_same_experiment(tmp_path, caplog):
  """sync.k under 'sync', a density of identity: ignored, so those points duplicate."""
  caplog.set_level('WARNING')
  grid = [{'sync.strategy': 'sync', 'sync.k': [1, 8]},
          {'compression.uplink.density': [0.01, 0.1]}, {'sync.k': [2, 3]}]
  sweep.run_sweep('configs/default.py', grid, str(tmp_path / 's'), dry_run=True,
                  out=lambda s: None)
  warnings = [r.getMessage() for r in caplog.records if r.levelname == 'WARNING']
  assert len(warnings) == 2, warnings
  assert "'sync.k=1__sync.strategy=sync' and 'sync.k=8__sync.strategy=sync'" in warnings[0]
  assert "sync.strategy='sync' runs K = 1" in warnings[0]
  assert 'compression.uplink.density' in warnings[1] and 'identity' in warnings[1]


def test_a_sweep_of_uncompressed_runs_compares_with_the_one_sending_most_bytes(tmp_path):
  """With no compressed row (a K sweep) the baseline is the most-communicating row."""
  for k, inter in ((4, 5), (1, 20), (2, 10)):
    for seed in (0, 1):
      cfg = _config(**{'seed': seed, 'sync.k': k})
      acc = 0.9 - 0.01 * k + 0.01 * seed
      _write_run(tmp_path / f'k{k}s{seed}', cfg, [(1, 0.5, 1.0, _bytes(1, 10, 10, inter)),
                                                   (2, acc, 2.0, _bytes(2, 10, 10, inter))],
                 summary={}, config_json=True)
  t = tables.build_table(report.load([str(tmp_path)]))
  rows = {r['label']: r for _, r in t.iterrows()}
  assert {r['baseline'] for r in rows.values()} == {'k=1'}
  # Bytes per run: (10 + 10 + inter) MB x 2 rounds; K=4 against K=1: 1 - 50 / 80.
  assert rows['k=4']['compression_ratio'] == pytest.approx(1 - 50 / 80)
  assert rows['k=4']['paired_delta'] == pytest.approx(-3.0)  # (0.86 - 0.89) x 100, both seeds
  assert rows['k=4']['paired_n'] == 2


def test_failed_run_reports_its_log_and_last_error(tmp_path, caplog):
  def runner(spec):
    os.makedirs(spec.workdir)
    with open(os.path.join(spec.workdir, 'train.log'), 'w') as f:
      f.write('$ python main.py (an earlier attempt)\nerror: an old problem\n'
              '$ python main.py ...\nI0101 some progress\n'
              'error: dataset.data_dir=\'/x\': directory does not exist\nW0101 a warning\n')
    return 2
  caplog.set_level('INFO')
  res = sweep.run_sweep('configs/default.py', {'seed': 0}, str(tmp_path / 's'),
                        runner=runner, report=False, out=lambda s: None)
  assert res.failed == ['seed=0']
  log = os.path.join(str(tmp_path / 's'), 'seed=0', 'train.log')
  errors = [r.getMessage() for r in caplog.records if r.levelname == 'ERROR']
  assert errors == [f'run seed=0 did not finish (exit status 2, no summary.json; log: {log}): '
                    "error: dataset.data_dir='/x': directory does not exist"]
  # A traceback's last line; a log without an error line; no log.
  path = tmp_path / 'train.log'
  path.write_text('$ cmd\nTraceback (most recent call last):\n  File "x.py"\n'
                  'jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: out of memory\n'
                  '  some trailing note\n')
  assert sweep.last_error_line(str(path)) == (
      'jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: out of memory')
  path.write_text('$ cmd\nKilled\n\n')
  assert sweep.last_error_line(str(path)) == 'Killed'
  assert sweep.last_error_line(str(tmp_path / 'none.log')) is None


def test_ctrl_c_stops_the_sweep_and_its_jobs(tmp_path, capsys, monkeypatch):
  # Parallel: Ctrl-C (here raised by the first job) cancels the runs not started yet;
  # the others wait until the sweep stops its jobs.
  started = []

  def runner(spec):
    started.append(spec.name)
    if spec.name == 'seed=0':
      raise KeyboardInterrupt
    assert sweep._STOPPING.wait(60)  # pylint: disable=protected-access
    return 130
  try:
    with pytest.raises(KeyboardInterrupt):
      sweep.run_sweep('configs/default.py', {'seed': list(range(8))}, str(tmp_path / 'p'),
                      runner=runner, parallel=2, report=False, out=lambda s: None)
  finally:
    sweep._STOPPING.clear()  # pylint: disable=protected-access
  assert 'seed=0' in started and set(started) <= {'seed=0', 'seed=1', 'seed=2'}
  # A running job is stopped (SIGINT, then kill), and no new one starts.
  import threading  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top
  sleeper = [sys.executable, '-c', 'import time; print("up", flush=True); time.sleep(120)']
  spec = sweep.RunSpec('r', str(tmp_path / 'r'), {}, sleeper)
  rc = []
  thread = threading.Thread(target=lambda: rc.append(sweep.subprocess_runner(spec)))
  thread.start()
  try:
    deadline = time.monotonic() + 60
    while 'up' not in ((tmp_path / 'r' / 'train.log').read_text()
                       if (tmp_path / 'r' / 'train.log').exists() else ''):
      assert time.monotonic() < deadline
      time.sleep(0.05)
    sweep.stop_children(grace_s=0.1, timeout_s=10)
    thread.join(30)
    assert not thread.is_alive() and rc and rc[0] != 0
    assert sweep.subprocess_runner(spec._replace(workdir=str(tmp_path / 'r2'))) == 130
  finally:
    sweep._STOPPING.clear()  # pylint: disable=protected-access
  # The CLI: one line, exit status 130.
  def interrupted_sweep(*args, **kwargs):
    raise KeyboardInterrupt
  monkeypatch.setattr(sweep, 'run_sweep', interrupted_sweep)
  (tmp_path / 'ex' / 'report').mkdir(parents=True)  # an earlier report; the manifest's runs
  (tmp_path / 'ex' / sweep.MANIFEST).write_text('{"runs": [{"name": "a"}, {"name": "b"}]}')
  capsys.readouterr()
  try:
    assert sweep.main(['--sweep', os.path.join(REPO, 'configs/sweeps/example.py'),
                       '--root', str(tmp_path / 'ex')]) == 130
  finally:
    sweep._STOPPING.clear()  # pylint: disable=protected-access
  err = capsys.readouterr().err
  assert err == (f"interrupted: the running training jobs were stopped; 2 run(s) not finished "
                 f"(a, b); {tmp_path / 'ex' / 'report'} is from before. Rerun the same command "
                 'to continue (finished runs are skipped, the others resume from their '
                 'checkpoints).\n')


def test_sigterm_stops_the_sweep_and_its_jobs(tmp_path):
  """SIGTERM to the sweep alone (a scheduler's ``kill``) used to end it silently with
  its jobs still training; now it stops them like Ctrl-C: one line, exit status 143.
  The jobs get SIGTERM, which main.py handles like Ctrl-C: a sweep started with ``&``
  from a script passes "ignore SIGINT" on to them, so SIGINT left them to be killed."""
  import signal  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top
  job = tmp_path / 'fake_python'  # stands in for the interpreter of the training jobs
  job.write_text('#!/bin/sh\nd="$(dirname "$0")"\ntrap "" INT\n'
                 'trap \'echo TERM > "$d/job.signal"; kill $!; exit 143\' TERM\n'
                 'sleep 120 &\necho $$ > "$d/job.pid"\nwait\n')
  job.chmod(0o755)
  proc = subprocess.Popen(
      [sys.executable, '-m', 'hfl.sweep', '--config', os.path.join(REPO, 'configs/smoke.py'),
       '--grid', 'seed=0,1', '--root', str(tmp_path / 'root'), f'--python={job}'],
      cwd=REPO, stderr=subprocess.PIPE, text=True)
  pid_file, deadline = tmp_path / 'job.pid', time.monotonic() + 120
  while not (pid_file.exists() and pid_file.read_text().strip()):
    assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
    time.sleep(0.1)
  job_pid = int(pid_file.read_text())
  proc.send_signal(signal.SIGTERM)
  assert proc.wait(60) == 143
  err = [l for l in proc.stderr.read().splitlines() if l.startswith('interrupted')]
  assert err and err[0].startswith('interrupted by SIGTERM: the running training jobs were '
                                   'stopped'), err
  with pytest.raises(ProcessLookupError):
    os.kill(job_pid, 0)  # the job is gone (stopped and reaped by the sweep)
  assert (tmp_path / 'job.signal').read_text().strip() == 'TERM'  # a clean stop, not SIGKILL


def test_sweep_help_gives_the_format_and_an_example(capsys):
  """Issue 18 (5): --help says what a sweep file holds, with an example, and --grid."""
  with pytest.raises(SystemExit) as e:
    sweep.parse_args(['--help'])
  assert e.value.code == 0
  out = capsys.readouterr().out
  for needle in ('get_sweep() -> (base, grid)', "'sync.strategy': ['sync', 'periodic']",
                 '--grid sync.k=1,2,4 --grid seed=0,1', 'cartesian product', 'caller'):
    assert needle in out


def test_grid_on_the_command_line():
  """Issue 18 (5): --grid KEY=V1,V2 (Python literals), several flags = cartesian product."""
  g = sweep.parse_grid(['sync.k=1,2,4', "seed=0,1", 'compression.uplink.name=topk,identity',
                        'network.dc_speed=(1.0,2.0),(1.0, 1.0)'])
  assert g == {'sync.k': [1, 2, 4], 'seed': [0, 1], 'compression.uplink.name': ['topk', 'identity'],
               'network.dc_speed': [(1.0, 2.0), (1.0, 1.0)]}
  pts = sweep.expand_grid(sweep.parse_grid(['sync.k=1,2,4', 'seed=0,1']))
  assert len(pts) == 6 and pts[:2] == [{'sync.k': 1, 'seed': 0}, {'sync.k': 1, 'seed': 1}]
  # With a sweep file's grid: each file point times each --grid point.
  both = sweep.combine_grids([{'sync.strategy': 'sync'}, {'sync.strategy': 'periodic'}],
                             {'seed': [0, 1]})
  assert sweep.expand_grid(both) == [
      {'sync.strategy': 'sync', 'seed': 0}, {'sync.strategy': 'sync', 'seed': 1},
      {'sync.strategy': 'periodic', 'seed': 0}, {'sync.strategy': 'periodic', 'seed': 1}]
  # inf/nan read as floats, as --config.KEY=inf does, so validation names the field.
  inf = sweep.parse_grid(['optimizer.learning_rate=inf,nan,-inf'])['optimizer.learning_rate']
  assert inf[0] == float('inf') and inf[1] != inf[1] and inf[2] == -float('inf')
  for bad in (['sync.k'], ['sync.k='], ['=1,2'], ['seed=0', 'seed=1']):
    with pytest.raises(ValueError, match='--grid'):
      sweep.parse_grid(bad)
  with pytest.raises(ValueError, match='--sweep=FILE, or --config=FILE'):
    sweep.sweep_from_args(sweep.parse_args(['--root', 'x', '--grid', 'seed=0,1']))


_FAKE_PYTHON = '''#!{python}
"""Stands in for `python main.py ...`: writes a finished workdir and where it ran."""
import json, os, sys
args = dict(a[2:].split('=', 1) for a in sys.argv[2:])
w = args['workdir']
os.makedirs(w, exist_ok=True)
cfg = {{'seed': int(args.get('config.seed', 0)), 'sync': {{'k': int(args.get('config.sync.k', 4))}},
        'config_file': args['config']}}
acc = 0.8 + 0.01 * cfg['sync']['k'] + 0.001 * cfg['seed']
rec = {{'step': 4, 'round': 1, 'test_accuracy': acc, 'sim_time_s': 1.0,
        'bytes': {{'intra_up': 1, 'intra_down': 1, 'inter_dc': 1}}}}
open(os.path.join(w, 'metrics.jsonl'), 'w').write(json.dumps(rec) + '\\n')
json.dump(dict(final_test_accuracy=acc, config=cfg), open(os.path.join(w, 'summary.json'), 'w'))
open(os.path.join(w, 'cwd.txt'), 'w').write(os.getcwd())
'''


def _git_status():
  return subprocess.run(['git', 'status', '--porcelain', '--untracked-files=all'], cwd=REPO,
                        capture_output=True, text=True, check=True).stdout


def test_sweep_from_another_directory_uses_the_callers_paths(tmp_path):
  """Issue 18 (5): relative --config, --sweep and --root are the caller's; jobs run in the
  caller's directory; nothing is written into the checkout."""
  fake = tmp_path / 'fake_python'
  fake.write_text(_FAKE_PYTHON.format(python=sys.executable))
  fake.chmod(0o755)
  (tmp_path / 'cfgs').mkdir()
  (tmp_path / 'cfgs' / 'mine.py').write_text(  # the caller's own config file
      'from configs import smoke\n\ndef get_config(arg=None):\n  return smoke.get_config()\n')
  before = _git_status()
  p = subprocess.run([sys.executable, '-m', 'hfl.sweep', '--config=cfgs/mine.py',
                      '--grid', 'sync.k=1,2', '--grid', 'seed=1', '--root=out',
                      f'--python={fake}'], cwd=tmp_path, env=_env(), capture_output=True,
                     text=True, timeout=300, check=False)
  assert p.returncode == 0, p.stderr
  names = sorted(d for d in os.listdir(tmp_path / 'out') if '=' in d)
  assert names == ['seed=1__sync.k=1', 'seed=1__sync.k=2']
  for n in names:
    assert (tmp_path / 'out' / n / 'cwd.txt').read_text() == str(tmp_path)
    assert json.loads((tmp_path / 'out' / n / 'summary.json').read_text())['config'][
        'config_file'] == str(tmp_path / 'cfgs' / 'mine.py')
  with open(tmp_path / 'out' / 'report' / 'results.csv') as f:  # sync.k labels the rows
    assert sorted(r['label'] for r in csv.DictReader(f)) == ['k=1', 'k=2']
  # A sweep file next to its own base config, and one naming hfl's configs/.
  (tmp_path / 'cfgs' / 'sw.py').write_text(
      'def get_sweep():\n  return "mine.py", {"sync.k": [8]}\n')
  (tmp_path / 'cfgs' / 'sw2.py').write_text(
      'from configs.sweeps.compression import FIXED\n\n'
      'def get_sweep():\n  return "configs/default.py", dict(FIXED, seed=[0, 1])\n')
  assert sweep.load_sweep(str(tmp_path / 'cfgs' / 'sw.py'))[0] == str(tmp_path / 'cfgs' / 'mine.py')
  p = subprocess.run([sys.executable, '-m', 'hfl.sweep', '--sweep=cfgs/sw2.py', '--root=o2',
                      '--dry_run'], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                     timeout=300, check=False)
  assert p.returncode == 0, p.stderr
  assert p.stdout.startswith(f'2 runs (0 done, 2 to run) under {tmp_path / "o2"}')
  assert f'--config={REPO}/configs/default.py' in p.stdout
  assert not (tmp_path / 'o2').exists() and _git_status() == before


# ---------------------------------------------------------------------------
# Language-model runs: loss metrics, lower-is-better target, WAN exposure fields


def _lm_config(**overrides):
  return _config(**{'dataset.name': 'tiny_shakespeare', 'train.target_loss': 0.3, **overrides})


WAN = dict(exposed_wan_s=3.5, compute_s=25.0, compute_utilisation=0.8,
           peak_wan_bytes_per_sync=2.5e5, wan_mbps_for_95pct_utilisation=None,
           wan_mbps_for_95pct_without_latency=12.5)


def _lm_runs(tmp_path):
  """K=4 seeds 0 (finished) and 1 (unfinished), K=16 seeds 0, 1; loss = 1 − acc."""
  lm = lambda k, seed, accs, summary: _write_run(
      tmp_path / f'k{k}_s{seed}', _lm_config(**{'sync.k': k, 'seed': seed}),
      [(i + 1, a, 10.0 * (i + 1), _bytes(i + 1, 1, 1, 5)) for i, a in enumerate(accs)], summary,
      config_json=summary is None)
  final = lambda loss, best: dict(WAN, final_test_loss=loss, best_test_loss=best,
                                  final_test_bits_per_char=loss / math.log(2))
  return [lm(4, 0, (0.5, 0.6, 0.8), final(0.2, 0.2)),
          lm(4, 1, (0.5, 0.75, 0.65), None),  # losses 0.5, 0.25, 0.35; no summary
          lm(16, 0, (0.5, 0.6, 0.7), final(0.3, 0.3)),
          lm(16, 1, (0.5, 0.6, 0.7), final(0.3, 0.3))]


def test_time_to_target_of_a_loss_is_reached_from_above():
  """Loss 0.5, 0.4, 0.2 at t = 10, 20, 30: 0.3 is crossed halfway between 20 and 30."""
  records = [{'test_loss': l, 'sim_time_s': t, 'round': t / 10} for l, t in
             ((0.5, 10.0), (0.4, 20.0), (0.2, 30.0))]
  get = lambda target, key='sim_time_s': metrics.time_to_target(
      records, target, key, metric='test_loss', higher_is_better=False)
  assert get(0.3) == pytest.approx(25.0) and get(0.3, 'round') == pytest.approx(2.5)
  assert get(0.6) == 10.0 and get(0.1) is None


def test_lm_run_metrics(tmp_path):
  paths = _lm_runs(tmp_path)
  done, partial = runs_lib.load_run(paths[0]), runs_lib.load_run(paths[1])
  assert runs_lib.target_of(runs_lib.flatten(done.config)) == runs_lib.Target(
      'test_loss', False, 0.3)
  m = runs_lib.run_metrics(done)
  assert m['final_loss'] == pytest.approx(0.2) and m['best_loss'] == pytest.approx(0.2)
  assert m['final_bpc'] == pytest.approx(0.2 / math.log(2))
  # The validation loss (0.5, 0.4, 0.2) reaches its target 0.3 at t = 25 s, round 2.5,
  # where the old accuracy rule took the first evaluation (accuracy 0.5 ≥ 0.3: 10 s).
  assert m['time_to_target_s'] == pytest.approx(25.0)
  assert m['rounds_to_target'] == pytest.approx(2.5)
  for k, v in WAN.items():
    assert m[k] == v, k
  # Unfinished: its last evaluation's loss, the smallest loss seen, no WAN fields.
  p = runs_lib.run_metrics(partial)
  assert p['final_loss'] == pytest.approx(0.35) and p['best_loss'] == pytest.approx(0.25)
  assert p['time_to_target_s'] == pytest.approx(18.0) and p['peak_wan_bytes_per_sync'] is None
  assert runs_lib.higher_is_better('final_acc') and runs_lib.higher_is_better(
      'compute_utilisation')
  assert not any(runs_lib.higher_is_better(k) for k in (
      'final_loss', 'best_loss', 'final_bpc', 'time_to_target_s', 'bytes.inter_dc',
      'wan_mbps_for_95pct_utilisation'))


def test_lm_report_pairs_the_loss_and_labels_the_target(tmp_path):
  paths = _lm_runs(tmp_path)
  frame = report.load(paths)
  assert frame.attrs['target'] == runs_lib.Target('test_loss', False, 0.3)
  table = tables.build_table(frame, baseline='k=4', metric='final_loss')
  row = table[table['label'] == 'k=16'].iloc[0]
  # K=16 − K=4 per seed: 0.3 − 0.2 and 0.3 − 0.35 (seed 1 unfinished still has a loss).
  assert row['paired_delta'] == pytest.approx((0.1 - 0.05) / 2)
  assert row['paired_n'] == 2
  out = tmp_path / 'out'
  written = report.write_report(paths, str(out), baseline='k=4')
  md = (out / 'results.md').read_text()
  assert 'Target: validation loss ≤ 0.300 nats/char.' in md
  assert 'paired Δ final loss (vs baseline)' in md
  assert '+0.025 ± 0.106 nats (n=2)' in md
  assert sorted(n for n in written if n.endswith('.png')) == [
      'loss_vs_bytes.png', 'loss_vs_inter_dc_rounds.png', 'loss_vs_sim_time.png']
  with open(out / 'results.csv') as f:
    rows = list(csv.DictReader(f))
  assert {r['target_metric'] for r in rows} == {'test_loss'}
  assert float(rows[0]['final_test_loss_mean']) == pytest.approx(0.275)


# ------------------------------------------------------------------------------
# Re-costing a run's clock for another LAN (hfl.report.runs.lan_recost).
# ------------------------------------------------------------------------------

U = 2.0**-52  # float64's unit roundoff
ARCHIVE = os.path.join(REPO, 'docs', 'results', 'runs', 'compression')


def _archived_lan_pairs():
  """Archived Fashion-MNIST compression runs trained at 1 Gbit/s and again at 100 Mbit/s
  with the same overrides otherwise (configs/sweeps/compression.py), whose evaluations
  agree exactly: the same training, two clocks."""
  if not os.path.isdir(ARCHIVE):
    return []
  runs = [runs_lib.load_run(d) for d in sorted(glob.glob(os.path.join(ARCHIVE, '*')))]
  def key(r):
    flat = runs_lib.flatten(r.config)
    return tuple(sorted((k, repr(v)) for k, v in flat.items()
                        if k.startswith(('compression.', 'seed', 'train.num_steps'))))
  by = {}
  for r in runs:
    by.setdefault(key(r), {})[runs_lib.flatten(r.config)['network.lan_bandwidth_gbps']] = r
  same = lambda a, b: ([m.get('test_accuracy') for m in a.metrics]
                       == [m.get('test_accuracy') for m in b.metrics])
  return [(v[1.0], v[0.1]) for v in by.values() if {1.0, 0.1} <= set(v) and same(v[1.0], v[0.1])]


PAIRS = _archived_lan_pairs()


def test_archive_holds_lan_pairs_to_check():
  """The check below runs on real pairs (the 9 compressed-broadcast runs at least)."""
  if not os.path.isdir(ARCHIVE):
    pytest.skip(f'{ARCHIVE} is not here')
  assert len(PAIRS) >= 9


@pytest.mark.parametrize('pair', PAIRS, ids=lambda p: p[0].name[-40:])
def test_lan_recost_reproduces_the_run_trained_on_the_other_lan(pair):
  """A 1 Gbit/s run re-costed to 100 Mbit/s equals the run trained at 100 Mbit/s: every
  evaluation's sim_time_s, the total, and the time to target. Tolerance: each clock is a
  float64 sum of about n + r positive terms (n iterations, r rounds), error <= (n + r) u
  times its value, for both runs, plus a few roundings of the re-costing itself."""
  fast, slow = pair
  got = runs_lib.lan_recost(fast, 0.1)
  n, r = slow.summary['intra_dc_iterations'], slow.summary['inter_dc_rounds']
  tol = lambda x: (2 * (n + r) + 8) * U * abs(x)
  assert len(got.metrics) == len(slow.metrics)
  for a, b in zip(got.metrics, slow.metrics):
    assert a['step'] == b['step'] and abs(a['sim_time_s'] - b['sim_time_s']) <= tol(b['sim_time_s'])
  assert abs(got.summary['sim_time_s'] - slow.summary['sim_time_s']) <= tol(slow.summary['sim_time_s'])
  want = metrics.time_to_target(slow.metrics, slow.summary['target'], 'sim_time_s')
  if want is None:
    assert got.summary['time_to_target_s'] is None
  else:
    # Linear interpolation between two evaluations: at most the two endpoints' errors
    # (each <= tol of the total, the largest clock value) and a few roundings more.
    assert abs(got.summary['time_to_target_s'] - want) <= 3 * tol(slow.summary['sim_time_s'])
  assert runs_lib.flatten(got.config)['network.lan_bandwidth_gbps'] == 0.1
  assert got.summary['lan_recost_from_gbps'] == 1.0
  assert fast.summary['sim_time_s'] != got.summary['sim_time_s']  # the input is unchanged


@pytest.mark.parametrize('change, needle', [
    ({'network': {'dc_speed': [3.0, 1.0]}}, 'different speeds'),
    ({'sync': {'strategy': 'semi_sync'}}, "sync.strategy='semi_sync'"),
    ({'sync': {'fragments': 4}}, 'overlap compute'),
    ({'train': {'sim_time_budget_s': 60.0}}, 'simulated-time budget'),
    ({'compression': {'uplink': {'name': 'co3'}}}, 'variable-length code'),
])
def test_lan_recost_refuses_runs_whose_training_depends_on_the_lan(change, needle):
  if not PAIRS:
    pytest.skip(f'no archived pairs under {ARCHIVE}')
  run = PAIRS[0][0]
  config = json.loads(json.dumps(run.config))
  for section, values in change.items():
    for k, v in values.items():
      if isinstance(v, dict):
        config[section][k].update(v)
      else:
        config[section][k] = v
  with pytest.raises(ValueError, match=re.escape(needle)):
    runs_lib.lan_recost(run._replace(config=config), 0.1)
  with pytest.raises(ValueError, match='must be > 0'):
    runs_lib.lan_recost(run, 0.0)
