"""Tests of hfl.sync: frequency optimisation, schedules, outer optimizers,
aggregation weights (FedAvg/FedNova) and the outage spec."""

import itertools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from hfl.sync import aggregation
from hfl.sync import faults
from hfl.sync import frequency
from hfl.sync import outer
from hfl.sync import schedule
from tests.helpers import run_schedule


# ----------------------------------------------------------------------------
# frequency


def _brute_force_k(t, c, k_max, budget):
  """Independent reference: enumerate all K in [1, k_max]^D, keep the feasible
  ones (K_d t_d + C_d <= budget (1 + TIME_RTOL)), maximise sum_d K_d."""
  best, best_sum, n_best = None, -1, 0
  lim = budget * (1 + frequency.TIME_RTOL)
  for ks in itertools.product(range(1, k_max + 1), repeat=len(t)):
    if all(k * ti + ci <= lim for k, ti, ci in zip(ks, t, c)):
      s = sum(ks)
      if s > best_sum:
        best, best_sum, n_best = ks, s, 1
      elif s == best_sum:
        n_best += 1
  return best, n_best


def test_optimal_k_matches_brute_force_random():
  rng = np.random.default_rng(0)
  for _ in range(300):
    d = int(rng.integers(1, 5))
    k_max = int(rng.integers(1, 9))
    k_base = int(rng.integers(1, k_max + 1))
    t = rng.uniform(0.01, 1.0, size=d)
    if rng.random() < 0.3:  # exact speed ratios stress the floor
      t = 0.1 / rng.integers(1, 5, size=d)
    c = rng.uniform(0.0, 2.0, size=d) if rng.random() < 0.7 else np.zeros(d)
    t_star = max(k_base * ti + ci for ti, ci in zip(t, c))
    want, n_best = _brute_force_k(t, c, k_max, t_star)
    assert n_best == 1  # the maximiser is unique
    np.testing.assert_array_equal(
        frequency.optimal_k_exact(t, c, k_base, k_max), want)
    np.testing.assert_array_equal(frequency.optimal_k(t, c, k_base, k_max), want)


def test_optimal_k_exact_with_budget_matches_brute_force():
  rng = np.random.default_rng(1)
  for _ in range(100):
    d = int(rng.integers(1, 5))
    k_max = int(rng.integers(1, 9))
    t = rng.uniform(0.01, 1.0, size=d)
    c = rng.uniform(0.0, 1.0, size=d)
    budget = float(np.max(t + c)) + rng.uniform(0.0, 3.0)
    want, _ = _brute_force_k(t, c, k_max, budget)
    np.testing.assert_array_equal(
        frequency.optimal_k_exact(t, c, 1, k_max, budget_s=budget), want)


def test_optimal_k_exact_infeasible_budget():
  with pytest.raises(ValueError, match='too short'):
    frequency.optimal_k_exact([1.0, 1.0], [0.0, 5.0], 1, 4, budget_s=2.0)


def test_optimal_k_properties():
  # Equal speeds and communication: everyone runs K_base.
  np.testing.assert_array_equal(
      frequency.optimal_k([0.1] * 3, [0.3] * 3, 4, 64), [4, 4, 4])
  # A DC 3x faster with equal C runs exactly 3x K_base.
  np.testing.assert_array_equal(
      frequency.optimal_k([0.1, 0.1 / 3], [0.5, 0.5], 4, 64), [4, 12])
  # ... and roughly 3x with unequal C; the slowest DC runs K_base.
  k = frequency.optimal_k([0.3, 0.1], [0.5, 0.2], 5, 64)
  assert k[0] == 5 and 14 <= k[1] <= 18
  # Capped by k_max.
  np.testing.assert_array_equal(
      frequency.optimal_k([1.0, 0.01], [0.0, 0.0], 2, 8), [2, 8])
  # Round time never exceeds periodic K_base's.
  rng = np.random.default_rng(2)
  for _ in range(50):
    t, c = rng.uniform(0.01, 1, 4), rng.uniform(0, 1, 4)
    k = frequency.optimal_k(t, c, 3, 32)
    assert np.all(k >= 3)
    assert frequency.round_time(k, t, c) <= frequency.round_time(
        np.full(4, 3), t, c) * (1 + 1e-9)
    assert frequency.round_time(k, t, c) == pytest.approx(
        frequency.target_round_time(t, c, 3))


