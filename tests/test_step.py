"""The shard_map'd step against independent single-device references."""

import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from configs import default as default_config
from hfl import accounting, collectives, mesh as mesh_lib, links as link_lib, models, optim, step as step_lib
from hfl import setup as setup_lib
from hfl.compress import base, chunked, co3, dgc, policy, quantize, registry, sparse
from tests.helpers import B, D, W, step_batches as _batches, host_metrics as _host
from tests.helpers import put as _put, run_steps as _run
from tests.test_chunked import reference as chunked_reference

LR = 0.1


def _setup(comp_up=None, comp_wan=None, optimizer=None, outer=None, model='mlp',
           shard_state=False, dgc_momentum=0.0, comp_down=None, broadcast='downlink'):
  mesh = mesh_lib.make_mesh(D, W)
  net = models.get_model(model, 10)
  params = net.init(jax.random.PRNGKey(0), jnp.zeros((1, 8, 8, 1)))['params']
  leaves = jax.tree.leaves(params)
  comp_up = comp_up or base.identity
  comp_wan = comp_wan or base.identity
  comp_down = comp_down or base.identity
  comps = step_lib.Compressors([comp_up(l.shape) for l in leaves],
                               [comp_down(l.shape) for l in leaves],
                               [comp_wan(l.shape) for l in leaves])
  optimizer = optimizer or optax.sgd(LR)
  outer = outer or optax.sgd(1.0)
  params = jax.tree.map(np.array, params)
  state = step_lib.init_state(params, optimizer, outer, comps, D, W, jax.random.PRNGKey(1),
                              shard_state=shard_state, dgc_momentum=dgc_momentum > 0,
                              broadcast=broadcast)
  state = jax.device_put(state, step_lib.state_shardings(mesh, state))
  apply_fn = lambda p, x: net.apply({'params': p}, x)
  fn = step_lib.make_step(apply_fn, optimizer, outer, comps, mesh, state,
                          dgc.Options(momentum=dgc_momentum))
  fn.comps = comps
  fn.sent = step_lib.broadcast_leaves(comps.down, broadcast)  # leaves not re-gathered
  # The step donates its state: keep a host copy of the initial parameters.
  return mesh, jax.tree.map(np.array, params), apply_fn, state, fn


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
  assert m['up_bits'][1] == 0 and m['up_bits'][0] > 0


def test_absent_dc_gets_zero_weight_and_rejoins_from_global_model():
  mesh, params, apply_fn, state, fn = _setup()
  xs, ys = _batches(1, seed=9)
  state, m = _run(mesh, fn, state, xs, ys, [[True, True]], [1.0, 0.0], [True])
  # The global model is DC 0's local result alone; DC 1 restarts from it.
  g = [jax.grad(_loss, argnums=1)(apply_fn, params, xs[0, 0, w], ys[0, 0, w]) for w in range(W)]
  ref = jax.tree.map(lambda p, *gg: p - LR * sum(gg) / W, params, *g)
  chex.assert_trees_all_close(state.global_params, ref, atol=1e-5)
  chex.assert_trees_all_close(jax.tree.map(lambda x: x[1], state.params), ref, atol=1e-5)
  assert m['wan_bits'][1] == 0 and m['wan_bits'][0] > 0


def _args(mesh, state, shape=(8, 8, 1), seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(D, W, B) + shape).astype(np.float32)
  y = rng.integers(0, 10, size=(D, W, B)).astype(np.int32)
  return (state, _put(mesh, x, 'dc', 'worker'), _put(mesh, y, 'dc', 'worker'),
          _put(mesh, np.array([True, True]), 'dc'), _put(mesh, np.array([.5, .5], np.float32)))


def _lowered(fn, mesh, state, do_round, shape=(8, 8, 1)):
  """(lowered StableHLO text of one program, host metrics of one run of it, the new
  state: the step donates the old one)."""
  args = _args(mesh, state, shape)
  text = fn.jitted[do_round].lower(*args).as_text()
  state, m = fn(args[0], args[1:3], *args[3:], do_round)
  return text, _host(fn, m, do_round), state


def _payload_ops(text, mesh):
  return accounting.collective_bytes(text, mesh)


