"""Per-round DC diagnostics and the semi-sync remedies (issue 15) against plain
references: numpy norms, closed forms, reference loops of local SGD."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from hfl import config as config_lib, mesh as mesh_lib, step as step_lib, train
from hfl import cost
from hfl.sync import aggregation, frequency, schedule as schedule_lib
from tests.helpers import D, W, mlp_identity, run_schedule, run_steps, step_batches

LR = 0.1


def _setup(prox_mu=0.0):
  mesh = mesh_lib.make_mesh(D, W)
  net, params, comps = mlp_identity(8)
  params = jax.tree.map(np.array, params)
  opt, outer = optax.sgd(LR), optax.sgd(1.0)
  state = step_lib.init_state(params, opt, outer, comps, D, W, jax.random.PRNGKey(1))
  state = jax.device_put(state, step_lib.state_shardings(mesh, state))
  apply_fn = lambda p, x: net.apply({'params': p}, x)
  fn = step_lib.make_step(apply_fn, opt, outer, comps, mesh, state, prox_mu=prox_mu)
  return mesh, params, apply_fn, state, fn


def _grad(apply_fn, p, x, y):
  loss = lambda q: optax.softmax_cross_entropy_with_integer_labels(apply_fn(q, x), y).mean()
  return jax.grad(loss)(p)


def _local_sgd(apply_fn, x0, xs, ys, d, steps, lr=LR, mu=0.0):
  """Reference: ``steps`` iterations of DC d from x0 (mean of its W workers'
  gradients, plus FedProx's mu (x - x0))."""
  x = x0
  for t in range(steps):
    gs = [_grad(apply_fn, x, xs[t, d, w], ys[t, d, w]) for w in range(W)]
    x = jax.tree.map(lambda p, p0, *g: p - lr * (sum(g) / W + mu * (p - p0)), x, x0, *gs)
  return x


def _norm(tree):
  return float(np.sqrt(sum(np.sum(np.square(np.asarray(v, np.float64)))
                           for v in jax.tree.leaves(tree))))


def test_round_reports_each_dcs_update_and_drift_norms():
  """Semi-sync round: DC 0 runs 3 iterations, DC 1 one; the step's float32 norms
  ||x_d - x_global|| and ||x_d - x_global'|| against numpy on a reference loop."""
  mesh, x0, apply_fn, state, fn = _setup()
  xs, ys = step_batches(3, seed=7)
  active = [[True, True], [True, False], [True, False]]
  weights = np.array([0.4, 0.6], np.float32)
  state, m = run_steps(mesh, fn, state, xs, ys, active, weights, [False, False, True])
  x_d = [_local_sgd(apply_fn, x0, xs, ys, 0, 3), _local_sgd(apply_fn, x0, xs, ys, 1, 1)]
  x_new = jax.tree.map(lambda p, a, b: p - (weights[0] * (p - a) + weights[1] * (p - b)),
                       x0, *x_d)
  want_upd = [_norm(jax.tree.map(lambda a, b: a - b, x, x0)) for x in x_d]
  want_drift = [_norm(jax.tree.map(lambda a, b: a - b, x, x_new)) for x in x_d]
  assert want_upd[0] > 1.5 * want_upd[1] > 0  # not trivially equal
  np.testing.assert_allclose(m['update_l2'], want_upd, rtol=1e-4)
  np.testing.assert_allclose(m['drift_l2'], want_drift, rtol=1e-4)
  # A local iteration carries no round, hence zero norms.
  _, m_local = run_steps(mesh, fn, state, xs[:1], ys[:1], active[:1], weights, [False])
  assert m_local['update_l2'].tolist() == [0.0, 0.0]


def test_round_diagnostics_samples_weights_and_contributions():
  actives = [[True, True], [True, False], [True, False], [True, False]]
  m = {'update_l2': np.array([2.0, 1.0]), 'drift_l2': np.array([0.5, 0.7])}
  diag = cost.round_diagnostics(7, actives, [True, True], 4 * 8, [0.25, 0.75], m)
  assert diag['round'] == 7 and diag['samples'] == [4 * 32, 32]
  # contribution_d = s_d ||D_d|| / sum_e s_e ||D_e|| = (0.5, 0.75) / 1.25
  np.testing.assert_allclose(diag['contribution'], [0.4, 0.6])
  assert diag['weight'] == [0.25, 0.75] and diag['drift_l2'] == [0.5, 0.7]
  absent = cost.round_diagnostics(1, actives, [True, False], 32, [1.0, 0.0], m)
  assert absent['samples'] == [128, 0] and absent['contribution'] == [1.0, 0.0]


def test_fedprox_round_equals_reference_loop_with_proximal_gradient():
  mu, k = 0.5, 3
  mesh, x0, apply_fn, state, fn = _setup(prox_mu=mu)
  xs, ys = step_batches(k, seed=11)
  weights = np.array([0.3, 0.7], np.float32)
  state, _ = run_steps(mesh, fn, state, xs, ys, [[True, True]] * k, weights,
                       [False] * (k - 1) + [True])
  x_d = [_local_sgd(apply_fn, x0, xs, ys, d, k, mu=mu) for d in range(D)]
  want = jax.tree.map(lambda p, a, b: p - (weights[0] * (p - a) + weights[1] * (p - b)),
                      x0, *x_d)
  for got, ref in zip(jax.tree.leaves(state.global_params), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=2e-5, atol=2e-6)
  # The proximal term changed the result (mu = 0 differs by more than the tolerance).
  plain = [_local_sgd(apply_fn, x0, xs, ys, d, k) for d in range(D)]
  assert _norm(jax.tree.map(lambda a, b: a - b, plain[0], x_d[0])) > 1e-4


def test_per_dc_lr_scale_equals_reference_loop_with_scaled_lr():
  mesh, x0, apply_fn, state, fn = _setup()
  xs, ys = step_batches(2, seed=13)
  scale = np.array([1.0, 0.25], np.float32)
  put = lambda a, *spec: jax.device_put(a, jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec(*spec)))
  for t in range(2):  # a float ``active``: each DC's learning-rate multiplier
    state, _ = fn(state, (put(xs[t], 'dc', 'worker'), put(ys[t], 'dc', 'worker')),
                  put(scale, 'dc'), put(np.array([.5, .5], np.float32)), False)
  for d in range(D):
    ref = _local_sgd(apply_fn, x0, xs, ys, d, 2, lr=LR * float(scale[d]))
    got = jax.tree.map(lambda x: np.asarray(x)[d], state.params)
    for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(ref)):
      np.testing.assert_allclose(g, np.asarray(r), rtol=2e-5, atol=2e-6)
  np.testing.assert_array_equal(train.round_lr_scale('inverse_k', [12, 4, 6]),
                                np.array([1 / 3, 1.0, 2 / 3], np.float32))
  assert train.round_lr_scale('none', [12, 4]).tolist() == [1.0, 1.0]


