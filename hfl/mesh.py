"""The ('dc', 'worker') device mesh.

Datacenters and workers are mesh axes: intra-DC aggregation is a
collective over ``'worker'``, inter-DC aggregation a collective over ``'dc'``.
On CPU the devices are simulated; their number must be set before JAX starts its
backend, which :func:`configure_cpu_devices` does.
"""

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

DC, WORKER = 'dc', 'worker'


class BackendUnavailableError(ValueError):
  """JAX could not start the backend that ``JAX_PLATFORMS`` asks for (a bad setting)."""


def global_devices() -> list:
  """``jax.devices()``, with a failure to start the backend explained.

  The first query of the devices starts JAX's backend; with ``JAX_PLATFORMS``
  naming a platform that is not installed or has no device here (e.g. ``cuda``
  on a machine without a GPU) JAX fails with a bare ``AssertionError`` or a
  RuntimeError.

  Raises:
    BackendUnavailableError: the backend could not start; the message names
      JAX_PLATFORMS and its value and what to do.
  """
  try:
    return jax.devices()
  except (RuntimeError, AssertionError) as e:
    requested = jax.config.jax_platforms
    detail = ' '.join(str(e).split()) or (
        'no device of that platform is visible on this machine')
    setting = (f'JAX_PLATFORMS={requested!r}' if requested else
               'JAX_PLATFORMS is not set (JAX chose by itself)')
    raise BackendUnavailableError(
        f'JAX could not start its backend: {setting}: {detail}. Set JAX_PLATFORMS to a '
        'platform that has devices on this machine (cpu always does), or unset it to let '
        'JAX choose; for a GPU, install the matching jax plugin (e.g. jax[cuda12]) and '
        'check that nvidia-smi sees it.') from None


# The most simulated CPU devices one process may ask for. hfl's step has several
# collectives; XLA:CPU's rendezvous of one of them on 512 simulated devices never
# completed (jax 0.10.2, 2 cores: every participant waited; XLA aborted the process
# after 40 s, and after 500 s with its terminate timeout raised), while 256 ran.
MAX_CPU_DEVICES = 256


def configure_cpu_devices(num_devices: int) -> None:
  """Asks for ``num_devices`` simulated CPU devices (no-op on GPU/TPU hosts).

  Must run before anything touches the JAX backend (first array, ``jax.devices()``).

  Raises:
    ValueError: ``num_devices`` exceeds :data:`MAX_CPU_DEVICES` (XLA:CPU's
      collectives deadlock on more).
    RuntimeError: the backend is already initialised with a different CPU device count.
  """
  if num_devices > MAX_CPU_DEVICES:
    raise ValueError(
        f'mesh.num_dcs * mesh.workers_per_dc = {num_devices} simulated CPU devices in one '
        f'process; at most {MAX_CPU_DEVICES} are supported (XLA:CPU\'s collectives '
        'deadlock on more: 512 aborted after 40 s here). Use a smaller mesh, or a GPU/TPU '
        'host, whose devices are real.')
  try:
    jax.config.update('jax_num_cpu_devices', int(num_devices))
  except RuntimeError:
    if jax.default_backend() == 'cpu' and jax.device_count() != num_devices:
      raise RuntimeError(
          f'JAX already started with {jax.device_count()} CPU devices; the mesh needs '
          f'{num_devices}. Set the device count before any JAX operation '
          '(main.py does this from the config).') from None


# ``mesh.simulate``: how the hierarchy runs. 'devices': one device per (DC, worker)
# under shard_map; 'vmap': the whole hierarchy on one device under nested jax.vmap
# (hfl.step.make_step's mode='vmap'); 'auto': 'vmap' when the backend has fewer
# devices than num_dcs * workers_per_dc, else 'devices'.
SIMULATE = ('auto', 'devices', 'vmap')


def simulate(config) -> str:
  """``mesh.simulate`` (absent: 'auto', hfl.workdir.ADDED_SECTIONS)."""
  return config.mesh.get('simulate', 'auto')


def wants_cpu_devices(config) -> bool:
  """Whether main.py should ask for num_dcs * workers_per_dc simulated CPU devices:
  not for 'vmap', nor for 'auto' beyond :data:`MAX_CPU_DEVICES` (that hierarchy then
  runs vmapped on one device instead)."""
  mode = simulate(config)
  need = config.mesh.num_dcs * config.mesh.workers_per_dc
  return mode == 'devices' or (mode == 'auto' and need <= MAX_CPU_DEVICES)


