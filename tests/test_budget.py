"""The simulated-time budget (hfl.budget): validation, the stopping rule on
hand-computed clocks (heterogeneous DCs, semi-sync with idle time), exact resume."""

import importlib.util
import json
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hfl import budget, models, network, sweep, train
from hfl import config as config_lib
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
    train.setup(budget_config(fake_data, 0.5, **{'optimizer.warmup_steps': 19}))
  assert str(e.value).startswith('optimizer.warmup_steps=19 must be < 19')
  assert 'Estimated from hfl.train.planned_times' in str(e.value)
  assert 'K = 4 the most iterations of a round' in str(e.value)
  s = train.setup(budget_config(fake_data, 0.5, **{'optimizer.warmup_steps': 18}))
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
  assert train.upgrade_config({'train': {'num_steps': 5}})['train']['sim_time_budget_s'] == 0.0


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
                             'sim_time_budget_s': 0.5}
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
  (hfl.train.planned_times from the model's payload shapes, at both speed levels),
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
    t, c = train.planned_times(cfg, net, train.build_compressors(cfg, shapes), shapes)
    assert mod.SYNC_ROUND_S == pytest.approx(float(np.max(t + c)), rel=1e-9)
    assert point['train.sim_time_budget_s'] == mod.SIM_BUDGET_S
  assert int(np.floor(mod.SIM_BUDGET_S / mod.SYNC_ROUND_S)) + 1 == sync_rounds


def test_printed_results_say_a_budget_stopped_the_run(capsys):
  summary = dict(final_test_accuracy=0.9, best_test_accuracy=0.91, target_accuracy=0.85,
                 bytes=dict(intra_up=1, intra_down=2, inter_dc=3), inter_dc_rounds=4,
                 intra_dc_iterations=8, sim_time_s=10.5, wall_time_s=3.0, time_to_target_s=None,
                 rounds_to_target=None,
                 stop=dict(governed_by='sim_time_budget_s', num_steps=0, sim_time_budget_s=10.0))
  train.print_results(summary)
  assert 'stopped at           simulated-time budget 10 s (train.sim_time_budget_s)\n' in (
      capsys.readouterr().out)
  train.print_results(dict(summary, stop=dict(governed_by='num_steps', num_steps=8)))
  assert 'stopped at' not in capsys.readouterr().out