def test_samples_aggregation_is_proportional_to_steps_run():
  p = jnp.array([0.7, 0.2, 0.1, 0.0])  # data weights; DC 3 absent
  k = jnp.array([12, 4, 6, 9])
  got = aggregation.aggregation_scale('samples', p, k)
  np.testing.assert_allclose(got, [12 / 22, 4 / 22, 6 / 22, 0.0], rtol=1e-6)
  # Equal steps: equal weights for the present DCs, whatever their data sizes.
  np.testing.assert_allclose(aggregation.samples_scale(p, jnp.array([3, 3, 3, 3])),
                             [1 / 3, 1 / 3, 1 / 3, 0.0], rtol=1e-6)
  assert float(jnp.sum(aggregation.samples_scale(jnp.zeros(2), jnp.ones(2)))) == 0.0


@pytest.mark.parametrize('k_d,ratio,k_max,want', [
    ([12, 8, 6, 4], 0.0, 32, [12, 8, 6, 4]),
    ([12, 8, 6, 4], 0.5, 32, [12, 8, 6, 6]),    # ceil(0.5 * 12) = 6
    ([12, 8, 6, 4], 0.7, 32, [12, 9, 9, 9]),    # ceil(8.4) = 9
    ([12, 8, 6, 4], 1.0, 32, [12, 12, 12, 12]),  # periodic with K = 12
    ([12, 8, 6, 4], 1.0, 10, [10, 10, 10, 10]),  # capped by k_max
])
def test_floor_k_closed_form(k_d, ratio, k_max, want):
  assert frequency.floor_k(np.array(k_d), ratio, k_max).tolist() == want


def test_semi_sync_schedule_with_k_min_ratio():
  t, c = [0.05 / 3, 0.05 / 2, 0.05], [0.04] * 3
  plain = schedule_lib.make_schedule('semi_sync', 3, 4, 32, t=t, c=c)
  floored = schedule_lib.make_schedule('semi_sync', 3, 4, 32, t=t, c=c, k_min_ratio=0.5)
  # T* = 4 * 0.05 + 0.04: K = (12, 8, 4); the floor raises the slowest to 6.
  assert plain.plan(plain.init()).k_d.tolist() == [12, 8, 4]
  assert floored.plan(floored.init()).k_d.tolist() == [12, 8, 6]
  with pytest.raises(ValueError, match='sync.k_min_ratio'):
    schedule_lib.make_schedule('semi_sync', 3, 4, 32, t=t, c=c, k_min_ratio=1.5)


