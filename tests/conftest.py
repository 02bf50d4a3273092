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
