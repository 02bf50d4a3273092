"""hfl.checkpoint on real orbax checkpoints: a save compiles nothing, what is restored is
what was saved, and resuming survives an unusable newest step directory."""

import errno
import glob
import logging
import os
import shutil
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from hfl import checkpoint as ckpt_lib
from hfl import mesh as mesh_lib

BACKEND_COMPILE = '/jax/core/compile/backend_compile_duration'


def _state(step):
  return {'w': jnp.arange(1000, dtype=jnp.float32).reshape(10, 100) * step,
          'b': jnp.full((3,), step, jnp.int32)}


def _abstract(state=None):
  """The restore target of ``state`` (default ``_state(0)``) on one device."""
  state = _state(0) if state is None else state
  sh = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return ckpt_lib.abstract(state, jax.tree.map(lambda _: sh, state))


def _workdir(tmp_path, steps=(2, 4)):
  workdir = str(tmp_path / 'run')
  mngr = ckpt_lib.manager(workdir)
  for step in steps:
    ckpt_lib.save(mngr, step, _state(step), {'step': step})
  mngr.close()
  return workdir


def _files(path):
  return sorted((os.path.relpath(f, path), os.path.getsize(f))
                for f in glob.glob(os.path.join(path, '**'), recursive=True) if os.path.isfile(f))


def _largest_state_file(step_dir):
  return max(glob.glob(os.path.join(step_dir, 'state', '**', 'd', '*'), recursive=True),
             key=os.path.getsize)


def _empty(c):
  os.makedirs(os.path.join(c, '6'))
  return '6'


def _no_host(c):
  shutil.copytree(os.path.join(c, '4'), os.path.join(c, '6'))
  shutil.rmtree(os.path.join(c, '6', 'host'))
  return '6'


def _no_commit_marker(c):
  shutil.copytree(os.path.join(c, '4'), os.path.join(c, '6'))
  os.remove(os.path.join(c, '6', ckpt_lib.COMMIT_FILE))
  return '6'


