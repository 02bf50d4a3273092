"""Orbax checkpoints of the TrainState plus the host-side loop state (JSON).

A checkpoint is saved at the end of a round: ``state`` (the sharded TrainState
pytree) and ``host`` (JSON: round, clock, byte totals, schedule state, ...). Orbax
writes each step to a temporary directory and renames it when complete, so a run
that fails mid-save leaves the previous checkpoints intact.
"""

import os

import jax
import orbax.checkpoint as ocp

from hfl import metrics


def manager(workdir: str, max_to_keep: int = 2) -> ocp.CheckpointManager:
  """The run's CheckpointManager, rooted at WORKDIR/checkpoints."""
  return ocp.CheckpointManager(
      os.path.join(os.path.abspath(workdir), 'checkpoints'),
      options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True))


def save(mngr: ocp.CheckpointManager, step: int, state, host: dict) -> None:
  """Saves ``state`` and ``host`` under ``step`` and waits until it is on disk.

  Raises:
    ValueError: ``host`` holds a NaN or infinite number (strict JSON has none;
      see hfl.metrics.to_json_value); nothing is saved.
  """
  host = metrics.to_json_value(host, where='checkpoint host state')
  mngr.save(step, args=ocp.args.Composite(
      state=ocp.args.StandardSave(state), host=ocp.args.JsonSave(host)))
  mngr.wait_until_finished()


def restore_latest(mngr: ocp.CheckpointManager, abstract_state):
  """Restores the newest checkpoint, or returns None when there is none.

  Args:
    mngr: the manager.
    abstract_state: pytree of jax.ShapeDtypeStruct with shardings (the target).

  Returns:
    (step, state, host) or None.
  """
  step = mngr.latest_step()
  if step is None:
    return None
  out = mngr.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(abstract_state), host=ocp.args.JsonRestore()))
  return step, out['state'], out['host']


def abstract(tree, shardings):
  """ShapeDtypeStructs of ``tree`` carrying ``shardings`` (same structure)."""
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      tree, shardings)
