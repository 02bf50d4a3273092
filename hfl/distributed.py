"""Multi-process runs: ``jax.distributed`` start-up and global arrays from local data.

One hfl run is one SPMD program. On one host it is one process that owns every
device; on a GPU cluster, a TPU pod or multi-slice, or the local multi-process
launcher (``launch/local_multiprocess.py``) it is N processes, each owning the
devices of its host (or of its share of the host's CPU), joined by JAX's own
distributed runtime (``jax.distributed.initialize``). Nothing here is
home-made: the coordinator, the heartbeats, and the collectives (NCCL, ICI/DCN,
or gloo on CPU) are JAX's.

Start-up (:func:`maybe_initialize`, called by ``main.py`` before anything
touches the JAX backend) decides whether the run is multi-process, in order:

  1. explicit settings: ``--coordinator_address/--num_processes/--process_id``
     on ``main.py``, else the environment variables ``HFL_COORDINATOR``,
     ``HFL_NUM_PROCESSES``, ``HFL_PROCESS_ID``;
  2. a cluster JAX detects by itself with more than one process (SLURM with
     ``SLURM_NTASKS > 1``, Open MPI, Cloud TPU pods and multi-slice): JAX's
     cluster detection fills in the coordinator, process count and id;
  3. otherwise a single process (no coordinator, the original behaviour).

Start-up is bounded: ``initialization_timeout`` (seconds) is passed to JAX, and
a watchdog turns JAX's own abort after a missing process or an unreachable
coordinator (a C++ ``DEADLINE_EXCEEDED`` stack trace) into one clear line and
exit status :data:`INIT_FAILED_EXIT_CODE`.

Data (:func:`put_global`, :func:`put_rows`): every process builds each global
array from process-local data, transferring to its devices only the blocks
those devices own under the array's sharding, through
``jax.make_array_from_callback`` (which calls back only for this process's
devices); with one process this is exactly ``jax.device_put`` of the whole
array (same bytes, same sharding). Small arrays (labels, masks, weights) are
held whole by every process (:func:`put_global`); images are row sources
(:class:`hfl.data.rows.NormalisedRows`) from which :func:`put_rows` reads, and
converts to float32, only the rows of this process's devices. Metrics sharded
over ``'dc'`` are gathered back to every process with :func:`to_host`.
"""

import dataclasses
import os
import socket
import sys
import threading
import time
from typing import Any, Callable, Mapping, Optional

import numpy as np

# Exit status of a process whose distributed start-up failed or timed out.
INIT_FAILED_EXIT_CODE = 75

# Default bound on start-up, seconds. Long enough for a cluster whose hosts
# start within a minute of each other; short enough that a missing process is
# reported before a CI job's timeout.
DEFAULT_TIMEOUT_S = 120

# Environment variables read when the flags are not given.
ENV_COORDINATOR = 'HFL_COORDINATOR'
ENV_NUM_PROCESSES = 'HFL_NUM_PROCESSES'
ENV_PROCESS_ID = 'HFL_PROCESS_ID'
ENV_TIMEOUT = 'HFL_INIT_TIMEOUT_S'
ENV_HEARTBEAT = 'HFL_HEARTBEAT_TIMEOUT_S'


@dataclasses.dataclass(frozen=True)
class ProcessInfo:
  """How this process takes part in the run.

  Attributes:
    num_processes: processes in the run (1: single process, no coordinator).
    process_id: this process's index in [0, num_processes).
    coordinator_address: 'host:port' of process 0's coordinator, or None when
      JAX detected the cluster itself or the run is single-process.
    source: where the settings came from: 'single', 'flags', 'env' or the name
      of the cluster JAX detected (e.g. 'SlurmCluster').
  """
  num_processes: int
  process_id: int
  coordinator_address: Optional[str]
  source: str

  @property
  def multi_process(self) -> bool:
    return self.num_processes > 1


class DistributedInitError(RuntimeError):
  """The multi-process settings are inconsistent or start-up failed."""


def _parse_int(value, name: str) -> Optional[int]:
  if value is None or value == '':
    return None
  try:
    return int(value)
  except (TypeError, ValueError):
    raise DistributedInitError(f'{name}={value!r} must be an integer.') from None