def _truncated_state_data(c):
  shutil.copytree(os.path.join(c, '4'), os.path.join(c, '6'))
  f = _largest_state_file(os.path.join(c, '6'))
  with open(f, 'r+b') as fh:
    fh.truncate(os.path.getsize(f) // 2)
  return '6'


def _corrupt_state_metadata(c):
  shutil.copytree(os.path.join(c, '4'), os.path.join(c, '6'))
  with open(os.path.join(c, '6', 'state', '_METADATA'), 'r+b') as fh:
    fh.truncate(50)
  return '6'


def _orbax_tmp_dir(c):
  # What an interrupted save leaves: orbax's temporary directory, never renamed.
  name = '6' + ckpt_lib.TMP_MARK
  shutil.copytree(os.path.join(c, '4'), os.path.join(c, name))
  os.remove(os.path.join(c, name, ckpt_lib.COMMIT_FILE))
  shutil.rmtree(os.path.join(c, name, 'host'))
  return name


KINDS = [_empty, _no_host, _no_commit_marker, _truncated_state_data, _corrupt_state_metadata,
         _orbax_tmp_dir]


# A planted truncated array makes TensorStore raise inside a thread orbax leaves behind:
# expected here, and its traceback would otherwise end the test log looking like a failure.
@pytest.mark.filterwarnings('ignore::pytest.PytestUnraisableExceptionWarning')
@pytest.mark.parametrize('plant', KINDS, ids=[k.__name__[1:] for k in KINDS])
def test_resume_skips_unusable_newest_step_and_keeps_saving(tmp_path, plant, caplog):
  workdir = _workdir(tmp_path)
  ckpts = os.path.join(workdir, 'checkpoints')
  good = {s: _files(os.path.join(ckpts, s)) for s in ('2', '4')}
  name = plant(ckpts)
  broken = _files(os.path.join(ckpts, name))
  mngr = ckpt_lib.manager(workdir)
  with caplog.at_level(logging.WARNING):
    step, state, host = ckpt_lib.restore_latest(mngr, _abstract())
  assert step == 4 and host == {'step': 4}
  np.testing.assert_array_equal(np.asarray(state['w']), np.asarray(_state(4)['w']))
  # Logged (which and why), moved aside whole, the complete checkpoints untouched.
  assert f'{ckpts}/{name} skipped' in caplog.text, caplog.text
  assert 'Resuming from checkpoint 4' in caplog.text or ckpt_lib.TMP_MARK in name
  moved = os.path.join(workdir, ckpt_lib.SKIPPED_DIR, name)
  assert not os.path.exists(os.path.join(ckpts, name)) and _files(moved) == broken
  assert {s: _files(os.path.join(ckpts, s)) for s in ('2', '4')} == good
  # The run keeps saving, the replaced step included, and resumes from it.
  ckpt_lib.save(mngr, 6, _state(6), {'step': 6})
  ckpt_lib.save(mngr, 8, _state(8), {'step': 8})
  mngr.close()
  mngr = ckpt_lib.manager(workdir)
  assert ckpt_lib.incomplete_reason(os.path.join(ckpts, '6')) is None
  step, state, host = ckpt_lib.restore_latest(mngr, _abstract())
  assert step == 8 and host == {'step': 8}
  np.testing.assert_array_equal(np.asarray(state['b']), [8, 8, 8])
  assert sorted(mngr.all_steps()) == [6, 8]  # max_to_keep=2 keeps the two newest.
  mngr.close()


def test_several_unusable_steps_all_skipped_repeated_names_kept(tmp_path, caplog):
  workdir = _workdir(tmp_path)
  ckpts = os.path.join(workdir, 'checkpoints')
  _truncated_state_data(ckpts)
  os.makedirs(os.path.join(ckpts, '8'))
  os.makedirs(os.path.join(workdir, ckpt_lib.SKIPPED_DIR, '8'))  # From an earlier crash.
  with caplog.at_level(logging.WARNING):
    step, _, _ = ckpt_lib.restore_latest(ckpt_lib.manager(workdir), _abstract())
  assert step == 4
  skipped = sorted(os.listdir(os.path.join(workdir, ckpt_lib.SKIPPED_DIR)))
  assert skipped == ['6', '8', '8.1']
  assert 'restore failed' in caplog.text and 'empty directory' in caplog.text


def test_only_incomplete_steps_start_afresh(tmp_path):
  workdir = str(tmp_path / 'run')
  os.makedirs(os.path.join(workdir, 'checkpoints', '2'))
  mngr = ckpt_lib.manager(workdir)
  assert ckpt_lib.restore_latest(mngr, _abstract()) is None
  assert os.listdir(os.path.join(workdir, ckpt_lib.SKIPPED_DIR)) == ['2']
  ckpt_lib.save(mngr, 2, _state(2), {'step': 2})
  assert ckpt_lib.restore_latest(mngr, _abstract())[0] == 2


def test_committed_but_unreadable_only_checkpoint_is_refused_untouched(tmp_path):
  workdir = _workdir(tmp_path, steps=(2,))
  step_dir = os.path.join(workdir, 'checkpoints', '2')
  f = _largest_state_file(step_dir)
  with open(f, 'r+b') as fh:
    fh.truncate(os.path.getsize(f) // 2)
  before = _files(step_dir)
  with pytest.raises(ckpt_lib.UnrestorableError,
                     match=r'No checkpoint .* can be restored: .*/checkpoints/2: restore failed'):
    ckpt_lib.restore_latest(ckpt_lib.manager(workdir), _abstract())
  assert _files(step_dir) == before
  assert not os.path.exists(os.path.join(workdir, ckpt_lib.SKIPPED_DIR))


def test_restore_errors_are_one_short_line_with_their_cause():
  """Orbax wraps a failed read in a bare Exception whose text ends in TensorStore's
  spec repr (many lines): cut before it, capped, with the cause that says why."""
  spec = '<bound method pybind11_detail_function_record_v1_spec of TensorStore({\n  "x": 1})>'
  try:
    try:
      raise ValueError('DATA_LOSS: Error decoding manifest: ' + 'x' * 500
                       + ' [tensorstore_spec=\'{"driver": "zarr"}\']')
    except ValueError as cause:
      raise Exception('Encountered error while reading array index: (slice(0, 1, 1),). '  # pylint: disable=broad-exception-raised
                      f'See full TensorStore details: {spec}.') from cause
  except Exception as e:  # pylint: disable=broad-except
    text = ckpt_lib.short_error(e)
  assert text.startswith('Exception: Encountered error while reading array index: '
                         '(slice(0, 1, 1),). (caused by ValueError: DATA_LOSS: Error decoding '
                         'manifest: xxx')
  assert text.endswith('x)') and ' [...] x' in text and len(text) < 450
  assert 'TensorStore' not in text and 'zarr' not in text and '\n' not in text
  assert ckpt_lib.short_error(RuntimeError('')) == 'RuntimeError'
  assert ckpt_lib.short_error(KeyError('a')) == "KeyError: 'a'"


def test_newest_complete_step_reads_only_the_files(tmp_path):
  """The step a restore starts from, found without orbax: incomplete step directories
  and temporary ones do not count; nothing is created or moved."""
  workdir = tmp_path / 'run'
  assert ckpt_lib.newest_complete_step(str(workdir)) is None
  for step in ('2', '4'):
    for item in ckpt_lib.ITEMS:
      (workdir / 'checkpoints' / step / item).mkdir(parents=True)
    (workdir / 'checkpoints' / step / ckpt_lib.COMMIT_FILE).write_text('')
  (workdir / 'checkpoints' / '6').mkdir()
  (workdir / 'checkpoints' / ('8' + ckpt_lib.TMP_MARK)).mkdir()
  before = _files(str(workdir)), sorted(os.listdir(workdir / 'checkpoints'))
  assert ckpt_lib.newest_complete_step(str(workdir)) == 4
  assert (_files(str(workdir)), sorted(os.listdir(workdir / 'checkpoints'))) == before


def test_complete_checkpoints_restore_with_nothing_moved(tmp_path, caplog):
  workdir = _workdir(tmp_path)
  with caplog.at_level(logging.WARNING):
    step, _, host = ckpt_lib.restore_latest(ckpt_lib.manager(workdir), _abstract())
  assert step == 4 and host == {'step': 4}
  assert 'skipped' not in caplog.text
  assert not os.path.exists(os.path.join(workdir, ckpt_lib.SKIPPED_DIR))
  assert ckpt_lib.restore_latest(ckpt_lib.manager(str(tmp_path / 'new')), _abstract()) is None


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


def test_checkpoint_of_the_layout_before_link_state_restores(tmp_path):
  """A TrainState saved with the six up_/down_/wan_ x residual/state fields (the
  layout before hfl.links.LinkState) restores into the per-link layout, every
  array where it belongs; a new-layout checkpoint still restores as itself."""
  import typing  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  from hfl import links as link_lib, step as step_lib  # pylint: disable=g-import-not-at-top
  from hfl.compress import base  # pylint: disable=g-import-not-at-top
  fields = ('params', 'opt_state', 'global_params', 'outer_state', 'up_residual', 'up_state',
            'down_residual', 'down_state', 'wan_residual', 'wan_state', 'local_steps', 'step',
            'key', 'dgc_velocity')
  Old = typing.NamedTuple('Old', [(f, typing.Any) for f in fields])  # the old field order
  params = {'w': jnp.arange(6.0).reshape(2, 3), 'b': jnp.ones(3)}
  # Lossy uplink and WAN (residual arrays), a lossless downlink (no residual).
  bf16 = [base.cast(l.shape, jnp.bfloat16) for l in jax.tree.leaves(params)]
  comps = step_lib.Compressors(bf16, [base.identity(l.shape) for l in jax.tree.leaves(params)],
                               bf16)
  new = step_lib.init_state(params, optax.adam(0.1), optax.sgd(1.0), comps, 1, 1,
                            jax.random.PRNGKey(0))
  # The old layout had none of the fields added since (TrainState.eager).
  legacy = {k: v for k, v in ckpt_lib.to_legacy(new).items() if k in fields}
  legacy['up_residual'] = jax.tree.map(lambda x: x + 3.0, legacy['up_residual'])
  legacy['wan_residual'] = jax.tree.map(lambda x: x - 1.0, legacy['wan_residual'])
  old = Old(**legacy)
  mngr = ckpt_lib.manager(str(tmp_path))
  ckpt_lib.save(mngr, 5, old, {'round': 1})
  abstract = _abstract(new)
  step, state, host = ckpt_lib.restore_latest(ckpt_lib.manager(str(tmp_path)), abstract)
  assert (step, host) == (5, {'round': 1})
  assert type(state) is step_lib.TrainState and type(state.up) is link_lib.LinkState
  assert float(state.up.residual['w'][0, 0, 1, 2]) == 3.0
  assert float(state.wan.residual['b'][0, 2]) == -1.0
  assert state.down.residual == {'w': None, 'b': None}
  for a, b in zip(jax.tree.leaves(ckpt_lib.to_legacy(state)), jax.tree.leaves(old._asdict())):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  ckpt_lib.save(mngr, 6, state, {'round': 2})
  step, again, _ = ckpt_lib.restore_latest(ckpt_lib.manager(str(tmp_path)), abstract)
  assert step == 6
  for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(state)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_checkpoint_without_a_field_added_since_restores(tmp_path):
  """A TrainState checkpoint written before ``eager`` existed (Streaming DiLoCo,
  empty when off) restores into today's TrainState with ``eager = ()`` and every
  array unchanged; a checkpoint that lacks a field with leaves is still refused."""
  import typing  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  from hfl import step as step_lib  # pylint: disable=g-import-not-at-top
  from hfl.compress import base  # pylint: disable=g-import-not-at-top
  params = {'w': jnp.arange(6.0).reshape(2, 3), 'b': jnp.ones(3)}
  comps = step_lib.Compressors(*[[base.identity(l.shape) for l in jax.tree.leaves(params)]] * 3)
  new = step_lib.init_state(params, optax.adam(0.1), optax.sgd(1.0), comps, 1, 1,
                            jax.random.PRNGKey(0))
  fields = [f for f in step_lib.TrainState._fields if f != 'eager']
  Before = typing.NamedTuple('TrainState', [(f, typing.Any) for f in fields])
  before = Before(**{f: getattr(new, f) for f in fields})._replace(
      params=jax.tree.map(lambda x: x + 2.0, new.params))
  ckpt_lib.save(ckpt_lib.manager(str(tmp_path)), 4, before, {'round': 1})
  abstract = _abstract(new)
  step, state, _ = ckpt_lib.restore_latest(ckpt_lib.manager(str(tmp_path)), abstract)
  assert step == 4 and type(state) is step_lib.TrainState and state.eager == ()
  for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(before)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # A target whose added field has leaves (eager on) does not match the old checkpoint.
  with_eager = abstract._replace(eager=abstract.params)
  assert ckpt_lib.added_fields(ckpt_lib.saved_fields(tmp_path / 'checkpoints' / '4'), with_eager) == []


def test_skipped_directories_that_cannot_be_moved_are_named_and_kept(tmp_path):
  """A workdir where the skipped steps cannot be moved (here WORKDIR/checkpoints_skipped
  is a file; a read-only workdir fails the same way) gives one clear error, and
  every checkpoint directory stays where it was."""
  workdir = _workdir(tmp_path)
  ckpts = os.path.join(workdir, 'checkpoints')
  _empty(ckpts)
  with open(os.path.join(workdir, ckpt_lib.SKIPPED_DIR), 'w') as fh:
    fh.write('not a directory')
  before = _files(ckpts)
  with pytest.raises(ckpt_lib.MoveAsideError,
                     match=r'Cannot move the skipped checkpoint directories .* \(Not a '
                     r'directory: .*; nothing was moved\. Skipped: 6 \(empty directory.*\)'
                     r'\. A run resumes only in a writable workdir'):
    ckpt_lib.restore_latest(ckpt_lib.manager(workdir), _abstract())
  assert _files(ckpts) == before


def test_checkpoint_with_residuals_of_lossless_links_restores_without_them(tmp_path):
  """Checkpoints written when lossless (identity) links kept zero residual arrays
  restore into today's state, which holds none there (hfl.links.init_link); every
  other array restores unchanged."""
  import optax  # pylint: disable=g-import-not-at-top
  from hfl import step as step_lib  # pylint: disable=g-import-not-at-top
  from hfl.compress import base  # pylint: disable=g-import-not-at-top
  params = {'w': jnp.arange(6.0).reshape(2, 3), 'b': jnp.ones(3)}
  leaves = jax.tree.leaves(params)
  ident = [base.identity(l.shape) for l in leaves]
  bf16 = [base.cast(l.shape, jnp.bfloat16) for l in leaves]
  # The old state: the same structure with a (lossy-shaped) residual on every link
  # (and, as before issue 48, the round's global model re-gathered: no broadcast state).
  old = step_lib.init_state(params, optax.adam(0.1), optax.sgd(1.0),
                            step_lib.Compressors(bf16, bf16, bf16), 1, 2, jax.random.PRNGKey(0),
                            broadcast='gather')
  old = old._replace(params=jax.tree.map(lambda x: x + 0.5, old.params))
  now = step_lib.init_state(params, optax.adam(0.1), optax.sgd(1.0),
                            step_lib.Compressors(ident, ident, bf16), 1, 2, jax.random.PRNGKey(0))
  assert now.up.residual == {'w': None, 'b': None}
  assert now.down.residual == {'w': None, 'b': None}
  mngr = ckpt_lib.manager(str(tmp_path))
  ckpt_lib.save(mngr, 3, old, {'round': 1})
  abstract = _abstract(now)
  step, state, host = ckpt_lib.restore_latest(ckpt_lib.manager(str(tmp_path)), abstract)
  assert (step, host) == (3, {'round': 1})
  assert jax.tree.structure(state) == jax.tree.structure(now)
  kept = old._replace(up=now.up._replace(compressor_state=old.up.compressor_state),
                      down=now.down._replace(compressor_state=old.down.compressor_state))
  for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(kept)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_save_that_finds_the_disk_full_is_one_error_and_keeps_the_older_steps(
    tmp_path, monkeypatch, caplog):
  """Orbax's JSON writes (the host item, the step's metadata) fail with ENOSPC: the
  save raises hfl.metrics.WriteError naming the step, orbax's error logs (tracebacks)
  are dropped, the partial step is removed and step 2 still restores."""
  from etils import epath  # pylint: disable=g-import-not-at-top
  from hfl import metrics  # pylint: disable=g-import-not-at-top
  workdir = _workdir(tmp_path, steps=(2,))
  ckpts = os.path.join(workdir, 'checkpoints')
  good = _files(os.path.join(ckpts, '2'))

  def full(self, *unused_args, **unused_kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
  monkeypatch.setattr(epath.Path, 'write_text', full)
  # Filters a failed save leaves in place (the process is meant to end) go with the test.
  monkeypatch.setattr(logging.getLogger('asyncio'), 'filters', [])
  monkeypatch.setattr(sys, 'unraisablehook', sys.unraisablehook)
  mngr = ckpt_lib.manager(workdir)
  with caplog.at_level(logging.INFO), pytest.raises(metrics.WriteError) as e:
    ckpt_lib.save(mngr, 4, _state(4), {'step': 4})
  assert e.value.errno == errno.ENOSPC and isinstance(e.value, OSError)
  assert str(e.value) == (f'no space left on device (ENOSPC) while writing {ckpts}/4; the '
                          'checkpoints saved before it are intact; its partial files were '
                          'removed'), str(e.value)
  assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
  assert os.listdir(ckpts) == ['2'] and _files(os.path.join(ckpts, '2')) == good
  monkeypatch.undo()
  step, state, host = ckpt_lib.restore_latest(ckpt_lib.manager(workdir), _abstract())
  assert step == 2 and host == {'step': 2}
  np.testing.assert_array_equal(np.asarray(state['w']), np.asarray(_state(2)['w']))


@pytest.mark.parametrize('err, code', [
    (ValueError('RESOURCE_EXHAUSTED: Error writing "a/0": Failed to write 5 bytes to file 4: '
                "No space left on device [os_error_code='28']"), errno.ENOSPC),
    (ValueError('StepAlreadyExistsError'), None),
    (KeyError('x'), None)])
def test_the_os_error_behind_a_failed_save_is_found_in_tensorstore_text(err, code):
  found = ckpt_lib._os_error(err)  # pylint: disable=protected-access
  assert (found and found.errno) == code and (found is None or found.strerror)
