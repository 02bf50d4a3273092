"""Sync strategies as registered objects (hfl.sync.strategies): every registered one
against the schedule's contract, the partial-participation strategy's rounds, the
clock of DCs that sit out, and the step's adoption of the global model."""

import chex
import jax
import numpy as np
import optax
import pytest

from hfl import config as config_lib
from hfl import mesh as mesh_lib
from hfl import network
from hfl import step as step_lib
from hfl.sync import schedule as schedule_lib
from hfl.sync import strategies
from hfl.sync.strategies import partial
from tests.helpers import D, W, mlp_identity, put, step_batches

T = np.array([1.0, 0.5, 0.25, 0.25])  # s per iteration of 4 DCs
C = np.array([0.1, 0.1, 0.1, 0.1])    # s of communication per round
LOSSES = [2.3, 2.0, 1.9, 1.89, 1.888, 1.887, 1.5, 1.4, 1.39, 1.389]


def _schedule(name, **kw):
  return schedule_lib.make_schedule(name, 4, 2, 16, t=T, c=C, **kw)


def _plans(sched, state=None):
  state = state or sched.init()
  plans = [sched.plan(state)]
  for loss in LOSSES:
    plan, state = sched.next_round(state, loss)
    plans.append(plan)
  return plans, state


@pytest.mark.parametrize('name', list(strategies.REGISTRY))
def test_every_registered_strategy_plans_valid_rounds_and_resumes(name):
  """Every registered strategy (built-in or added by a new file) gives K_d >= 1 per DC,
  participation and adoption of the right shapes and ranges, the same plans for the
  same losses, and the same plans again from its JSON state (a resumed run)."""
  sched = _schedule(name)
  plans, _ = _plans(sched)
  for p in plans:
    assert p.k_d.shape == (4,) and p.k_d.dtype.kind == 'i' and np.all(p.k_d >= 1)
    assert 1 <= p.k_base <= 16
    if p.takes_part is not None:
      assert p.takes_part.shape == (4,) and p.takes_part.dtype == bool
    if p.adopt is not None:
      assert p.adopt.shape == (4,) and np.all((p.adopt >= 0) & (p.adopt <= 1))
    assert strategies.get(name).partial or (p.takes_part is None and p.adopt is None)
  again, _ = _plans(_schedule(name))
  assert [p.k_d.tolist() for p in again] == [p.k_d.tolist() for p in plans]
  # Resume after 4 rounds from the JSON text of the state.
  state = sched.init()
  for loss in LOSSES[:4]:
    _, state = sched.next_round(state, loss)
  restored = schedule_lib.state_from_json(schedule_lib.state_to_json(state))
  plan = sched.plan(restored)
  np.testing.assert_array_equal(plan.k_d, plans[4].k_d)


@pytest.mark.parametrize('name', list(strategies.REGISTRY))
def test_every_registered_strategy_is_a_valid_config_with_its_fields(name):
  """The default config carries every strategy's own fields; selecting the strategy
  validates; another strategy's field set away from its default is refused."""
  from configs import default  # pylint: disable=g-import-not-at-top
  c = default.get_config()
  for field, value in strategies.get(name).hyper.items():
    assert c.sync[field] == value
  c.sync.strategy = name
  if strategies.get(name).needs_times:
    c.network.dc_speed = (2.0, 1.0)
  config_lib.validate(c, paths=False)
  for other in strategies.REGISTRY.values():
    for field, value in other.hyper.items():
      if field in strategies.get(name).hyper:
        continue
      c2 = default.get_config()
      c2.sync.strategy = name
      c2.sync[field] = 0.5 if isinstance(value, float) else value
      if c2.sync[field] != value:
        with pytest.raises(ValueError, match=f'sync.{field}=.*has no effect'):
          config_lib.validate(c2, paths=False)


def test_registering_checks_names_and_shared_fields():
  with pytest.raises(ValueError, match='identifier'):
    strategies.register(strategies.Strategy(name='not a name', plan=None))
  with pytest.raises(ValueError, match='also'):
    strategies.register(strategies.Strategy(name='zz_test', plan=None,
                                            hyper={'participation': 0.25}))
  assert 'zz_test' not in strategies.REGISTRY
  with pytest.raises(ValueError, match="sync.strategy must be one of .*'partial'"):
    strategies.get('nope')


