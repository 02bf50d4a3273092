"""Model FLOPs of a program and the peak FLOP/s of this CPU, for model FLOPs utilisation.

* :func:`jaxpr_flops` counts the matmul and convolution work of a jaxpr: 2 x the
  multiply-adds of every ``dot_general`` and ``conv_general_dilated`` (sub-jaxprs
  included), the usual "model FLOPs" of MFU (Chowdhery et al. 2022, "PaLM",
  App. B: matmul FLOPs of the forward and backward passes; elementwise work,
  normalisation and the optimizer are left out).
* :func:`peak_flops` derives the float32 peak from lscpu / /proc/cpuinfo:
  cores x clock x fp32 lanes per vector x FMA units per core x 2.

No side effects on import (no JAX backend start): tests import it.
"""

import math
import os
import re
import subprocess


def _eqn_flops(eqn) -> float:
  """2 x multiply-adds of a dot_general or conv_general_dilated equation, else 0."""
  name = eqn.primitive.name
  out = eqn.outvars[0].aval
  if name == 'dot_general':
    (lhs_contract, _), _ = eqn.params['dimension_numbers']
    lhs = eqn.invars[0].aval.shape
    return 2.0 * math.prod(out.shape) * math.prod(lhs[i] for i in lhs_contract)
  if name == 'conv_general_dilated':
    rhs = eqn.invars[1].aval.shape
    out_feature_dim = eqn.params['dimension_numbers'].rhs_spec[0]
    taps = math.prod(rhs) / rhs[out_feature_dim]  # window x input features per group
    # A transposed convolution (lhs dilation: the input gradient of a strided
    # convolution) also multiplies the zeros it inserts; count the non-zero taps.
    dilation = math.prod(eqn.params.get('lhs_dilation') or (1,))
    return 2.0 * math.prod(out.shape) * taps / dilation
  return 0.0


def _sub_jaxprs(params):
  for value in params.values():
    for x in (value if isinstance(value, (tuple, list)) else (value,)):
      if hasattr(x, 'eqns') or hasattr(getattr(x, 'jaxpr', None), 'eqns'):
        yield x


def jaxpr_flops(jaxpr) -> float:
  """Matmul and convolution FLOPs of a jaxpr or ClosedJaxpr.

  Sub-jaxprs (pjit, custom_jvp/vjp, cond branches, loop bodies) are included; a
  scan body counts ``length`` times, a while body once (its trip count is not
  static), every cond branch once.

  Returns:
    FLOPs (float): sum over dot_general of 2 x |output| x |contracted dims|,
    over conv_general_dilated of 2 x |output| x |window| x input features per
    group / |lhs dilation|.
  """
  jaxpr = getattr(jaxpr, 'jaxpr', jaxpr)
  total = 0.0
  for eqn in jaxpr.eqns:
    total += _eqn_flops(eqn)
    times = eqn.params.get('length', 1) if eqn.primitive.name == 'scan' else 1
    for sub in _sub_jaxprs(eqn.params):
      total += times * jaxpr_flops(sub)
  return total


def xla_cost(compiled, key: str = 'flops') -> float:
  """One figure of XLA's cost analysis of a compiled program (one device's share for
  an SPMD program): ``'flops'``, or ``'bytes accessed'`` (bytes read and written by
  its operations); NaN when the backend gives none."""
  ca = compiled.cost_analysis()
  ca = ca[0] if isinstance(ca, (list, tuple)) else ca
  return float((ca or {}).get(key, float('nan')))


def xla_flops(compiled) -> float:
  """FLOPs of a compiled program from XLA's cost analysis (:func:`xla_cost`)."""
  return xla_cost(compiled, 'flops')


