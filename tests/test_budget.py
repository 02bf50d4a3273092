"""The budgets (hfl.budget): the simulated-time budget (validation, the stopping rule
on hand-computed clocks: heterogeneous DCs, semi-sync with idle time; exact resume)
and the sample budget, equal work (validation, the stopping rule on hand-computed
sample counts: heterogeneous K_d, an absent DC; exact resume, extension, older
checkpoints and configs)."""

import importlib.util
import json
import logging
import os
import shutil
import time
import types

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hfl import budget, models, network, sweep, tasks, train
from hfl import setup as setup_lib
from hfl import cost
from hfl import data as data_lib
from hfl import config as config_lib
from hfl.sync import schedule as schedule_lib
from hfl import diagnostics
from hfl import workdir as workdir_lib
from tests.helpers import crash_then_resume, final_state, smoke_config

# A network whose LAN and WAN transfers are negligible (1e18 bit/s: the smoke MLP's
# payloads cost < 1e-11 s) and whose only latency is the WAN's: every clock below
# is hand-computed from t_d = compute_time_s / speed_d and C = H * wan_latency_s.
NET = {'network.lan_bandwidth_gbps': 1e9, 'network.lan_latency_s': 0.0,
       'network.wan_bandwidth_mbps': 1e12, 'network.wan_latency_s': 0.02,
       'network.wan_latencies_per_round': 2.0, 'network.compute_time_s': 0.05,
       'network.dc_speed': (2.2, 1.0)}
TOL = 1e-9  # seconds: what the negligible transfers add over a few rounds


def budget_config(data_dir, budget_s, **more):
  cfg = dict(NET, **{'train.num_steps': 0, 'train.sim_time_budget_s': budget_s,
                     'sync.strategy': 'semi_sync'})
  cfg.update(more)
  return smoke_config(data_dir, **cfg)


def hand_clock(k_base=2):
  """(round length, fastest-DC iterations per round, idle of DC 0 per round) of
  semi-sync with K_base on NET, by hand: t = (0.05/2.2, 0.05), C = 0.04 s.
  T* = K_base * 0.05 + 0.04; DC 0 runs floor((T* - 0.04) / t_0) iterations."""
  t0, t1, c = 0.05 / 2.2, 0.05, 0.04
  t_star = k_base * t1 + c
  k0 = int(np.floor((t_star - c) / t0))
  return t_star, k0, t_star - (k0 * t0 + c)


# ------------------------------------------------------------------------------
# Validation (no compilation).
# ------------------------------------------------------------------------------

@pytest.mark.parametrize('overrides,match', [
    ({'train.sim_time_budget_s': 10.0}, 'exactly one'),                     # both set
    ({'train.num_steps': 0}, 'exactly one'),                                # neither
    ({'train.num_steps': 0, 'train.sim_time_budget_s': -1.0}, 'train.sim_time_budget_s'),
    ({'train.num_steps': 0, 'train.sim_time_budget_s': float('inf')}, 'train.sim_time_budget_s'),
    ({'train.num_steps': -3}, 'train.num_steps'),
    ({'train.num_steps': 0, 'train.sim_time_budget_s': 5.0, 'optimizer.schedule': 'cosine'},
     'optimizer.decay_steps'),
    # The sample budget: beside either other rule, negative, a decaying schedule
    # without decay_steps, Streaming DiLoCo (which stops at train.num_steps).
    ({'train.sample_budget': 600}, 'exactly one'),
    ({'train.num_steps': 0, 'train.sim_time_budget_s': 5.0, 'train.sample_budget': 600},
     'exactly one'),
    ({'train.num_steps': 0, 'train.sample_budget': -1}, 'train.sample_budget=-1 must be an '
     'integer number of training samples >= 0'),
    ({'train.num_steps': 0, 'train.sample_budget': 600, 'optimizer.schedule': 'linear'},
     r'optimizer.decay_steps.*train.sample_budget=600 governs'),
    ({'train.num_steps': 0, 'train.sample_budget': 600, 'sync.fragments': 2},
     "train.sample_budget=600: Streaming DiLoCo .* needs train.sample_budget=0"),
])
def test_bad_stopping_fields_fail_before_compilation_naming_the_field(
    fake_data, tmp_path, overrides, match, monkeypatch):
  import jax  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(jax, 'jit', lambda *a, **k: (_ for _ in ()).throw(
      AssertionError('compiled before validating the config')))
  with pytest.raises(ValueError, match=match):
    train.train_and_evaluate(smoke_config(fake_data, **overrides), str(tmp_path / 'w'))
  assert not os.path.exists(tmp_path / 'w')


