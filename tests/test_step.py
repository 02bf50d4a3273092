"""The shard_map'd step against independent single-device references."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from hfl import accounting, mesh as mesh_lib, models, step as step_lib
from hfl.compress import base, co3, lowrank, policy, quantize, sparse

D, W, B = 2, 4, 4
LR = 0.1


def _setup(comp_up=None, comp_wan=None, optimizer=None, outer=None, model='mlp',
           shard_state=False):
  mesh = mesh_lib.make_mesh(D, W)
  net = models.get_model(model, 10)
  params = net.init(jax.random.PRNGKey(0), jnp.zeros((1, 8, 8, 1)))['params']
  leaves = jax.tree.leaves(params)
  comp_up = comp_up or base.identity
  comp_wan = comp_wan or base.identity
  comps = step_lib.Compressors([comp_up(l.shape) for l in leaves],
                               [base.identity(l.shape) for l in leaves],
                               [comp_wan(l.shape) for l in leaves])
  optimizer = optimizer or optax.sgd(LR)
  outer = outer or optax.sgd(1.0)
  params = jax.tree.map(np.array, params)
  state = step_lib.init_state(params, optimizer, outer, comps, D, W, jax.random.PRNGKey(1),
                              shard_state=shard_state)
  state = jax.device_put(state, step_lib.state_shardings(mesh, state))
  apply_fn = lambda p, x: net.apply({'params': p}, x)
  fn = step_lib.make_step(apply_fn, optimizer, outer, comps, mesh, state)
  fn.comps = comps
  # The step donates its state: keep a host copy of the initial parameters.
  return mesh, jax.tree.map(np.array, params), apply_fn, state, fn


def _batches(n, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, D, W, B, 8, 8, 1)).astype(np.float32)
  y = rng.integers(0, 10, size=(n, D, W, B)).astype(np.int32)
  return x, y


def _put(mesh, x, *spec):
  return jax.device_put(x, NamedSharding(mesh, P(*spec)))


def _run(mesh, fn, state, xs, ys, active, weights, rounds):
  for t in range(len(xs)):
    state, m = fn(state, (_put(mesh, xs[t], 'dc', 'worker'), _put(mesh, ys[t], 'dc', 'worker')),
                  _put(mesh, np.asarray(active[t]), 'dc'),
                  _put(mesh, np.asarray(weights, np.float32)), rounds[t])
    jax.block_until_ready(state)
  return state, m


def _loss(apply_fn, p, x, y):
  return optax.softmax_cross_entropy_with_integer_labels(apply_fn(p, x), y).mean()


def test_k1_iid_equals_single_device_sgd_on_global_batch():
  mesh, params, apply_fn, state, fn = _setup()
  xs, ys = _batches(3)
  state, _ = _run(mesh, fn, state, xs, ys, [[True, True]] * 3, [0.5, 0.5], [True] * 3)
  ref = params
  for t in range(3):
    g = jax.grad(_loss, argnums=1)(apply_fn, ref, xs[t].reshape((-1, 8, 8, 1)),
                                   ys[t].reshape(-1))
    ref = jax.tree.map(lambda p, gg: p - LR * gg, ref, g)
  chex.assert_trees_all_close(state.global_params, ref, atol=1e-5, rtol=1e-5)
  for d in range(D):
    chex.assert_trees_all_close(jax.tree.map(lambda x: x[d], state.params), ref, atol=1e-5)


def test_gradients_are_per_worker():
  """One local iteration: x_d - lr * mean_w grad(batch_{d,w}) — not W times that, not a DC-wide grad."""
  mesh, params, apply_fn, state, fn = _setup()
  xs, ys = _batches(1, seed=3)
  state, _ = _run(mesh, fn, state, xs, ys, [[True, True]], [0.5, 0.5], [False])
  for d in range(D):
    grads = [jax.grad(_loss, argnums=1)(apply_fn, params, xs[0, d, w], ys[0, d, w])
             for w in range(W)]
    mean_g = jax.tree.map(lambda *g: sum(g) / W, *grads)
    ref = jax.tree.map(lambda p, g: p - LR * g, params, mean_g)
    chex.assert_trees_all_close(jax.tree.map(lambda x: x[d], state.params), ref, atol=1e-5)
  # Not trivially equal: different workers' gradients differ.
  g0 = jax.grad(_loss, argnums=1)(apply_fn, params, xs[0, 0, 0], ys[0, 0, 0])
  g1 = jax.grad(_loss, argnums=1)(apply_fn, params, xs[0, 0, 1], ys[0, 0, 1])
  assert not np.allclose(g0['Dense_0']['kernel'], g1['Dense_0']['kernel'])


def test_periodic_equals_local_sgd_then_weighted_average():
  k, rounds = 3, 2
  weights = np.array([0.3, 0.7], np.float32)
  mesh, params, apply_fn, state, fn = _setup()
  xs, ys = _batches(k * rounds, seed=5)
  flags = [(t + 1) % k == 0 for t in range(k * rounds)]
  state, _ = _run(mesh, fn, state, xs, ys, [[True, True]] * len(xs), weights, flags)
  x_global = params
  for r in range(rounds):
    finals = []
    for d in range(D):
      x = x_global
      for t in range(r * k, (r + 1) * k):
        gs = [jax.grad(_loss, argnums=1)(apply_fn, x, xs[t, d, w], ys[t, d, w]) for w in range(W)]
        x = jax.tree.map(lambda p, *g: p - LR * sum(g) / W, x, *gs)
      finals.append(x)
    x_global = jax.tree.map(lambda *xd: sum(float(weights[d]) * xd[d] for d in range(D)), *finals)
  chex.assert_trees_all_close(state.global_params, x_global, atol=2e-5, rtol=2e-5)


def test_inactive_dc_does_not_change_and_counts_no_bytes():
  mesh, params, apply_fn, state, fn = _setup()
  xs, ys = _batches(2, seed=7)
  state, m = _run(mesh, fn, state, xs, ys, [[True, False], [True, False]], [0.5, 0.5],
                  [False, False])
  chex.assert_trees_all_equal(jax.tree.map(lambda x: x[1], state.params), params)
  assert not np.allclose(state.params['Dense_0']['kernel'][0], params['Dense_0']['kernel'])
  np.testing.assert_array_equal(np.asarray(state.local_steps), [2, 0])
  assert float(m['up_bits'][1]) == 0 and float(m['up_bits'][0]) > 0


def test_absent_dc_gets_zero_weight_and_rejoins_from_global_model():
  mesh, params, apply_fn, state, fn = _setup()
  xs, ys = _batches(1, seed=9)
  state, m = _run(mesh, fn, state, xs, ys, [[True, True]], [1.0, 0.0], [True])
  # The global model is DC 0's local result alone; DC 1 restarts from it.
  g = [jax.grad(_loss, argnums=1)(apply_fn, params, xs[0, 0, w], ys[0, 0, w]) for w in range(W)]
  ref = jax.tree.map(lambda p, *gg: p - LR * sum(gg) / W, params, *g)
  chex.assert_trees_all_close(state.global_params, ref, atol=1e-5)
  chex.assert_trees_all_close(jax.tree.map(lambda x: x[1], state.params), ref, atol=1e-5)
  assert float(m['wan_bits'][1]) == 0 and float(m['wan_bits'][0]) > 0


def n_bytes_wan(params, itemsize):
  return sum(l.size for l in jax.tree.leaves(params)) * itemsize


@pytest.mark.parametrize('up,wan', [(base.identity, base.identity),
                                    (lambda s: base.cast(s, jnp.bfloat16),
                                     lambda s: base.cast(s, jnp.float16))])
def test_counted_bytes_equal_hlo_collectives(up, wan):
  mesh, params, apply_fn, state, fn = _setup(comp_up=up, comp_wan=wan)
  xs, ys = _batches(1)
  args = (state, _put(mesh, xs[0], 'dc', 'worker'), _put(mesh, ys[0], 'dc', 'worker'),
          _put(mesh, np.array([True, True]), 'dc'), _put(mesh, np.array([.5, .5], np.float32)))
  # The local iteration's 'worker' collectives are the uplink; the round's 'dc'
  # collectives the WAN exchange (its re-assembly inside the DC is over 'worker').
  coll_local = accounting.collective_bytes(fn.jitted[False].lower(*args).as_text(), mesh)
  coll = accounting.collective_bytes(fn.jitted[True].lower(*args).as_text(), mesh)
  assert 'dc' not in coll_local
  # The step's own metrics (loss, bit counts) are rank-0 all-reduces: not payload.
  worker_payload = sum(b for _, b, t in coll_local['worker'] if t.count('x') > 0)
  dc_payload = sum(b for _, b, t in coll['dc'] if t.count('x') > 0)
  _, m = fn(*args[:1], args[1:3], *args[3:], True)
  # up_bits is the sum over the DC's W workers of the per-device operand bits.
  assert float(m['up_bits'][0]) / 8 == W * worker_payload
  # Over 'dc' each of the DC's W workers sends 1/W of every payload array (padded to
  # a multiple of W): the DC's W devices together put the payload on the WAN once.
  itemsize = 4 if wan is base.identity else 2
  padded = sum(-(-l.size // W) * W * itemsize for l in jax.tree.leaves(params))
  assert W * dc_payload == padded
  assert float(m['wan_bits'][0]) / 8 == n_bytes_wan(params, itemsize)
  assert padded - float(m['wan_bits'][0]) / 8 < W * itemsize * len(jax.tree.leaves(params))
  n = sum(l.size for l in jax.tree.leaves(params))
  bytes_per_entry = 4 if up is base.identity else 2
  assert worker_payload == n * bytes_per_entry
  dtypes = {t.split('x')[-1] for _, _, t in coll['dc'] if t.count('x') > 0}
  assert dtypes == ({'f32>'} if wan is base.identity else {'f16>'})


def test_nesterov_outer_step_is_optax_nesterov_on_the_pseudo_gradient():
  outer = optax.sgd(0.7, momentum=0.9, nesterov=True)
  weights = np.array([0.5, 0.5], np.float32)
  mesh, params, apply_fn, state, fn = _setup(outer=optax.sgd(0.7, momentum=0.9, nesterov=True))
  xs, ys = _batches(2, seed=11)
  state, _ = _run(mesh, fn, state, xs, ys, [[True, True]] * 2, weights, [True, True])
  x_global, opt_state = params, outer.init(params)
  for t in range(2):
    finals = []
    for d in range(D):
      gs = [jax.grad(_loss, argnums=1)(apply_fn, x_global, xs[t, d, w], ys[t, d, w])
            for w in range(W)]
      finals.append(jax.tree.map(lambda p, *g: p - LR * sum(g) / W, x_global, *gs))
    delta = jax.tree.map(lambda x0, *xd: x0 - sum(0.5 * x for x in xd), x_global, *finals)
    upd, opt_state = outer.update(delta, opt_state, x_global)
    x_global = optax.apply_updates(x_global, upd)
  chex.assert_trees_all_close(state.global_params, x_global, atol=2e-5, rtol=2e-5)


def _lowered_bytes(fn, mesh, state, do_round):
  """(payload collective bytes per device by axis, metrics) of one lowered step."""
  xs, ys = _batches(1)
  args = (state, _put(mesh, xs[0], 'dc', 'worker'), _put(mesh, ys[0], 'dc', 'worker'),
          _put(mesh, np.array([True, True]), 'dc'), _put(mesh, np.array([.5, .5], np.float32)))
  coll = accounting.collective_bytes(fn.jitted[do_round].lower(*args).as_text(), mesh)
  # The step's own metrics (loss, bit counts) are rank-0 all-reduces: not payload.
  payload = {axis: [(op, b, t) for op, b, t in ops if t.count('x') > 0]
             for axis, ops in coll.items()}
  _, m = fn(*args[:1], args[1:3], *args[3:], do_round)
  return payload, m


UPLINKS = {
    'topk': lambda s: sparse.topk(s, 0.05),
    'topk_thr': lambda s: sparse.topk(s, 0.02, threshold_variant=True),
    'randk': lambda s: sparse.randk(s, 0.05),
    'qsgd': lambda s: quantize.qsgd(s, levels=16),
    'sign': quantize.sign,
    'powersgd': lambda s: lowrank.powersgd(s, rank=2),
    'bf16': lambda s: base.cast(s, jnp.bfloat16),
}


@pytest.mark.parametrize('name', sorted(UPLINKS))
def test_compressed_uplink_bytes_equal_hlo_collectives(name):
  """The 'worker' collectives of the local step move exactly the counted uplink bits.

  Sparse payloads are all-gathered as values + indices, quantised ones as packed
  uint8 codes + float32 scales (nothing dense, never an all-reduce of encoded
  values); casts are all-reduced in their 16-bit dtype.
  """
  mesh, params, apply_fn, state, fn = _setup(comp_up=UPLINKS[name])
  payload, m = _lowered_bytes(fn, mesh, state, False)
  assert 'dc' not in payload
  ops = payload['worker']
  per_device = sum(b for _, b, _ in ops)
  assert float(m['up_bits'][0]) / 8 == W * per_device
  dtypes = {t.split('x')[-1] for _, _, t in ops}
  n = sum(l.size for l in jax.tree.leaves(params))
  if name.startswith(('topk', 'randk')):
    assert {op for op, _, _ in ops} == {'all_gather'}
    assert dtypes == {'f32>', 'ui16>'}  # values, and uint16 indices (leaves <= 2^16)
    assert per_device < 0.2 * 4 * n
  elif name in ('qsgd', 'sign'):
    assert {op for op, _, _ in ops} == {'all_gather'}
    assert dtypes == {'f32>', 'ui8>'}   # scales / norms, packed codes
    bits_per_entry = 6 if name == 'qsgd' else 1
    # One f32 scale per leaf (sign) or per bucket of 512 entries (QSGD), plus packing slack.
    scales = sum(-(-l.size // 512) for l in jax.tree.leaves(params))
    assert per_device < 4 * scales + bits_per_entry * n / 8 + 8 * len(jax.tree.leaves(params))
  elif name == 'bf16':
    assert {op for op, _, _ in ops} == {'all_reduce'} and dtypes == {'bf16>'}
    assert per_device == 2 * n


def test_co3_uplink_moves_uint8_symbols_and_charges_the_coded_length():
  """CO3 charges the entropy-coded message (what a real link would carry) while the
  simulated collective moves the fixed-width uint8 symbols plus the float32 scale:
  moved = size + 4 bytes per leaf (the beta index, a 1-byte header field of the
  coded message, is not needed by the decoder here, so it is not moved); counted
  = Huffman bits of the symbols + 5 header bytes, below the moved bytes for fp4.
  """
  mesh, params, apply_fn, state, fn = _setup(comp_up=lambda s: co3.co3(s, 'fp4'))
  payload, m = _lowered_bytes(fn, mesh, state, False)
  ops = payload['worker']
  assert {op for op, _, _ in ops} == {'all_gather'}
  leaves = jax.tree.leaves(params)
  assert sorted(t for _, _, t in ops) == sorted(
      [f'tensor<1x{"x".join(map(str, l.shape))}xui8>' for l in leaves]
      + ['tensor<1xf32>'] * len(leaves))
  moved = sum(b for _, b, _ in ops)
  assert moved == sum(l.size + 4 for l in leaves)
  counted = float(m['up_bits'][0]) / 8 / W
  assert 5 * len(leaves) < counted < moved


@pytest.mark.parametrize('up', ['identity', 'topk'])
def test_sharded_state_bytes_equal_hlo_collectives(up):
  """ZeRO-1 (sharded optimizer state): the 'worker' collectives of the local step
  move exactly the counted uplink bits — for an identity leaf a reduce-scatter of
  the gradient (padded to a multiple of W) instead of the all-reduce, for a top-k
  leaf the usual all-gather of values + indices — plus the all-gather of the
  updated parameter slices; the plan's static bits equal the counted ones."""
  comp_up = base.identity if up == 'identity' else UPLINKS['topk']
  mesh, params, apply_fn, state, fn = _setup(comp_up=comp_up, optimizer=optax.adam(1e-3),
                                             shard_state=True)
  payload, m = _lowered_bytes(fn, mesh, state, False)
  assert 'dc' not in payload
  ops = payload['worker']
  leaves = jax.tree.leaves(params)
  chunks = [-(-l.size // W) for l in leaves]
  gathers = [f'tensor<{c}xf32>' for c in chunks]
  if up == 'identity':
    assert sorted(t for op, _, t in ops if op == 'reduce_scatter') == sorted(
        f'tensor<{W * c}xf32>' for c in chunks)
    assert sorted(t for op, _, t in ops if op == 'all_gather') == sorted(gathers)
    assert {op for op, _, _ in ops} == {'reduce_scatter', 'all_gather'}
  else:
    assert {op for op, _, _ in ops} == {'all_gather'}
    assert set(gathers) <= {t for _, _, t in ops}
  per_device = sum(b for _, b, _ in ops)
  assert float(m['up_bits'][0]) / 8 == W * per_device
  # Down: each worker's slice of the (dense) downlink, and the other W - 1 slices
  # of the parameters.
  slice_bytes = 4 * sum(chunks)
  assert float(m['down_bits'][0]) / 8 == W * (slice_bytes + (W - 1) * slice_bytes)
  up_b, down_b, wan_b = step_lib.static_bits(fn.comps, params, W, shard_state=True)
  assert (up_b * W, down_b * W) == (float(m['up_bits'][0]), float(m['down_bits'][0]))
  assert step_lib.static_bits(fn.comps, params, W)[:2] == (
      sum(policy.static_bits(c) for c in fn.comps.up),
      sum(policy.static_bits(c) for c in fn.comps.down))


@pytest.mark.parametrize('name', ['topk', 'bf16'])
def test_compressed_wan_bytes_equal_hlo_collectives(name):
  """All leaves' WAN payloads cross 'dc' in one fused collective (hfl.collectives:
  top-k values and indices as one byte buffer, the bf16 casts as one bf16 buffer),
  and each of the DC's W workers sends 1/W of it (padded to a multiple of W), so
  the DC's devices put the counted WAN payload on the WAN once, plus < W padding
  entries."""
  wan = {'topk': lambda s: sparse.topk(s, 0.05), 'bf16': lambda s: base.cast(s, jnp.bfloat16)}
  mesh, params, apply_fn, state, fn = _setup(comp_wan=wan[name])
  payload, m = _lowered_bytes(fn, mesh, state, True)
  ops = payload['dc']
  leaves = jax.tree.leaves(params)
  if name == 'topk':
    assert [op for op, _, _ in ops] == ['all_gather']
    assert ops[0][2].endswith('xui8>')
    arrays = [(sparse.num_kept(l.size, 0.05), 4) for l in leaves] + [
        (sparse.num_kept(l.size, 0.05), jnp.dtype(sparse.index_dtype(l.size)).itemsize)
        for l in leaves]
    entries, size = sum(n * s for n, s in arrays), 1  # one buffer of bytes
  else:
    assert [op for op, _, _ in ops] == ['all_reduce']
    arrays = [(l.size, 2) for l in leaves]
    entries, size = sum(l.size for l in leaves), 2  # one bf16 buffer
  padded = -(-entries // W) * W * size
  assert W * sum(b for _, b, _ in ops) == padded
  counted = float(m['wan_bits'][0]) / 8
  assert counted == sum(n * size for n, size in arrays)
  assert 0 <= padded - counted < W * size


def test_co3_as_wan_compressor_of_the_pseudo_gradient():
  """CO3 on the WAN (DESIGN 4.4): each DC sends Q(p_d) with p_d = Δ_d + γ e_d, Δ_d the
  pseudo-gradient (global − local model), keeps e_d ← p_d − Q(p_d), and the global
  model takes the outer SGD(1) step on Σ_d w_d Q(p_d). Two rounds of K = 1 against a
  reference that applies the same compressor eagerly per DC (so the second round
  checks the decaying memory), and the charged WAN bits equal the length of the
  real Huffman-coded message of the reference payload (co3.encode_message) to
  within 64 bits: a few entries may round the other way under a different float
  summation order."""
  gamma, weights = 0.9, np.array([0.3, 0.7], np.float32)
  make = lambda s: co3.co3(s, 'fp4', gamma=gamma)
  mesh, params, apply_fn, state, fn = _setup(comp_wan=make)
  xs, ys = _batches(2, seed=11)
  codec = co3.make_codec((1, 2, 1), 'huffman')
  leaves, treedef = jax.tree.flatten(params)
  comps = [make(l.shape) for l in leaves]
  encode = [jax.jit(lambda p, s, c=c: c.encode(p, s, None)) for c in comps]
  decode = [jax.jit(c.decode) for c in comps]
  resid = [[np.zeros(l.shape, np.float32) for l in leaves] for _ in range(D)]
  states = [[c.init() for c in comps] for _ in range(D)]
  glob = leaves
  for t in range(2):
    state, m = _run(mesh, fn, state, xs[t:t + 1], ys[t:t + 1], [[True, True]], weights, [True])
    p_glob = treedef.unflatten(glob)
    agg = [np.zeros(l.shape, np.float32) for l in leaves]
    for d in range(D):
      gs = [jax.grad(_loss, argnums=1)(apply_fn, p_glob, xs[t, d, w], ys[t, d, w])
            for w in range(W)]
      x_d = jax.tree.leaves(jax.tree.map(lambda p, *g: p - LR * sum(g) / W, p_glob, *gs))
      bits = 0
      for i in range(len(comps)):
        p = (glob[i] - x_d[i]) + gamma * resid[d][i]
        payload, states[d][i] = encode[i](jnp.asarray(p), states[d][i])
        g_hat = np.asarray(decode[i](payload))
        resid[d][i] = p - g_hat
        agg[i] += weights[d] * g_hat
        bits += 8 * len(co3.encode_message(payload, codec))
      if d == 0:
        # Rounding of a few entries may flip on float-order differences: bits agree
        # to within a handful of symbols' code lengths (Huffman lengths <= 16 bits).
        assert abs(float(m['wan_bits'][0]) - bits) <= 64, (t, float(m['wan_bits'][0]), bits)
    glob = [g - a for g, a in zip(glob, agg)]
    got = jax.tree.leaves(state.global_params)
    for i, (a, b) in enumerate(zip(got, glob)):
      close = np.isclose(np.asarray(a), b, atol=1e-5, rtol=1e-4)
      assert close.mean() > 0.995, (t, i, close.mean())
    for d in range(D):
      got_r = jax.tree.leaves(jax.tree.map(lambda x: x[d], state.wan_residual))
      assert np.mean([np.isclose(np.asarray(a), b, atol=1e-5, rtol=1e-4).mean()
                      for a, b in zip(got_r, resid[d])]) > 0.995
  # The memory is non-trivial: fp4 leaves most of the pseudo-gradient behind.
  assert max(np.abs(r).max() for r in resid[0]) > 0
