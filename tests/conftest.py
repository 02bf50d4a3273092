"""Test setup: a fast allocator, then 8 simulated CPU devices before anything touches JAX.

Shared fixtures live here (``fake_data``); shared helper functions in
``tests/helpers.py``. Markers (``slow``, ``multiprocess``) are registered in
``pytest.ini``.

Run from the pytest command line, the session re-executes itself once with the
allocator of :mod:`hfl.runtime` (tcmalloc) before any test module is imported;
the tests' own subprocesses (main.py, launchers) inherit it. ``HFL_ALLOCATOR=system``
turns this off.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hfl import runtime  # noqa: E402


def _pytest_command_line() -> bool:
  """Whether this process is the pytest command (not pytest.main() inside a program)."""
  main = sys.modules.get('__main__')
  spec = getattr(main, '__spec__', None)
  if spec is not None and spec.name in ('pytest', 'pytest.__main__'):
    return True
  return os.path.basename(sys.argv[0]) in ('pytest', 'py.test')


_REEXEC = _pytest_command_line() and runtime.needs_reexec()

if not _REEXEC:  # the re-executed session imports JAX instead
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')
  import jax  # noqa: E402

  jax.config.update('jax_num_cpu_devices', 8)


def pytest_configure(config):
  """Re-executes the session with the fast allocator (before collection imports tests)."""
  if _REEXEC:
    capture = config.pluginmanager.getplugin('capturemanager')
    runtime.use_fast_allocator(
        before_exec=capture.stop_global_capturing if capture is not None else None)


@pytest.fixture(scope='session')
def fake_data(tmp_path_factory):
  """A directory of gzip'd IDX files: a learnable 10-class Fashion-MNIST stand-in
  (640 train, 160 test images; :func:`tests.helpers.make_fake_fashion_mnist`)."""
  from tests.helpers import make_fake_fashion_mnist  # pylint: disable=g-import-not-at-top
  return make_fake_fashion_mnist(tmp_path_factory.mktemp('fmnist'))


# Persistent XLA compilation cache for the session (jax.config, in this process
# only: subprocesses of main.py or the launchers compile for themselves).
# HFL_TEST_JAX_CACHE=DIR picks the directory; HFL_TEST_JAX_CACHE= (empty) turns it off.
JAX_CACHE_DIR = os.path.expanduser(
    os.environ.get('HFL_TEST_JAX_CACHE', os.path.join('~', '.cache', 'hfl', 'jax_tests')))
# Programs that took >= 0.2 s to compile, of any size (tiny op-by-op programs load
# about as slowly as they compile). No jax_compilation_cache_max_size: JAX needs the
# filelock package for it, and without it every cache read fails (a warning, then a
# compilation). The test programs take ~1.5 MB.
JAX_CACHE_SETTINGS = {'jax_persistent_cache_min_compile_time_secs': 0.2,
                      'jax_persistent_cache_min_entry_size_bytes': -1}


@pytest.fixture(scope='session', autouse=True)
def jax_compilation_cache():
  """Compiled programs persist across test sessions: a second run of the same tests
  loads the step, evaluation and init programs instead of compiling them."""
  if not JAX_CACHE_DIR:
    yield None
    return
  import jax  # pylint: disable=g-import-not-at-top,redefined-outer-name
  from jax.experimental.compilation_cache import compilation_cache  # pylint: disable=g-import-not-at-top
  os.makedirs(JAX_CACHE_DIR, exist_ok=True)
  settings = dict(JAX_CACHE_SETTINGS, jax_compilation_cache_dir=JAX_CACHE_DIR)
  old = {k: getattr(jax.config, k) for k in settings}
  for k, v in settings.items():
    jax.config.update(k, v)
  compilation_cache.reset_cache()  # JAX decides on its first compilation: decide again
  yield JAX_CACHE_DIR
  for k, v in old.items():
    jax.config.update(k, v)
  compilation_cache.reset_cache()