def test_max_iterations_bounds_the_hand_computed_runs():
  # semi-sync on NET under 0.5 s: t = 0.05/2.2 (DC 0), C = 0.04, K_0 = 4 a round;
  # the run below makes 16 iterations; sync (K = 1) makes 6.
  assert budget.max_iterations(0.5, 0.05 / 2.2, 0.04, 4) == 19   # floor(15.3) + 4
  assert budget.max_iterations(0.5, 0.05 / 2.2, 0.04, 1) == 8    # floor(7.97) + 1
  assert budget.max_iterations(0.3, 0.1, 0.0, 1) == 4            # 3 whole, then 1
  assert budget.max_iterations(1.0, 0.0, 0.0, 4) is None         # free iterations: no bound


@pytest.mark.parametrize('faults,bound', [('', 6), ('1:1-1', 7)])
def test_a_warmup_the_budget_cannot_finish_is_refused_by_validate(tmp_path, faults, bound):
  """configs/smoke.py (t = 0.05 + 2e-4 s, C >= 2 x 0.02 s, K = 2) under 0.3 s, payloads
  not counted: at most floor(0.3 / (t + C / 2)) + 2 = 6 iterations; 7 with faults
  (a round with one DC present exchanges nothing: C >= 0)."""
  cfg = lambda warm: smoke_config(str(tmp_path), **{
      'train.num_steps': 0, 'train.sim_time_budget_s': 0.3, 'sync.faults': faults,
      'optimizer.warmup_steps': warm})
  for warm in (bound, 10**6):
    with pytest.raises(ValueError) as e:
      config_lib.validate(cfg(warm))
    msg = str(e.value)
    assert msg.startswith(f'optimizer.warmup_steps={warm} must be < {bound}, the most '
                          'iterations a DC can run within train.sim_time_budget_s=0.3: ')
    assert 'Estimated from the network model without the payloads' in msg
    assert 'K = 2 the most iterations of a round' in msg
  config_lib.validate(cfg(bound - 1))


def test_setup_refuses_the_warmup_with_the_planned_times(fake_data, monkeypatch):
  """semi-sync on NET under 0.5 s (16 iterations, hand_clock): validate bounds K by
  sync.k_max = 64 (85 iterations); setup, with the schedule's K_0 = 4 and the planned
  times, by 19. Nothing is compiled either way."""
  monkeypatch.setattr(jax, 'jit', lambda *a, **k: (_ for _ in ()).throw(
      AssertionError('compiled before validating the config')))
  with pytest.raises(ValueError, match='optimizer.warmup_steps=85 must be < 85'):
    config_lib.validate(budget_config(fake_data, 0.5, **{'optimizer.warmup_steps': 85}))
  config_lib.validate(budget_config(fake_data, 0.5, **{'optimizer.warmup_steps': 19}))
  with pytest.raises(ValueError) as e:
    setup_lib.setup(budget_config(fake_data, 0.5, **{'optimizer.warmup_steps': 19}))
  assert str(e.value).startswith('optimizer.warmup_steps=19 must be < 19')
  assert 'Estimated from hfl.setup.planned_times' in str(e.value)
  assert 'K = 4 the most iterations of a round' in str(e.value)
  s = setup_lib.setup(budget_config(fake_data, 0.5, **{'optimizer.warmup_steps': 18}))
  assert s.loop.stop.governed_by == 'sim_time_budget_s'


def test_stop_rule_and_unset_defaults():
  steps = budget.Stop(12, 0.0)
  assert steps.governed_by == 'num_steps' and steps.step_cap() == 12
  assert not steps.finished(11, 1e9) and steps.finished(12, 0.0)
  timed = budget.Stop(0, 2.5)
  assert timed.governed_by == 'sim_time_budget_s' and timed.step_cap() is None
  assert not timed.finished(10 ** 6, 2.4999) and timed.finished(0, 2.5)
  # A config written before the field existed: num_steps governs.
  old = config_lib.load_file('configs/smoke.py')
  del old.train['sim_time_budget_s']
  assert budget.from_config(old.train) == budget.Stop(12, 0.0)
  assert workdir_lib.upgrade_config({'train': {'num_steps': 5}})['train']['sim_time_budget_s'] == 0.0


# ------------------------------------------------------------------------------
# The rule on hand-computed clocks.
# ------------------------------------------------------------------------------

@pytest.fixture(scope='module')
def budget_run(fake_data, tmp_path_factory):
  """(workdir, summary) of semi-sync on 2 DCs 2.2x apart under a 0.5 s budget."""
  workdir = str(tmp_path_factory.mktemp('budget') / 'run')
  return workdir, train.train_and_evaluate(budget_config(fake_data, 0.5), workdir)