@pytest.mark.parametrize('args, field', [
    (([0.1, -0.1], [0.0, 0.0], 2, 4), 'network.dc_speed'),
    (([0.1, 0.0], [0.0, 0.0], 2, 4), 'network.dc_speed'),
    (([0.1, np.nan], [0.0, 0.0], 2, 4), 'network.dc_speed'),
    (([0.1, 0.1], [0.0, -1.0], 2, 4), 'network.wan'),
    (([0.1, 0.1], [0.0], 2, 4), 'mesh.num_dcs'),
    (([], [], 2, 4), 'network.dc_speed'),
    (([0.1, 0.1], [0.0, 0.0], 0, 4), 'sync.k'),
    (([0.1, 0.1], [0.0, 0.0], 2.5, 4), 'sync.k'),
    (([0.1, 0.1], [0.0, 0.0], 5, 4), 'sync.k_max'),
])
def test_optimal_k_errors(args, field):
  for fn in (frequency.optimal_k, frequency.optimal_k_exact):
    with pytest.raises(ValueError, match=field):
      fn(*args)


# ----------------------------------------------------------------------------
# schedule


def test_sync_and_periodic_constant():
  for strategy, want in (('sync', 1), ('periodic', 6)):
    sched = schedule.make_schedule(strategy, 3, 6, 64)
    plans, state = run_schedule(sched, np.linspace(2.0, 0.1, 20))
    for p in plans:
      np.testing.assert_array_equal(p.k_d, [want] * 3)
      assert p.k_base == want and p.k_d.dtype == np.int64
    assert state.round == 20


def test_semi_sync_equal_speeds_is_periodic():
  semi = schedule.make_schedule('semi_sync', 4, 5, 64, t=[0.2] * 4, c=[1.0] * 4)
  per = schedule.make_schedule('periodic', 4, 5, 64)
  losses = [1.0, 0.9, 0.8]
  for a, b in zip(run_schedule(semi, losses)[0], run_schedule(per, losses)[0]):
    np.testing.assert_array_equal(a.k_d, b.k_d)


def test_semi_sync_heterogeneous_and_missing_times():
  sched = schedule.make_schedule('semi_sync', 2, 4, 64, t=[0.1, 0.05],
                                 c=[0.2, 0.2])
  np.testing.assert_array_equal(sched.plan(sched.init()).k_d, [4, 8])
  with pytest.raises(ValueError, match='network'):
    schedule.make_schedule('semi_sync', 2, 4, 64)
  with pytest.raises(ValueError, match='mesh.num_dcs'):
    schedule.make_schedule('semi_sync', 3, 4, 64, t=[0.1, 0.1], c=[0.0, 0.0])


def test_progress_aware_raises_on_plateau_and_respects_k_max():
  sched = schedule.make_schedule(
      'semi_sync', 2, 2, 12, t=[0.1, 0.05], c=[0.0, 0.0], progress_aware=True,
      progress_window=3, progress_threshold=0.01, progress_factor=2.0)
  # Improving fast: no change.
  plans, state = run_schedule(sched, [1.0, 0.8, 0.6, 0.4, 0.3, 0.2])
  assert all(p.k_base == 2 for p in plans)
  # Plateau: after window + 1 = 4 flat losses K_base doubles, then waits another
  # 4 rounds at the new K before the next raise; capped at k_max = 12.
  plans, state = run_schedule(sched, [1.0] * 20)
  kb = [p.k_base for p in plans]
  assert kb[:4] == [2, 2, 2, 2] and kb[4] == 4
  assert kb[5:8] == [4, 4, 4] and kb[8] == 8
  assert kb[12] == 12 and max(kb) == 12
  assert all(b >= a for a, b in zip(kb, kb[1:]))
  for p in plans:
    assert np.all(p.k_d <= 12) and p.k_d[0] == p.k_base
  # Small factors still make progress: 1 -> 2 with factor 1.5.
  slow = schedule.make_schedule('periodic', 1, 1, 8, progress_aware=True,
                                progress_window=1, progress_factor=1.5)
  assert [p.k_base for p in run_schedule(slow, [1.0] * 6)[0]] == [1, 1, 2, 2, 3, 3, 4]


