"""Streaming DiLoCo (hfl.sync.streaming, hfl.step.stream_event) against hand-written
schedules and a plain per-DC reference loop."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from hfl import mesh as mesh_lib, models, step as step_lib
from hfl.compress import base, minifloat, sparse
from hfl.sync import streaming
from tests.helpers import D, W, put, step_batches

LR = 0.1


# ------------------------------------------------------------------ schedule, partition


def test_schedule_against_a_hand_written_table():
  """H = 8, P = 4, τ = 1: a fragment every 2 iterations, in the order 1, 2, 3, 0,
  each merged one iteration later."""
  table = {  # s: (sync, merge)
      1: (-1, -1), 2: (1, -1), 3: (-1, 1), 4: (2, -1), 5: (-1, 2), 6: (3, -1),
      7: (-1, 3), 8: (0, -1), 9: (-1, 0), 10: (1, -1), 11: (-1, 1), 16: (0, -1),
      17: (-1, 0)}
  for s, (sync, merge) in table.items():
    assert streaming.event_at(s, 8, 4, 1) == streaming.Event(sync, merge), s
  # P = 1, τ = 0 is periodic: sync and merge of the whole model every K.
  assert [streaming.event_at(s, 3, 1, 0) for s in range(1, 7)] == [
      streaming.Event(), streaming.Event(), streaming.Event(0, 0)] * 2
  # τ = 0 merges at once; H = 4, P = 2: fragment 1 at 2, 6; fragment 0 at 4, 8.
  assert [streaming.event_at(s, 4, 2, 0).sync for s in range(1, 9)] == [
      -1, 1, -1, 0, -1, 1, -1, 0]


@pytest.mark.parametrize('kw,match', [
    (dict(k=8, num_fragments=3, overlap_steps=0, alpha=0.0, eager=False), 'must divide'),
    (dict(k=8, num_fragments=4, overlap_steps=2, alpha=0.0, eager=False), r'\[0, 2\)'),
    (dict(k=8, num_fragments=0, overlap_steps=0, alpha=0.0, eager=False), 'fragments=0'),
    (dict(k=8, num_fragments=2, overlap_steps=1, alpha=1.5, eager=False), 'mixing_alpha'),
    (dict(k=8, num_fragments=2, overlap_steps=0, alpha=0.0, eager=True), 'overlap_steps >= 1'),
])
def test_check_names_the_field(kw, match):
  with pytest.raises(ValueError, match=match):
    streaming.check(**kw)


def test_partition_by_layer_units_balanced():
  net = models.get_model('mlp', 10)  # Dense_0 16640, Dense_1 32896, Dense_2 1290 entries
  params = net.init(jax.random.PRNGKey(0), jnp.zeros((1, 8, 8, 1)))['params']
  assert streaming.partition(params, 1) == ((0, 1, 2, 3, 4, 5),)
  assert streaming.partition(params, 2) == ((0, 1), (2, 3, 4, 5))
  assert streaming.partition(params, 3) == ((0, 1), (2, 3), (4, 5))
  with pytest.raises(ValueError, match='sync.fragments=4 exceeds'):
    streaming.partition(params, 4)
  # Natural order of unit names: Block_2 before Block_10; the minimax cut.
  tree = {f'Block_{i}': {'w': jnp.zeros((s,))} for i, s in
          zip([0, 1, 2, 10], [5, 5, 5, 5])}
  assert [u[0] for u in streaming.units(tree)] == ['Block_0', 'Block_1', 'Block_2', 'Block_10']
  assert streaming.partition(tree, 2) == ((0, 1), (2, 3))  # leaves order: 0, 1, 10, 2
  assert '| 1 | Block_2, Block_10 | 2 | 10 |' in streaming.describe(
      streaming.partition(tree, 2), tree)


# ------------------------------------------------------------------ the step


def _setup(outer, wan=base.identity, stream=None):
  mesh = mesh_lib.make_mesh(D, W)
  net = models.get_model('mlp', 10)
  params = jax.tree.map(np.array, net.init(jax.random.PRNGKey(0),
                                           jnp.zeros((1, 8, 8, 1)))['params'])
  leaves = jax.tree.leaves(params)
  comps = step_lib.Compressors([base.identity(l.shape) for l in leaves],
                               [base.identity(l.shape) for l in leaves],
                               [wan(l.shape) for l in leaves])
  opt = optax.sgd(LR)
  state = step_lib.init_state(params, opt, outer, comps, D, W, jax.random.PRNGKey(1),
                              stream=stream)
  state = jax.device_put(state, step_lib.state_shardings(mesh, state))
  apply_fn = lambda p, x: net.apply({'params': p}, x)
  fn = step_lib.make_step(apply_fn, opt, outer, comps, mesh, state, stream=stream)
  return mesh, params, apply_fn, state, fn


def _run(mesh, fn, state, xs, ys, weights, events):
  metrics = []
  for t in range(len(xs)):
    state, m = fn(state, (put(mesh, xs[t], 'dc', 'worker'), put(mesh, ys[t], 'dc', 'worker')),
                  put(mesh, np.ones(D, bool), 'dc'), put(mesh, np.asarray(weights, np.float32)),
                  events[t])
    jax.block_until_ready(state)
    metrics.append(m)
  return state, metrics


NESTEROV = optax.sgd(0.7, momentum=0.9, nesterov=True)


@pytest.mark.parametrize('wan', [base.identity, minifloat.e3m0])
def test_one_fragment_no_overlap_is_bitwise_periodic_diloco(wan):
  """P = 1, τ = 0, α = 0 through stream_event gives bitwise the parameters, global
  model, outer state and WAN residuals of the periodic round (inter_dc_round)."""
  k, steps = 3, 6
  weights = np.array([0.4, 0.6], np.float32)
  xs, ys = step_batches(steps, seed=3)
  mesh, params, _, s0, periodic = _setup(NESTEROV, wan)
  spec = streaming.Spec(streaming.partition(params, 1))
  _, _, _, s1, stream = _setup(NESTEROV, wan, spec)
  a, _ = _run(mesh, periodic, s0, xs, ys, weights, [(t + 1) % k == 0 for t in range(steps)])
  events = [streaming.event_at(t + 1, k, 1, 0) for t in range(steps)]
  b, _ = _run(mesh, stream, s1, xs, ys, weights, events)
  same = lambda x, y: jax.tree.all(jax.tree.map(
      lambda u, v: np.array_equal(np.asarray(u), np.asarray(v)), x, y))
  assert same(a.params, b.params) and same(a.global_params, b.global_params)
  assert same(a.wan.residual, b.wan.residual)
  assert same(jax.tree.leaves(a.outer_state), jax.tree.leaves(b.outer_state))
  if wan is minifloat.e3m0:  # the lossy WAN did leave residuals
    assert any(np.abs(np.asarray(r)).max() > 0 for r in jax.tree.leaves(b.wan.residual))


def _nesterov(g, m, delta, lr=0.7, mu=0.9):
  """optax's Nesterov form: m <- mu m + Δ; g <- g - lr (mu m + Δ)."""
  m = mu * m + delta
  return g - lr * (mu * m + delta), m


