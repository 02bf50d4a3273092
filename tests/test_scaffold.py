"""SCAFFOLD control variates between DCs (hfl.sync.scaffold; Karimireddy et al., ICML
2020, Algorithm 1, option II) against a plain numpy loop of the paper's algorithm on
a quadratic problem; its bytes against the lowered program; config validation; an
end-to-end run and its bitwise resume."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from hfl import accounting, config as config_lib, mesh as mesh_lib, network, step as step_lib
from hfl import train
from hfl import workdir as workdir_lib
from hfl.compress import base
from hfl.sync import scaffold
from tests.helpers import B, D, W, mlp_identity, put, run_steps, smoke_config

N = 5          # parameters of the quadratic
LR = 0.05
K = (3, 1)     # local steps per round: DC 0 three, DC 1 one (semi-sync masking)
ROUNDS = 3
P_D = np.array([0.3, 0.7])  # data weights n_d / n = FedAvg's aggregation weights


def _quadratic(params, inputs, labels):
  """One worker's f(x) = 1/2 mean_b (a_b . x - t_b)^2; inputs f32[B, N + 1] = [a_b, t_b]."""
  del labels
  r = inputs[:, :N] @ params['x'] - inputs[:, N]
  return 0.5 * jnp.mean(r * r)


def _grad(x, inputs):
  """numpy float64 gradient of :func:`_quadratic`: A^T (A x - t) / B."""
  a, t = inputs[:, :N].astype(np.float64), inputs[:, N].astype(np.float64)
  return a.T @ (a @ x - t) / len(t)


def _data(seed=0):
  """ROUNDS x max K iterations of per-worker batches [T, D, W, B, N + 1], non-IID:
  each DC's targets come from its own optimum."""
  rng = np.random.default_rng(seed)
  t = ROUNDS * max(K)
  a = rng.normal(size=(t, D, W, B, N))
  opt = rng.normal(size=(D, N)) * 3.0
  tgt = np.einsum('tdwbn,dn->tdwb', a, opt) + 0.1 * rng.normal(size=(t, D, W, B))
  return np.concatenate([a, tgt[..., None]], -1).astype(np.float32)


def _reference(x0, data, lr_fn, scale=(1.0, 1.0), control=True, present=(True, True),
               beta=0.0, nesterov=False):
  """Algorithm 1 of the paper, plain numpy (float64): D clients = DCs, each running
  K[d] local SGD steps on the mean of its W workers' gradients; option II control
  variates; server: x <- x - sum_d p_d (x - y_d) (FedAvg; outer SGD lr 1) and
  c <- c + sum_d p_d (c_d+ - c_d). ``lr_fn(count)`` is the inner learning rate at
  the DC's own step count, times ``scale[d]``. A DC not ``present`` (the paper's
  client outside the sampled set S) keeps its c_d and is left out of the average
  (weights p_d renormalised over the present DCs; the c update keeps p_d, so that
  c = sum_d p_d c_d). With ``beta`` > 0 the local steps are optax's heavy ball
  (m <- g~ + beta m, step lr m; Nesterov: lr (g~ + beta m)), the momentum kept across
  rounds as hfl keeps the optimizer state, and option II divides by the SGD-equivalent
  sum_k lr_k / (1 - beta) (hfl.sync.scaffold.gain). Returns (x, c_d [D, N], c)."""
  agg = P_D * np.asarray(present) / np.sum(P_D * np.asarray(present))
  x = np.asarray(x0, np.float64)
  c, c_d, count, mom = np.zeros(N), np.zeros((D, N)), [0] * D, np.zeros((D, N))
  for r in range(ROUNDS):
    ys, new_c = [], np.zeros((D, N))
    for d in range(D):
      y, lr_sum = x.copy(), 0.0
      for k in range(K[d]):
        t = r * max(K) + k
        g = np.mean([_grad(y, data[t, d, w]) for w in range(W)], axis=0)
        eta = lr_fn(count[d]) * scale[d]
        count[d] += 1
        g = g - c_d[d] + c if control else g
        mom[d] = g + beta * mom[d]
        y = y - eta * (g + beta * mom[d] if nesterov else mom[d])
        lr_sum += eta / (1.0 - beta)
      new_c[d] = c_d[d] - c + (x - y) / lr_sum if present[d] else c_d[d]  # option II
      ys.append(y)
    x = x - sum(agg[d] * (x - ys[d]) for d in range(D))
    c = c + sum(P_D[d] * (new_c[d] - c_d[d]) for d in range(D))
    c_d = new_c
  return x, c_d, c


