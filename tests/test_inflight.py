"""Steps in flight (hfl.inflight): where the loop waits for every step, the window's
order and timing, and that steps in flight compute bitwise the same states and metrics
as waiting for each one (the vmapped one-device step on CPU, the path that keeps
several in flight there)."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from hfl import inflight, mesh as mesh_lib, models, step as step_lib
from hfl.compress import base
from tests.helpers import D, W, put, step_batches


def test_depth_waits_for_every_step_only_on_the_cpu_device_mesh():
  assert inflight.depth('cpu', 'mesh', 8) == 1
  assert inflight.depth('cpu', 'mesh', 1) == inflight.MAX_IN_FLIGHT
  assert inflight.depth('cpu', 'vmap', 1) == inflight.MAX_IN_FLIGHT
  assert inflight.depth('gpu', 'mesh', 8) == inflight.MAX_IN_FLIGHT
  assert inflight.depth('tpu', 'vmap', 1) == inflight.MAX_IN_FLIGHT > 1
  with pytest.raises(ValueError, match='depth=0'):
    inflight.Window(0, lambda *a: None)


@pytest.mark.parametrize('depth', [1, 3])
def test_window_retires_the_oldest_step_first_and_times_it_from_the_later_start(
    depth):
  """At most depth - 1 steps stay in flight after a push; each step is reported once,
  in dispatch order, with start = max(its dispatch, the previous step's completion)."""
  clock = iter(float(t) for t in range(100, 200))
  done = []
  win = inflight.Window(depth, lambda program, start: done.append((program, start)),
                        clock=lambda: next(clock))
  for i in range(5):
    win.push(jnp.float32(i), ('local', i), t_dispatch=10.0 * i)
    assert len(win) == min(i + 1, depth - 1)
  win.drain()
  assert len(win) == 0 and [p for p, _ in done] == [('local', i) for i in range(5)]
  # Completions were seen at 100, 101, ... (one clock reading per retired step).
  assert [s for _, s in done] == [0.0] + [max(10.0 * i, 100.0 + i - 1) for i in range(1, 5)]


def _vmap_step():
  """(step, its 1 x 1 mesh, its initial state): the MLP with identity links, SGD,
  the D x W hierarchy vmapped on one device."""
  net = models.get_model('mlp', 10)
  params = net.init(jax.random.PRNGKey(0), jnp.zeros((1, 8, 8, 1)))['params']
  ident = [base.identity(l.shape) for l in jax.tree.leaves(params)]
  comps = step_lib.Compressors(ident, ident, ident)
  opt, outer = optax.sgd(0.1), optax.sgd(1.0)
  mesh = mesh_lib.make_mesh(1, 1, jax.devices()[:1])
  state = step_lib.init_state(params, opt, outer, comps, D, W, jax.random.PRNGKey(1))
  state = jax.device_put(state, step_lib.state_shardings(mesh, state))
  fn = step_lib.make_step(lambda p, x: net.apply({'params': p}, x), opt, outer, comps, mesh,
                          state, mode='vmap', shape=(D, W))
  return fn, mesh, state


def test_steps_in_flight_compute_bitwise_what_waiting_for_each_computes():
  """8 iterations (a round every 2nd, a DC idle in some) dispatched through a window
  of depth 1 and of MAX_IN_FLIGHT: equal final states and per-iteration metrics bit
  for bit, and the second really had several steps in flight."""
  xs, ys = step_batches(8, seed=3)
  actives = [[True, True], [True, False]] * 4
  out = {}
  for depth in (1, inflight.MAX_IN_FLIGHT):
    fn, mesh, state = _vmap_step()
    win, ms, most = inflight.Window(depth, lambda *a: None), [], 0
    for t in range(len(xs)):
      state, m = fn(state, (put(mesh, xs[t], 'dc', 'worker'), put(mesh, ys[t], 'dc', 'worker')),
                    put(mesh, np.asarray(actives[t]), 'dc'),
                    put(mesh, np.asarray([.5, .5], np.float32)), t % 2 == 1)
      win.push(m, t, 0.0)
      most = max(most, len(win))
      ms.append(m)
    win.drain()
    out[depth] = (jax.tree.map(np.asarray, state), [np.asarray(m) for m in ms], most)
  (a, ma, most_a), (b, mb, most_b) = out[1], out[inflight.MAX_IN_FLIGHT]
  assert most_a == 0 and most_b == inflight.MAX_IN_FLIGHT - 1
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)
  for x, y in zip(ma, mb):
    np.testing.assert_array_equal(x, y)


@pytest.mark.slow
def test_a_run_with_steps_in_flight_equals_one_waiting_for_each(fake_data, tmp_path,
                                                                monkeypatch):
  """The smoke config end to end in vmap mode, the loop waiting for every step
  (MAX_IN_FLIGHT = 1) and with steps in flight: summary.json and metrics.jsonl equal
  apart from wall-clock fields, and the final checkpoints' states bitwise."""
  from hfl import train  # pylint: disable=g-import-not-at-top
  from tests.helpers import final_state, smoke_config  # pylint: disable=g-import-not-at-top
  runs = {}
  for depth in (1, inflight.MAX_IN_FLIGHT):
    monkeypatch.setattr(inflight, 'MAX_IN_FLIGHT', depth)
    workdir = str(tmp_path / f'depth{depth}')
    train.train_and_evaluate(smoke_config(fake_data, **{'mesh.simulate': 'vmap'}), workdir)
    with open(os.path.join(workdir, 'summary.json')) as f:
      summary = json.load(f)
    with open(os.path.join(workdir, 'metrics.jsonl')) as f:
      records = [json.loads(line) for line in f]
    for rec in [summary] + records:
      for key in ('wall_time_s', 'step_wall_s', 'provenance'):
        rec.pop(key, None)
    runs[depth] = (summary, records, final_state(workdir))
  (sa, ra, (step_a, state_a)), (sb, rb, (step_b, state_b)) = runs.values()
  assert sa == sb and ra == rb and step_a == step_b
  for x, y in zip(jax.tree.leaves(state_a), jax.tree.leaves(state_b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
