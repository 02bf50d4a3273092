"""The compressor registry (hfl.compress.registry): modules register themselves, the
package imports every module, and each registration's example spec builds.

The registry-wide tests (tests/test_links.py, tests/test_numerics.py, the byte test
of tests/test_step.py, tests/test_broadcast.py) take their cases from the registry
and build each from its example spec; here a compressor written in a module of its
own, which nothing imports by name, reaches the registry, config validation and
the policy.
"""

import pkgutil
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hfl.compress
from configs import default as default_config
from hfl import config as config_lib
from hfl.compress import base, policy, registry

SHAPE = (12, 10)

# A throw-away compressor module: a 2-bit sign-magnitude code (sign, and whether
# |x| is at least the leaf's mean |x|; decoded to +-1.5 or +-0.5 times that mean).
TOY_MODULE = '''
import jax.numpy as jnp

from hfl.compress import base
from hfl.compress.registry import register


def signmag2(shape, **unused):
  shape = tuple(shape)

  def encode(x, state, key):
    del key
    x = x.astype(jnp.float32)
    m = base.mean_abs(x)
    codes = (x < 0).astype(jnp.uint8) * 2 + (jnp.abs(x) >= m).astype(jnp.uint8)
    # A non-finite entry makes the scale non-finite, hence every decoded value.
    return {'codes': codes, 'scale': m}, state

  def decode(payload):
    c = payload['codes']
    mag = jnp.where(c % 2 == 1, 1.5, 0.5) * payload['scale']
    return jnp.where(c >= 2, -mag, mag).reshape(shape)

  return base.Compressor('signmag2', shape, base.EmptyState, encode, decode)


register('signmag2', signmag2)
'''


@pytest.fixture
def toy_package(tmp_path, monkeypatch):
  """A package ``hfl_toy_compressors`` in ``tmp_path`` holding ``signmag2.py``
  (TOY_MODULE), imported with :func:`registry.import_modules` as hfl/compress/ is;
  its registration and modules are removed afterwards."""
  pkg = tmp_path / 'hfl_toy_compressors'
  pkg.mkdir()
  (pkg / '__init__.py').write_text('')
  (pkg / 'signmag2.py').write_text(textwrap.dedent(TOY_MODULE))
  (pkg / '_private.py').write_text('raise RuntimeError("not imported")\n')
  monkeypatch.syspath_prepend(str(tmp_path))
  assert 'signmag2' not in registry.REGISTRY
  try:
    yield registry.import_modules('hfl_toy_compressors', [str(pkg)])
  finally:
    registry.REGISTRY.pop('signmag2', None)
    for name in [m for m in sys.modules if m.startswith('hfl_toy_compressors')]:
      del sys.modules[name]


def test_every_module_of_the_package_is_imported_and_registers_itself():
  names = [m.name for m in pkgutil.iter_modules(hfl.compress.__path__)
           if not m.name.startswith('_')]
  assert {'casts', 'chunked', 'co3', 'lowrank', 'minifloat', 'quantize', 'sparse'} <= set(names)
  for name in names:
    assert f'hfl.compress.{name}' in sys.modules, name
  expected = {'identity', 'float32', 'bf16', 'bfloat16', 'fp16', 'float16', 'topk', 'randk',
              'qsgd', 'sign', 'powersgd', 'co3', 'e3m0', 'chunked_topk'}
  assert expected <= set(policy.REGISTRY)
  assert policy.REGISTRY is registry.REGISTRY and policy.register is registry.register
  for name, entry in registry.REGISTRY.items():
    assert entry.factory.__module__.startswith('hfl.compress.'), name


@pytest.mark.parametrize('name', sorted(registry.REGISTRY))
def test_every_registered_name_builds_from_its_example_spec(name):
  spec = registry.example_spec(name)
  assert set(spec) - {'name'} <= set(registry.lookup(name).hyper)
  [c] = policy.build(spec, jax.ShapeDtypeStruct(SHAPE, jnp.float32), 0, 'float32')
  assert isinstance(c, base.Compressor) and c.shape == SHAPE


def test_distinct_names_keep_one_name_per_factory_and_example():
  names = registry.distinct_names()
  assert names == sorted(names) and set(names) <= set(registry.REGISTRY)
  assert {'identity', 'bf16', 'fp16'} <= set(names)
  assert not {'float32', 'bfloat16', 'float16'} & set(names)
  keys = {(id(registry.REGISTRY[n].factory), repr(sorted(registry.REGISTRY[n].example.items())))
          for n in registry.REGISTRY}
  assert len(names) == len(keys)


def test_register_refuses_an_example_outside_its_hyper_parameters_and_bad_names():
  with pytest.raises(ValueError, match=r"register\('bad'\): example sets rank, which are not "
                     r'among its hyper-parameters \(density\)'):
    registry.register('bad', base.identity, ('density',), example={'rank': 2})
  with pytest.raises(ValueError, match='non-empty str'):
    registry.register('', base.identity)
  assert 'bad' not in registry.REGISTRY and '' not in registry.REGISTRY
  with pytest.raises(KeyError, match="unknown compressor 'bad'; registered: bf16, bfloat16"):
    registry.lookup('bad')


def test_a_compressor_in_a_new_module_is_discovered_validated_and_built(toy_package):
  """The toy package's one module is imported (not _private.py) and its register call
  makes 'signmag2' a valid config name, buildable by the policy and among the
  registry-wide tests' cases; its payload decodes as the module defines."""
  assert toy_package == ['hfl_toy_compressors.signmag2']
  assert 'signmag2' in sorted(policy.REGISTRY) and 'signmag2' in registry.distinct_names()
  assert registry.example_spec('signmag2') == {'name': 'signmag2'}
  cfg = default_config.get_config()
  cfg.compression.uplink.name = 'signmag2'
  config_lib.validate(cfg, paths=False)
  assert config_lib.ignored_fields(cfg)['compression.uplink.density'] == (
      "compression.uplink.name='signmag2' takes no hyper-parameters")
  [c] = policy.build(registry.example_spec('signmag2'),
                     jax.ShapeDtypeStruct(SHAPE, jnp.float32), 0, 'float32')
  x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
  payload, _ = jax.jit(lambda v: c.encode(v, c.init(), None))(x)
  assert base.payload_bits(payload) == 8 * x.size + 32
  dec = np.asarray(c.decode(payload))
  m = np.mean(np.abs(x))
  np.testing.assert_allclose(np.abs(dec), np.where(np.abs(x) >= m, 1.5, 0.5) * m, rtol=1e-6)
  assert np.all(np.sign(dec) == np.sign(x))
  x[3, 4] = np.nan
  assert not np.isfinite(np.asarray(c.decode(c.encode(x, c.init(), None)[0]))).any()


def test_an_unregistered_name_is_refused_by_config_validation():
  cfg = default_config.get_config()
  cfg.compression.wan.name = 'signmag2'
  with pytest.raises(ValueError, match=r"compression\.wan\.name='signmag2': unknown "
                     r'compressor; allowed: bf16, bfloat16, chunked_topk'):
    config_lib.validate(cfg, paths=False)