def _run(opt, lr, data, scale=None, control=True, mode='mesh', weights=P_D, shard=False):
  """The step with the quadratic loss, ROUNDS semi-sync rounds of K: on a (D, W) mesh,
  or (``mode='vmap'``) the same hierarchy simulated on one device."""
  mesh = mesh_lib.make_mesh(D, W) if mode == 'mesh' else mesh_lib.make_mesh(
      1, 1, jax.devices()[:1])
  params = {'x': np.zeros(N, np.float32)}
  ident = [base.identity((N,))]
  comps = step_lib.Compressors(ident, ident, ident)
  outer = optax.sgd(1.0)
  state = step_lib.init_state(params, opt, outer, comps, D, W, jax.random.PRNGKey(1),
                              scaffold=control, shard_state=shard)
  state = jax.device_put(state, step_lib.state_shardings(mesh, state))
  spec = scaffold.spec(P_D, lr) if control else None
  fn = step_lib.make_step(None, opt, outer, comps, mesh, state, scaffold=spec,
                          loss_fn=_quadratic, mode=mode, shape=(D, W))
  active, rounds = [], []
  for _ in range(ROUNDS):
    for it in range(max(K)):
      on = np.array([it < k for k in K])
      active.append(on if scale is None else np.where(on, scale, 0.0).astype(np.float32))
      rounds.append(it + 1 == max(K))
  labels = np.zeros(data.shape[:4], np.int32)
  state, m = run_steps(mesh, fn, state, data, labels, active,
                       np.asarray(weights, np.float32), rounds)
  return state, m