def resolve(coordinator_address: Optional[str] = None,
            num_processes: Optional[int] = None,
            process_id: Optional[int] = None,
            environ: Optional[Mapping[str, str]] = None) -> Optional[ProcessInfo]:
  """Resolves explicit multi-process settings from flags, then the environment.

  Args:
    coordinator_address: 'host:port' of process 0 (flag), or None.
    num_processes: number of processes (flag), or None.
    process_id: this process's id (flag), or None.
    environ: the environment (default ``os.environ``).

  Returns:
    A ProcessInfo when settings were given explicitly (flags win over the
    environment, field by field), or None when none were (then a cluster JAX
    detects, or a single process).

  Raises:
    DistributedInitError: some but not all of the three settings are given,
      num_processes < 1, process_id outside [0, num_processes), or the
      address is not 'host:port' with a port in [1, 65535].
  """
  env = os.environ if environ is None else environ
  source = 'flags'
  if coordinator_address is None and num_processes is None and process_id is None:
    source = 'env'
  addr = coordinator_address if coordinator_address else env.get(ENV_COORDINATOR) or None
  n = num_processes if num_processes is not None else _parse_int(
      env.get(ENV_NUM_PROCESSES), ENV_NUM_PROCESSES)
  pid = process_id if process_id is not None else _parse_int(
      env.get(ENV_PROCESS_ID), ENV_PROCESS_ID)
  given = {'coordinator_address': addr, 'num_processes': n, 'process_id': pid}
  if all(v is None for v in given.values()):
    return None
  if n == 1 and addr is None:
    # A single process may be stated without a coordinator.
    return ProcessInfo(1, pid or 0, None, source)
  missing = [k for k, v in given.items() if v is None]
  if missing:
    raise DistributedInitError(
        f'multi-process settings are incomplete: {", ".join(missing)} missing '
        f'(given: {", ".join(f"{k}={v!r}" for k, v in given.items() if v is not None)}). '
        f'Set all three of --coordinator_address/--num_processes/--process_id '
        f'(or {ENV_COORDINATOR}/{ENV_NUM_PROCESSES}/{ENV_PROCESS_ID}), or none.')
  if n < 1:
    raise DistributedInitError(f'num_processes={n} must be >= 1.')
  if not 0 <= pid < n:
    raise DistributedInitError(f'process_id={pid} must be in [0, num_processes={n}).')
  host, sep, port = addr.rpartition(':')
  if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
    raise DistributedInitError(
        f'coordinator_address={addr!r} must be host:port (e.g. 10.0.0.1:1234), the '
        'address of process 0 and a free port on it.')
  return ProcessInfo(n, pid, addr, source)


def detect_cluster() -> Optional[ProcessInfo]:
  """Asks JAX's own cluster detection for a multi-process cluster.

  Uses the environments JAX knows (SLURM, Open MPI, Cloud TPU pods and
  multi-slice, Kubernetes) through ``jax._src.clusters`` — the same code
  ``jax.distributed.initialize()`` runs without arguments — only to learn the
  process count, so that a single-task SLURM job or a single TPU VM stays a
  plain single-process run.

  Returns:
    ProcessInfo(source=<cluster class name>) when a cluster with more than one
    process is detected, else None.
  """
  try:
    from jax._src import clusters  # lazy: jax  pylint: disable=g-import-not-at-top
    envs = [e for e in clusters.ClusterEnv._cluster_types  # pylint: disable=protected-access
            if not getattr(e, 'opt_in_only_method', False)]
  except (ImportError, AttributeError):  # JAX moved its internals: fall back.
    envs = []
  for env in envs:
    try:
      if not env.is_env_present():
        continue
      n = int(env.get_process_count())
      pid = int(env.get_process_id())
    except Exception:  # pylint: disable=broad-except
      continue  # A half-present environment (e.g. metadata server down).
    if n > 1:
      return ProcessInfo(n, pid, None, env.__name__)
    return None
  return None


def _wait_for_coordinator(address: str, deadline: float) -> bool:
  """Polls a TCP connect to ``address`` until it succeeds or ``deadline`` passes."""
  host, _, port = address.rpartition(':')
  host = host.strip('[]')
  while True:
    try:
      with socket.create_connection((host, int(port)), timeout=2):
        return True
    except OSError:
      if time.monotonic() >= deadline:
        return False
      time.sleep(0.25)


