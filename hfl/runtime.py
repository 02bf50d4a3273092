"""Process start-up: a fast memory allocator for XLA:CPU, chosen before anything runs.

XLA:CPU allocates and frees its large per-step buffers (activations, gradients,
collective staging) every step. glibc's malloc returns such blocks to the kernel
(``munmap`` of mmap'd chunks, trimming of the heap top and of the per-thread arena
heaps), so the next step faults every page in again: on the default experiment
about a third of the CPU time went to the kernel (issue 17, measured in
``docs/benchmarks.md``). tcmalloc (gperftools' ``libtcmalloc_minimal``) keeps
freed spans in its page heap and releases them slowly, which removes nearly all
of it; glibc's malloc tunables (no trimming, a high mmap threshold) remove most.

:func:`use_fast_allocator` is called first thing by ``main.py``, the benchmarks
and ``tests/conftest.py``. An allocator is chosen when the process starts (the
dynamic loader reads ``LD_PRELOAD`` and ``GLIBC_TUNABLES`` before ``main``), so
the function re-executes the same command line (``os.execv`` of
``sys.executable`` with ``sys.orig_argv``: same pid, same environment plus the
allocator's variables) once:

* with ``LD_PRELOAD=libtcmalloc_minimal.so.4`` when that library is installed
  (Debian/Ubuntu: ``libtcmalloc-minimal4``, installed by ``launch/setup.sh``);
* otherwise with the glibc tunables :data:`GLIBC_MALLOC_TUNABLES`, and one line
  on stderr saying that tcmalloc is missing and how to install it.

It does nothing when the user already chose (an allocator in ``LD_PRELOAD``,
``glibc.malloc`` tunables in ``GLIBC_TUNABLES``, or ``HFL_ALLOCATOR=system``),
when the re-executed process runs it again (marker :data:`MARKER` in the
environment: it never loops, and child processes inherit the choice silently),
on a C library other than glibc, and where the command line cannot be replayed
(interactive interpreter, a script read from stdin). The allocator changes no
result: ``tests/test_runtime.py`` trains the smoke config with and without it
and compares ``summary.json`` bitwise apart from wall-clock fields.

Environment:
  HFL_ALLOCATOR: ``auto`` (default: tcmalloc, else the tunables), ``tcmalloc``
    (tcmalloc or nothing), ``tunables`` (glibc tunables only), ``system``
    (leave the process alone).
"""

import ctypes.util
import glob
import os
import platform
import signal
import sys

# Set in the environment of the re-executed process: what it was started with.
MARKER = 'HFL_ALLOCATOR_APPLIED'
CHOICE = 'HFL_ALLOCATOR'
CHOICES = ('auto', 'tcmalloc', 'tunables', 'system')
TCMALLOC = 'libtcmalloc_minimal.so.4'
# Searched when the loader cache (ldconfig) does not list the library.
_TCMALLOC_GLOBS = ('/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4',
                   '/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4',
                   '/usr/lib*/libtcmalloc_minimal.so.4',
                   '/usr/local/lib*/libtcmalloc_minimal.so.4')
# glibc malloc: serve every block below 4 GiB from the arenas instead of a fresh
# mmap (XLA:CPU's per-execution temporaries are one block per device, ~36 MB for
# the default CNN: above glibc's dynamic threshold's 32 MiB ceiling, so without
# this each step maps and unmaps them), and never trim the heap tops.
GLIBC_MALLOC_TUNABLES = ('glibc.malloc.mmap_threshold=4294967295:'
                         'glibc.malloc.trim_threshold=4294967295')
# tcmalloc reports single allocations above 1 GiB on stderr by default (a large
# dataset array would print a stack address line); raise the threshold to 1 TiB.
_TCMALLOC_ENV = {'TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD': str(1 << 40)}
_ALLOCATOR_LIBS = ('tcmalloc', 'jemalloc', 'mimalloc', 'hoard', 'tbbmalloc')


def find_tcmalloc() -> str | None:
  """Path (or loader name) of ``libtcmalloc_minimal.so.4``, None when not installed."""
  for pattern in _TCMALLOC_GLOBS:
    found = sorted(glob.glob(pattern))
    if found:
      return found[0]
  name = ctypes.util.find_library('tcmalloc_minimal')  # ldconfig -p, then gcc/ld
  return name or None


def user_choice(env=None) -> str | None:
  """The allocator the user already set, as a short description, or None.

  Args:
    env: the environment (default ``os.environ``).

  Returns:
    ``'LD_PRELOAD=...'`` when it names an allocator, ``'GLIBC_TUNABLES=...'``
    when it sets a ``glibc.malloc`` tunable, ``'HFL_ALLOCATOR=system'``; None
    when the user chose nothing.
  """
  env = os.environ if env is None else env
  preload = env.get('LD_PRELOAD', '')
  if any(lib in preload for lib in _ALLOCATOR_LIBS):
    return f'LD_PRELOAD={preload}'
  if 'glibc.malloc.' in env.get('GLIBC_TUNABLES', ''):
    return f'GLIBC_TUNABLES={env["GLIBC_TUNABLES"]}'
  if env.get(CHOICE, 'auto') == 'system':
    return f'{CHOICE}=system'
  return None