@pytest.mark.slow
def test_semi_sync_budget_stops_after_the_round_that_crosses_it(budget_run):
  workdir, summary = budget_run
  t_round, k0, idle0 = hand_clock()
  assert (t_round, k0) == (pytest.approx(0.14), 4) and idle0 == pytest.approx(0.1 / 11)
  # Rounds end at 0.14, 0.28, 0.42, 0.56 s: the 4th starts at 0.42 < 0.5 and is run
  # whole, the clock then reads 0.56 >= 0.5 and the run stops.
  assert summary['inter_dc_rounds'] == 4 and summary['intra_dc_iterations'] == 4 * k0
  assert summary['sim_time_s'] == pytest.approx(4 * t_round, abs=TOL)
  assert summary['idle_s'] == pytest.approx([4 * idle0, 0.0], abs=TOL)
  assert summary['stop'] == {'governed_by': 'sim_time_budget_s', 'num_steps': 0,
                             'sim_time_budget_s': 0.5, 'sample_budget': 0}
  hist = summary['eval_history']
  assert [h['round'] for h in hist] == [1, 2, 3, 4]  # eval_every 1, and at the stop
  assert [h['step'] for h in hist] == [4, 8, 12, 16]
  assert [h['sim_time_s'] for h in hist] == pytest.approx([0.14, 0.28, 0.42, 0.56], abs=TOL)
  records = [json.loads(l) for l in open(os.path.join(workdir, 'metrics.jsonl'))]
  assert hist[-1]['test_accuracy'] == records[-1]['test_accuracy'] == summary[
      'final_test_accuracy']
  # Per-round diagnostics (strict JSON): W x B = 32 samples per iteration; DC 0 runs
  # 4 iterations a round, DC 1 2; FedAvg weights n_d / n; norms of float32 sums.
  diags = [r for rec in records for r in rec['dc_rounds']]
  assert [r['round'] for r in diags] == [1, 2, 3, 4]
  assert all(r['samples'] == [4 * 32, 2 * 32] for r in diags)
  assert all(abs(sum(r['weight']) - 1) < 1e-6 and abs(sum(r['contribution']) - 1) < 1e-6
             for r in diags)
  assert all(r['update_l2'][0] > 0 and r['drift_l2'][1] > 0 and r['train_loss'] > 0
             for r in diags)


@pytest.mark.slow
@pytest.mark.parametrize('strategy,budget_s,rounds,steps', [
    # semi-sync: a budget just below the end of round 3 (0.42 s) stops there ...
    ('semi_sync', 0.42 - 1e-6, 3, 12),
    # ... sync (K = 1): rounds of t_slow + C = 0.09 s; DC 0 idles 0.05 - 0.05/2.2 per
    # round; ends 0.45 < 0.5 <= 0.54: 6 rounds.
    ('sync', 0.5, 6, 6),
])
def test_budget_on_hand_computed_clocks(fake_data, tmp_path, strategy, budget_s, rounds, steps):
  summary = train.train_and_evaluate(
      budget_config(fake_data, budget_s, **{'sync.strategy': strategy,
                                            'train.checkpoint_every': 0}), str(tmp_path / 'r'))
  t_round = 0.14 if strategy == 'semi_sync' else 0.09
  idle0 = hand_clock()[2] if strategy == 'semi_sync' else 0.05 - 0.05 / 2.2
  assert (summary['inter_dc_rounds'], summary['intra_dc_iterations']) == (rounds, steps)
  assert summary['sim_time_s'] == pytest.approx(rounds * t_round, abs=TOL)
  assert summary['idle_s'][0] == pytest.approx(rounds * idle0, abs=TOL)
  assert summary['eval_history'][-1]['round'] == rounds


@pytest.mark.slow
def test_interrupted_budget_run_resumes_bitwise(fake_data, budget_run, tmp_path, monkeypatch):
  ref_dir, ref = budget_run
  cut_dir = str(tmp_path / 'cut')
  # step 10 is inside round 3
  summary = crash_then_resume(lambda: budget_config(fake_data, 0.5), cut_dir, monkeypatch, 10)
  step_a, a = final_state(ref_dir)
  step_b, b = final_state(cut_dir)
  assert step_a == step_b == 16
  chex.assert_trees_all_equal(a, b)
  for key in ('final_test_accuracy', 'bytes', 'sim_time_s', 'idle_s', 'inter_dc_rounds',
              'eval_history', 'stop'):
    assert summary[key] == ref[key], key
  # Rerun once finished: nothing to do, the same summary.
  again = train.train_and_evaluate(budget_config(fake_data, 0.5), cut_dir)
  assert again['eval_history'] == ref['eval_history']