def test_partial_takes_dcs_in_turn():
  """Hand-computed cyclic participation: m = ceil(fraction x D) DCs per round."""
  s = lambda frac, d=4: strategies.Settings('partial', d, 2, 16, None, None, False, 3,
                                            0.01, 2.0, hyper={'participation': frac})
  rows = lambda st, n: [np.flatnonzero(partial.participants(st, r)).tolist() for r in range(n)]
  assert rows(s(0.5), 3) == [[0, 1], [2, 3], [0, 1]]
  assert rows(s(0.25), 5) == [[0], [1], [2], [3], [0]]
  assert rows(s(0.5, 3), 4) == [[0, 1], [0, 2], [1, 2], [0, 1]]  # m = 2 of 3, wrapping
  assert rows(s(1 / 3, 3), 3) == [[0], [1], [2]]
  assert rows(s(1.0), 2) == [[0, 1, 2, 3]] * 2
  plan = _schedule('partial', hyper={'participation': 0.5}).plan(
      strategies.ScheduleState(round=1, k_base=2, history=(), loss0=None))
  assert plan.takes_part.tolist() == [False, False, True, True]
  assert plan.adopt.tolist() == [0, 0, 1, 1] and plan.k_d.tolist() == [2] * 4


def test_round_masks_combine_the_plan_with_outages():
  plan = strategies.RoundPlan(np.full(4, 2), 2, np.array([True, True, False, False]),
                              np.array([1, 1, 0, 0], np.float32))
  present, adopt, waits = strategies.round_masks(plan, np.array([True, False, True, True]))
  assert present.tolist() == [True, False, False, False]
  assert adopt.tolist() == [1, 1, 0, 0]  # DC 1 is down: discarded, restarts from the global
  assert waits.tolist() == [True, True, False, False]
  full = strategies.round_masks(strategies.RoundPlan(np.full(2, 1), 1), np.array([True, False]))
  assert [m.tolist() for m in full] == [[True, False], [1, 1], [True, True]]


def test_a_dc_that_sits_out_keeps_its_own_clock():
  """Closed form: DCs 0 and 1 exchange (C = 0.5 s) and wait for the later; DCs 2 and
  3 sit out: their clocks and idle times do not move."""
  clock = network.Clock(np.array([1.0, 3.0, 2.0, 5.0]), np.zeros(4))
  out = network.advance_round(clock, np.array([0.5, 0.5, 0.0, 0.0]),
                              present=np.array([True, True, False, False]),
                              waits=np.array([True, True, False, False]))
  np.testing.assert_allclose(out.time_s, [3.5, 3.5, 2.0, 5.0])
  np.testing.assert_allclose(out.idle_s, [2.0, 0.0, 0.0, 0.0])
  assert out.now == 5.0


def test_partial_config_rules():
  from configs import default  # pylint: disable=g-import-not-at-top
  def refused(match, **fields):
    c = default.get_config()
    c.sync.strategy = 'partial'
    for k, v in fields.items():
      sec, name = k.split('__')
      c[sec][name] = v
    with pytest.raises(ValueError, match=match):
      config_lib.validate(c, paths=False)
  refused(r'sync.participation=0.0 must be a number in \(0, 1\]', sync__participation=0)
  refused(r'sync.participation=1.5', sync__participation=1.5)
  refused("sync.aggregation='fednova' is not supported", sync__aggregation='fednova')
  refused('sync.control_variates', sync__control_variates='scaffold')
  refused("compression.broadcast='downlink' with a lossy downlink", compression__small='bfloat16',
          compression__small_threshold=1000)  # cast small leaves go through the downlink too


