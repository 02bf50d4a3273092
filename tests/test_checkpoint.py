"""hfl.checkpoint: a save compiles nothing, and what is restored is what was saved."""

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from hfl import checkpoint as ckpt_lib
from hfl import mesh as mesh_lib

BACKEND_COMPILE = '/jax/core/compile/backend_compile_duration'


def test_save_compiles_nothing_and_restores_bitwise(tmp_path):
  """Sharded like hfl's TrainState (per DC, per worker, replicated), shapes no other
  test uses. Orbax's default replica-parallel save split every replicated shard along
  an axis divisible by its replica count (36 by the 4 workers, 24 by the 8 devices),
  one op-by-op slice each, compiling one program per slice shape (issue 17)."""
  mesh = mesh_lib.make_mesh(2, 4)
  rng = np.random.default_rng(17)
  specs = {'per_dc': P('dc'), 'per_worker': P('dc', 'worker'), 'replicated': P()}
  shapes = {'per_dc': (2, 36, 5), 'per_worker': (2, 4, 11), 'replicated': (24, 3)}
  host = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
  shardings = {k: NamedSharding(mesh, s) for k, s in specs.items()}
  state = jax.device_put(host, shardings)
  jax.block_until_ready(state)
  compiled = []
  listener = lambda event, secs, **kw: compiled.append(event) if event == BACKEND_COMPILE else None
  mngr = ckpt_lib.manager(str(tmp_path))
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    ckpt_lib.save(mngr, 3, state, {'round': 1})
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert compiled == []
  step, restored, loop = ckpt_lib.restore_latest(mngr, ckpt_lib.abstract(state, shardings))
  assert (step, loop) == (3, {'round': 1})
  for k in host:
    assert restored[k].sharding == shardings[k]
    np.testing.assert_array_equal(np.asarray(restored[k]), host[k])
  mngr.close()