def allocator_env(env=None, tcmalloc: str | None = None) -> tuple[dict, str | None]:
  """The environment to re-execute with, and a warning for the log (or None).

  Args:
    env: the current environment (default ``os.environ``); not modified.
    tcmalloc: path of ``libtcmalloc_minimal.so.4`` (None: not installed).

  Returns:
    ``(new_env, warning)``: ``new_env`` is ``env`` plus the allocator's
    variables and :data:`MARKER` (set to ``'tcmalloc'``, ``'tunables'`` or
    ``'none'``); ``warning`` says what is missing when tcmalloc was wanted but
    not found.

  Raises:
    ValueError: ``HFL_ALLOCATOR`` is not one of :data:`CHOICES`.
  """
  env = dict(os.environ if env is None else env)
  choice = env.get(CHOICE, 'auto') or 'auto'
  if choice not in CHOICES:
    raise ValueError(f'{CHOICE}={choice!r} is not one of {", ".join(CHOICES)}.')
  warning = None
  if choice in ('auto', 'tcmalloc') and tcmalloc:
    env['LD_PRELOAD'] = ':'.join(p for p in (tcmalloc, env.get('LD_PRELOAD', '')) if p)
    for key, value in _TCMALLOC_ENV.items():
      env.setdefault(key, value)
    env[MARKER] = 'tcmalloc'
    return env, None
  if choice in ('auto', 'tcmalloc'):
    warning = (f'hfl: {TCMALLOC} not found, so XLA:CPU runs with glibc malloc'
               + (' tuned by GLIBC_TUNABLES' if choice == 'auto' else '')
               + ' (slower; install it with `bash launch/setup.sh` or '
               '`apt-get install libtcmalloc-minimal4`; docs/benchmarks.md).')
  if choice in ('auto', 'tunables'):
    env['GLIBC_TUNABLES'] = ':'.join(
        t for t in (env.get('GLIBC_TUNABLES', ''), GLIBC_MALLOC_TUNABLES) if t)
    env[MARKER] = 'tunables'
  else:
    env[MARKER] = 'none'
  return env, warning


def _replayable_argv() -> list[str] | None:
  """The command line to re-execute, or None when it cannot be replayed."""
  orig = getattr(sys, 'orig_argv', None)
  if not orig or getattr(sys, 'frozen', False) or hasattr(sys, 'ps1'):
    return None
  if sys.flags.interactive or not sys.executable:
    return None
  if len(sys.argv) and sys.argv[0] in ('', '-'):  # -i / script from stdin
    return None
  return [sys.executable] + list(orig[1:])


def active() -> str | None:
  """The allocator this process runs with: 'tcmalloc' (mapped in), 'tunables', or None."""
  try:
    with open('/proc/self/maps') as f:
      if 'tcmalloc' in f.read():
        return 'tcmalloc'
  except OSError:
    pass
  return 'tunables' if 'glibc.malloc.' in os.environ.get('GLIBC_TUNABLES', '') else None


def needs_reexec() -> bool:
  """Whether :func:`use_fast_allocator` would re-execute this process."""
  if os.environ.get(MARKER) is not None or user_choice() is not None:
    return False
  if sys.platform != 'linux' or platform.libc_ver()[0] != 'glibc':
    return False
  return _replayable_argv() is not None


def use_fast_allocator(before_exec=None) -> None:
  """Re-executes this process once with a fast allocator (see the module docstring).

  Call it first thing, before JAX or anything that starts threads is imported;
  returns normally when nothing is to be done (and always in the re-executed
  process).

  Args:
    before_exec: optional callable run just before ``os.execv`` (pytest uses it
      to stop capturing its output).

  Raises:
    SystemExit: ``HFL_ALLOCATOR`` holds an unknown value (one line on stderr,
      exit status 2).
  """
  if not needs_reexec():
    return
  try:
    env, warning = allocator_env(tcmalloc=find_tcmalloc())
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    raise SystemExit(2) from None
  if warning:
    print(warning, file=sys.stderr)
  if env[MARKER] == 'none':
    os.environ[MARKER] = 'none'  # decided: children stay silent
    return
  if before_exec is not None:
    before_exec()
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, _replayable_argv(), env)


class Terminated(KeyboardInterrupt):
  """SIGTERM (a scheduler's or ``kill``'s stop) once :func:`stop_on_sigterm` is set: it
  unwinds like Ctrl-C, so locks are released and jobs stopped, and the run can resume."""


def stop_on_sigterm():
  """Makes SIGTERM raise :class:`Terminated` in the main thread (call it from there);
  returns the previous handler (``signal.signal(signal.SIGTERM, it)`` restores it)."""
  def handler(signum, frame):
    del signum, frame
    raise Terminated()
  return signal.signal(signal.SIGTERM, handler)


def interrupt_status(e: BaseException) -> int:
  """The exit status of an interrupted command: 143 for SIGTERM, else 130 (Ctrl-C)."""
  return 143 if isinstance(e, Terminated) else 130
