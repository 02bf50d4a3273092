"""hfl.config.check_fields: a config file's fields must be ones hfl reads.

``--config.sync.kk=3`` is refused by :func:`hfl.config.apply_overrides`; these
tests cover the same typo written inside a config file, which
:func:`hfl.config.validate` refuses (main.py, hfl.sweep's pre-check, hfl.setup.setup).
"""

import glob
import json
import os
import subprocess
import sys
import textwrap

import ml_collections
import pytest

from configs import default, shakespeare
from hfl import config as config_lib
from hfl import models, sweep, train
from hfl import workdir as workdir_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WHY = ("A config's fields must be ones hfl reads: those of configs/default.py, and the "
       "transformer's model.num_layers, model.num_heads, model.embed_dim, model.seq_len (as "
       'configs/shakespeare.py sets them). Config fields are listed in the README (config '
       'reference) and configs/default.py.')


def _config_file(tmp_path, body: str, base: str = 'default', name: str = 'typo.py') -> str:
  """A config file ``get_config`` = configs/<base>.py's config, then ``body`` on ``c``."""
  path = tmp_path / name
  path.write_text(f'from configs import {base}\n\n\ndef get_config(arg=None):\n'
                  f'  c = {base}.get_config(arg)\n'
                  + textwrap.indent(textwrap.dedent(body), '  ') + '  return c\n')
  return str(path)


def _refusal(config) -> str:
  with pytest.raises(ValueError) as e:
    config_lib.validate(config, paths=False)
  return str(e.value)


def test_a_misspelled_field_in_a_config_file_is_refused(tmp_path, monkeypatch):
  import jax  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(jax, 'jit', lambda *a, **k: (_ for _ in ()).throw(
      AssertionError('compiled while validating the config')))
  config = config_lib.load_file(_config_file(tmp_path, 'c.sync.kk = 3\n'))
  assert config.sync.k == 4  # the run would have used the default
  assert _refusal(config) == f"unknown config field 'sync.kk'; did you mean 'sync.k'? {WHY}"
  config = config_lib.load_file(_config_file(tmp_path, 'c.optimizer.lr = 0.1\n'))
  assert _refusal(config).startswith("unknown config field 'optimizer.lr'; did you mean "
                                     "'optimizer.learning_rate'? A config's fields")
  config_lib.validate(config_lib.load_file(_config_file(tmp_path, 'c.sync.k = 3\n')),
                      paths=False)  # the field spelled right


def test_a_misspelled_section_is_named_once_with_what_it_holds(tmp_path):
  config = config_lib.load_file(_config_file(tmp_path, '''\
      import ml_collections
      c.optimzer = ml_collections.ConfigDict()
      c.optimzer.name = 'adam'
      c.optimzer.learning_rate = 1e-3
      '''))
  assert _refusal(config) == ("unknown config section 'optimzer' (it holds "
                              'optimzer.learning_rate, optimzer.name); did you mean '
                              f"'optimizer'? {WHY}")
  config = default.get_config()
  config.sync.outr = ml_collections.ConfigDict({'name': 'nesterov'})
  assert _refusal(config).startswith("unknown config section 'sync.outr' (it holds "
                                     "sync.outr.name); did you mean 'sync.outer'?")
  config = default.get_config()
  config.optimzer = 'adam'  # the section's name, given a value
  assert _refusal(config).startswith("unknown config field 'optimzer'; did you mean "
                                     "'optimizer'?")


def test_several_unknown_fields_are_named_in_one_message():
  config = default.get_config()
  config.sync.kk = 3
  config.train.num_step = 10
  config.zzzz = 1
  config.optimzer = ml_collections.ConfigDict({'learning_rate': 0.1})
  assert _refusal(config) == (
      '4 config fields are not ones hfl reads:\n'
      "  unknown config section 'optimzer' (it holds optimzer.learning_rate); did you mean "
      "'optimizer'?\n"
      "  unknown config field 'sync.kk'; did you mean 'sync.k'?\n"
      "  unknown config field 'train.num_step'; did you mean 'train.num_steps'?\n"
      "  unknown config field 'zzzz'\n" + WHY)


def test_a_value_for_a_section_and_a_section_for_a_value_are_named():
  d = default.get_config().to_dict()
  d['sync']['outer'] = 'nesterov'  # type-safe ConfigDicts refuse these; a dict does not
  d['sync']['k'] = {'base': 4}
  assert _refusal(ml_collections.ConfigDict(d)) == (
      '2 config fields are not ones hfl reads:\n'
      "  config field 'sync.k' must be a value, not a section (it holds sync.k.base)\n"
      "  config field 'sync.outer' must be a section (with fields sync.outer.learning_rate, "
      "sync.outer.momentum, sync.outer.name), not a value: got 'nesterov'\n" + WHY)
  config = default.get_config()
  config.compression.dgc = None
  assert _refusal(config).startswith("config field 'compression.dgc' must be a section (with "
                                     'fields compression.dgc.clip_norm, ')


def test_transformer_fields_are_known_and_checked(tmp_path):
  assert set(config_lib.known_fields()) == set(config_lib.field_names(default.get_config())) | {
      f'model.{k}' for k in models.TRANSFORMER_FIELDS}
  config_lib.validate(shakespeare.get_config(), paths=False)
  path = _config_file(tmp_path, 'c.model.embed_dim = 64\nc.model.num_layer = 2\n',
                      base='shakespeare')
  assert _refusal(config_lib.load_file(path)).startswith(
      "unknown config field 'model.num_layer'; did you mean 'model.num_layers'?")