# ------------------------------------------------------------------------------
# The equal-time sweeps' budgets (configs/sweeps/*semisync_budget.py).
# ------------------------------------------------------------------------------

@pytest.mark.parametrize('sweep_file,input_shape,sync_rounds', [
    ('semisync_budget.py', (28, 28, 1), 600),        # configs/semisync.py's 600 iterations
    ('cifar10_semisync_budget.py', (32, 32, 3), 4800),  # configs/cifar10.py's 4,800
])
def test_budget_sweeps_give_sync_its_configured_iterations(sweep_file, input_shape,
                                                           sync_rounds):
  """Each budget sweep's SYNC_ROUND_S is max_d(t_d + C_d) of its sync runs
  (hfl.setup.planned_times from the model's payload shapes, at both speed levels),
  and its budget stops sync after exactly ``sync_rounds`` rounds: the round that
  reaches the budget is run, so rounds = floor(budget / round) + 1."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  base, grid = sweep.load_sweep(os.path.join(root, 'configs', 'sweeps', sweep_file))
  spec = importlib.util.spec_from_file_location('_budget_sweep', os.path.join(
      root, 'configs', 'sweeps', sweep_file))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  points = [p for p in sweep.expand_grid(grid) if p['sync.strategy'] == 'sync']
  assert len(points) == 2 * 3  # two speed levels x three seeds
  for point in points:
    cfg = config_lib.load_file(base)
    cfg.update_from_flattened_dict(point)
    model = models.from_config(cfg.model, 10)
    shapes = jax.eval_shape(lambda: model.init(  # noqa: B023
        jax.random.PRNGKey(0), jnp.zeros((1,) + input_shape))['params'])
    net = network.from_config(cfg.network, cfg.mesh.num_dcs)
    t, c = setup_lib.planned_times(cfg, net, setup_lib.build_compressors(cfg, shapes), shapes)
    assert mod.SYNC_ROUND_S == pytest.approx(float(np.max(t + c)), rel=1e-9)
    assert point['train.sim_time_budget_s'] == mod.SIM_BUDGET_S
  assert int(np.floor(mod.SIM_BUDGET_S / mod.SYNC_ROUND_S)) + 1 == sync_rounds


def test_printed_results_say_a_budget_stopped_the_run(capsys):
  summary = dict(final_test_accuracy=0.9, best_test_accuracy=0.91, target_accuracy=0.85,
                 bytes=dict(intra_up=1, intra_down=2, inter_dc=3), inter_dc_rounds=4,
                 intra_dc_iterations=8, sim_time_s=10.5, wall_time_s=3.0, time_to_target_s=None,
                 rounds_to_target=None,
                 stop=dict(governed_by='sim_time_budget_s', num_steps=0, sim_time_budget_s=10.0))
  cost.print_results(summary)
  assert 'stopped at           simulated-time budget 10 s (train.sim_time_budget_s)\n' in (
      capsys.readouterr().out)
  cost.print_results(dict(summary, stop=dict(governed_by='num_steps', num_steps=8)))
  assert 'stopped at' not in capsys.readouterr().out


# ------------------------------------------------------------------------------
# The sample budget (equal work): validation (no compilation).
# ------------------------------------------------------------------------------

# configs/smoke.py: 2 DCs x W = 4 workers x B = 8: one DC's iteration is 32 samples.
# Semi-sync on NET plans K_d = (4, 2) (hand_clock): a round is 6 x 32 = 192 samples.
WB = 32
ROUND_SAMPLES = (4 * WB, 2 * WB)


def sample_config(data_dir, sample_budget, **more):
  cfg = dict(NET, **{'train.num_steps': 0, 'train.sample_budget': sample_budget,
                     'sync.strategy': 'semi_sync'})
  cfg.update(more)
  return smoke_config(data_dir, **cfg)


@pytest.mark.parametrize('value', [1.5, 6e5, True, '600', None, -3])
def test_sample_budget_must_be_a_non_negative_int(value):
  """As a config.json or a sweep's JSON holds it (a plain dict): refused by name."""
  with pytest.raises(ValueError) as e:
    budget.from_config({'num_steps': 0, 'sample_budget': value})
  assert str(e.value).startswith(f'train.sample_budget={value!r} must be an integer number of '
                                 'training samples >= 0, summed over all DCs and workers')


