"""hfl.collectives: fused psum / all-gather over pytrees, and fused exchange generators.

References are numpy (sums and stacks of the host arrays) and the per-leaf JAX
collectives; the number of collectives is read from the lowered StableHLO.
"""

import os
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from hfl import collectives
from hfl import mesh as mesh_lib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                'bench'))
import hlo_ops  # noqa: E402  pylint: disable=g-import-not-at-top

D, W = 2, 4


def _mesh():
  return mesh_lib.make_mesh(D, W)


def _tree(rng):
  """Per-DC leaves [D, ...] of several dtypes, some sharing one."""
  return {
      'w1': rng.normal(size=(D, 3, 5)).astype(np.float32),
      'w2': rng.normal(size=(D, 11)).astype(np.float32),
      'scalar': rng.normal(size=(D,)).astype(np.float32),
      'half': rng.normal(size=(D, 7)).astype(np.float16),
      'bf': rng.normal(size=(D, 2, 2)).astype(jnp.bfloat16),
      'idx': rng.integers(0, 2**31 - 1, size=(D, 4)).astype(np.int32),
      'u16': rng.integers(0, 2**16, size=(D, 3)).astype(np.uint16),
      'sym': rng.integers(0, 256, size=(D, 9)).astype(np.uint8),
      'mask': rng.integers(0, 2, size=(D, 6)).astype(bool),
      'empty': np.zeros((D, 0), np.float32),
  }


def _shard_dc(fn, mesh):
  """jit(shard_map(fn)) over per-DC leaves [D, ...] (P('dc')), outputs [D, ...].

  Zero-size leaves are made inside the body, not passed in: XLA:CPU in jax 0.11.2
  crashes compiling a jitted shard_map that reads a zero-size argument (jax 0.10.2
  does not); ``fn`` sees them all the same.
  """
  def build(t):  # (jitted program, its arguments)
    leaves, treedef = jax.tree.flatten(t)
    empty = [x.size == 0 for x in leaves]

    def body(full):
      it = iter(full)
      mine = [jax.lax.pcast(jnp.zeros(x.shape[1:], x.dtype), 'dc', to='varying') if e
              else next(it)[0] for x, e in zip(leaves, empty)]  # varying like the inputs
      out = fn(jax.tree.unflatten(treedef, mine))
      return jax.tree.map(lambda x: x[None], out)
    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P('dc'), out_specs=P('dc')))
    return f, [x for x, e in zip(leaves, empty) if not e]

  def run(t):
    f, args = build(t)
    return f(args)

  def lower(t):
    f, args = build(t)
    return f.lower(args)
  run.lower = lower
  return run


def _ops(text: str, op: str) -> list:
  """The result types of every ``op`` collective in lowered StableHLO text."""
  return re.findall(rf'"stablehlo\.{op}"\(.*?\)\s*(?:<\{{.*?\}}>)?.*?->\s*(\S+)', text)


def _count(text: str, op: str) -> int:
  return len(re.findall(rf'"stablehlo\.{op}"', text))


def test_fused_psum_equals_numpy_sums_with_one_all_reduce_per_dtype():
  mesh = _mesh()
  tree = {k: v for k, v in _tree(np.random.default_rng(0)).items()
          if k not in ('mask', 'sym', 'u16')}
  f = _shard_dc(lambda t: collectives.fused_psum(t, 'dc'), mesh)
  out = f(tree)
  for k, x in tree.items():
    got = np.asarray(out[k])
    assert got.dtype == x.dtype and got.shape == x.shape, k
    want = x.astype(np.float64).sum(0) if x.dtype != np.int32 else x.astype(np.int64).sum(0)
    want = want.astype(x.dtype)  # int32 wraps like the device sum
    for d in range(D):
      np.testing.assert_array_equal(got[d], want, err_msg=k)
  # Equal, bit for bit, to the per-leaf psum.
  ref = _shard_dc(lambda t: jax.lax.psum(t, 'dc'), mesh)(tree)
  for k in tree:
    np.testing.assert_array_equal(np.asarray(out[k]), np.asarray(ref[k]), err_msg=k)
  # One all-reduce per dtype (f32, f16, bf16, i32), against one per leaf unfused.
  assert _count(f.lower(tree).as_text(), 'all_reduce') == 4
  unfused = _shard_dc(lambda t: jax.tree.map(lambda a: jax.lax.psum(a, 'dc'), t), mesh)
  assert _count(unfused.lower(tree).as_text(), 'all_reduce') == len(tree)


@pytest.mark.parametrize('n', [1, collectives.CONCAT_GROUP, 2 * collectives.CONCAT_GROUP + 1])
def test_grouped_concat_is_the_concatenation(n):
  rng = np.random.default_rng(n)
  arrays = [rng.normal(size=(i % 5,)).astype(np.float32) for i in range(n)]  # some empty
  got = jax.jit(collectives.grouped_concat)([jnp.asarray(a) for a in arrays])
  np.testing.assert_array_equal(np.asarray(got), np.concatenate(arrays))