@pytest.mark.parametrize('case', ['constant', 'lr_scaling', 'schedule', 'schedule_zero1'])
def test_rounds_equal_numpy_algorithm_1_option_ii(case):
  """Global model, every c_d and c after 3 rounds of K_d = (3, 1) equal the paper's
  Algorithm 1 in numpy: with a constant learning rate (Σ η = K_d η), with per-DC
  multipliers (sync.lr_scaling: η_d = η s_d) and with a schedule evaluated at each
  DC's own update count (Σ_k η_{d,k}), also with ZeRO-1's sharded optimizer state."""
  data = _data()
  sched = optax.linear_schedule(LR, LR / 5, 6)
  lr = sched if case.startswith('schedule') else LR
  scale = (1.0, 0.5) if case == 'lr_scaling' else None
  state, _ = _run(optax.sgd(lr), lr, data, scale, shard=case == 'schedule_zero1')
  lr_fn = (lambda n: float(sched(n))) if case.startswith('schedule') else (lambda n: LR)
  x, c_d, c = _reference(np.zeros(N), data, lr_fn, scale or (1.0, 1.0))
  np.testing.assert_allclose(np.asarray(state.global_params['x']), x, rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose(np.asarray(state.scaffold.c['x']), c_d, rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose(np.asarray(state.scaffold_c['x']), c, rtol=2e-5, atol=2e-5)
  # c is the data-weighted mean of the c_d; the learning-rate sums restart each round.
  np.testing.assert_allclose(c, P_D @ c_d, rtol=1e-9, atol=1e-12)
  assert np.asarray(state.scaffold.lr_sum).tolist() == [0.0, 0.0]
  assert np.asarray(state.scaffold.count).tolist() == [ROUNDS * K[0], ROUNDS * K[1]]
  # The corrections mattered: plain FedAvg ends elsewhere.
  plain, _, _ = _reference(np.zeros(N), data, lr_fn, scale or (1.0, 1.0), control=False)
  assert np.abs(plain - x).max() > 100 * 2e-5


@pytest.mark.parametrize('nesterov', [False, True])
def test_momentum_uses_the_sgd_equivalent_learning_rate(nesterov):
  """Heavy-ball and Nesterov inner optimizers (configs/default.py's 'momentum', β =
  0.9): η = lr / (1 - β) in option II, against the numpy loop with optax's momentum."""
  beta, data = 0.9, _data(seed=4)
  cfg = smoke_config('/nonexistent', **{'optimizer.name': 'nesterov' if nesterov else 'momentum',
                                        'optimizer.momentum': beta})
  g = scaffold.gain(cfg.optimizer)
  assert g == pytest.approx(10.0) and scaffold.gain(smoke_config('/x').optimizer) == 1.0
  opt = optax.sgd(LR, momentum=beta, nesterov=nesterov)
  mesh = mesh_lib.make_mesh(D, W)
  ident = [base.identity((N,))]
  comps = step_lib.Compressors(ident, ident, ident)
  state = step_lib.init_state({'x': np.zeros(N, np.float32)}, opt, optax.sgd(1.0), comps, D, W,
                              jax.random.PRNGKey(1), scaffold=True)
  state = jax.device_put(state, step_lib.state_shardings(mesh, state))
  fn = step_lib.make_step(None, opt, optax.sgd(1.0), comps, mesh, state,
                          scaffold=scaffold.spec(P_D, LR, g), loss_fn=_quadratic)
  active = [np.array([it < k for k in K]) for _ in range(ROUNDS) for it in range(max(K))]
  rounds = [it + 1 == max(K) for _ in range(ROUNDS) for it in range(max(K))]
  state, _ = run_steps(mesh, fn, state, data, np.zeros(data.shape[:4], np.int32), active,
                       P_D.astype(np.float32), rounds)
  x, c_d, c = _reference(np.zeros(N), data, lambda n: LR, beta=beta, nesterov=nesterov)
  np.testing.assert_allclose(np.asarray(state.global_params['x']), x, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(np.asarray(state.scaffold.c['x']), c_d, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(np.asarray(state.scaffold_c['x']), c, rtol=1e-4, atol=1e-4)


def test_one_device_simulation_equals_the_reference():
  """mesh.simulate's vmap path (the whole hierarchy on one device) runs the same
  Algorithm 1: the state keeps the mesh path's layout ([D, ...] control variates)."""
  data = _data(seed=5)
  state, _ = _run(optax.sgd(LR), LR, data, mode='vmap')
  x, c_d, c = _reference(np.zeros(N), data, lambda n: LR)
  np.testing.assert_allclose(np.asarray(state.global_params['x']), x, rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose(np.asarray(state.scaffold.c['x']), c_d, rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose(np.asarray(state.scaffold_c['x']), c, rtol=2e-5, atol=2e-5)


def test_an_absent_dc_keeps_its_control_variate_and_sends_nothing():
  """DC 1 absent from every round (aggregation weight 0, hfl.sync.faults): its c_d stays
  0, c = p_0 c_0, the global model follows DC 0 alone, and it is charged no WAN bits."""
  data = _data(seed=9)
  state, m = _run(optax.sgd(LR), LR, data, weights=(1.0, 0.0))
  x, c_d, c = _reference(np.zeros(N), data, lambda n: LR, present=(True, False))
  assert not c_d[1].any() and np.abs(c_d[0]).max() > 0.1
  np.testing.assert_allclose(np.asarray(state.global_params['x']), x, rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose(np.asarray(state.scaffold.c['x']), c_d, rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose(np.asarray(state.scaffold_c['x']), c, rtol=2e-5, atol=2e-5)
  assert m['wan_bits'].tolist() == [2 * 32 * N, 0]


def test_an_outage_rolls_back_the_absent_dcs_scaffold_state():
  """hfl.sync.faults: the loop restores an absent DC's round-start state
  (step.discard_absent), SCAFFOLD's c_d, learning-rate sum and update count included
  (the count stays the inner optimizer's, which is rolled back too)."""
  ident = [base.identity((N,))]
  comps = step_lib.Compressors(ident, ident, ident)
  state = step_lib.init_state({'x': np.zeros(N, np.float32)}, optax.sgd(LR), optax.sgd(1.0),
                              comps, D, W, jax.random.PRNGKey(1), scaffold=True)
  start = step_lib.round_start(state)
  moved = state._replace(scaffold=scaffold.DCState(
      {'x': jnp.ones((D, N))}, jnp.array([0.3, 0.1]), jnp.array([3, 1], jnp.int32)))
  back = step_lib.discard_absent(moved, start, np.array([True, False]))
  np.testing.assert_array_equal(back.scaffold.c['x'], [[1.0] * N, [0.0] * N])
  np.testing.assert_array_equal(back.scaffold.lr_sum, np.array([0.3, 0.0], np.float32))
  assert back.scaffold.count.tolist() == [3, 0]


def test_none_builds_no_control_variates_and_is_the_plain_run():
  """'none' (the default): no SCAFFOLD leaves in the state (checkpoints unchanged) and
  the step equals plain local SGD + FedAvg of the same numpy loop."""
  data = _data(seed=3)
  state, _ = _run(optax.sgd(LR), LR, data, control=False)
  assert state.scaffold == () and state.scaffold_c == ()
  plain, _, _ = _reference(np.zeros(N), data, lambda n: LR, control=False)
  np.testing.assert_allclose(np.asarray(state.global_params['x']), plain, rtol=2e-5, atol=2e-5)
  with pytest.raises(ValueError, match='control variates'):
    ident = [base.identity((N,))]
    comps = step_lib.Compressors(ident, ident, ident)
    step_lib.make_step(None, optax.sgd(LR), optax.sgd(1.0), comps, mesh_lib.make_mesh(D, W),
                       state, scaffold=scaffold.spec(P_D, LR), loss_fn=_quadratic)


def test_option_ii_update_and_correction_closed_form():
  c_d = {'x': jnp.array([1.0, -2.0])}
  c = {'x': jnp.array([0.5, 0.5])}
  pseudo = {'x': jnp.array([0.3, 0.6])}
  got = scaffold.update(c_d, c, pseudo, jnp.float32(0.15))
  np.testing.assert_allclose(got['x'], [1.0 - 0.5 + 2.0, -2.0 - 0.5 + 4.0], rtol=1e-6)
  # No learning rate summed (a warm-up's first update): c_d is kept, not 0 / 0.
  kept = scaffold.update(c_d, c, pseudo, jnp.float32(0.0))
  np.testing.assert_array_equal(kept['x'], c_d['x'])
  np.testing.assert_allclose(scaffold.correction(c_d, c)['x'], [-0.5, 2.5])
  assert scaffold.payload_bits({'a': jnp.zeros((3, 4)), 'b': jnp.zeros(5)}) == 32 * 17


def _lowered(fn, mesh, state, do_round):
  rng = np.random.default_rng(0)
  x = put(mesh, rng.normal(size=(D, W, B, 8, 8, 1)).astype(np.float32), 'dc', 'worker')
  y = put(mesh, rng.integers(0, 10, size=(D, W, B)).astype(np.int32), 'dc', 'worker')
  act, wts = put(mesh, np.array([True, True]), 'dc'), put(mesh, np.array([.5, .5], np.float32))
  text = fn.jitted[do_round].lower(state, x, y, act, wts).as_text()
  state, m = fn(state, (x, y), act, wts, do_round)
  return text, step_lib.host_metrics(fn.info[do_round], np.asarray(m), np.array([True, True]),
                                     np.array([.5, .5], np.float32))


def test_control_variate_deltas_are_charged_as_a_second_float32_wan_payload():
  """The round with SCAFFOLD moves, over 'dc', the pseudo-gradient and the c_d deltas
  (float32, all-reduced in 1/W slices) and re-gathers both over 'worker'; hfl charges
  exactly 32 bits per parameter more per DC on inter_dc, W x that more on the
  round's fan-out (intra_down), and the lowered program's collectives grow by the
  same bytes (up to the padding of the fused buffer to a multiple of W entries)."""
  mesh = mesh_lib.make_mesh(D, W)
  net, params, comps = mlp_identity(8)
  params = jax.tree.map(np.array, params)  # the step donates its state's buffers
  n = sum(int(l.size) for l in jax.tree.leaves(params))
  apply_fn = lambda p, x: net.apply({'params': p}, x)
  out = {}
  for on in (False, True):
    state = step_lib.init_state(params, optax.sgd(0.1), optax.sgd(1.0), comps, D, W,
                                jax.random.PRNGKey(1), scaffold=on)
    state = jax.device_put(state, step_lib.state_shardings(mesh, state))
    fn = step_lib.make_step(apply_fn, optax.sgd(0.1), optax.sgd(1.0), comps, mesh, state,
                            scaffold=scaffold.spec([.5, .5], 0.1) if on else None)
    text, m = _lowered(fn, mesh, state, True)
    out[on] = (accounting.collective_totals(text, mesh), m)
  (t0, m0), (t1, m1) = out[False], out[True]
  assert (m1['wan_bits'] - m0['wan_bits']).tolist() == [32 * n] * D
  assert (m1['round_down_bits'] - m0['round_down_bits']).tolist() == [W * 32 * n] * D
  assert (m1['up_bits'] == m0['up_bits']).all() and (m1['down_bits'] == m0['down_bits']).all()
  padded = -(-n // W) * W * 4  # one fused float32 buffer, padded to a multiple of W
  assert t1['dc'] - t0['dc'] == D * padded
  assert t1['worker'] - t0['worker'] == D * padded
  assert 0 <= D * padded - D * 4 * n < D * W * 4
  # The inter-DC link: each DC's payload reaches the other D - 1.
  both = np.array([True, True])
  assert network.link_bits(m1['wan_bits'], both) == (
      network.link_bits(m0['wan_bits'], both) + D * (D - 1) * 32 * n)


@pytest.mark.parametrize('overrides,match', [
    ({'sync.control_variates': 'scafold'}, r"sync.control_variates='scafold' is unknown; "
                                           r'allowed: none, scaffold'),
    ({'sync.control_variates': 'scaffold', 'sync.strategy': 'sync'},
     r"sync.control_variates='scaffold' has no effect with sync.strategy='sync'"),
    ({'sync.control_variates': 'scaffold', 'sync.fragments': 2},
     r"sync.control_variates='scaffold': Streaming DiLoCo .* needs "
     r"sync.control_variates='none'"),
])
def test_config_refuses_scaffold_where_it_makes_no_sense(fake_data, overrides, match):
  cfg = smoke_config(fake_data, **overrides)
  with pytest.raises(ValueError, match=match):
    config_lib.validate(cfg)


def test_older_configs_run_without_control_variates():
  old = {'sync': {'strategy': 'periodic'}}
  assert workdir_lib.upgrade_config(old)['sync']['control_variates'] == 'none'
  assert not scaffold.enabled({}) and scaffold.enabled({'control_variates': 'scaffold'})
  assert scaffold.spec_from_config(smoke_config('/nonexistent'), [0.5, 0.5]) is None


def _semi_sync_scaffold(data_dir, **more):
  return smoke_config(data_dir, **{'sync.strategy': 'semi_sync', 'network.dc_speed': (3.0, 1.0),
                                   'sync.control_variates': 'scaffold', 'train.num_steps': 16,
                                   'train.checkpoint_every': 1, **more})


@pytest.mark.slow
def test_semi_sync_scaffold_trains_and_resumes_bitwise(fake_data, tmp_path, monkeypatch):
  """configs/smoke.py, semi_sync on 2 DCs 3x apart with SCAFFOLD: finite loss, the WAN
  charged twice the model per DC and round, and a run interrupted mid-round resumes
  to bitwise the same state (control variates included) and summary."""
  from tests.helpers import crash_then_resume, final_state  # pylint: disable=g-import-not-at-top
  ref = train.train_and_evaluate(_semi_sync_scaffold(fake_data), str(tmp_path / 'ref'))
  assert np.isfinite(ref['final_test_loss']) and ref['final_test_accuracy'] > 0.2
  plain = train.train_and_evaluate(
      _semi_sync_scaffold(fake_data, **{'sync.control_variates': 'none'}), str(tmp_path / 'p'))
  # Per round (K_d may differ: the plan counts the second payload), twice the WAN bytes.
  assert ref['bytes']['inter_dc'] * plain['inter_dc_rounds'] == (
      2 * plain['bytes']['inter_dc'] * ref['inter_dc_rounds'])
  summary = crash_then_resume(lambda: _semi_sync_scaffold(fake_data), str(tmp_path / 'cut'),
                              monkeypatch, 7)
  step_a, a = final_state(str(tmp_path / 'ref'))
  step_b, b = final_state(str(tmp_path / 'cut'))
  assert step_a == step_b and 'scaffold' in a and jax.tree.leaves(a['scaffold_c'])
  chex.assert_trees_all_equal(a, b)
  for key in ('final_test_accuracy', 'bytes', 'sim_time_s', 'inter_dc_rounds', 'eval_history'):
    assert summary[key] == ref[key], key
