"""Where a run's numbers come from: the code, the libraries and the machine.

Every start of a run (a fresh start or a resumption that trains) records one
:func:`collect` entry; ``summary.json`` keeps them as the list ``provenance``, in
order, so a number on the results page can be traced to the commit, library
versions and device that produced it, and a run resumed on other code or another
machine says so.

An entry (all strings or ints; ``None`` where it cannot be known, e.g. a copy of
hfl outside a git checkout):

- ``started_utc``: ISO 8601 time of the start, seconds; ``at_iteration``: the
  intra-DC iteration the start trained from (0 for a fresh run);
- ``git_commit`` (40 hex digits) and ``git_dirty`` (bool: tracked files differ from
  the commit; untracked files are not counted) of the checkout holding ``hfl``;
- ``hfl_version`` (:data:`VERSION`), ``python``, and the versions of ``jax``,
  ``jaxlib``, ``flax``, ``optax``;
- ``backend`` (``cpu``, ``gpu``, ``tpu``), ``device_kind`` (e.g. ``cpu``,
  ``NVIDIA H100 80GB HBM3``), ``device_count`` (global), ``process_count``;
- ``cpu_model``: the host's processor name (``/proc/cpuinfo``'s ``model name``, else
  :func:`platform.processor`).
"""

import datetime
import functools
import importlib.metadata
import os
import platform
import subprocess

import jax

VERSION = '0.9.0'

FIELDS = ('started_utc', 'at_iteration', 'git_commit', 'git_dirty', 'hfl_version', 'python',
          'jax', 'jaxlib', 'flax', 'optax', 'backend', 'device_kind', 'device_count',
          'process_count', 'cpu_model')

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _git(*args: str) -> str | None:
  """``git -C <hfl's checkout> ARGS``'s stdout, stripped; None when git or the
  checkout is missing, or the command fails (within 10 s)."""
  try:
    out = subprocess.run(['git', '-C', _REPO, *args], capture_output=True, text=True,
                         timeout=10, check=True)
  except (OSError, subprocess.SubprocessError):
    return None
  return out.stdout.strip()


def _version(package: str) -> str | None:
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return None


def cpu_model() -> str | None:
  """The host processor's name: ``model name`` of ``/proc/cpuinfo`` (Linux), else
  :func:`platform.processor`, else None."""
  try:
    with open('/proc/cpuinfo', encoding='utf-8', errors='replace') as f:
      for line in f:
        if line.lower().startswith('model name'):
          return line.split(':', 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or None


@functools.cache
def _static() -> dict:
  """The fields of :func:`collect` that do not change within a process."""
  commit = _git('rev-parse', 'HEAD')
  dirty = None
  if commit is not None:
    status = _git('status', '--porcelain', '--untracked-files=no')
    dirty = None if status is None else bool(status)
  dev = jax.devices()[0]
  return dict(git_commit=commit, git_dirty=dirty, hfl_version=VERSION,
              python=platform.python_version(), jax=jax.__version__, jaxlib=_version('jaxlib'),
              flax=_version('flax'), optax=_version('optax'), backend=jax.default_backend(),
              device_kind=dev.device_kind, device_count=jax.device_count(),
              process_count=jax.process_count(), cpu_model=cpu_model())


def collect(at_iteration: int = 0) -> dict:
  """One provenance entry (module docstring) for a start at ``at_iteration``.

  Starts JAX's backend (it asks for the devices). Never raises for a missing git,
  checkout or package: those fields are None.
  """
  now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
  return dict(started_utc=now.isoformat(), at_iteration=int(at_iteration), **_static())