def test_progress_aware_ignores_non_finite_and_none():
  sched = schedule.make_schedule('periodic', 2, 2, 64, progress_aware=True,
                                 progress_window=1)
  plans, state = run_schedule(sched, [None, float('nan'), float('inf')])
  assert [p.k_base for p in plans] == [2, 2, 2, 2]
  assert state.history == () and state.round == 3


def test_adacomm_decreases_k_as_loss_falls():
  sched = schedule.make_schedule('adacomm', 2, 16, 64)
  losses = [2.0, 1.5, 1.0, 0.5, 0.125, 0.02]
  plans, state = run_schedule(sched, losses)
  kb = [p.k_base for p in plans]
  # tau_l = ceil(sqrt(F_l / F_0) * tau_0)
  want = [16] + [int(np.ceil(np.sqrt(l / 2.0) * 16)) for l in losses]
  assert kb == want == [16, 16, 14, 12, 8, 4, 2]
  assert state.loss0 == 2.0
  for p in plans:
    np.testing.assert_array_equal(p.k_d, [p.k_base] * 2)
  with pytest.raises(ValueError, match='adacomm'):
    sched.next_round(sched.init(), 0.0)
  with pytest.raises(ValueError, match='sync.progress_aware'):
    schedule.make_schedule('adacomm', 2, 16, 64, progress_aware=True)


@pytest.mark.parametrize('strategy', schedule.STRATEGIES)
def test_schedule_json_round_trip_and_resume(strategy):
  sched = schedule.make_schedule(
      strategy, 3, 4, 32, t=[0.1, 0.05, 0.03], c=[0.1, 0.2, 0.3],
      progress_aware=strategy != 'adacomm', progress_window=2)
  rng = np.random.default_rng(3)
  losses = list(1.0 + 0.01 * rng.standard_normal(30))
  full_plans, _ = run_schedule(sched, losses)
  # Interrupt after 11 rounds, checkpoint as JSON, resume.
  state = sched.init()
  for loss in losses[:11]:
    _, state = sched.next_round(state, loss)
  text = schedule.state_to_json(state)
  restored = schedule.state_from_json(text)
  assert restored == state
  resumed = [sched.plan(restored)]
  for loss in losses[11:]:
    plan, restored = sched.next_round(restored, loss)
    resumed.append(plan)
  for a, b in zip(full_plans[11:], resumed):
    np.testing.assert_array_equal(a.k_d, b.k_d)
    assert a.k_base == b.k_base
  with pytest.raises(ValueError):
    schedule.state_from_json('{"round": 1}')


def test_schedule_errors_and_from_config():
  with pytest.raises(ValueError, match='sync.strategy'):
    schedule.make_schedule('async', 2, 4, 8)
  with pytest.raises(ValueError, match='sync.k_max'):
    schedule.make_schedule('periodic', 2, 16, 8)
  with pytest.raises(ValueError, match='sync.k '):
    schedule.make_schedule('periodic', 2, 0, 8)
  with pytest.raises(ValueError, match='sync.progress_factor'):
    schedule.make_schedule('periodic', 2, 2, 8, progress_aware=True,
                           progress_factor=1.0)
  with pytest.raises(ValueError, match='sync.progress_window'):
    schedule.make_schedule('periodic', 2, 2, 8, progress_aware=True,
                           progress_window=0)
  # sync ignores sync.k (may exceed k_max).
  s = schedule.make_schedule('sync', 2, 16, 8)
  np.testing.assert_array_equal(s.plan(s.init()).k_d, [1, 1])
  # A restored state beyond this run's k_max is rejected clearly.
  bad = schedule.ScheduleState(round=3, k_base=32, history=(), loss0=None)
  with pytest.raises(ValueError, match='sync.k_max'):
    s.plan(bad)
  cfg = ml_collections.ConfigDict(dict(
      strategy='periodic', k=4, k_max=64, progress_aware=False,
      progress_window=3, progress_threshold=0.01, progress_factor=2.0))
  s = schedule.from_config(cfg, 2)
  np.testing.assert_array_equal(s.plan(s.init()).k_d, [4, 4])