def test_a_float_sample_budget_is_refused_where_it_is_set(tmp_path):
  """--config.train.sample_budget=6e5 (or a sweep grid's float): refused by the field's type."""
  with pytest.raises(ValueError, match='train.sample_budget=600000.0 has type float; the field '
                     'takes int'):
    config_lib.apply_overrides(smoke_config(str(tmp_path)), {'train.sample_budget': 6e5})


def test_exactly_one_stopping_rule_message():
  with pytest.raises(ValueError) as e:
    budget.from_config({'num_steps': 12, 'sim_time_budget_s': 0.0, 'sample_budget': 600})
  assert str(e.value) == (
      'train.num_steps=12, train.sim_time_budget_s=0.0 and train.sample_budget=600: exactly '
      'one of them must be > 0 (it stops the run; 2 are); set the others to 0, e.g. '
      '--config.train.num_steps=0 --config.train.sample_budget=600000')
  with pytest.raises(ValueError, match=r'\(it stops the run; 0 are\)'):
    budget.from_config({'num_steps': 0})


def test_sample_stop_rule_and_older_configs():
  work = budget.Stop(0, 0.0, 577)
  assert work.governed_by == 'sample_budget' and work.step_cap() is None
  assert not work.finished(10**6, 1e9, 576) and work.finished(0, 0.0, 577)
  with pytest.raises(ValueError, match='train.sample_budget=577 governs this run, but the '
                     'samples it has processed are unknown'):
    work.finished(4, 1.0)
  assert work.to_json() == dict(governed_by='sample_budget', num_steps=0,
                                sim_time_budget_s=0.0, sample_budget=577)
  # The other rules ignore the samples.
  assert budget.Stop(12, 0.0).finished(12, 0.0, None) and not budget.Stop(0, 2.5).finished(
      0, 2.4, 10**9)
  # A config written before the field existed: its rule governs, sample_budget 0.
  old = config_lib.load_file('configs/smoke.py')
  del old.train['sample_budget']
  assert budget.from_config(old.train) == budget.Stop(12, 0.0, 0)
  assert workdir_lib.upgrade_config({'train': {'num_steps': 5}})['train']['sample_budget'] == 0
  assert workdir_lib.upgrade_config({'train': {'sample_budget': 9}})['train']['sample_budget'] == 9


def test_max_iterations_of_samples_bounds_the_hand_computed_runs():
  # Semi-sync on NET, S = 577: K = 4 a round (K_d = 4, 2), P = 2 DCs: the run makes
  # 4 rounds, DC 0 16 iterations; the bound n x 32 x 5 / 4 < 577 (n <= 14), + 4 = 18.
  assert budget.max_iterations_of_samples(577, WB, 4, 2) == 18
  # Exactly on the budget: n x 40 < 576 -> n <= 14 (the run: 12 then 4, 3 rounds).
  assert budget.max_iterations_of_samples(576, WB, 4, 2) == 18
  assert budget.max_iterations_of_samples(560, WB, 4, 2) == 13 + 4
  # Sync (K = 1), both DCs: 64 samples a round, S = 700 -> 11 rounds; bound 10 + 1.
  assert budget.max_iterations_of_samples(700, WB, 1, 2) == 11
  # One DC present (an outage): n x 32 < 700 -> 21, + 1.
  assert budget.max_iterations_of_samples(700, WB, 1, 1) == 22
  # The bound is reached: sync, S = 641 -> 11 rounds (640 < 641), 11 iterations.
  assert budget.max_iterations_of_samples(641, WB, 1, 2) == 11


@pytest.mark.parametrize('faults,bound', [('', 85), ('1:1-1', 85)])
def test_a_warmup_the_sample_budget_cannot_finish_is_refused(fake_data, monkeypatch, faults,
                                                             bound):
  """Semi-sync, S = 700: validate bounds K by sync.k_max = 64: (700 x 64 - 1) //
  (32 x 65) + 64 = 21 + 64 with both DCs, (700 x 64 - 1) // (32 x 64) + 64 = 21 + 64
  with outages (P = 1); setup, with the schedule's K = 4: 2799 // 160 + 4 = 21
  (P = 2), 2799 // 128 + 4 = 25 (P = 1). Nothing is compiled."""
  monkeypatch.setattr(jax, 'jit', lambda *a, **k: (_ for _ in ()).throw(
      AssertionError('compiled before validating the config')))
  cfg = lambda warm: sample_config(fake_data, 700, **{'optimizer.warmup_steps': warm,
                                                      'sync.faults': faults})
  with pytest.raises(ValueError) as e:
    config_lib.validate(cfg(bound))
  p = 1 if faults else 2
  assert str(e.value) == (
      f'optimizer.warmup_steps={bound} must be < {bound}, the most iterations a DC can run '
      'within train.sample_budget=700: the run would end before reaching '
      'optimizer.learning_rate. The bound is floor((S K - 1) / (W B (K + P - 1))) + K with '
      'W B = 32 samples per iteration (mesh.workers_per_dc x train.batch_size), K = 64 the '
      f'most iterations of a round (sync.k_max) and P = {p} the fewest DCs present in a '
      f'round ({"sync.faults" if faults else "mesh.num_dcs"}; the last round may cross the '
      'budget). Lower optimizer.warmup_steps or raise train.sample_budget')
  config_lib.validate(cfg(bound - 1))
  tight = 25 if faults else 21
  with pytest.raises(ValueError, match=f'optimizer.warmup_steps={tight} must be < {tight},.*'
                     r"K = 4 the most iterations of a round \(the K schedule's plan\)"):
    setup_lib.setup(cfg(tight))
  assert setup_lib.setup(cfg(tight - 1)).loop.stop.governed_by == 'sample_budget'