def _fail(message: str) -> None:
  """Prints one clear line to stderr and exits the process immediately."""
  sys.stderr.write(f'error: {message}\n')
  sys.stderr.flush()
  sys.stdout.flush()
  os._exit(INIT_FAILED_EXIT_CODE)  # pylint: disable=protected-access


def maybe_initialize(coordinator_address: Optional[str] = None,
                     num_processes: Optional[int] = None,
                     process_id: Optional[int] = None,
                     timeout_s: Optional[int] = None,
                     heartbeat_timeout_s: Optional[int] = None,
                     auto_detect: bool = True,
                     initialize_fn: Optional[Callable[..., Any]] = None) -> ProcessInfo:
  """Starts JAX's distributed runtime when the run is multi-process.

  Must run before anything touches the JAX backend (first array,
  ``jax.devices()``); ``main.py`` calls it first. On CPU it also selects the
  gloo collectives (``jax_cpu_collectives_implementation``), so that
  collectives cross processes.

  Args:
    coordinator_address: 'host:port' of process 0 (``--coordinator_address``).
    num_processes: processes in the run (``--num_processes``).
    process_id: this process's id (``--process_id``).
    timeout_s: start-up bound in seconds (default ``$HFL_INIT_TIMEOUT_S`` or
      :data:`DEFAULT_TIMEOUT_S`): how long process 0 waits for every process to
      register, and others for the coordinator.
    heartbeat_timeout_s: seconds without a heartbeat after which JAX declares
      a process dead and stops the others (default ``$HFL_HEARTBEAT_TIMEOUT_S``
      or JAX's 100).
    auto_detect: ask JAX's cluster detection when nothing is set explicitly.
    initialize_fn: for tests; defaults to ``jax.distributed.initialize``.

  Returns:
    The ProcessInfo of this process (num_processes == 1: nothing started).

  Raises:
    DistributedInitError: inconsistent settings (see :func:`resolve`), the
      coordinator's port is already in use (process 0, checked before JAX
      starts anything), or ``jax.distributed.initialize`` raised (e.g. the
      backend had already started).

  A coordinator that cannot be reached or a process that never registers
  within ``timeout_s`` ends this process with a one-line error on stderr and
  exit status :data:`INIT_FAILED_EXIT_CODE` (JAX aborts the process in C++ in
  that case, so no Python exception can be raised).
  """
  info = resolve(coordinator_address, num_processes, process_id)
  if info is None and auto_detect:
    info = detect_cluster()
  if info is None or not (info.multi_process or info.coordinator_address):
    # An explicit coordinator with one process still starts the runtime (then
    # even a single process uses the cross-process collectives, as N would).
    return info or ProcessInfo(1, 0, None, 'single')

  timeout_s, heartbeat_timeout_s = _timeouts(timeout_s, heartbeat_timeout_s)
  _use_gloo()
  who = (f'process {info.process_id} of {info.num_processes}'
         if info.coordinator_address else f'a {info.source} process')
  where = info.coordinator_address or 'the coordinator chosen by JAX'
  _check_coordinator_port(info, who)
  deadline = time.monotonic() + timeout_s
  if info.coordinator_address and info.process_id != 0:
    if not _wait_for_coordinator(info.coordinator_address, deadline):
      _fail(f'{who}: coordinator {where} unreachable for {timeout_s} s (is process 0 '
            'running, and is the address/port right and open?).')
  done = _start_watchdog(who, where, timeout_s, deadline)
  try:
    _initialize(info, who, timeout_s, heartbeat_timeout_s, initialize_fn)
  finally:
    done.set()
  return info


def _timeouts(timeout_s: Optional[int], heartbeat_timeout_s: Optional[int]):
  """(start-up timeout, heartbeat timeout or None) in seconds, from the arguments
  or the environment (:data:`ENV_TIMEOUT`, :data:`ENV_HEARTBEAT`).

  Raises:
    DistributedInitError: a start-up timeout below 1 s (or a malformed variable).
  """
  if timeout_s is None:
    timeout_s = _parse_int(os.environ.get(ENV_TIMEOUT), ENV_TIMEOUT) or DEFAULT_TIMEOUT_S
  if heartbeat_timeout_s is None:
    heartbeat_timeout_s = _parse_int(os.environ.get(ENV_HEARTBEAT), ENV_HEARTBEAT)
  if timeout_s < 1:
    raise DistributedInitError(f'initialization timeout {timeout_s} s must be >= 1.')
  return timeout_s, heartbeat_timeout_s