def test_fused_psum_of_many_leaves_writes_them_in_groups():
  """More leaves than one XLA:CPU concatenation fusion takes: the same values as one
  psum per leaf, and the compiled program writes the computed leaves into the
  collective's buffer a group at a time (about one operation per leaf: its slice of the
  result), not each leaf out on its own and then one unfused concatenation of them all
  (about two per leaf; issue 52, bench/op_count.py)."""
  n = 2 * collectives.CONCAT_GROUP + 1
  rng = np.random.default_rng(3)
  tree = [rng.normal(size=(D, 3 + i)).astype(np.float32) for i in range(n)]
  body = lambda t: collectives.fused_psum([2 * a + 1 for a in t], 'dc')
  f = _shard_dc(body, _mesh())
  ref = _shard_dc(lambda t: [jax.lax.psum(2 * a + 1, 'dc') for a in t], _mesh())(tree)
  for a, b in zip(f(tree), ref):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  ops = hlo_ops.entry_opcodes(f.lower(tree).compile().as_text())
  assert 'concatenate' not in ops, dict(ops)
  groups = -(-n // collectives.CONCAT_GROUP)
  assert hlo_ops.op_count(ops) <= n + groups + 2, dict(ops)  # ungrouped: 2 n + 2


def test_fused_all_gather_moves_every_dtype_in_one_byte_buffer():
  mesh = _mesh()
  tree = _tree(np.random.default_rng(1))
  f = _shard_dc(lambda t: collectives.fused_all_gather(t, 'dc', to='invarying'), mesh)
  out = f(tree)
  for k, x in tree.items():
    got = np.asarray(out[k])
    assert got.dtype == x.dtype and got.shape == (D,) + x.shape, k
    for d in range(D):  # every DC receives the stack of all DCs' leaves, bitwise
      np.testing.assert_array_equal(got[d], x, err_msg=k)
  text = f.lower(tree).as_text()
  assert _count(text, 'all_gather') == 1
  total = sum(x[0].size * x.dtype.itemsize for x in tree.values())
  assert re.search(rf'tensor<{D}x{total}xui8>', text), 'one uint8 buffer of all the bytes'


def test_fused_keeps_sub_byte_dtypes_apart():
  """int4 cannot be bitcast to bytes: it gets its own collective, values intact."""
  mesh = _mesh()
  x = np.arange(D * 6).reshape(D, 6) % 7
  tree = {'a': x.astype(jnp.int4), 'b': np.ones((D, 3), np.float32)}
  f = _shard_dc(lambda t: collectives.fused_all_gather(t, 'dc', to='invarying'), mesh)
  out = f(tree)
  np.testing.assert_array_equal(np.asarray(out['a'][0]).astype(int), x)
  assert _count(f.lower(tree).as_text(), 'all_gather') == 2


def test_fused_outside_shard_map_is_plain_tree_map():
  tree = {'a': jnp.arange(6.0).reshape(2, 3), 'b': jnp.arange(4, dtype=jnp.int32)}
  got = collectives.fused(lambda a: jnp.stack([a, 2 * a]), tree)
  for k, x in tree.items():
    np.testing.assert_array_equal(got[k], np.stack([x, 2 * x]))
  got = collectives.fused(lambda a: jnp.stack([a, a]), tree, pack_bytes=True)
  for k, x in tree.items():
    np.testing.assert_array_equal(got[k], np.stack([x, x]))


def _caller(x, scale):
  """A caller generator: pre-processing, one psum over 'dc', post-processing."""
  y = x * scale
  s = yield collectives.Call(lambda a: jax.lax.psum(a, 'dc'), {'v': y}, ('psum', 'dc'))
  return s['v'] + 1, y


def test_run_fused_equals_run_of_each_caller_with_one_collective():
  mesh = _mesh()
  rng = np.random.default_rng(2)
  tree = [rng.normal(size=(D,) + s).astype(np.float32) for s in ((3,), (2, 2), ())]

  def fused(xs):
    return collectives.run_fused([_caller(x, i + 1.0) for i, x in enumerate(xs)])

  def each(xs):
    return [collectives.run(_caller(x, i + 1.0)) for i, x in enumerate(xs)]

  f, g = _shard_dc(fused, mesh), _shard_dc(each, mesh)
  for (a, sa), (b, sb), x, i in zip(f(tree), g(tree), tree, range(3)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_allclose(np.asarray(a)[0], (x * (i + 1.0)).sum(0) + 1, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(sa), x * np.float32(i + 1.0))
    np.testing.assert_array_equal(np.asarray(sb), x * np.float32(i + 1.0))
  assert _count(f.lower(tree).as_text(), 'all_reduce') == 1
  assert _count(g.lower(tree).as_text(), 'all_reduce') == 3


def test_run_accepts_callers_that_need_no_collective():
  def quiet():
    return 7
    yield  # pylint: disable=unreachable

  assert collectives.run(quiet()) == 7
  assert collectives.run_fused([quiet(), quiet()]) == [7, 7]

  def twice():
    yield collectives.Call(lambda a: a, jnp.zeros(1), 0)
    yield collectives.Call(lambda a: a, jnp.zeros(1), 0)

  with pytest.raises(RuntimeError, match='exactly one'):
    collectives.run(twice())


@pytest.mark.parametrize('wan', ['identity', 'topk', 'co3'])
def test_round_crosses_the_wan_in_one_collective(wan):
  """The inter-DC round of hfl.step: one 'dc' collective for all the model's leaves
  (their payloads are several arrays each for top-k and CO3), where the per-leaf
  exchange had one per leaf and payload array."""
  import optax  # pylint: disable=g-import-not-at-top
  from hfl import accounting, models, step as step_lib  # pylint: disable=g-import-not-at-top
  from hfl.compress import base, co3, sparse  # pylint: disable=g-import-not-at-top
  comp = {'identity': base.identity, 'topk': lambda s: sparse.topk(s, 0.05),
          'co3': lambda s: co3.co3(s, 'fp4')}[wan]
  mesh = _mesh()
  net = models.get_model('mlp', 10)
  params = net.init(jax.random.PRNGKey(0), jnp.zeros((1, 8, 8, 1)))['params']
  leaves = jax.tree.leaves(params)
  assert len(leaves) > 1
  comps = step_lib.Compressors([base.identity(l.shape) for l in leaves],
                               [base.identity(l.shape) for l in leaves],
                               [comp(l.shape) for l in leaves])
  state = step_lib.init_state(params, optax.sgd(0.1), optax.sgd(1.0), comps, D, W,
                              jax.random.PRNGKey(1))
  state = jax.device_put(state, step_lib.state_shardings(mesh, state))
  fn = step_lib.make_step(lambda p, x: net.apply({'params': p}, x), optax.sgd(0.1),
                          optax.sgd(1.0), comps, mesh, state)
  put = lambda x, *spec: jax.device_put(x, NamedSharding(mesh, P(*spec)))
  args = (state, put(np.zeros((D, W, 2, 8, 8, 1), np.float32), 'dc', 'worker'),
          put(np.zeros((D, W, 2), np.int32), 'dc', 'worker'),
          put(np.array([True, True]), 'dc'), put(np.array([.5, .5], np.float32)))
  ops = accounting.collective_bytes(fn.jitted[True].lower(*args).as_text(), mesh)['dc']
  payload = [op for op, _, t in ops if t.count('x') > 0]  # rank-0 ones are metrics
  assert payload == (['all_reduce'] if wan == 'identity' else ['all_gather'])


def test_collective_bytes_reads_both_replica_group_formats():
  """jax 0.10 lists device groups, jax 0.11 names the mesh axes; the same program's
  collectives are attributed to the same axes with the same bytes (lines as lowered)."""
  from hfl import accounting  # pylint: disable=g-import-not-at-top
  mesh = _mesh()
  ids = np.vectorize(lambda d: d.id)(mesh.devices)
  dc_groups = np.moveaxis(ids, 0, -1).reshape(-1, D).tolist()
  worker_groups = ids.reshape(-1, W).tolist()
  both_groups = [ids.reshape(-1).tolist()]
  old = lambda g: f'replica_groups = dense<{g}> : tensor<{len(g)}x{len(g[0])}xi64>'
  new = lambda *axes: ('replica_groups = #stablehlo.replica_group_mesh_axes<mesh = @mesh_0, '
                       'axes = [' + ', '.join(f'#stablehlo.axis_ref<name = "{a}">' for a in axes)
                       + ']>')
  def program(dc, worker, both):
    return '\n'.join([
        f'    %1 = "stablehlo.all_reduce"(%arg1) <{{channel_handle = #stablehlo.channel_handle'
        f'<handle = 1, type = 1>, {dc}, use_global_device_ids}}> ({{',
        '    ^bb0(%a: tensor<f32>, %b: tensor<f32>):',
        '    }) : (tensor<1x3xf32>) -> tensor<1x3xf32>',
        f'    %3 = "stablehlo.all_gather"(%2) <{{all_gather_dim = 0 : i64, {worker}, '
        'use_global_device_ids}> : (tensor<1x7xbf16>) -> tensor<4x7xbf16>',
        f'    %4 = "stablehlo.all_reduce"(%3) <{{{both}, use_global_device_ids}}> ({{',
        '    }) : (tensor<5xi32>) -> tensor<5xi32>'])
  want = {'dc': [('all_reduce', 12, 'tensor<1x3xf32>')],
          'worker': [('all_gather', 14, 'tensor<1x7xbf16>')],
          'other': [('all_reduce', 20, 'tensor<5xi32>')]}
  assert accounting.collective_bytes(
      program(old(dc_groups), old(worker_groups), old(both_groups)), mesh) == want
  assert accounting.collective_bytes(
      program(new('dc'), new('worker'), new('dc', 'worker')), mesh) == want
  with pytest.raises(ValueError, match='no replica groups'):
    accounting.collective_bytes('    %1 = "stablehlo.all_reduce"(%0) <{}> : (tensor<2xf32>) '
                                '-> tensor<2xf32>', mesh)
