"""Communication accounting: bits on every link, and their check against the HLO.

The step (hfl.step) counts, per DC and iteration, the bits of the payloads it hands
to collectives (``Compressor.wire_bits``; exact integers, hfl.step.host_metrics):
``up_bits`` (all the DC's workers' uplink payloads, and with ZeRO-1 their
parameter slices), ``down_bits`` (PS downlink x workers, and with ZeRO-1 the
W - 1 parameter slices each worker receives), ``wan_bits`` (the DC's
pseudo-gradient payload) and ``round_down_bits`` (the round's result reaching the
DC's W workers: W x what each worker holds after the re-gather over 'worker' at
the leaves whose downlink compressor is lossless or with ``compression.broadcast``
= 'gather', and W x the correction's downlink payload at the others,
hfl.step.broadcast_correction).
The training loop turns them into bytes per link:

  intra_up   = sum over DCs and iterations of up_bits / 8
  intra_down = sum over DCs and iterations of down_bits / 8
               + sum over DCs and rounds of round_down_bits / 8
  inter_dc   = sum over rounds and present DCs of wan_bits * (D_present - 1) / 8
               (each DC's payload reaches every other DC; hfl.network)

:func:`collective_bytes` reads the collectives back from the lowered program
(StableHLO keeps the dtypes written in the program; compiled XLA:CPU HLO upcasts
bf16 collectives to f32), grouped by mesh axis through the replica groups, and
:func:`collective_totals` sums them per axis over all devices, so a test can check
that every byte the collectives move is counted on a link: over 'worker', the
uplink payloads (plus ZeRO-1 parameter slices) and the re-gather of the round's
result; over 'dc', the WAN payloads.
"""

import json
import re
from collections import defaultdict

import numpy as np

from hfl import collectives
from hfl import step as step_lib
from hfl.compress import policy

_DTYPE_BITS = {'f64': 64, 'f32': 32, 'bf16': 16, 'f16': 16, 'f8E5M2': 8, 'f8E4M3FN': 8,
               'i64': 64, 'ui64': 64, 'i32': 32, 'ui32': 32, 'i16': 16, 'ui16': 16,
               'i8': 8, 'ui8': 8, 'i1': 8}
_OP = re.compile(
    r'"stablehlo\.(all_reduce|all_gather|reduce_scatter|all_to_all|collective_permute)"')
_GROUPS = re.compile(r'replica_groups = dense<(\[\[[^>]*\]\])>')
# jax >= 0.11 names the mesh axes instead of listing device groups.
_MESH_AXES = re.compile(r'replica_groups = #stablehlo\.replica_group_mesh_axes<[^>]*?axes = '
                        r'\[((?:#stablehlo\.axis_ref<name = "[^"]*">(?:, )?)*)\]')
_AXIS_REF = re.compile(r'name = "([^"]*)"')
_SIG = re.compile(r': \(([^()]*)\) -> ')
_TENSOR = re.compile(r'tensor<((?:\d+x)*)([a-zA-Z0-9]+)>')


def tensor_bits(type_str: str) -> int:
  """Bits of a StableHLO tensor type such as ``tensor<3x4xbf16>``."""
  m = _TENSOR.fullmatch(type_str.strip())
  if not m:
    raise ValueError(f'not a tensor type: {type_str!r}')
  dims = [int(x) for x in m.group(1).split('x') if x]
  return int(np.prod(dims, dtype=np.int64)) * _DTYPE_BITS[m.group(2)]


def _axis_of(groups: list, mesh_devices: np.ndarray, axis_names) -> str:
  """Which mesh axis a replica-group list reduces over."""
  ids = np.vectorize(lambda d: d.id)(mesh_devices)
  for i, name in enumerate(axis_names):
    moved = np.moveaxis(ids, i, -1).reshape(-1, ids.shape[i])
    if sorted(map(sorted, moved.tolist())) == sorted(map(sorted, groups)):
      return name
  return 'other'


def _line_axis(line: str, mesh) -> str:
  """The mesh axis a collective's StableHLO line reduces over ('other' for several)."""
  named = _MESH_AXES.search(line)
  if named:
    axes = _AXIS_REF.findall(named.group(1))
    return axes[0] if len(axes) == 1 else 'other'
  groups = _GROUPS.search(line)
  if not groups:
    raise ValueError(f'no replica groups in a collective of the lowered program: {line[:200]}')
  return _axis_of(json.loads(groups.group(1)), mesh.devices, mesh.axis_names)