def test_the_step_adopts_the_global_model_per_dc():
  """A round with weights (1, 0) and adoption (1, 0): the outer step (SGD, lr 1) moves
  the global model to DC 0's model; DC 0 takes it, DC 1 keeps the model its own two
  local iterations made, exactly as a run without the round (numpy reference: the
  plain step with no round)."""
  net, params, comps = mlp_identity(8)
  params = jax.tree.map(np.array, params)  # host copies: the step donates its state
  mesh = mesh_lib.make_mesh(D, W)
  apply_fn = lambda p, x: net.apply({'params': p}, x)
  opt = optax.sgd(0.1)

  def fresh():
    s = step_lib.init_state(params, opt, optax.sgd(1.0), comps, D, W, jax.random.PRNGKey(1))
    return jax.device_put(s, step_lib.state_shardings(mesh, s))
  make = lambda adoption: step_lib.make_step(apply_fn, opt, optax.sgd(1.0), comps, mesh,
                                             fresh(), adoption=adoption)
  xs, ys = step_batches(2, seed=5)
  act = put(mesh, np.array([True, True]), 'dc')
  batch = lambda t: (put(mesh, xs[t], 'dc', 'worker'), put(mesh, ys[t], 'dc', 'worker'))
  plain, adopting = make(False), make(True)
  ref = fresh()
  for t in range(2):
    ref, _ = plain(ref, batch(t), act, put(mesh, np.zeros(D, np.float32)), False)
  ref_params = jax.tree.map(np.asarray, ref.params)
  state = fresh()
  state, _ = adopting(state, batch(0), act, put(mesh, np.zeros((2, D), np.float32)), False)
  state, m = adopting(state, batch(1), act, put(mesh, np.array([[1, 0], [1, 0]], np.float32)),
                      True)
  got = jax.tree.map(np.asarray, state.params)
  dc = lambda tree, d: jax.tree.map(lambda x: x[d], tree)
  chex.assert_trees_all_close(dc(got, 1), dc(ref_params, 1), atol=1e-6, rtol=1e-6)
  chex.assert_trees_all_close(dc(got, 0), dc(ref_params, 0), atol=1e-6, rtol=1e-6)
  chex.assert_trees_all_close(jax.tree.map(np.asarray, state.global_params),
                              dc(ref_params, 0), atol=1e-6, rtol=1e-6)
  # DC 0 adopted (its local steps restart), DC 1 keeps counting them.
  assert np.asarray(state.local_steps).tolist() == [0, 2]
  hm = step_lib.host_metrics(adopting.info[True], np.asarray(m), np.array([True, True]),
                             np.array([1, 0], np.float32), np.array([1, 0], np.float32))
  assert hm['wan_bits'][1] == 0 and hm['round_down_bits'][1] == 0
  assert hm['wan_bits'][0] > 0 and hm['round_down_bits'][0] > 0


@pytest.mark.slow
def test_partial_runs_end_to_end(fake_data, tmp_path):
  """'partial' with every DC taking part is 'periodic' (same accuracy, bytes, clock);
  with half of them, every DC's training still counts in ``samples``;
  with half of 4 DCs taking part, each round's all-to-all WAN exchange has 2 x 1
  payloads instead of 4 x 3 (identity WAN: 1/6 of the bytes, closed form), and the
  DCs of equal speed never wait."""
  from hfl import train  # pylint: disable=g-import-not-at-top
  from tests.helpers import smoke_config  # pylint: disable=g-import-not-at-top
  base = {'mesh.num_dcs': 4, 'mesh.workers_per_dc': 2, 'train.num_steps': 8,
          'train.checkpoint_every': 0, 'network.dc_speed': (1.0, 1.0, 1.0, 1.0)}
  run = lambda name, **kw: train.train_and_evaluate(
      smoke_config(fake_data, **base, **kw), str(tmp_path / name))
  periodic = run('periodic')
  full = run('full', **{'sync.strategy': 'partial'})
  half = run('half', **{'sync.strategy': 'partial', 'sync.participation': 0.5})
  for key in ('final_test_accuracy', 'bytes', 'sim_time_s', 'idle_s', 'eval_history'):
    assert full[key] == periodic[key], key
  assert half['bytes']['inter_dc'] * 6 == periodic['bytes']['inter_dc']
  # A DC that sits out keeps training: its samples count (8 iterations x 4 DCs x 2 x 8).
  assert half['samples'] == periodic['samples'] == 8 * 4 * 2 * 8
  assert half['inter_dc_rounds'] == periodic['inter_dc_rounds'] == 4
  assert half['idle_s'] == [0.0] * 4 and half['final_test_accuracy'] != periodic[
      'final_test_accuracy']