def _use_gloo() -> None:
  """Selects gloo CPU collectives: the default in current JAX, set explicitly so an
  older default (no cross-process CPU collectives) cannot silently deadlock."""
  import jax  # lazy: jax  pylint: disable=g-import-not-at-top
  try:
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  except (AttributeError, ValueError):
    pass


def _start_watchdog(who: str, where: str, timeout_s: int, deadline: float) -> threading.Event:
  """Starts a daemon thread that ends the process with one line on stderr unless the
  returned event is set before ``deadline`` (time.monotonic seconds).

  JAX aborts the process (SIGABRT, C++ stack trace) when start-up exceeds its
  timeout; this reports it, a little earlier, in words.
  """
  done = threading.Event()

  def watchdog():
    if not done.wait(max(deadline - time.monotonic(), 1.0)):
      _fail(f'{who}: distributed start-up did not complete within {timeout_s} s '
            f'(coordinator {where}): a process is missing or failed to start, or the '
            'coordinator is unreachable. Start all processes with the same '
            'coordinator address and process count, each with its own process id.')

  threading.Thread(target=watchdog, name='hfl-init-watchdog', daemon=True).start()
  return done


def _initialize(info: ProcessInfo, who: str, timeout_s: int,
                heartbeat_timeout_s: Optional[int],
                initialize_fn: Optional[Callable[..., Any]]) -> None:
  """Calls ``initialize_fn`` (default ``jax.distributed.initialize``) for ``info``.

  Raises:
    DistributedInitError: the call raised (e.g. the backend had already started).
  """
  import jax  # lazy: jax  pylint: disable=g-import-not-at-top
  kwargs = dict(initialization_timeout=int(timeout_s) + 30)
  if heartbeat_timeout_s:
    kwargs['heartbeat_timeout_seconds'] = int(heartbeat_timeout_s)
  if info.coordinator_address:
    kwargs.update(coordinator_address=info.coordinator_address,
                  num_processes=info.num_processes, process_id=info.process_id)
  init = initialize_fn or jax.distributed.initialize
  try:
    init(**kwargs)
  except Exception as e:  # pylint: disable=broad-except
    raise DistributedInitError(
        f'{who}: jax.distributed.initialize failed: {e}. It must run before any JAX '
        'operation (main.py calls it first).') from e


def port_in_use(port: int) -> bool:
  """Whether TCP ``port`` is taken on this machine (something listens or is bound there).

  Probes by binding the wildcard address (IPv4, with SO_REUSEADDR so that a port
  in TIME_WAIT counts as free, as it does for the coordinator's own server).
  """
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      s.bind(('', int(port)))
    except OSError:
      return True
  return False


def _check_coordinator_port(info: ProcessInfo, who: str) -> None:
  """Process 0 starts the coordinator: a taken port is reported as such, first."""
  if info.process_id != 0 or not info.coordinator_address:
    return
  port = int(info.coordinator_address.rpartition(':')[2])
  if port_in_use(port):
    raise DistributedInitError(
        f'{who}: port {port} is already in use on this machine, so the coordinator '
        f'({info.coordinator_address}) cannot start there; choose another port for '
        '--coordinator_address / HFL_COORDINATOR (every process must use the same one).')


def cpu_devices_per_process(total_devices: int, info: ProcessInfo) -> int:
  """Simulated CPU devices each process should create for a mesh of ``total_devices``.

  Raises:
    ValueError: ``total_devices`` is not a multiple of the process count (names
      the mesh fields).
  """
  if total_devices % info.num_processes:
    raise ValueError(
        f'mesh.num_dcs * mesh.workers_per_dc = {total_devices} devices cannot be split '
        f'evenly over {info.num_processes} processes; choose a process count that '
        'divides it (e.g. one process per DC).')
  return total_devices // info.num_processes