def test_k_max_scope_k_base_caps_only_the_slowest_dc():
  """With sync.k_max_scope='k_base' a progress-aware semi_sync schedule that reaches
  K_base = K_max keeps the equal-finish-time split above it; 'every_dc' (the
  thesis's rule) clips every K_d at K_max, i.e. periodic K = K_max."""
  t, c = [0.05 / 3, 0.05 / 2, 0.05], [0.04] * 3
  kw = dict(t=t, c=c, progress_aware=True, progress_window=1)
  every = schedule_lib.make_schedule('semi_sync', 3, 4, 16, **kw)
  base = schedule_lib.make_schedule('semi_sync', 3, 4, 16, k_max_scope='k_base', **kw)
  # K_base 4 -> 8 -> 16 on a flat loss (window 1: a raise every 2 rounds).
  plans_every, _ = run_schedule(every, [1.0] * 6)
  plans_base, _ = run_schedule(base, [1.0] * 6)
  assert [p.k_base for p in plans_every] == [p.k_base for p in plans_base] == [
      4, 4, 8, 8, 16, 16, 16]
  # At K_base = 16: T* = 16 * 0.05 + 0.04 = 0.84 s, K_d = floor((T* - 0.04) / t_d)
  # = (48, 32, 16) (the predicate K_d t_d + C_d <= T*, exact here).
  want = [int(np.floor((16 * 0.05 + 0.04 - 0.04) / td + 1e-9)) for td in t]
  assert want == [48, 32, 16]
  assert plans_base[-1].k_d.tolist() == want
  assert plans_every[-1].k_d.tolist() == [16, 16, 16]
  # Before the cap both agree (K_base = 8: (24, 16, 8) is below 16 for the slowest only).
  assert plans_base[2].k_d.tolist() == [24, 16, 8]
  assert plans_every[2].k_d.tolist() == [16, 16, 8]
  assert schedule_lib.most_k('semi_sync', 16, t, c, 'k_base') == 48
  assert schedule_lib.most_k('semi_sync', 16, t, c, 'every_dc') == 16
  assert schedule_lib.most_k('periodic', 16) == 16
  with pytest.raises(ValueError, match='sync.k_max_scope'):
    schedule_lib.make_schedule('semi_sync', 3, 4, 16, t=t, c=c, k_max_scope='slowest')


def test_k_max_scope_is_refused_where_it_does_nothing(fake_data):
  from tests.helpers import smoke_config  # pylint: disable=g-import-not-at-top
  cfg = smoke_config(fake_data, **{'sync.strategy': 'periodic', 'sync.k_max_scope': 'k_base'})
  with pytest.raises(ValueError, match="sync.k_max_scope='k_base' has no effect"):
    config_lib.validate(cfg)
  cfg = smoke_config(fake_data, **{'sync.strategy': 'semi_sync', 'sync.k_max_scope': 'x'})
  with pytest.raises(ValueError, match='sync.k_max_scope'):
    config_lib.validate(cfg)


def _ks(test, losses, window=3):
  sched = schedule_lib.make_schedule('periodic', 2, 4, 32, progress_aware=True,
                                     progress_window=window, progress_test=test)
  state, ks = sched.init(), []
  for loss in losses:
    _, state = sched.next_round(state, loss)
    ks.append(state.k_base)
  return ks


def test_one_noisy_round_raises_k_under_the_endpoint_test_not_the_window_means():
  # Falling ~2.5% per round, then one round 0.995 (mini-batch noise): the endpoint test
  # compares 0.93 with 0.995 (rel -7% < 1%) and doubles K; the window means compare
  # (1.00 + 0.95 + 0.93) / 3 = 0.96 with (0.90 + 0.88 + 0.995) / 3 = 0.925 (rel +3.6%).
  losses = [1.00, 0.95, 0.93, 0.90, 0.88, 0.995]
  assert _ks('endpoints', losses) == [4, 4, 4, 4, 4, 8]
  assert _ks('window_means', losses) == [4, 4, 4, 4, 4, 4]
  # A true plateau raises K under both (window means after 2 W rounds).
  flat = [0.5] * 6
  assert _ks('endpoints', flat) == [4, 4, 4, 8, 8, 8]
  assert _ks('window_means', flat) == [4, 4, 4, 4, 4, 8]
  with pytest.raises(ValueError, match='sync.progress_test'):
    schedule_lib.make_schedule('periodic', 2, 4, 32, progress_aware=True, progress_test='x')


@pytest.mark.slow
def test_remedies_run_end_to_end(fake_data, tmp_path):
  """semi_sync on 2 DCs 3x apart with every remedy on: samples aggregation, a K_d
  floor, per-DC learning rates (a float ``active``) and FedProx."""
  from tests.helpers import smoke_config  # pylint: disable=g-import-not-at-top
  cfg = smoke_config(fake_data, **{
      'train.num_steps': 12, 'sync.strategy': 'semi_sync', 'network.dc_speed': (3.0, 1.0),
      'sync.aggregation': 'samples', 'sync.k_min_ratio': 0.75, 'sync.lr_scaling': 'inverse_k',
      'sync.prox_mu': 0.1, 'train.checkpoint_every': 0})
  summary = train.train_and_evaluate(cfg, str(tmp_path / 'r'))
  import json  # pylint: disable=g-import-not-at-top
  recs = [json.loads(l) for l in open(tmp_path / 'r' / 'metrics.jsonl')]
  k_d = recs[0]['k_d']
  # The floor ceil(0.75 K_fast) raised the slow DC above K_base = 2.
  assert k_d[1] == int(np.ceil(0.75 * k_d[0])) > 2, k_d
  first = recs[0]['dc_rounds'][0]
  np.testing.assert_allclose(first['weight'], np.array(k_d) / sum(k_d), rtol=1e-6)
  assert first['samples'] == [k * 4 * 8 for k in k_d]
  assert np.isfinite(summary['final_test_loss']) and summary['final_test_accuracy'] > 0.2