def collective_bytes(hlo_text: str, mesh) -> dict:
  """Operand bytes of every collective in a lowered StableHLO module, by mesh axis.

  Args:
    hlo_text: ``jax.jit(f).lower(...).as_text()``.
    mesh: the Mesh the program runs on (to map replica groups to axis names).

  Returns:
    dict: axis name -> list of (op name, operand bytes per device, operand shape),
    one entry per collective operand, in program order.
  """
  out = defaultdict(list)
  lines = hlo_text.splitlines()
  for i, line in enumerate(lines):
    m = _OP.search(line)
    if not m:
      continue
    axis = _line_axis(line, mesh)
    j = i
    if line.rstrip().endswith('({'):  # a reduction region: the signature closes it
      j = next(k for k in range(i + 1, len(lines)) if lines[k].lstrip().startswith('}) :'))
    sig = _SIG.findall(lines[j])[-1]
    for t in re.findall(r'tensor<[^>]*>', sig):
      out[axis].append((m.group(1), tensor_bits(t) // 8, t))
  return dict(out)


def collective_totals(hlo_text: str, mesh) -> dict:
  """Bytes handed to collectives per mesh axis, summed over all devices.

  Every device of an SPMD program executes every collective, so an axis' total
  is the sum of :func:`collective_bytes`' per-device operand bytes times the
  number of devices.

  Args:
    hlo_text: ``jax.jit(f).lower(...).as_text()``.
    mesh: the Mesh the program runs on.

  Returns:
    dict: axis name (or 'other' for groups that are no single mesh axis) -> int
    bytes.
  """
  n = int(np.prod(mesh.devices.shape))
  return {axis: n * sum(b for _, b, _ in ops)
          for axis, ops in collective_bytes(hlo_text, mesh).items()}


def static_bits(comps, params_shape, num_w: int,
                shard_state: bool = False) -> tuple[int, int, int]:
  """Bits per iteration of one worker's uplink, of what one worker receives on the
  downlink, and of one DC's WAN payload, from payload shapes (nothing runs).

  The same counting as the step (which counts the payloads it sends): exact where
  ``wire_bits`` is static, the moved bits for variable-length codes. Used to
  plan (semi-synchronous K_d) before anything is compiled.

  Args:
    comps: per-leaf compressors (``hfl.step.Compressors``: lists ``up``, ``down``,
      ``wan``).
    params_shape: pytree of the parameters (arrays or ShapeDtypeStructs).
    num_w: W, workers per DC.
    shard_state: ZeRO-1 sharded optimizer state (reduce-scatter of identity
      leaves, sliced dense downlinks, the parameter all-gather).

  Returns:
    (up, down, wan) bits, Python ints.
  """
  chunk_bits = collectives.chunk_bits
  up = down = 0
  for cu, cd in zip(comps.up, comps.down):
    if shard_state and collectives.reduce_scatters(cu, cd):
      up += num_w * chunk_bits(policy.payload_shape(cu), num_w)
      down += chunk_bits(policy.payload_shape(cd), num_w)
    else:
      up += policy.static_bits(cu)
      down += (chunk_bits(policy.payload_shape(cd), num_w) if shard_state and cd.linear
               else policy.static_bits(cd))
  if shard_state and num_w > 1:
    gather = chunk_bits(params_shape, num_w)
    up += gather
    down += (num_w - 1) * gather
  return int(up), int(down), int(sum(policy.static_bits(c) for c in comps.wan))


def round_down_bits(comps, num_w: int, num_present: int, broadcast: str = 'gather') -> int:
  """Planning estimate of ``hfl.step.host_metrics``' ``round_down_bits`` (one DC,
  one round, ``num_present`` DCs present), from payload shapes (nothing runs):
  W x (at the leaves whose update goes through the downlink,
  ``hfl.step.broadcast_leaves(comps.correction(), broadcast)``, the correction's payload
  bits: the downlink's, or ``comps.bcast``'s (``compression.correction``, or the downlink's
  compressor at ``compression.broadcast_density``);
  at the others the all-reduced WAN leaves' bits + num_present x the all-gathered
  ones).

  Raises:
    ValueError: ``broadcast`` not one of ``hfl.step.BROADCASTS``.
  """
  sent = step_lib.broadcast_leaves(comps.correction(), broadcast)
  summed = sum(policy.static_bits(c) for c, s in zip(comps.wan, sent)
               if collectives.reduces(c) and not s)
  gathered = sum(policy.static_bits(c) for c, s in zip(comps.wan, sent)
                 if not collectives.reduces(c) and not s)
  corrected = sum(policy.static_bits(c) for c, s in zip(comps.correction(), sent) if s)
  return int(num_w * (summed + num_present * gathered + corrected))