# Set (to 1) by launch/emulated_wan.py: each DC must be exactly one process.
ENV_ONE_DC_PER_PROCESS = 'HFL_ONE_DC_PER_PROCESS'


def dc_placement_problem(process_of_device: np.ndarray,
                         one_dc_per_process: bool = False) -> Optional[str]:
  """What is wrong with how the ('dc', 'worker') mesh's DCs sit on processes, if anything.

  hfl models the 'worker' collectives as a DC's LAN and the 'dc' collectives as
  the WAN. A DC whose workers live on several processes ("straddles" them) sends
  part of its intra-DC traffic across the process boundary: on a cluster that is
  a DC spread over several hosts (legitimate, worth a warning); under
  ``launch/emulated_wan.py``, where each process is one DC in its own network
  namespace, it puts intra-DC traffic on the emulated WAN (an error).

  Args:
    process_of_device: int [D, W], the process index of each mesh position
      (``mesh.devices[d, w].process_index``).
    one_dc_per_process: require exactly one whole DC per process.

  Returns:
    None when the placement is fine, else one paragraph naming the DCs that
    straddle processes (or the processes holding several DCs) and how to fix
    the process count or the mesh.
  """
  procs = np.asarray(process_of_device)
  num_dcs, workers = procs.shape
  num_processes = len(np.unique(procs))
  per_dc = [sorted(set(int(p) for p in row)) for row in procs]
  straddle = {d: ps for d, ps in enumerate(per_dc) if len(ps) > 1}
  several = {p: [d for d, ps in enumerate(per_dc) if ps == [p]]
             for p in sorted(set(procs.ravel().tolist()))}
  several = {p: ds for p, ds in several.items() if len(ds) > 1}
  if not straddle and not (one_dc_per_process and several):
    return None
  divisors = [n for n in range(1, num_dcs + 1) if num_dcs % n == 0]
  layout = (f'mesh.num_dcs={num_dcs} x mesh.workers_per_dc={workers} on {num_processes} '
            f'processes of {procs.size // num_processes} devices each')
  parts = [f'DC {d} spans processes {", ".join(map(str, ps))}' for d, ps in straddle.items()]
  if one_dc_per_process:
    parts += [f'process {p} holds DCs {", ".join(map(str, ds))}' for p, ds in several.items()]
    return (f'the emulated WAN runs each DC as one process in its own network namespace, '
            f'but {"; ".join(parts)} ({layout}), so intra-DC traffic would cross the '
            f'emulated WAN. Run mesh.num_dcs={num_dcs} processes (one per DC) with '
            f'mesh.workers_per_dc devices each.')
  return (f'{"; ".join(parts)} ({layout}): that DC\'s intra-DC (\'worker\') collectives '
          f'cross the process boundary instead of staying on one host. To keep every DC in '
          f'one process, use a process count that divides mesh.num_dcs '
          f'({", ".join(map(str, divisors))}), or set mesh.num_dcs to a multiple of '
          f'{num_processes} processes.')