def fma_units(vendor: str, family: int, model: int, flags: set) -> tuple[int, str]:
  """Vector FMA units per core at the full vector width (512 bits with avx512f, else
  256), and why.

  lscpu does not report them. AMD Zen/Zen+ (family 17h, model < 30h) has two
  128-bit FMA pipes, i.e. one 256-bit FMA per cycle; Zen 2 and Zen 3 two 256-bit
  pipes; Zen 4 (family 19h with avx512f) runs a 512-bit FMA on its two 256-bit
  pipes, i.e. one per cycle; Zen 5 (family 1Ah) server and desktop parts (models
  00h-1Fh, 40h-4Fh) have two 512-bit FMA pipes, its mobile parts a 256-bit data path
  (one 512-bit FMA per cycle). Intel cores since Haswell have two FMA ports (at 512
  bits on Xeon Gold/Platinum; some parts have one, pass --fma_units there).
  """
  avx512 = 'avx512f' in flags
  if 'fma' not in flags:
    return 0, 'no FMA'
  if vendor == 'AuthenticAMD' and family == 0x17 and model < 0x30:
    return 1, 'AMD Zen/Zen+ (family 17h, model < 30h): two 128-bit FMA pipes'
  if vendor == 'AuthenticAMD' and family == 0x1A and avx512:
    if model < 0x20 or 0x40 <= model < 0x50:
      return 2, f'AMD Zen 5 server/desktop (family 1Ah, model {model:x}h): two 512-bit FMA pipes'
    return 1, (f'AMD Zen 5 mobile (family 1Ah, model {model:x}h): 512-bit FMAs on a '
               '256-bit data path')
  if vendor == 'AuthenticAMD' and family >= 0x17 and avx512:
    return 1, (f'AMD Zen 4 (family {family:x}h, model {model:x}h): 512-bit FMAs on two '
               '256-bit pipes')
  if vendor == 'AuthenticAMD' and family >= 0x17:
    return 2, f'AMD Zen 2 or later (family {family:x}h, model {model:x}h): two 256-bit FMA pipes'
  if vendor == 'GenuineIntel':
    return 2, 'Intel Haswell or later: two FMA ports'
  return 1, 'unknown microarchitecture: one FMA unit assumed'


def peak_flops(lscpu: dict, cpuinfo: str, cpus: int, units: int | None = None,
               clock_ghz: float | None = None) -> tuple[float, str]:
  """Peak float32 FLOP/s and its derivation.

  peak = cores x clock x lanes x FMA units x 2 (an FMA is a multiply and an add;
  without FMA one vector op per cycle counts 1). Cores: ``cpus`` divided by
  lscpu's threads per core (SMT siblings share the FMA units). Clock: lscpu's
  "CPU max MHz" when it has one, else the highest /proc/cpuinfo "cpu MHz" (what a
  VM reports; turbo clocks above it are not counted). Lanes: 16 (avx512f),
  8 (avx, avx2), 4 (sse).

  Args:
    lscpu: ``lscpu`` output as a dict (field -> value).
    cpuinfo: the text of /proc/cpuinfo.
    cpus: logical CPUs this process may run on.
    units: override the FMA units per core.
    clock_ghz: override the clock.

  Returns:
    (FLOP/s, one-line derivation).
  """
  flag_text = lscpu.get('Flags') or (re.search(r'flags\s*:(.*)', cpuinfo) or [None, ''])[1]
  flags = set(flag_text.split())
  threads = int(lscpu.get('Thread(s) per core', 1))
  cores = max(1, cpus // threads)
  if clock_ghz is not None:
    clock_src = 'given'
  elif lscpu.get('CPU max MHz'):
    clock_ghz, clock_src = float(lscpu['CPU max MHz']) / 1e3, 'lscpu CPU max MHz'
  else:
    mhz = [float(m) for m in re.findall(r'cpu MHz\s*:\s*([\d.]+)', cpuinfo)]
    clock_ghz, clock_src = max(mhz) / 1e3, '/proc/cpuinfo cpu MHz'
  lanes, isa = ((16, 'avx512f') if 'avx512f' in flags else (8, 'avx2') if 'avx2' in flags
                else (8, 'avx') if 'avx' in flags else (4, 'sse'))
  found, why = fma_units(lscpu.get('Vendor ID', ''), int(lscpu.get('CPU family', 0)),
                         int(lscpu.get('Model', 0)), flags)
  if units is None:
    units = found
  else:
    why = 'given'
  per_cycle = lanes * units * 2 if units else lanes
  peak = cores * clock_ghz * 1e9 * per_cycle
  text = (f'{cores} cores ({cpus} CPUs, {threads} thread(s) per core, '
          f'{lscpu.get("Model name", "?")}) x {clock_ghz:.4g} GHz ({clock_src}) x {lanes} '
          f'fp32 lanes ({isa}) x {units} FMA units ({why}) x 2 = {peak / 1e9:.1f} GFLOP/s')
  return peak, text


def this_cpu_peak_flops(units: int | None = None, clock_ghz: float | None = None
                        ) -> tuple[float, str]:
  """:func:`peak_flops` of the CPUs this process may run on (runs lscpu)."""
  try:
    out = subprocess.run(['lscpu'], capture_output=True, text=True, check=True).stdout
  except (OSError, subprocess.CalledProcessError):
    out = ''
  info = {k.strip(): v.strip() for k, _, v in (l.partition(':') for l in out.splitlines())}
  cpuinfo = ''
  if os.path.exists('/proc/cpuinfo'):
    with open('/proc/cpuinfo') as f:
      cpuinfo = f.read()
  return peak_flops(info, cpuinfo, len(os.sched_getaffinity(0)), units, clock_ghz)