def _reference(params, apply_fn, xs, ys, weights, k, frags, tau, alpha, eager):
  """Plain per-DC loop: inner SGD per DC (mean of W workers' gradients); fragment
  p's exchange at s ≡ p k / P (mod k), merged τ iterations later."""
  loss = lambda p, x, y: optax.softmax_cross_entropy_with_integer_labels(
      apply_fn(p, x), y).mean()
  treedef = jax.tree.structure(params)
  leaves = lambda t: [np.asarray(v, np.float64) for v in jax.tree.leaves(t)]
  g = leaves(params)
  m = [np.zeros_like(v) for v in g]
  x = [list(g) for _ in range(D)]
  stand_in = [list(g) for _ in range(D)]
  period, num = k // len(frags), len(frags)
  for t in range(len(xs)):
    for d in range(D):
      p32 = treedef.unflatten([jnp.asarray(v, jnp.float32) for v in x[d]])
      grads = [leaves(jax.grad(loss)(p32, xs[t, d, w], ys[t, d, w])) for w in range(W)]
      x[d] = [v - LR * sum(gr[i] for gr in grads) / W for i, v in enumerate(x[d])]
    s = t + 1
    if s % period == 0:  # sync
      for i in frags[(s // period) % num]:
        deltas = [g[i] - x[d][i] for d in range(D)]
        if eager:
          for d in range(D):
            stand_in[d][i] = _nesterov(g[i], m[i], deltas[d])[0]
            x[d][i] = stand_in[d][i]
        g[i], m[i] = _nesterov(g[i], m[i], sum(weights[d] * deltas[d] for d in range(D)))
    if s > tau and (s - tau) % period == 0:  # merge
      for i in frags[((s - tau) // period) % num]:
        for d in range(D):
          x[d][i] = (x[d][i] + g[i] - stand_in[d][i] if eager
                     else alpha * x[d][i] + (1 - alpha) * g[i])
  return x, g


@pytest.mark.parametrize("tau,alpha,eager", [(1, 0.25, False), (1, 0.0, False), (1, 0.0, True)])
def test_delayed_merge_against_a_per_dc_reference_loop(tau, alpha, eager):
  """P = 2 fragments of the MLP (Dense_0 | Dense_1 + Dense_2), H = 4, DiLoCo's
  Nesterov outer step per fragment: params after 9 iterations (4 syncs, each merged
  τ later) equal the reference loop's within float32 rounding of 9 SGD steps."""
  k, steps = 4, 9
  weights = np.array([0.3, 0.7], np.float32)
  xs, ys = step_batches(steps, seed=7)
  mesh, params, apply_fn, _, _ = _setup(NESTEROV)
  frags = streaming.partition(params, 2)
  assert frags == ((0, 1), (2, 3, 4, 5))
  spec = streaming.Spec(frags, alpha, eager)
  _, _, _, state, fn = _setup(NESTEROV, stream=spec)
  events = [streaming.event_at(t + 1, k, 2, tau) for t in range(steps)]
  state, _ = _run(mesh, fn, state, xs, ys, weights, events)
  x_ref, g_ref = _reference(params, apply_fn, xs, ys, weights, k, frags, tau, alpha, eager)
  for i, v in enumerate(jax.tree.leaves(state.global_params)):
    np.testing.assert_allclose(np.asarray(v), g_ref[i], rtol=1e-5, atol=1e-5)
  for d in range(D):
    for i, v in enumerate(jax.tree.leaves(state.params)):
      np.testing.assert_allclose(np.asarray(v)[d], x_ref[d][i], rtol=1e-5, atol=1e-5)
  # The DC models differ (fragment 1 last synced at s = 6 with local steps since).
  p = [np.asarray(v) for v in jax.tree.leaves(state.params)]
  assert not np.array_equal(p[2][0], p[2][1])


@pytest.mark.parametrize('wan', [base.identity, minifloat.e3m0,
                                 lambda s: sparse.topk(s, 0.05)])
def test_fragment_bytes_equal_the_lowered_hlo_collectives(wan):
  """A sync event of fragment p moves exactly fragment p's WAN payload over 'dc'
  (each of the DC's W workers sends 1/W of the fused buffer, padded to a multiple
  of W entries: a float32 all-reduce for identity, one all-gather of bytes for
  E3M0 and top-k), counted as wan_bits; a merge-only iteration moves nothing over 'dc'."""
  from hfl import accounting
  from hfl.compress import policy
  mesh, params, _, _, _ = _setup(NESTEROV)
  frags = streaming.partition(params, 2)
  _, _, _, state, fn = _setup(NESTEROV, wan, streaming.Spec(frags, 0.5))
  xs, ys = step_batches(1, seed=2)
  leaves = jax.tree.leaves(params)
  counted_all = 0
  for event in (streaming.Event(1, -1), streaming.Event(-1, 1), streaming.Event(0, -1)):
    args = (put(mesh, xs[0], 'dc', 'worker'), put(mesh, ys[0], 'dc', 'worker'),
            put(mesh, np.ones(D, bool), 'dc'), put(mesh, np.full(D, .5, np.float32)))
    state, m = fn(state, args[:2], *args[2:], event)
    text = fn.jitted[event].lower(state, *args).as_text()
    host = step_lib.host_metrics(fn.info[event], np.asarray(m), np.ones(D, bool),
                                 np.full(D, .5, np.float32))
    totals = accounting.collective_totals(text, mesh)
    if event.sync < 0:
      assert 'dc' not in totals and not host['wan_bits'].any()
      continue
    comps = [wan(leaves[i].shape) for i in frags[event.sync]]
    counted = sum(policy.static_bits(c) for c in comps) // 8
    assert list(host['wan_bits']) == [8 * counted] * D
    # Padding in buffer entries: float32 for the all-reduced identity payloads,
    # bytes for the all-gathered (packed) ones.
    size = 4 if wan is base.identity else 1
    assert totals['dc'] == D * size * (-(-(counted // size) // W) * W), (totals, counted)
    counted_all += counted
  whole = sum(policy.static_bits(wan(l.shape)) for l in leaves) // 8
  assert counted_all == whole  # the fragments' payloads add up to the model's


# ------------------------------------------------------------------ config and loop

STREAM_BAD = [
    ({'sync.fragments': 3}, 'sync.fragments=3 must divide sync.k=2'),
    ({'sync.overlap_steps': 2}, 'sync.overlap_steps=2'),
    ({'sync.mixing_alpha': 1.5}, 'sync.mixing_alpha=1.5'),
    ({'sync.eager': True}, 'sync.eager=True needs sync.overlap_steps'),
    ({'sync.fragments': 2, 'sync.strategy': 'semi_sync'}, "sync.strategy='semi_sync'"),
    ({'sync.fragments': 2, 'sync.aggregation': 'fednova'}, "sync.aggregation='fednova'"),
    ({'sync.fragments': 2, 'sync.faults': '1:1-2'}, "sync.faults='1:1-2'"),
    ({'sync.fragments': 2, 'sync.k': 4, 'train.num_steps': 13}, 'train.num_steps=13'),
    ({'sync.fragments': 4, 'sync.k': 4}, 'sync.fragments=4 exceeds the model'),
    ({'sync.fragments': 2, 'sync.prox_mu': 0.1}, 'sync.prox_mu=0.1'),
    ({'sync.fragments': 2, 'sync.lr_scaling': 'inverse_k'}, "sync.lr_scaling='inverse_k'"),
    ({'sync.fragments': 2, 'train.num_steps': 0, 'train.sim_time_budget_s': 1.0},
     'train.sim_time_budget_s=1.0'),
]


@pytest.mark.parametrize('overrides,message', STREAM_BAD, ids=[b[1] for b in STREAM_BAD])
def test_bad_streaming_config_fails_before_compilation(fake_data, tmp_path, overrides,
                                                       message, monkeypatch):
  from hfl import train
  from tests.helpers import smoke_config
  def no_compile(*a, **k):
    raise AssertionError('compiled before validating the config')
  monkeypatch.setattr(jax, 'jit', no_compile)
  with pytest.raises(ValueError) as e:
    train.train_and_evaluate(smoke_config(fake_data, **overrides), str(tmp_path / 'w'))
  assert message in str(e.value)
  assert not os.path.exists(tmp_path / 'w')


@pytest.mark.slow
def test_streaming_run_resumes_bitwise_and_records_the_wan_exposure(fake_data, tmp_path,
                                                                    monkeypatch):
  """2 fragments, τ = 1, eager, E3M0 WAN: a run interrupted at step 5 resumes to
  the uninterrupted run's state; the summary holds the WAN exposure fields, with
  a sync event every 2 iterations moving one fragment."""
  from hfl import train
  from tests.helpers import crash_then_resume, final_state, smoke_config
  cfg = {'sync.k': 4, 'sync.fragments': 2, 'sync.overlap_steps': 1, 'sync.eager': True,
         'compression.wan.name': 'e3m0', 'sync.outer.name': 'nesterov',
         'sync.outer.learning_rate': 0.7, 'sync.outer.momentum': 0.9,
         'train.num_steps': 8, 'train.eval_every': 2, 'train.checkpoint_every': 1}
  ref_dir, cut_dir = str(tmp_path / 'ref'), str(tmp_path / 'cut')
  ref = train.train_and_evaluate(smoke_config(fake_data, **cfg), ref_dir)
  summary = crash_then_resume(lambda: smoke_config(fake_data, **cfg), cut_dir, monkeypatch, 5)
  chex_equal = lambda a, b: jax.tree.all(jax.tree.map(np.array_equal, a, b))
  assert chex_equal(final_state(ref_dir)[1], final_state(cut_dir)[1])
  for key in ('bytes', 'sim_time_s', 'exposed_wan_s', 'peak_wan_bytes_per_sync',
              'wan_mbps_for_95pct_utilisation', 'final_test_accuracy'):
    assert summary[key] == ref[key], key
  assert ref['inter_dc_rounds'] == 4
  # The peak event is the larger fragment (Dense_0: 784 x 256 + 256 entries), E3M0
  # kernel (4 bits + a float32 scale) and float32 bias, sent to the one other DC.
  assert ref['peak_wan_bytes_per_sync'] == 2 * (784 * 256 // 2 + 4 + 256 * 4)
  assert ref['wan_mbps_for_95pct_without_latency'] > 0
  assert 0 <= ref['exposed_wan_s'] < ref['sim_time_s']
  assert 0 < ref['compute_utilisation'] < 1


@pytest.mark.slow
def test_an_extended_streaming_run_is_accounted_as_a_fresh_one(fake_data, tmp_path):
  """Issue 51, fault 1: 2 fragments, τ = 1, E3M0 WAN, 8 iterations, rerun with
  ``train.num_steps=12``. The state was bitwise the fresh 12-step run's, but the 8-step
  run's last sync event, charged whole (nothing followed to hide it), stayed on the
  checkpointed clock: sim_time_s 0.7723 s against 0.7235 s, exposed_wan_s 0.0977 s
  against 0.0489 s. The two runs do the same float operations in the same order, so
  the summaries and the evaluation records are equal exactly, apart from the
  wall-clock fields, changed_on_resume and provenance (the record of each start)."""
  import json  # pylint: disable=g-import-not-at-top
  from hfl import train  # pylint: disable=g-import-not-at-top
  from tests.helpers import final_state, smoke_config  # pylint: disable=g-import-not-at-top
  cfg = {'sync.k': 4, 'sync.fragments': 2, 'sync.overlap_steps': 1,
         'compression.wan.name': 'e3m0'}
  ext_dir, fresh_dir = str(tmp_path / 'extended'), str(tmp_path / 'fresh')
  short = train.train_and_evaluate(smoke_config(fake_data, **cfg, **{'train.num_steps': 8}),
                                   ext_dir)
  # The stopped run is charged its last transfer whole; its last evaluation, like
  # every other, is stamped with the clock of the round it follows.
  assert short['sim_time_s'] > short['eval_history'][-1]['sim_time_s']
  ext = train.train_and_evaluate(smoke_config(fake_data, **cfg, **{'train.num_steps': 12}),
                                 ext_dir)
  fresh = train.train_and_evaluate(smoke_config(fake_data, **cfg, **{'train.num_steps': 12}),
                                   fresh_dir)
  chex_equal = lambda a, b: jax.tree.all(jax.tree.map(np.array_equal, a, b))
  assert chex_equal(final_state(ext_dir)[1], final_state(fresh_dir)[1])
  assert ext['changed_on_resume'] == [dict(at_iteration=8,
                                           changes=['train.num_steps: 8 -> 12'])]
  wall = ('wall_time_s', 'step_wall_s', 'changed_on_resume', 'provenance')
  drop = lambda d: {k: v for k, v in d.items() if k not in wall}
  assert drop(ext) == drop(fresh)
  assert ext['exposed_wan_s'] < short['exposed_wan_s'] * 2  # the 8-step run's last one is hidden
  records = lambda w: [drop(json.loads(l)) for l in open(os.path.join(w, 'metrics.jsonl'))]
  assert records(ext_dir) == records(fresh_dir)