# ----------------------------------------------------------------------------
# outer


def _tree(rng):
  return {'w': rng.standard_normal((3, 4)).astype(np.float32),
          'b': rng.standard_normal((4,)).astype(np.float32)}


def test_outer_avg_is_weighted_average():
  rng = np.random.default_rng(4)
  x_prev = _tree(rng)
  xs = [_tree(rng) for _ in range(3)]
  p = np.array([0.5, 0.3, 0.2], np.float32)
  deltas = jax.tree.map(lambda xp, *xd: np.stack([xp - x for x in xd]),
                        x_prev, *xs)
  delta = aggregation.weighted_sum(deltas, p)
  tx = outer.make_outer('avg', 1.0, 0.0)
  new, _ = outer.apply_outer(tx, x_prev, delta, tx.init(x_prev))
  want = jax.tree.map(lambda *xd: sum(pi * x for pi, x in zip(p, xd)), *xs)
  for k in want:
    np.testing.assert_allclose(new[k], want[k], rtol=1e-5, atol=1e-6)


def test_outer_nesterov_matches_optax_and_numpy_recurrence():
  lr, mu = 0.7, 0.9
  rng = np.random.default_rng(5)
  x0 = _tree(rng)
  tx = outer.make_outer('nesterov', lr, mu)
  ref_tx = optax.sgd(lr, momentum=mu, nesterov=True)
  x, state = x0, tx.init(x0)
  x_ref, ref_state = x0, ref_tx.init(x0)
  x_np = {k: v.astype(np.float64) for k, v in x0.items()}
  m_np = {k: np.zeros_like(v) for k, v in x_np.items()}
  step = jax.jit(lambda x, d, s: outer.apply_outer(tx, x, d, s))
  for _ in range(6):
    # Pseudo-gradient of this round (stand-in for x_prev - average).
    delta = _tree(rng)
    x, state = step(x, delta, state)
    upd, ref_state = ref_tx.update(delta, ref_state, x_ref)
    x_ref = optax.apply_updates(x_ref, upd)
    # Hand-written Nesterov: m <- mu m + d;  x <- x - lr (d + mu m).
    for k in x_np:
      m_np[k] = mu * m_np[k] + delta[k]
      x_np[k] = x_np[k] - lr * (delta[k] + mu * m_np[k])
  for k in x0:
    np.testing.assert_allclose(x[k], x_ref[k], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(x[k], x_np[k], rtol=1e-5, atol=1e-5)


def test_outer_sgd_and_errors():
  x = {'a': jnp.ones(3)}
  tx = outer.make_outer('sgd', 0.5)
  new, _ = outer.apply_outer(tx, x, {'a': jnp.full(3, 2.0)}, tx.init(x))
  np.testing.assert_allclose(new['a'], 0.0)
  with pytest.raises(ValueError, match='sync.outer.name'):
    outer.make_outer('adam', 0.1, 0.0)
  with pytest.raises(ValueError, match='sync.outer.learning_rate'):
    outer.make_outer('sgd', 0.0)
  with pytest.raises(ValueError, match='sync.outer.learning_rate'):
    outer.make_outer('avg', 0.7)
  with pytest.raises(ValueError, match='sync.outer.momentum'):
    outer.make_outer('nesterov', 0.7, 1.0)
  with pytest.raises(ValueError, match='sync.outer.momentum'):
    outer.make_outer('nesterov', 0.7, 0.0)
  with pytest.raises(ValueError, match='sync.outer.momentum'):
    outer.make_outer('avg', 1.0, 0.9)


# ----------------------------------------------------------------------------
# aggregation


def test_fedavg_weights_renormalise():
  n = jnp.array([100, 300, 600])
  np.testing.assert_allclose(
      aggregation.fedavg_weights(n, jnp.array([True, True, True])),
      [0.1, 0.3, 0.6], rtol=1e-6)
  w = aggregation.fedavg_weights(n, jnp.array([True, False, True]))
  np.testing.assert_allclose(w, [1 / 7, 0.0, 6 / 7], rtol=1e-6)
  assert w.dtype == jnp.float32
  w = jax.jit(aggregation.fedavg_weights)(n, jnp.array([False, False, False]))
  np.testing.assert_array_equal(w, [0.0, 0.0, 0.0])  # no NaN


def _local_sgd_delta(x0, a, b, eta, k):
  """K steps of SGD on f(x) = 0.5 a ||x - b||^2 with optax; returns x0 - x_K."""
  loss = lambda x: 0.5 * a * jnp.sum((x - b) ** 2)
  tx = optax.sgd(eta)

  def body(_, carry):
    x, s = carry
    u, s = tx.update(jax.grad(loss)(x), s, x)
    return optax.apply_updates(x, u), s

  x, _ = jax.lax.fori_loop(0, k, body, (x0, tx.init(x0)))
  return x0 - x


def test_fednova_closed_form_on_quadratics():
  rng = np.random.default_rng(6)
  d, dim, eta = 4, 5, 0.05
  a = rng.uniform(0.5, 3.0, d)
  b = rng.standard_normal((d, dim))
  x0 = rng.standard_normal(dim)
  k = np.array([1, 3, 7, 12])
  n = np.array([10, 20, 30, 40])
  present = np.array([True, True, False, True])
  deltas = jnp.stack([
      _local_sgd_delta(jnp.asarray(x0, jnp.float32), a[i], jnp.asarray(
          b[i], jnp.float32), eta, int(k[i])) for i in range(d)])
  p = aggregation.fedavg_weights(jnp.asarray(n), jnp.asarray(present))
  got = aggregation.weighted_sum(
      deltas, aggregation.aggregation_scale('fednova', p, jnp.asarray(k)))
  # numpy closed form: Delta_d = (1 - (1 - eta a_d)^K_d)(x0 - b_d)
  delta_np = (1 - (1 - eta * a) ** k)[:, None] * (x0[None, :] - b)
  p_np = n * present / np.sum(n * present)
  tau_eff = np.sum(p_np * k)
  want = tau_eff * np.sum((p_np / k)[:, None] * delta_np, axis=0)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  fedavg = aggregation.weighted_sum(deltas, aggregation.fedavg_scale(p, k))
  np.testing.assert_allclose(
      fedavg, np.sum(p_np[:, None] * delta_np, axis=0), rtol=1e-5, atol=1e-6)


def test_fednova_is_objective_consistent_for_small_steps():
  # For eta -> 0, Delta_d ~ eta K_d grad f_d(x0): FedNova's update is
  # eta tau_eff grad F(x0) with F = sum p_d f_d, FedAvg's is biased toward large
  # K_d (it follows sum p_d K_d grad f_d).
  a = np.array([1.0, 2.0])
  b = np.array([[1.0], [-1.0]])
  x0, eta, k, p = np.array([0.0]), 1e-5, np.array([1, 10]), np.array([.5, .5])
  delta = (1 - (1 - eta * a) ** k)[:, None] * (x0 - b)
  grad_f = np.sum((p * a)[:, None] * (x0 - b), axis=0)
  nova = np.asarray(aggregation.weighted_sum(
      jnp.asarray(delta), aggregation.fednova_scale(p, k)))
  tau_eff = np.sum(p * k)
  np.testing.assert_allclose(nova / (eta * tau_eff), grad_f, rtol=1e-3)
  avg = np.asarray(aggregation.weighted_sum(
      jnp.asarray(delta), aggregation.fedavg_scale(p, k)))
  assert abs(avg[0] / (eta * tau_eff) - grad_f[0]) > 0.1


def test_fednova_equal_k_is_fedavg_and_errors():
  p = jnp.array([0.2, 0.0, 0.8])
  np.testing.assert_allclose(
      aggregation.fednova_scale(p, jnp.array([5, 5, 5])), p, rtol=1e-6)
  np.testing.assert_allclose(
      jax.jit(aggregation.fednova_scale)(p, jnp.array([5, 1, 5])), p, rtol=1e-6)
  with pytest.raises(ValueError, match='sync.aggregation'):
    aggregation.aggregation_scale('scaffold', p, jnp.array([1, 1, 1]))


# ----------------------------------------------------------------------------
# faults


def test_faults_unreached_are_those_ending_after_the_run():
  # Rounds are numbered from 1 (issue 51, fault 3): a run of n rounds did rounds 1..n.
  spec = '0:1-2,1:3-5,0:7,1:9'
  assert faults.unreached(spec, 2, 9) == ()
  assert faults.unreached(spec, 2, 8) == (faults.Outage(1, 9, 9),)
  assert faults.unreached(spec, 2, 4) == (faults.Outage(1, 3, 5), faults.Outage(0, 7, 7),
                                          faults.Outage(1, 9, 9))
  assert faults.unreached('', 2, 0) == ()


def test_faults_parse_and_present():
  present = faults.make_present_fn('1:10-12, 2:5', 3)
  assert present(1).tolist() == [True, True, True]
  assert present(5).tolist() == [True, True, False]
  for r in (10, 11, 12):
    assert present(r).tolist() == [True, False, True]
  assert present(13).tolist() == [True, True, True]
  assert faults.parse_faults('', 2) == ()
  assert faults.parse_faults('  ', 1) == ()
  assert faults.parse_faults('0:3', 2) == (faults.Outage(0, 3, 3),)
  # Overlapping entries: union.
  present = faults.make_present_fn('0:1-4,0:3-6,1:8', 2)
  assert [bool(present(r)[0]) for r in range(1, 8)] == [
      False, False, False, False, False, False, True]
  # Rounds are numbered from 1 (issue 51, fault 3): there is no round 0.
  for bad in (0, -1):
    with pytest.raises(ValueError, match='numbered from 1'):
      present(bad)


@pytest.mark.parametrize('spec, num_dcs, match', [
    ('1', 2, 'malformed'),
    ('1:', 2, 'malformed'),
    ('a:3', 2, 'malformed'),
    ('1:3-', 2, 'malformed'),
    ('1:-3', 2, 'malformed'),
    ('1:3,,0:4', 2, 'malformed'),
    ('1:3-4-5', 2, 'malformed'),
    ('2:3', 2, 'out of range'),
    ('1:5-3', 2, 'reversed'),
    ('0:3', 1, 'every DC'),
    ('0:1-5,1:5-9', 2, 'round 5'),
    ('0:1-5,1:7-9,2:1-20', 3, None),  # no round with all absent: fine
    # Rounds are numbered from 1 (issue 51, fault 3): round 0 is a 0-based config.
    ('1:0', 2, 'round 0'),
    ('1:0-3', 2, 'numbered from 1'),
])
def test_faults_errors(spec, num_dcs, match):
  if match is None:
    faults.parse_faults(spec, num_dcs)
    return
  with pytest.raises(ValueError, match='sync.faults') as e:
    faults.parse_faults(spec, num_dcs)
  assert match in str(e.value)


def test_end_to_end_round_with_absent_dc():
  # Aggregation with DC 1 absent equals averaging the present DCs only.
  rng = np.random.default_rng(7)
  x_prev = jnp.asarray(rng.standard_normal(6), jnp.float32)
  x_d = jnp.asarray(rng.standard_normal((3, 6)), jnp.float32)
  present = faults.make_present_fn('1:1', 3)(1)
  p = aggregation.fedavg_weights(jnp.array([1, 1, 2]), present)
  delta = aggregation.weighted_sum(x_prev[None] - x_d, p)
  tx = outer.make_outer('avg')
  new, _ = outer.apply_outer(tx, x_prev, delta, tx.init(x_prev))
  np.testing.assert_allclose(new, (x_d[0] + 2 * x_d[2]) / 3, rtol=1e-5,
                             atol=1e-6)