def check_dc_placement(mesh, environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
  """Checks the mesh's DC placement (:func:`dc_placement_problem`).

  Args:
    mesh: the ('dc', 'worker') jax.sharding.Mesh.
    environ: the environment (default ``os.environ``); ``HFL_ONE_DC_PER_PROCESS=1``
      (set by launch/emulated_wan.py) requires exactly one DC per process.

  Returns:
    A warning to show (a DC straddles processes), or None.

  Raises:
    ValueError: ``HFL_ONE_DC_PER_PROCESS=1`` and the placement is not one whole
      DC per process.
  """
  env = os.environ if environ is None else environ
  strict = env.get(ENV_ONE_DC_PER_PROCESS, '') not in ('', '0')
  procs = np.vectorize(lambda dev: dev.process_index, otypes=[int])(mesh.devices)
  problem = dc_placement_problem(procs, strict)
  if problem and strict:
    raise ValueError(problem)
  return problem


# ------------------------------------------------------------------------------
# Global arrays from process-local data.
# ------------------------------------------------------------------------------

def put_global(host: np.ndarray, sharding) -> Any:
  """Places a host array held (identically) by every process onto ``sharding``.

  Each process transfers only the blocks of its own (addressable) devices. With
  one process the result equals ``jax.device_put(host, sharding)`` bitwise.

  Args:
    host: numpy array of the global shape.
    sharding: a jax.sharding.Sharding over the global mesh.

  Returns:
    A global jax.Array of ``host.shape`` and ``host.dtype``.
  """
  import jax  # lazy: jax  pylint: disable=g-import-not-at-top
  host = np.asarray(host)
  return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def put_rows(source, idx: np.ndarray, sharding) -> Any:
  """Builds the global array ``source[idx]`` reading only this process's rows.

  The training batch is ``images[idx]`` with ``idx`` int [D, W, B]: a process
  whose devices hold the mesh positions (d, w) reads only ``idx[d, w]`` —
  the rows of its own DCs/workers — and never reads or materialises the others.
  ``source`` is indexed once per addressable device, with that device's block
  of ``idx``.

  Args:
    source: the rows [N, ...]: a numpy array (e.g. labels) or a row source with
      ``shape``, ``dtype`` and numpy-style ``source[int_array]`` (e.g.
      ``Dataset.train_images``, a NormalisedRows that reads and converts only
      the rows asked for).
    idx: int array [*lead] of row indices into ``source``; the same on every
      process (it is a pure function of the partition, step and seed).
    sharding: sharding of the result, of rank ``idx.ndim + len(source.shape) - 1``.

  Returns:
    A global jax.Array of shape ``idx.shape + source.shape[1:]`` and the dtype
    of ``source[...]`` (float32 for NormalisedRows); with one process bitwise
    equal to ``jax.device_put(np.asarray(source)[idx], sharding)``.
  """
  import jax  # lazy: jax  pylint: disable=g-import-not-at-top
  idx = np.asarray(idx)
  lead = idx.ndim
  shape = idx.shape + tuple(source.shape[1:])

  def block(index):
    rows = source[idx[index[:lead]]]
    return rows[(slice(None),) * lead + tuple(index[lead:])]
  return jax.make_array_from_callback(shape, sharding, block)


def to_host(tree):
  """Numpy copies of a pytree of jax.Arrays, complete on every process.

  Arrays that this process cannot address in full (e.g. per-DC metrics sharded
  over ``'dc'`` when DCs live on different hosts) are all-gathered across
  processes; others are copied directly (bitwise the same as ``np.asarray``).
  """
  import jax  # lazy: jax  pylint: disable=g-import-not-at-top

  def one(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      if x.is_fully_replicated:
        return np.asarray(x.addressable_data(0))
      from jax.experimental import multihost_utils  # lazy: jax  pylint: disable=g-import-not-at-top
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)
  return jax.tree.map(one, tree)


def to_host_stacked(trees: list) -> list:
  """Numpy copies of several same-structure pytrees, in one cross-process gather.

  Used for the per-iteration metrics of a round: all leaves of all trees must
  share one shape and dtype (e.g. float32 [D] per-DC metrics). They are stacked on
  the devices into one array [T * L, ...] (T trees, L leaves), fetched with
  :func:`to_host` (so, when DCs live on different processes, a single all-gather
  crosses the inter-DC network instead of T * L of them) and split back.

  Args:
    trees: T pytrees with the same structure; leaves jax.Arrays of equal shape and
      dtype.

  Returns:
    T pytrees of numpy arrays, bitwise equal to ``to_host(tree)`` of each.

  Raises:
    ValueError: the trees differ in structure, or the leaves in shape or dtype.
  """
  import jax  # lazy: jax  pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # lazy: jax  pylint: disable=g-import-not-at-top

  if not trees:
    return []
  flat = [jax.tree.flatten(t) for t in trees]
  treedef = flat[0][1]
  leaves = [l for f, td in flat for l in f]
  if any(td != treedef for _, td in flat) or len({(l.shape, l.dtype) for l in leaves}) != 1:
    raise ValueError('to_host_stacked needs pytrees of one structure whose leaves share one '
                     f'shape and dtype; got {[(l.shape, str(l.dtype)) for l in leaves]}.')
  host = to_host(jnp.stack(leaves))
  n = treedef.num_leaves
  return [jax.tree.unflatten(treedef, list(host[i * n:(i + 1) * n])) for i in range(len(trees))]