def test_the_known_fields_are_loaded_once(monkeypatch):
  config_lib.known_fields.cache_clear()
  loaded = []
  load = config_lib.load_file
  monkeypatch.setattr(config_lib, 'load_file', lambda arg: loaded.append(arg) or load(arg))
  for _ in range(3):
    config_lib.validate(default.get_config(), paths=False)
  assert loaded == [os.path.join(REPO, 'configs', 'default.py')]


def test_every_shipped_config_sweep_point_and_recorded_run_has_known_fields():
  for path in glob.glob(os.path.join(REPO, 'configs', '*.py')):
    config_lib.validate(config_lib.load_file(path), paths=False)
  sweeps = 0
  for path in glob.glob(os.path.join(REPO, 'configs', 'sweeps', '*.py')):
    if 'def get_sweep' not in open(path).read():
      continue  # a module the sweep files share
    base, grid = sweep.load_sweep(path)
    config_arg = sweep.resolve_base(base, '/nonexistent/root', write=False)
    runs = sweep.make_runs(config_arg, grid, '/nonexistent/root')
    assert len(list(sweep._run_configs(base, config_arg, runs, paths=False))) == len(runs)
    sweeps += 1
  assert sweeps >= 10
  # Finished runs' configs are only compared (hfl.workdir_lib.check_workdir_config), never
  # validated; still, none holds a field hfl no longer reads.
  for path in glob.glob(os.path.join(REPO, 'docs', 'results', 'runs', '*', '*', 'config.json')):
    with open(path) as f:
      config_lib.check_fields(ml_collections.ConfigDict(workdir_lib.upgrade_config(json.load(f))))


def test_main_refuses_a_config_file_with_unknown_fields(fake_data, tmp_path):
  """Exit status 2, the fields on stderr, before anything is written to the workdir."""
  config = _config_file(tmp_path, f'''\
      c.dataset.data_dir = {fake_data!r}
      c.sync.kk = 3
      c.train.num_step = 4
      ''', base='smoke')
  workdir = tmp_path / 'run'
  out = subprocess.run([sys.executable, os.path.join(REPO, 'main.py'), f'--config={config}',
                        f'--workdir={workdir}'], env=dict(os.environ, JAX_PLATFORMS='cpu'),
                       capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
  assert out.returncode == 2, out.stderr[-3000:]
  assert out.stderr == ('error: 2 config fields are not ones hfl reads:\n'
                        "  unknown config field 'sync.kk'; did you mean 'sync.k'?\n"
                        "  unknown config field 'train.num_step'; did you mean "
                        f"'train.num_steps'?\n{WHY}\n")
  assert not os.path.exists(workdir)


def test_a_field_set_to_none_in_a_config_file_is_refused(tmp_path):
  """None where the default holds a value ran the default and recorded null."""
  config = config_lib.load_file(_config_file(tmp_path, '''\
      c.compression.uplink.name = 'topk'
      c.compression.uplink.density = None
      c.sync.eager = None
      '''))
  assert _refusal(config).startswith(
      "config fields compression.uplink.density (default 0.01), sync.eager (default False) "
      'are None: give a value')


@pytest.mark.parametrize('body, why', [
    ("raise RuntimeError('boom')", 'RuntimeError: boom'),
    ('return undefined_name', "NameError: name 'undefined_name' is not defined"),
])
def test_a_config_file_that_raises_is_one_line(tmp_path, body, why):
  """hfl.config.load_file (the sweep's loader) and main.py: the file and its exception in
  one line, exit status 2, no traceback, no workdir."""
  path = tmp_path / 'bad.py'
  path.write_text(f'def get_config(arg=None):\n  {body}\n')
  with pytest.raises(ValueError, match=f'^config file {path} did not load: {why}$'):
    config_lib.load_file(str(path))
  workdir = tmp_path / 'run'
  out = subprocess.run([sys.executable, os.path.join(REPO, 'main.py'), f'--config={path}',
                        f'--workdir={workdir}'], env=dict(os.environ, JAX_PLATFORMS='cpu'),
                       capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
  assert out.returncode == 2, out.stderr[-3000:]
  assert out.stderr == (f'error: could not load --config ({path} raised {why}); pass a config '
                        'file such as configs/default.py.\n')
  assert not os.path.exists(workdir)


def test_load_file_calls_get_config_as_main_does(tmp_path):
  """Without ':ARG', get_config() gets no argument (as ml_collections' --config= calls it):
  a get_config(arg) without a default is refused here too, naming the file."""
  path = tmp_path / 'req.py'
  path.write_text('from configs import default\n\n\ndef get_config(arg):\n'
                  '  c = default.get_config()\n  c.sync.k = int(arg)\n  return c\n')
  with pytest.raises(ValueError, match=f"^config file {path} did not load: TypeError: "
                     r"get_config\(\) missing 1 required positional argument: 'arg'$"):
    config_lib.load_file(str(path))
  assert config_lib.load_file(f'{path}:7').sync.k == 7