def step_mode(setting: str, num_dcs: int, workers_per_dc: int,
              device_count: int | None = None) -> str:
  """hfl.step.make_step's ``mode`` for ``mesh.simulate`` = ``setting``: 'mesh' or 'vmap'.

  Args:
    setting: one of :data:`SIMULATE`.
    device_count: the backend's devices (default: ``jax.device_count()``).

  Raises:
    ValueError: an unknown ``setting`` (names the field).
  """
  if setting not in SIMULATE:
    raise ValueError(f'mesh.simulate={setting!r} must be one of {SIMULATE}')
  if setting == 'auto':
    count = len(global_devices()) if device_count is None else device_count
    return 'vmap' if count < num_dcs * workers_per_dc else 'mesh'
  return 'vmap' if setting == 'vmap' else 'mesh'


def placement_mesh(mode: str, num_dcs: int, workers_per_dc: int) -> Mesh:
  """The mesh the run's arrays live on: the ('dc', 'worker') device mesh in 'mesh'
  mode; in 'vmap' mode a 1 x 1 mesh of the first device with the same axis names
  (so every PartitionSpec of the device path places whole arrays on it).

  Raises:
    ValueError: 'vmap' with several processes (the one-device simulation runs in one).
  """
  if mode != 'vmap':
    return make_mesh(num_dcs, workers_per_dc)
  if jax.process_count() > 1:
    raise ValueError(f"mesh.simulate='vmap' runs the whole hierarchy on one device of one "
                     f'process, but {jax.process_count()} processes were started; use '
                     "mesh.simulate='devices' for multi-process runs")
  return make_mesh(1, 1, global_devices()[:1])


def make_mesh(num_dcs: int, workers_per_dc: int, devices=None) -> Mesh:
  """Builds the ('dc', 'worker') mesh of shape [num_dcs, workers_per_dc].

  Args:
    num_dcs: size of axis 'dc'.
    workers_per_dc: size of axis 'worker'.
    devices: optional flat device list (default: all global devices).

  Raises:
    ValueError: the device count is not num_dcs * workers_per_dc (names the
      fields mesh.num_dcs and mesh.workers_per_dc).
    BackendUnavailableError (a ValueError): JAX's backend did not start
      (:func:`global_devices`).
  """
  devices = global_devices() if devices is None else list(devices)
  need = num_dcs * workers_per_dc
  if len(devices) != need:
    raise ValueError(
        f'mesh.num_dcs * mesh.workers_per_dc = {num_dcs} * {workers_per_dc} = {need} '
        f'devices, but {len(devices)} are available ({jax.default_backend()}); '
        'choose a mesh whose product equals the device count, or run the hierarchy on one '
        "device with mesh.simulate='vmap' (or 'auto').")
  if jax.process_count() > 1:
    from jax.experimental import mesh_utils  # lazy: jax  pylint: disable=g-import-not-at-top
    # 'dc' spans processes/slices (DCN), 'worker' stays inside one.
    per_process = len(devices) // jax.process_count()
    if num_dcs % jax.process_count() == 0 and workers_per_dc <= per_process:
      arr = mesh_utils.create_hybrid_device_mesh(
          (num_dcs // jax.process_count(), workers_per_dc), (jax.process_count(), 1),
          devices=devices, process_is_granule=True)
    else:
      arr = np.array(devices).reshape(num_dcs, workers_per_dc)
  else:
    arr = np.array(devices).reshape(num_dcs, workers_per_dc)
  return Mesh(arr, (DC, WORKER))


def parse_shape(text: str, flag: str = '--mesh') -> tuple[int, int]:
  """(num_dcs, workers_per_dc) from a command-line mesh shape ``"D,W"``.

  Raises:
    ValueError: ``text`` is not two positive integers separated by a comma (the
      message names ``flag``).
  """
  parts = str(text).split(',')
  try:
    d, w = (int(v) for v in parts)
  except ValueError:
    d = w = 0
  if len(parts) != 2 or d < 1 or w < 1:
    raise ValueError(f'{flag} must be two positive integers D,W (DCs, workers per DC), '
                     f'got {text!r}')
  return d, w


def sharding(mesh: Mesh, *spec) -> NamedSharding:
  """NamedSharding for PartitionSpec(*spec) on ``mesh``."""
  return NamedSharding(mesh, P(*spec))