# ------------------------------------------------------------------------------
# The sample budget: pure pieces of the loop state.
# ------------------------------------------------------------------------------

def _loop_state(rnd=3, dc_rounds=(), samples=0):
  sched = schedule_lib.from_config(smoke_config('').sync, 2, t=np.ones(2), c=np.zeros(2))
  return cost.new_loop_state(sched, 2)._replace(
      round=rnd, step=4 * rnd, since_eval=cost.SinceEval(dc_rounds=tuple(dc_rounds)),
      samples=samples), sched


def test_samples_survive_the_checkpoint_and_older_ones_derive_them():
  ls, sched = _loop_state(samples=576)
  host = json.loads(json.dumps(cost.to_host(ls, 1.0)))
  assert host['samples'] == 576 and cost.from_host(host, sched).samples == 576
  del host['samples']  # a checkpoint written before the count
  assert cost.from_host(host, sched).samples is None
  # metrics.jsonl's rounds 1-2 and the checkpoint's round 3 (after its last evaluation);
  # a record past the checkpoint (round 4) is not counted.
  rec = lambda *rounds: {'dc_rounds': [{'round': r, 'samples': [128, 64 * (r != 2)]}
                                       for r in rounds]}
  ls, _ = _loop_state(rnd=3, dc_rounds=({'round': 3, 'samples': [128, 64]},), samples=None)
  assert workdir_lib.samples_from_log([rec(1), rec(2), rec(4)], ls) == 192 + 128 + 192
  assert workdir_lib.samples_from_log([rec(1), rec(1, 2), rec(4)], ls) == 192 + 128 + 192
  assert workdir_lib.samples_from_log([rec(1)], ls) is None          # round 2 missing
  assert workdir_lib.samples_from_log([{'step': 4}, {'step': 8}], ls) is None  # before dc_rounds
  assert cost.add_samples(None, [128, 64]) is None and cost.add_samples(5, [1, 2]) == 8


def test_resume_refuses_unknown_samples_and_a_budget_the_run_went_past():
  stop = budget.Stop(0, 0.0, 577)
  ls, _ = _loop_state(rnd=4, samples=768)
  workdir_lib.check_resumed_samples(stop, ls, 577, 'w')      # the same run, finished
  workdir_lib.check_resumed_samples(stop, ls, 500, 'w')      # raised from 500: 768 reached both
  workdir_lib.check_resumed_samples(stop, ls._replace(samples=576), 0, 'w')  # not yet reached
  workdir_lib.check_resumed_samples(budget.Stop(16, 0.0), ls._replace(samples=None), 0, 'w')
  with pytest.raises(ValueError) as e:
    workdir_lib.check_resumed_samples(stop, ls, 961, 'w')    # lowered: 768 processed >= 577
  assert str(e.value) == (
      'train.sample_budget=577 is not above the 768 samples --workdir=w has already '
      'processed (checkpoint of iteration 16, round 4), so the run might have stopped rounds '
      'earlier; use a new workdir for a smaller budget.')
  with pytest.raises(ValueError, match='the checkpoint of iteration 16 in --workdir=w '
                     "predates the sample count and its metrics.jsonl does not record every "
                     "round's samples; use a new --workdir"):
    workdir_lib.check_resumed_samples(stop, ls._replace(samples=None), 577, 'w')
  # A run trained under num_steps (no old budget) past the new budget: refused.
  with pytest.raises(ValueError, match='is not above the 768 samples'):
    workdir_lib.check_resumed_samples(stop, ls, 0, 'w')