def _fused_padded_bytes(wan, parts):
  """Bytes of a round's fused WAN buffers (hfl.collectives.fused): one buffer of the
  all-reduced (float32) payloads and one per packing bucket of the all-gathered
  ones (every whole-byte dtype as bytes; a sub-byte dtype alone), each zero-padded
  to a multiple of ``parts`` entries. Returns (all-reduced, all-gathered) bytes."""
  buckets = {}
  for c in wan:
    for a in jax.tree.leaves(policy.payload_shape(c)):
      n, dt = int(np.prod(a.shape)), jnp.dtype(a.dtype)
      if collectives.reduces(c):
        key, entries, size = 'sum', n, dt.itemsize
      elif dt == jnp.bool_ or dt.itemsize * 8 == (
          jnp.finfo(dt).bits if jnp.issubdtype(dt, jnp.inexact) else jnp.iinfo(dt).bits):
        key, entries, size = 'bytes', n * dt.itemsize, 1
      else:
        key, entries, size = str(dt), n, dt.itemsize
      e, _ = buckets.get(key, (0, size))
      buckets[key] = (e + entries, size)
  padded = {k: -(-e // parts) * parts * size for k, (e, size) in buckets.items()}
  return padded.pop('sum', 0), sum(padded.values())


def assert_every_collective_counted(fn, text, mesh, m, do_round):
  """The TOTAL collective bytes per mesh axis of a lowered program (every device's
  operands, hfl.accounting.collective_totals) are what hfl counts, for static-size
  payloads (CO3's coded length is checked separately):

  'worker' — the uplink payloads, plus with ZeRO-1 each worker's parameter slice:
    sum over DCs of up_bits / 8; in a round program also the re-gather of the
    round's result, per DC the all-reduced WAN leaves' payload plus the D DCs'
    all-gathered payloads, each array padded to a multiple of W (each worker
    re-gathers 1/W of it), counted as round_down_bits = W x the same, unpadded —
    except at the leaves whose update goes through a lossy downlink (``fn.sent``,
    hfl.step.broadcast_leaves): there the re-gather only assembles x_global' on the
    replicated PS, and round_down_bits counts W x the correction's downlink payload,
    which (like the PS downlink) no collective carries.
  'dc' — in a round program the D DCs' WAN payloads, padded likewise, each DC's
    counted once (unpadded) as wan_bits.
  Nothing else: no collective for metrics, none on another axis.
  """
  d, w = mesh.shape['dc'], mesh.shape['worker']
  totals = accounting.collective_totals(text, mesh)
  assert set(totals) <= {'worker', 'dc'}, totals
  up = int(m['up_bits'].sum())
  assert up % 8 == 0
  wan = fn.comps.wan
  if not do_round:
    assert 'dc' not in totals and totals.get('worker', 0) == up // 8, (totals, up // 8)
    assert not m['round_down_bits'].any() and not m['wan_bits'].any()
    return
  summed, gathered = _fused_padded_bytes(wan, w)
  regather = summed + d * gathered
  assert totals['worker'] == up // 8 + d * regather, (totals, up // 8, regather)
  assert totals['dc'] == d * (summed + gathered), totals
  unpadded = lambda c: policy.static_bits(c)
  assert list(m['wan_bits']) == [sum(unpadded(c) for c in wan)] * d
  sent = getattr(fn, 'sent', None) or [False] * len(wan)
  regathered = sum(unpadded(c) * (1 if collectives.reduces(c) else d)
                   for c, s in zip(wan, sent) if not s)
  corrected = sum(unpadded(c) for c, s in zip(fn.comps.down, sent) if s)
  assert list(m['round_down_bits']) == [w * (regathered + corrected)] * d
  # Padding is less than W entries per fused buffer.
  if not any(sent):
    assert 0 <= regather * 8 - m['round_down_bits'][0] // w


@pytest.mark.parametrize('up,wan', [(base.identity, base.identity),
                                    (lambda s: base.cast(s, jnp.bfloat16),
                                     lambda s: base.cast(s, jnp.float16))])
def test_counted_bytes_equal_hlo_collectives(up, wan):
  """Identity links: the uplink is a float32 all-reduce over 'worker', the WAN a
  float32 all-reduce of 1/W slices over 'dc' and the re-gather of the sum over
  'worker'. Casts: every payload crosses in its 16-bit dtype as an all-gather (each
  decoded and added in float32 by the receiver)."""
  mesh, params, apply_fn, state, fn = _setup(comp_up=up, comp_wan=wan)
  n = sum(l.size for l in jax.tree.leaves(params))
  for do_round in (False, True):
    text, m, state = _lowered(fn, mesh, state, do_round)
    assert_every_collective_counted(fn, text, mesh, m, do_round)
    coll = _payload_ops(text, mesh)
    up_ops = [(op, b, t) for op, b, t in coll['worker']][:len(jax.tree.leaves(params))]
    assert sum(b for _, b, _ in up_ops) == n * (4 if up is base.identity else 2)
    assert {op for op, _, _ in up_ops} == ({'all_reduce'} if up is base.identity
                                           else {'all_gather'})
    if do_round:
      dtypes = {t.split('x')[-1] for _, _, t in coll['dc']}
      # fp16 payloads are all-gathered packed as bytes (hfl.collectives); their
      # 2 bytes per entry are checked by the totals above.
      assert dtypes == ({'f32>'} if wan is base.identity else {'ui8>'})
      assert {op for op, _, _ in coll['dc']} == ({'all_reduce'} if wan is base.identity
                                                 else {'all_gather'})


@pytest.mark.parametrize('down,wan', [('topk', 'identity'), ('bf16', 'topk')])
def test_round_with_compressed_downlink_bytes_equal_hlo_collectives(down, wan):
  """Issue 48: with a lossy downlink the round's update reaches the workers as the
  PS's correction through the downlink compressor. Both programs move exactly the
  counted bytes per axis (assert_every_collective_counted), the round program's
  collectives are byte for byte those of the re-gathered round ('gather': no
  collective is added for the correction), and round_down_bits is W x the
  correction's downlink payload per DC, where 'gather' counts the re-gathered
  WAN result (with a top-k WAN, D sparse payloads)."""
  comp = {'topk': lambda s: sparse.topk(s, 0.05), 'bf16': lambda s: base.cast(s, jnp.bfloat16),
          'identity': base.identity}
  totals, rounds = {}, {}
  for mode in ('downlink', 'gather'):
    mesh, params, apply_fn, state, fn = _setup(comp_down=comp[down], comp_wan=comp[wan],
                                               broadcast=mode)
    assert any(fn.sent) == (mode == 'downlink')
    for do_round in (False, True):
      text, m, state = _lowered(fn, mesh, state, do_round)
      assert_every_collective_counted(fn, text, mesh, m, do_round)
    totals[mode] = accounting.collective_totals(text, mesh)
    rounds[mode] = int(m['round_down_bits'][0])
  assert totals['downlink'] == totals['gather']
  leaves = jax.tree.leaves(params)
  assert rounds['downlink'] == W * sum(policy.static_bits(comp[down](l.shape)) for l in leaves)
  # Against an identity WAN (float32 global model) the correction is far cheaper; a
  # sparse WAN's re-gathered payloads can be cheaper than a bf16 correction, which
  # compression.broadcast='gather' then keeps (README, "Links and bytes").
  assert (rounds['downlink'] < rounds['gather']) == (wan == 'identity')


def test_default_config_every_collective_is_counted():
  """configs/default.py (CNN on 28x28 images, momentum, identity links, 2 DCs x 4
  workers): the iteration and the round program move exactly the counted bytes
  per axis, and the round's re-gather over 'worker' (the summed pseudo-gradient
  reaching the DC's workers) is counted: W x the model's float32 bytes per DC."""
  cfg = default_config.get_config()
  mesh = mesh_lib.make_mesh(D, W)
  net = models.get_model(cfg.model.name, 10)
  params = net.init(jax.random.PRNGKey(0), jnp.zeros((1, 28, 28, 1)))['params']
  comps = setup_lib.build_compressors(cfg, params)
  opt = optim.make_optimizer(cfg.optimizer)
  state = step_lib.init_state(params, opt, optax.sgd(1.0), comps, D, W, jax.random.PRNGKey(1))
  state = jax.device_put(state, step_lib.state_shardings(mesh, state))
  fn = step_lib.make_step(lambda p, x: net.apply({'params': p}, x), opt, optax.sgd(1.0),
                          comps, mesh, state)
  fn.comps = comps
  n = sum(l.size for l in jax.tree.leaves(params))
  for do_round in (False, True):
    text, m, state = _lowered(fn, mesh, state, do_round, shape=(28, 28, 1))
    assert_every_collective_counted(fn, text, mesh, m, do_round)
  assert list(m['round_down_bits']) == [W * n * 32] * D


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


TOPK = lambda s: sparse.topk(s, 0.05)

# The collective-bytes cases: every registered compressor once (aliases of one factory
# and example spec once: hfl.compress.registry.distinct_names), built from its
# registered example spec, plus the threshold-estimated top-k. A registered name that
# does not build fails its case.
HLO_CASES = {name: registry.example_spec(name) for name in registry.distinct_names()}
HLO_CASES['topk_thr'] = dict(name='topk', density=0.02, threshold_variant=True)

_MLIR_DTYPES = {'float32': 'f32', 'bfloat16': 'bf16', 'float16': 'f16', 'uint8': 'ui8',
                'uint16': 'ui16', 'uint32': 'ui32', 'int8': 'i8', 'int16': 'i16',
                'int32': 'i32', 'bool': 'i1'}


def _registered(spec):
  """``shape -> Compressor``: the registered factory of ``spec['name']`` with the spec's
  (validated) hyper-parameters, for every leaf (biases included: no small-leaf rule)."""
  name, hyper = policy.check_spec(spec, 'compression.uplink')
  factory = registry.lookup(name).factory
  return lambda shape: factory(shape, **hyper)


def _ops_kinds(compressors):
  """The collective ops their payloads travel in: an all-reduce for a float32 sum
  (identity), an all-gather otherwise."""
  return {'all_reduce' if collectives.reduces(c) else 'all_gather' for c in compressors}


@pytest.mark.parametrize('name', sorted(HLO_CASES))
def test_every_registry_compressor_bytes_equal_hlo_collectives(name):
  """Every registered compressor on the uplink and the WAN (the same spec on both).

  Local program (lowered only): the 'worker' collectives move exactly the uplink
  payloads' static bytes (hfl.compress.policy.static_bits) of every device, each
  payload array in its own dtype (sparse payloads as values + indices, quantised
  ones as packed uint8 codes + float32 scales, casts in their 16-bit dtype),
  all-gathered (never a sum of encoded values) unless the compressor is identity.
  Round program (lowered and run): in addition the WAN payloads cross 'dc' fused
  and padded, and their re-gather crosses 'worker' (_fused_padded_bytes). For a
  static-size payload that is also exactly what hfl counts
  (assert_every_collective_counted); a variable-length code (CO3) charges its coded
  length instead, which test_co3_uplink_moves_uint8_symbols_and_charges_the_coded_length
  and test_co3_as_wan_compressor_of_the_pseudo_gradient check against the real message.
  """
  spec = HLO_CASES[name]
  make = _registered(spec)
  mesh, params, apply_fn, state, fn = _setup(comp_up=make, comp_wan=make)
  d, w = mesh.shape['dc'], mesh.shape['worker']
  up, wan = fn.comps.up, fn.comps.wan
  static = all(c.wire_bits is base.payload_bits for c in list(up) + list(wan))
  leaves = jax.tree.leaves(params)
  n = sum(l.size for l in leaves)

  # What the payloads' static shapes put on each link (a variable-length code's
  # payload may hold header fields that the simulated collective need not move:
  # CO3's beta index, so there at most this).
  moved = lambda totals, expected: (totals == expected if static else (
      set(totals) == set(expected) and all(0 < totals[k] <= v for k, v in expected.items())))

  # The local program is only lowered (not compiled); the round program, which runs
  # the same local step first, is lowered and run, and its metrics count both.
  local = fn.jitted[False].lower(*_args(mesh, state)).as_text()
  text, m, state = _lowered(fn, mesh, state, True)
  moved_up = d * w * sum(policy.static_bits(c) for c in up) // 8
  totals = accounting.collective_totals(local, mesh)
  assert moved(totals, {'worker': moved_up}), (totals, moved_up)
  if static:
    assert totals == {'worker': int(m['up_bits'].sum()) // 8}
  else:
    assert m['up_bits'].all()
  ops = _payload_ops(local, mesh)['worker']
  per_device = sum(b for _, b, _ in ops)
  assert {op for op, _, _ in ops} == _ops_kinds(up)
  dtypes = {t.split('x')[-1] for _, _, t in ops}
  payload_dtypes = {_MLIR_DTYPES[jnp.dtype(a.dtype).name] + '>' for c in up
                    for a in jax.tree.leaves(policy.payload_shape(c))}
  assert dtypes == payload_dtypes if static else dtypes <= payload_dtypes
  if not all(c.lossless for c in up):
    assert per_device < 4 * n
  if spec['name'] in ('topk', 'randk'):
    assert dtypes == {'f32>', 'ui16>'}  # values, and uint16 indices (leaves <= 2^16)
    assert per_device < 0.2 * 4 * n
  elif spec['name'] in ('qsgd', 'sign'):
    assert dtypes == {'f32>', 'ui8>'}   # scales / norms, packed codes
    if spec['name'] == 'qsgd':
      bits_per_entry = quantize.level_bits(spec['levels']) + 1  # magnitude + sign
      scales = sum(-(-l.size // spec['bucket_size']) for l in leaves)  # one norm per bucket
    else:
      bits_per_entry, scales = 1, len(leaves)
    assert per_device < 4 * scales + bits_per_entry * n / 8 + 8 * len(leaves)
  elif spec['name'] in ('bf16', 'fp16'):
    assert per_device == 2 * n

  summed, gathered = _fused_padded_bytes(wan, w)
  totals = accounting.collective_totals(text, mesh)
  assert moved(totals, {'worker': moved_up + d * (summed + d * gathered),
                        'dc': d * (summed + gathered)}), totals
  if static:
    assert_every_collective_counted(fn, text, mesh, m, True)
  else:
    assert m['wan_bits'].all()
  ops = _payload_ops(text, mesh)['dc']
  assert {op for op, _, _ in ops} == _ops_kinds(wan)
  counted = int(m['wan_bits'][0]) // 8
  if spec['name'] == 'topk':
    # One fused all-gather of bytes; each of the W workers sends 1/W (padded).
    assert ops[0][2].endswith('xui8>')
    k = lambda l: sparse.num_kept(l.size, spec['density'])
    assert counted == sum(k(l) * (4 + jnp.dtype(sparse.index_dtype(l.size)).itemsize)
                          for l in leaves)
    assert w * sum(b for _, b, _ in ops) == -(-counted // w) * w
  elif spec['name'] == 'chunked_topk':
    # Per leaf: n chunks x k offsets (uint8: chunk <= 256), 2 packed bit-planes, bf16 scales.
    def leaf_bytes(size):
      chunk = min(spec['chunk_size'], size)
      chunks, k = -(-size // chunk), sparse.num_kept(chunk, spec['density'])
      return chunks * k + 2 * (-(-chunks * k // 8)) + 2 * 2 * chunks
    assert counted == sum(leaf_bytes(l.size) for l in leaves)
    assert w * sum(b for _, b, _ in ops) == -(-counted // w) * w


def test_co3_uplink_moves_uint8_symbols_and_charges_the_coded_length():
  """CO3 charges the entropy-coded message (what a real link would carry) while the
  simulated collective moves the fixed-width uint8 symbols plus the float32 scale:
  moved = size + 4 bytes per leaf (the beta index, a 1-byte header field of the
  coded message, is not needed by the decoder here, so it is not moved); counted
  = Huffman bits of the symbols + 5 header bytes, below the moved bytes for fp4.
  The local program has no other collective.
  """
  mesh, params, apply_fn, state, fn = _setup(comp_up=lambda s: co3.co3(s, 'fp4'))
  text, m, state = _lowered(fn, mesh, state, False)
  assert set(accounting.collective_totals(text, mesh)) == {'worker'}
  ops = _payload_ops(text, mesh)['worker']
  assert {op for op, _, _ in ops} == {'all_gather'}
  leaves = jax.tree.leaves(params)
  assert sorted(t for _, _, t in ops) == sorted(
      [f'tensor<1x{"x".join(map(str, l.shape))}xui8>' for l in leaves]
      + ['tensor<1xf32>'] * len(leaves))
  moved = sum(b for _, b, _ in ops)
  assert moved == sum(l.size + 4 for l in leaves)
  counted = m['up_bits'][0] / 8 / W
  assert 5 * len(leaves) < counted < moved


@pytest.mark.parametrize('up', ['identity', 'topk'])
def test_sharded_state_bytes_equal_hlo_collectives(up):
  """ZeRO-1 (sharded optimizer state): the 'worker' collectives of the local step
  move exactly the counted uplink bits — for an identity leaf a reduce-scatter of
  the gradient (padded to a multiple of W) instead of the all-reduce, for a top-k
  leaf the usual all-gather of values + indices — plus the all-gather of the
  updated parameter slices; the round program adds only the WAN exchange and its
  re-gather; the plan's static bits equal the counted ones."""
  comp_up = base.identity if up == 'identity' else TOPK
  mesh, params, apply_fn, state, fn = _setup(comp_up=comp_up, optimizer=optax.adam(1e-3),
                                             shard_state=True)
  text, m, state = _lowered(fn, mesh, state, False)
  assert_every_collective_counted(fn, text, mesh, m, False)
  ops = _payload_ops(text, mesh)['worker']
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
  assert m['up_bits'][0] / 8 == W * per_device
  # Down: each worker's slice of the (dense) downlink, and the other W - 1 slices
  # of the parameters.
  slice_bytes = 4 * sum(chunks)
  assert m['down_bits'][0] / 8 == W * (slice_bytes + (W - 1) * slice_bytes)
  up_b, down_b, wan_b = accounting.static_bits(fn.comps, params, W, shard_state=True)
  assert (up_b * W, down_b * W) == (m['up_bits'][0], m['down_bits'][0])
  assert accounting.static_bits(fn.comps, params, W)[:2] == (
      sum(policy.static_bits(c) for c in fn.comps.up),
      sum(policy.static_bits(c) for c in fn.comps.down))
  text, m, state = _lowered(fn, mesh, state, True)
  assert_every_collective_counted(fn, text, mesh, m, True)


def test_dgc_step_every_collective_is_counted():
  """DGC momentum correction (velocity sent through the top-k uplink): both programs
  move exactly the counted bytes per axis."""
  mesh, params, apply_fn, state, fn = _setup(comp_up=TOPK, dgc_momentum=0.9)
  for do_round in (False, True):
    text, m, state = _lowered(fn, mesh, state, do_round)
    assert_every_collective_counted(fn, text, mesh, m, do_round)


def test_co3_as_wan_compressor_of_the_pseudo_gradient():
  """CO3 on the WAN (hfl.compress.co3): each DC sends Q(p_d) with p_d = Δ_d + γ e_d, Δ_d the
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
      got_r = jax.tree.leaves(jax.tree.map(lambda x: x[d], state.wan.residual))
      assert np.mean([np.isclose(np.asarray(a), b, atol=1e-5, rtol=1e-4).mean()
                      for a, b in zip(got_r, resid[d])]) > 0.995
  # The memory is non-trivial: fp4 leaves most of the pseudo-gradient behind.
  assert max(np.abs(r).max() for r in resid[0]) > 0


def test_sparseloco_round_against_a_hand_computation():
  """SparseLoCo's outer loop (Sarfi et al., arXiv:2508.15706, Algorithm 1; as
  configs/sparseloco.py sets it up): each DC forms p_d = Δ_d + β e_d from its
  pseudo-gradient Δ_d (global − local model), sends the chunked top-k of p_d with 2-bit
  values, keeps e_d <- p_d − Ĉ(p_d), and the global model takes a plain outer step
  θ <- θ − α mean_d Ĉ(p_d) (outer SGD, no momentum: the error feedback is the only
  memory). Two rounds of K = 1 against numpy: the compressor by tests/test_chunked.py's
  reference, the rest written out here. A near-tie at a chunk's k-th magnitude may be
  decided the other way under another float summation order, so a small fraction of
  entries may differ."""
  beta, alpha, density, chunk = 0.95, 0.7, 0.1, 64
  make = lambda s: chunked.chunked_topk(s, density=density, chunk_size=chunk, gamma=beta)
  mesh, params, apply_fn, state, fn = _setup(comp_wan=make, outer=optax.sgd(alpha))
  weights = np.array([0.5, 0.5], np.float32)
  xs, ys = _batches(2, seed=5)
  leaves, treedef = jax.tree.flatten(params)
  glob = [np.asarray(l, np.float32) for l in leaves]
  resid = [[np.zeros(l.shape, np.float32) for l in leaves] for _ in range(D)]
  close = lambda a, b: np.isclose(np.asarray(a), b, atol=1e-5, rtol=1e-4).mean()
  for t in range(2):
    state, _ = _run(mesh, fn, state, xs[t:t + 1], ys[t:t + 1], [[True, True]], weights, [True])
    p_glob = treedef.unflatten([jnp.asarray(g) for g in glob])
    mean = [np.zeros(l.shape, np.float32) for l in leaves]
    for d in range(D):
      gs = [jax.grad(_loss, argnums=1)(apply_fn, p_glob, xs[t, d, w], ys[t, d, w])
            for w in range(W)]
      x_d = jax.tree.leaves(jax.tree.map(lambda p, *g: p - LR * sum(g) / W, p_glob, *gs))
      for i, g in enumerate(glob):
        p = (g - np.asarray(x_d[i])) + beta * resid[d][i]
        sent = chunked_reference(p, density, chunk)
        resid[d][i] = p - sent
        mean[i] += sent / D
    glob = [g - alpha * m for g, m in zip(glob, mean)]
    for i, (a, b) in enumerate(zip(jax.tree.leaves(state.global_params), glob)):
      assert close(a, b) > 0.99, (t, i, close(a, b))
    for d in range(D):
      got = jax.tree.leaves(jax.tree.map(lambda x, d=d: x[d], state.wan.residual))
      assert np.mean([close(a, b) for a, b in zip(got, resid[d])]) > 0.99, (t, d)
  # Sparse: most of each DC's accumulated pseudo-gradient is still in its buffer.
  kept = sum(np.count_nonzero(r) for r in resid[0]) / sum(r.size for r in resid[0])
  assert kept > 0.8, kept


def test_non_finite_gradient_is_flagged_per_link_and_leaf():
  """An inf pixel in one worker's batch: its gradient is non-finite; the step flags
  the uplink input of that (DC, worker) and the downlink input (the aggregate) of
  its DC — each worker checks its share of the aggregate, so the OR over the DC's
  workers flags exactly the leaves whose gradient was non-finite —, and nothing of
  the other DC."""
  mesh, params, apply_fn, state, fn = _setup()
  xs, ys = _batches(1, seed=13)
  xs[0, 1, 2, 0, 3, 3, 0] = np.inf
  state, m = _run(mesh, fn, state, xs, ys, [[True, True]], [0.5, 0.5], [False])
  flags = m['flags']
  assert flags.shape == (D, W, link_lib.NUM_LINKS, len(jax.tree.leaves(params)))
  assert np.all(flags[0] == 0)
  assert np.all(flags[1, :, 0][[0, 1, 3]] == 0) and np.any(flags[1, 2, 0] & link_lib.BAD_INPUT)
  down = np.bitwise_or.reduce(flags[1, :, 1], axis=0) & link_lib.BAD_INPUT
  assert np.any(down) and np.array_equal(down != 0, flags[1, 2, 0] & link_lib.BAD_INPUT != 0)
  assert link_lib.first_nonfinite(flags).endswith('on the uplink (DC 1, worker 2)')


def test_bit_counts_are_exact_integers_beyond_2_to_24_entries():
  """Issue 12, fault 6: one float32 leaf of 2^24 + 1 entries, 1 DC, 2 workers,
  identity links: 2 x (2^24 + 1) x 32 = 1,073,741,888 uplink bits per DC per step
  (float32 counts on the device gave 1,073,741,824). Static payload sizes are
  Python ints fixed at trace time, summed on the host in int64."""
  n = 2**24 + 1
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]).reshape(1, 2), ('dc', 'worker'))
  params = {'w': np.zeros((n,), np.float32)}
  comps = step_lib.Compressors(*[[base.identity((n,))]] * 3)
  apply_fn = lambda p, x: jnp.zeros((x.shape[0], 10)) + p['w'][0] * jnp.mean(x)
  state = step_lib.init_state(params, optax.sgd(0.1), optax.sgd(1.0), comps, 1, 2,
                              jax.random.PRNGKey(0))
  state = jax.device_put(state, step_lib.state_shardings(mesh, state))
  fn = step_lib.make_step(apply_fn, optax.sgd(0.1), optax.sgd(1.0), comps, mesh, state)
  put = lambda a, *spec: jax.device_put(a, NamedSharding(mesh, P(*spec)))
  batch = (put(np.ones((1, 2, 2, 1, 1, 1), np.float32), 'dc', 'worker'),
           put(np.zeros((1, 2, 2), np.int32), 'dc', 'worker'))
  state, m = fn(state, batch, put(np.array([True]), 'dc'), put(np.ones(1, np.float32)), True)
  m = step_lib.host_metrics(fn.info[True], np.asarray(m), [True], [1.0])
  assert m['up_bits'].tolist() == [1_073_741_888]
  assert m['down_bits'].tolist() == [1_073_741_888]
  assert m['wan_bits'].tolist() == [n * 32]
  assert m['round_down_bits'].tolist() == [2 * n * 32]


def test_inter_dc_round_alone_is_the_weighted_model_average():
  """hfl.step.inter_dc_round on its own (shard_map over a 2 x 2 mesh, identity WAN,
  outer SGD lr 1): the new global model is x_global - sum_d w_d (x_global - x_d),
  every DC restarts from it, local steps are reset, and the fused WAN exchange is
  charged one float32 payload per DC, all-reduced."""
  d, w = 2, 2
  mesh = mesh_lib.make_mesh(d, w, jax.devices()[:d * w])
  params = {'a': np.arange(6, dtype=np.float32).reshape(2, 3), 'b': np.ones(3, np.float32)}
  comps = step_lib.Compressors(*[[base.identity(l.shape) for l in jax.tree.leaves(params)]] * 3)
  state = step_lib.init_state(params, optax.sgd(0.1), optax.sgd(1.0), comps, d, w,
                              jax.random.PRNGKey(0))
  x_d = {k: np.stack([v * 2.0, v - 1.0]) for k, v in params.items()}  # per-DC models
  state = state._replace(params=x_d, local_steps=jnp.array([3, 1], jnp.int32))
  state = jax.device_put(state, step_lib.state_shardings(mesh, state))
  weights = np.array([0.25, 0.75], np.float32)
  setup = step_lib.Setup(None, optax.sgd(0.1), optax.sgd(1.0), comps, d, w, False, dgc.Options())
  specs = step_lib.state_specs(state)
  charges = []

  def f(s, wt):
    keys = step_lib.step_keys(s.key, s.step, d)
    new, charge = step_lib.inter_dc_round(setup, step_lib.to_local(s, specs), wt, keys.dc)
    charges.append(charge)
    return step_lib.from_local(new, specs)

  new = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(specs, P()), out_specs=specs))(
      state, jax.device_put(weights, NamedSharding(mesh, P())))
  for k, x0 in params.items():
    want = x0 - sum(weights[i] * (x0 - x_d[k][i]) for i in range(d))
    np.testing.assert_allclose(np.asarray(new.global_params[k]), want, rtol=1e-6, atol=1e-6)
    for i in range(d):
      np.testing.assert_array_equal(np.asarray(new.params[k][i]), np.asarray(new.global_params[k]))
  assert np.asarray(new.local_steps).tolist() == [0, 0]
  (charge,) = charges
  assert (charge.wan_sum, charge.wan_gather) == (32 * 9, 0) and charge.wan.static == 32 * 9


def test_lossless_links_hold_no_residual_and_a_mismatched_state_is_refused():
  """A lossless (identity) leaf keeps no residual on any link: the state's arrays are
  the two models and the step counters alone, and the step's program takes and
  returns no residual for it. A lossy compressor on such a state is refused before
  tracing, naming the link and the leaf."""
  mesh, params, apply_fn, state, fn = _setup()
  n = len(jax.tree.leaves(params))
  for link in (state.up, state.down, state.wan):
    assert all(r is None for r in jax.tree.structure(params).flatten_up_to(link.residual))
  assert len(jax.tree.leaves(state)) == 2 * n + 3  # params, global_params, counters, key
  num_args = len(jax.tree.leaves(state)) + 4  # + images, labels, active, weights
  xs, ys = _batches(1, seed=3)
  lowered = fn.jitted[True].lower(state, _put(mesh, xs[0], 'dc', 'worker'),
                                  _put(mesh, ys[0], 'dc', 'worker'),
                                  _put(mesh, np.ones(D, bool), 'dc'),
                                  _put(mesh, np.full(D, 0.5, np.float32)))
  assert len(jax.tree.leaves(lowered.args_info)) == num_args
  assert lowered.out_tree.num_leaves == len(jax.tree.leaves(state)) + 1  # + the metrics
  bf16 = [base.cast(l.shape, jnp.bfloat16) for l in jax.tree.leaves(params)]
  comps = fn.comps._replace(wan=fn.comps.wan[:1] + bf16[1:])
  name = jax.tree_util.keystr(jax.tree_util.tree_flatten_with_path(params)[0][1][0])
  with pytest.raises(ValueError, match=re.escape(
      f"wan link's leaf 1 ({name}) has compressor 'bfloat16'")):
    step_lib.make_step(apply_fn, optax.sgd(LR), optax.sgd(1.0), comps, mesh, state)
  with pytest.raises(ValueError, match=f'{len(bf16) - 1} up compressors for {len(bf16)} '):
    step_lib.make_step(apply_fn, optax.sgd(LR), optax.sgd(1.0),
                       fn.comps._replace(up=fn.comps.up[1:]), mesh, state)


def test_round_program_holds_the_models_and_donates_the_rest():
  """An iteration program donates the whole state; a round program all of it but
  ``params`` and ``global_params`` (step.ROUND_HELD: it writes the new global model into
  both, and donated XLA:CPU would copy both first). Both give the same values as a
  program that donates nothing."""
  mesh, _, _, state, fn = _setup()
  assert step_lib.ROUND_HELD == ('params', 'global_params')
  args = _args(mesh, state)
  copy = lambda s: jax.tree.map(lambda a: a.copy(), s)
  s1, _ = fn(copy(args[0]), args[1:3], *args[3:], False)
  held = copy(s1)
  s2, _ = fn(held, args[1:3], *args[3:], True)
  for name in step_lib.ROUND_HELD:  # still readable after the round
    for leaf in jax.tree.leaves(getattr(held, name)):
      assert not leaf.is_deleted()
  rest = jax.tree.leaves(held._replace(**{n: None for n in step_lib.ROUND_HELD}))
  assert any(l.is_deleted() for l in rest)  # the rest was donated (JAX may keep a scalar)
  # The held models are the round's inputs: the same round on a second copy gives the
  # same new state.
  s3, _ = fn(copy(s1), args[1:3], *args[3:], True)
  chex.assert_trees_all_equal(s2.params, s3.params)
  chex.assert_trees_all_equal(s2.global_params, s3.global_params)
  before = copy(s1)
  fn(before, args[1:3], *args[3:], False)
  assert all(l.is_deleted() for l in jax.tree.leaves(before.params))