def test_progress_line_and_printed_results_under_the_sample_budget(caplog, capsys):
  ls, sched = _loop_state(samples=384)
  config = smoke_config('')
  stop = budget.Stop(0, 0.0, 577)
  rt = types.SimpleNamespace(log_at=(time.time(), 0, False), s=types.SimpleNamespace(
      loop=types.SimpleNamespace(stop=stop), task=tasks.from_config(config)))
  with caplog.at_level(logging.INFO):
    diagnostics.log_progress(rt, ls._replace(plan=sched.plan(sched.init())), 10, 0.5)
  line = caplog.records[-1].getMessage()
  assert line.startswith('step 10/? round 3 ') and line.endswith(
      'ETA at 577 samples (384 done)')
  summary = dict(final_test_accuracy=0.9, best_test_accuracy=0.91, target_accuracy=0.85,
                 bytes=dict(intra_up=1, intra_down=2, inter_dc=3), inter_dc_rounds=4,
                 intra_dc_iterations=16, sim_time_s=0.5, wall_time_s=3.0,
                 time_to_target_s=None, rounds_to_target=None, samples=768,
                 stop=stop.to_json())
  cost.print_results(summary)
  assert ('stopped at           sample budget 577 (train.sample_budget; 768 processed)\n'
          in capsys.readouterr().out)


# ------------------------------------------------------------------------------
# The sample budget on hand-computed sample counts (trains).
# ------------------------------------------------------------------------------

@pytest.fixture(scope='module')
def sample_run(fake_data, tmp_path_factory):
  """(workdir, summary) of semi-sync on 2 DCs 2.2x apart (K_d = 4, 2) under S = 577."""
  workdir = str(tmp_path_factory.mktemp('samples') / 'run')
  return workdir, train.train_and_evaluate(sample_config(fake_data, 577), workdir)


@pytest.mark.slow
def test_sample_budget_stops_after_the_round_that_reaches_it(sample_run):
  workdir, summary = sample_run
  # Rounds of 4 x 32 + 2 x 32 = 192 samples: 192, 384, 576 < 577, so round 4 is run
  # whole; 768 >= 577 and the run stops (overshoot 191 < one round).
  assert (summary['inter_dc_rounds'], summary['intra_dc_iterations']) == (4, 16)
  assert summary['samples'] == 768
  assert summary['stop'] == {'governed_by': 'sample_budget', 'num_steps': 0,
                             'sim_time_budget_s': 0.0, 'sample_budget': 577}
  hist = summary['eval_history']
  assert [(h['round'], h['step'], h['samples']) for h in hist] == [
      (1, 4, 192), (2, 8, 384), (3, 12, 576), (4, 16, 768)]
  records = [json.loads(l) for l in open(os.path.join(workdir, 'metrics.jsonl'))]
  assert [r['samples'] for r in records] == [192, 384, 576, 768]
  # The count is the sum of the per-round diagnostics' samples.
  diags = [d for r in records for d in r['dc_rounds']]
  assert all(d['samples'] == list(ROUND_SAMPLES) for d in diags)
  assert sum(sum(d['samples']) for d in diags) == summary['samples']


@pytest.mark.slow
@pytest.mark.parametrize('more,budget_samples,per_round', [
    # Exactly on the budget after round 3 (576 = 3 x 192): the run stops there.
    ({}, 576, [ROUND_SAMPLES] * 3),
    # Sync (K = 1, both DCs): 64 a round; 640 < 641 <= 704: 11 rounds, 11 iterations.
    ({'sync.strategy': 'sync'}, 641, [(WB, WB)] * 11),
    # DC 1 absent in round 2 (rounds count from 1): its 64 samples are not counted,
    # 192, 320, 512 < 513 <= 704: 4 rounds (without the outage, 576 >= 513 after 3).
    ({'sync.faults': '1:2'}, 513, [ROUND_SAMPLES, (4 * WB, 0)] + [ROUND_SAMPLES] * 2),
], ids=['semi_sync-exactly-on-the-budget', 'sync', 'semi_sync-an-absent-dc'])
def test_sample_budget_on_hand_computed_counts(fake_data, tmp_path, more, budget_samples,
                                               per_round):
  workdir = str(tmp_path / 'r')
  summary = train.train_and_evaluate(
      sample_config(fake_data, budget_samples, **more, **{'train.checkpoint_every': 0}),
      workdir)
  rounds = len(per_round)
  assert summary['inter_dc_rounds'] == rounds
  assert summary['intra_dc_iterations'] == sum(max(r) // WB for r in per_round)
  assert summary['samples'] == sum(map(sum, per_round))
  assert summary['samples'] - sum(per_round[-1]) < budget_samples <= summary['samples']
  records = [json.loads(l) for l in open(os.path.join(workdir, 'metrics.jsonl'))]
  assert [tuple(d['samples']) for r in records for d in r['dc_rounds']] == per_round


def _drop_samples_from_checkpoints(workdir):
  """Makes WORKDIR's checkpoints look written before LoopState.samples existed."""
  root = os.path.join(workdir, 'checkpoints')
  for step in (n for n in os.listdir(root) if n.isdigit()):
    path = os.path.join(root, step, 'host', 'metadata')
    with open(path) as f:
      host = json.load(f)
    del host['samples']
    with open(path, 'w') as f:
      json.dump(host, f)


@pytest.mark.slow
@pytest.mark.parametrize('older_checkpoint', [False, True])
def test_interrupted_sample_budget_run_resumes_bitwise(fake_data, sample_run, tmp_path,
                                                       monkeypatch, older_checkpoint):
  """Crashed inside round 3 (at step 10), resumed from round 2's checkpoint: the same
  final state and summary as the uninterrupted run; from a checkpoint older than the
  count, its samples come from metrics.jsonl's dc_rounds."""
  ref_dir, ref = sample_run
  cut_dir = str(tmp_path / 'cut')
  real = data_lib.batch_indices

  def crash(part, batch_size, step, seed):
    if step == 10:
      raise KeyboardInterrupt('simulated crash')
    return real(part, batch_size, step, seed)
  monkeypatch.setattr(data_lib, 'batch_indices', crash)
  with pytest.raises(KeyboardInterrupt):
    train.train_and_evaluate(sample_config(fake_data, 577), cut_dir)
  monkeypatch.setattr(data_lib, 'batch_indices', real)
  if older_checkpoint:
    _drop_samples_from_checkpoints(cut_dir)
  summary = train.train_and_evaluate(sample_config(fake_data, 577), cut_dir)
  step_a, a = final_state(ref_dir)
  step_b, b = final_state(cut_dir)
  assert step_a == step_b == 16
  chex.assert_trees_all_equal(a, b)
  for key in ('final_test_accuracy', 'bytes', 'sim_time_s', 'idle_s', 'inter_dc_rounds',
              'samples', 'eval_history', 'stop'):
    assert summary[key] == ref[key], key
  again = train.train_and_evaluate(sample_config(fake_data, 577), cut_dir)
  assert again['eval_history'] == ref['eval_history']


@pytest.mark.slow
def test_a_larger_sample_budget_extends_the_run_as_a_fresh_one(fake_data, sample_run, tmp_path):
  """train.sample_budget is resumable: 577 -> 961 goes on from the finished run's
  768 samples (960 < 961: 6 rounds, 1,152 samples), bitwise the fresh run of 961;
  a budget below what it processed is refused, nothing written."""
  ext = str(tmp_path / 'ext')
  shutil.copytree(sample_run[0], ext)
  lower = sample_config(fake_data, 500)
  with pytest.raises(ValueError, match='train.sample_budget=500 is not above the 768 samples'):
    train.train_and_evaluate(lower, ext)
  assert workdir_lib.check_workdir_config(ext, sample_config(fake_data, 961)) == [
      'train.sample_budget: 577 -> 961']
  summary = train.train_and_evaluate(sample_config(fake_data, 961), ext)
  fresh_dir = str(tmp_path / 'fresh')
  fresh = train.train_and_evaluate(sample_config(fake_data, 961), fresh_dir)
  assert (summary['inter_dc_rounds'], summary['samples']) == (6, 1152)
  assert summary['changed_on_resume'] == [dict(at_iteration=16,
                                               changes=['train.sample_budget: 577 -> 961'])]
  chex.assert_trees_all_equal(final_state(ext)[1], final_state(fresh_dir)[1])
  for key in ('final_test_accuracy', 'bytes', 'sim_time_s', 'idle_s', 'samples',
              'eval_history', 'stop'):
    assert summary[key] == fresh[key], key


def test_an_older_workdir_config_without_the_field_resumes(fake_data, tmp_path):
  """A config.json written before train.sample_budget existed is the same config."""
  config = smoke_config(fake_data)
  workdir = tmp_path / 'old'
  workdir.mkdir()
  stored = json.loads(config.to_json())
  del stored['train']['sample_budget']
  (workdir / 'config.json').write_text(json.dumps(stored))
  (workdir / 'summary.json').write_text(json.dumps(dict(
      intra_dc_iterations=12, sim_time_s=1.0, config=stored)))
  assert workdir_lib.check_workdir_config(str(workdir), config) == []
