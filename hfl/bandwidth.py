"""WAN bandwidth needed for a compute utilisation, per sync strategy and model size.

The quantity: the per-DC WAN bandwidth at which a strategy keeps the compute busy
a fraction u* of the wall time (u* = 50, 75, 90, 95, 99%), as the DiLoCo scaling-law
paper tabulates it in its appendix (Charles et al. 2025, "Communication-Efficient
Language Model Training Scales Reliably and Robustly: Scaling Laws for DiLoCo",
arXiv:2503.09799) and Douillard's DiLoCo bandwidth simulator plots it.

It is computed with the code that charges a training run's simulated clock, so a
run's recorded ``wan_mbps_for_95pct_utilisation`` (``hfl.cost.wan_summary``) is
one point of it (tests/test_bandwidth.py):

* payload bits: the WAN compressor policy over the model's leaf shapes
  (:func:`hfl.setup.build_compressors`, :func:`hfl.compress.policy.static_bits`;
  abstract, ``jax.ShapeDtypeStruct`` leaves suffice, so a 13B model needs no
  memory);
* Streaming DiLoCo: the fragments of :func:`hfl.sync.streaming.partition`; the
  largest fragment's payload is the peak sync event;
* the bits a DC's link carries per event: :func:`hfl.network.dc_link_bits`
  (max(egress, ingress) of the all-to-all exchange, as
  :func:`hfl.network.round_comm_time` charges it);
* iterations per event from the K schedule (:mod:`hfl.sync.schedule`; K / P
  for Streaming DiLoCo) and the iteration time from
  :func:`hfl.setup.planned_times` (compute + the LAN of the static intra-DC
  payloads) or a stated step time;
* the closed form :func:`hfl.network.wan_bandwidth_for_utilisation`, with the whole
  iteration counted as busy time (as ``wan_summary`` does) and the latency term
  H x one-way WAN latency (``network.wan_latencies_per_round``,
  ``network.wan_latency_s``).

Units: bits, seconds, bits/s (Gbit/s = 1e9 bits/s where named so). The DCs are
taken equal (``network.dc_speed`` all equal for the calculator's configs); a
run's config with unequal DCs is handled through its K schedule
(:func:`planned_event`).

Host-side; JAX only through ``jax.eval_shape``.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from hfl import config as config_lib
from hfl import models
from hfl import network
from hfl import setup as setup_lib
from hfl.compress import policy
from hfl.sync import scaffold as scaffold_lib
from hfl.sync import schedule as schedule_lib
from hfl.sync import streaming

TARGETS = (0.5, 0.75, 0.9, 0.95, 0.99)

# The usual GPT family (Brown et al. 2020, "Language Models are Few-Shot Learners",
# Table 2.1): name, width d, layers L. With GPT-2's vocabulary of 50,257 tokens.
GPT_FAMILY = (('125M', 768, 12), ('350M', 1024, 24), ('760M', 1536, 24), ('1.3B', 2048, 24),
              ('2.7B', 2560, 32), ('6.7B', 4096, 32), ('13B', 5120, 40))
GPT_VOCAB = 50257


# The calculator's strategies: name -> what it is (the config each gets is
# :func:`strategy_overrides`).
STRATEGIES = {
    'data_parallel': 'K = 1 (sync.strategy=sync), float32 WAN',
    'data_parallel_topk': 'K = 1, top-k WAN (values float32 + indices)',
    'diloco': 'periodic K = H (DiLoCo; FedAvg is the same traffic), float32 WAN',
    'diloco_topk': 'periodic K = H, top-k WAN',
    'semi_sync': 'semi_sync, K_base = H (equal DCs: every K_d = H)',
    'streaming': 'Streaming DiLoCo: H, P fragments, overlap τ, 4-bit E3M0 WAN',
    'sparseloco': 'SparseLoCo: periodic K = H, chunked top-k (chunks of 4096) with 2-bit values',
    'diloco_2bit': 'periodic K = H, every entry in 2 bits with two bfloat16 scales per chunk '
                   "of 4096 (MuLoCo's 2-bit pseudo-gradients; the inner optimizer sends nothing)",
}


def strategy_overrides(name: str, h: int, fragments: int, overlap_steps: int,
                       topk_density: float) -> dict:
  """Config overrides (dotted field -> value) of one of :data:`STRATEGIES`.

  Args:
    name: a key of :data:`STRATEGIES`.
    h: H = ``sync.k`` (K for periodic and semi_sync), >= 1.
    fragments: P = ``sync.fragments`` (streaming).
    overlap_steps: τ = ``sync.overlap_steps`` (streaming).
    topk_density: ``compression.wan.density`` of the top-k strategies.

  Returns:
    dict for :func:`hfl.config.apply_overrides`.

  Raises:
    ValueError: an unknown name (listing the allowed ones).
  """
  k = {'sync.k': int(h), 'sync.k_max': max(int(h), 64)}
  topk = {'compression.wan.name': 'topk', 'compression.wan.density': float(topk_density)}
  two_bit = lambda density: {  # chunked top-k, 2-bit values (SparseLoCo's code; 1.0: MuLoCo's)
      'sync.strategy': 'periodic', 'compression.wan.name': 'chunked_topk',
      'compression.wan.density': density, 'compression.wan.chunk_size': 4096,
      'compression.wan.value_bits': 2, **k}
  table = {
      'data_parallel': {'sync.strategy': 'sync'},
      'data_parallel_topk': dict({'sync.strategy': 'sync'}, **topk),
      'diloco': dict({'sync.strategy': 'periodic'}, **k),
      'diloco_topk': dict({'sync.strategy': 'periodic'}, **k, **topk),
      'semi_sync': dict({'sync.strategy': 'semi_sync'}, **k),
      'streaming': dict({'sync.strategy': 'periodic', 'sync.fragments': int(fragments),
                         'sync.overlap_steps': int(overlap_steps), 'sync.mixing_alpha': 0.5,
                         'compression.wan.name': 'e3m0'}, **k),
      'sparseloco': two_bit(float(topk_density)),
      'diloco_2bit': two_bit(1.0),
  }
  if name not in table:
    raise ValueError(f'strategy {name!r} unknown; allowed: {", ".join(STRATEGIES)}')
  return table[name]


def calculator_config(num_dcs: int, wan_latency_s: float, wan_latencies_per_round: float,
                      overrides: dict) -> ml_collections.ConfigDict:
  """configs/default.py with ``num_dcs`` equal DCs, the WAN latency and ``overrides``.

  Everything else keeps its default (compression.small float32,
  small_threshold 0: every matrix gets the WAN compressor, vectors go float32).

  Raises:
    ValueError: as :func:`hfl.config.apply_overrides` and
      :func:`hfl.network.from_config`.
  """
  config = config_lib.load_file('configs/default.py')
  config_lib.apply_overrides(config, {
      'mesh.num_dcs': int(num_dcs), 'network.dc_speed': (1.0,) * int(num_dcs),
      'network.wan_latency_s': float(wan_latency_s),
      'network.wan_latencies_per_round': float(wan_latencies_per_round)})
  config_lib.apply_overrides(config, overrides)
  network.from_config(config.network, int(num_dcs))
  return config


class Plan(NamedTuple):
  """The steady state of a strategy's largest sync event.

  Attributes:
    dc_bits: int, bits one DC's WAN link carries in the largest event (max of
      egress and ingress, :func:`hfl.network.dc_link_bits`).
    iterations: I, iterations per sync event (1: data parallel; K; K / P for
      Streaming DiLoCo).
    iteration_s: t, seconds of one iteration (counted whole as busy time).
    overlap_steps: τ, iterations the event's transfer overlaps.
    latency_s: seconds of the event's latency term, H x one-way WAN latency.
  """
  dc_bits: int
  iterations: int
  iteration_s: float
  overlap_steps: int
  latency_s: float


def transformer_shapes(d: int, layers: int, vocab: int = GPT_VOCAB) -> dict:
  """Parameter shapes of a synthetic decoder-only transformer (float32 ShapeDtypeStructs).

  Per layer: q, k, v, o [d, d], MLP in [d, 4d] and out [4d, d], two norms' scale
  and bias [d]; a token embedding [vocab, d] tied with the output head (no
  separate head, no position table) and a final norm's scale and bias [d]. No
  projection biases. Top-level keys are the layer units of
  :func:`hfl.sync.streaming.units`: ``Block_0`` .. ``Block_{L-1}``, ``Embed_0``,
  ``LayerNorm_0`` (that natural order).

  Args:
    d: width, >= 1. layers: L, >= 1. vocab: >= 1.

  Returns:
    dict pytree of jax.ShapeDtypeStruct; L (12 d^2 + 4 d) + vocab d + 2 d entries.

  Raises:
    ValueError: a size below 1.
  """
  for name, v in (('d', d), ('layers', layers), ('vocab', vocab)):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
      raise ValueError(f'{name}={v!r} must be an integer >= 1')
  s = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
  block = lambda: {'q': s(d, d), 'k': s(d, d), 'v': s(d, d), 'o': s(d, d),
                   'mlp_in': s(d, 4 * d), 'mlp_out': s(4 * d, d),
                   'norm1_scale': s(d), 'norm1_bias': s(d),
                   'norm2_scale': s(d), 'norm2_bias': s(d)}
  tree = {f'Block_{i}': block() for i in range(layers)}
  tree['Embed_0'] = {'embedding': s(vocab, d)}
  tree['LayerNorm_0'] = {'scale': s(d), 'bias': s(d)}
  return tree


def model_shapes(model_cfg, num_classes: int, sample_shape: tuple, sample_dtype) -> dict:
  """Parameter shapes of an hfl model (``jax.eval_shape`` of its init; nothing runs).

  Args:
    model_cfg: a config's ``model`` section (:func:`hfl.models.from_config`).
    num_classes: classes, or the vocabulary size for the transformer.
    sample_shape: one input's shape with its batch axis, e.g. (1, 28, 28, 1)
      float32 images or (1, seq_len) int32 tokens.
    sample_dtype: its dtype.

  Returns:
    the params pytree of ShapeDtypeStructs.
  """
  model = models.from_config(model_cfg, num_classes)
  sample = jax.ShapeDtypeStruct(tuple(sample_shape), sample_dtype)
  return jax.eval_shape(lambda x: model.init(jax.random.PRNGKey(0), x)['params'], sample)


def param_count(shapes) -> int:
  """Entries of a params pytree (Python int)."""
  return sum(int(np.prod(np.shape(x), dtype=np.int64)) for x in jax.tree.leaves(shapes))


def leaf_bits(comps) -> list[int]:
  """Static payload bits of each leaf's compressor (:func:`hfl.compress.policy.static_bits`).

  Compressors of one :func:`hfl.compress.policy.build` with the same name and
  shape send the same payload, so each such pair is traced once.

  Args:
    comps: list of Compressor (e.g. ``Compressors.wan``), one per leaf.

  Returns:
    list of int bits, aligned with ``comps``.
  """
  memo = {}
  out = []
  for c in comps:
    key = (c.name, tuple(c.shape), c.linear)
    if key not in memo:
      memo[key] = policy.static_bits(c)
    out.append(memo[key])
  return out


def peak_payload_bits(config, params_shape, wan_comps) -> int:
  """Bits of one DC's WAN payload in the largest sync event.

  The whole model's payload, or with Streaming DiLoCo (``sync.fragments`` etc.,
  :func:`hfl.sync.streaming.enabled`) the largest fragment's of
  :func:`hfl.sync.streaming.partition`.

  Raises:
    ValueError: ``sync.fragments`` exceeds the model's layer units.
  """
  bits = leaf_bits(wan_comps)
  if not streaming.enabled(config.sync):
    return int(sum(bits))
  fragments = streaming.partition(params_shape, int(config.sync.fragments))
  return int(max(sum(bits[i] for i in f) for f in fragments))


def planned_event(config: ml_collections.ConfigDict, params_shape,
                  iteration_s: float | None = None) -> Plan:
  """The :class:`Plan` of a config's largest sync event, from payload shapes.

  With ``iteration_s`` None, each DC's iteration time t_d and round time c_d
  come from :func:`hfl.setup.planned_times` (``network.compute_time_s`` /
  ``dc_speed`` + the LAN of the static intra-DC payloads); else every DC
  iterates in ``iteration_s`` (the calculator's stated step time; the LAN is
  not modelled) and c_d is the round's :func:`hfl.network.round_comm_time`.
  With SCAFFOLD (``sync.control_variates``) the DC's payload also holds its float32
  control-variate deltas, as the run charges them. The K schedule's first plan (:func:`hfl.sync.schedule.from_config`) gives
  k_d; an event runs I = max_d k_d iterations (K / P with Streaming DiLoCo) and
  its iteration time is t = max_d(k_d t_d) / max_d k_d (the slowest DC's
  share; t_d itself for equal DCs). Exact for static schedules; a K that moves
  with the loss (``adacomm``, ``sync.progress_aware``) is taken at its start.

  Args:
    config: a validated experiment config.
    params_shape: the model's params pytree (arrays or ShapeDtypeStructs).
    iteration_s: seconds per iteration, > 0, or None.

  Returns:
    Plan (bits, iterations, seconds).

  Raises:
    ValueError: what :func:`hfl.setup.build_compressors`,
      :func:`hfl.network.from_config`, the schedule or
      :func:`hfl.sync.streaming.partition` refuse; ``iteration_s`` <= 0.
  """
  d = int(config.mesh.num_dcs)
  net = network.from_config(config.network, d)
  comps = setup_lib.build_compressors(config, params_shape)
  payload = peak_payload_bits(config, params_shape, comps.wan)
  if scaffold_lib.enabled(config.sync):  # the c_d deltas: a second, float32 payload
    payload += scaffold_lib.payload_bits(params_shape)
  dc_bits = int(np.max(network.dc_link_bits(np.full(d, payload, np.int64))))
  if iteration_s is None:
    t_d, c_d = setup_lib.planned_times(config, net, comps, params_shape)
  else:
    if not 0 < float(iteration_s) < np.inf:
      raise ValueError(f'iteration_s={iteration_s!r} must be a finite number > 0 (seconds)')
    t_d = np.full(d, float(iteration_s))
    c_d = network.round_comm_time(net, np.full(d, payload))
  sched = schedule_lib.from_config(config.sync, d, t=t_d, c=c_d)
  k_d = np.asarray(sched.plan(sched.init()).k_d, np.int64)
  iterations = int(np.max(k_d))
  t = float(np.max(k_d * t_d)) / iterations
  tau = 0
  if streaming.enabled(config.sync):
    iterations = int(config.sync.k) // int(config.sync.fragments)
    tau = int(config.sync.overlap_steps)
  return Plan(dc_bits, iterations, t, tau,
              net.wan_latencies_per_round * net.wan_latency_s)


def bandwidth_for_utilisation(plan: Plan, targets=TARGETS, latency: bool = True) -> np.ndarray:
  """Per-DC WAN bits/s at which ``plan``'s steady state reaches each target utilisation.

  :func:`hfl.network.wan_bandwidth_for_utilisation` with compute = the whole
  iteration time (as ``hfl.cost.wan_summary``).

  Args:
    plan: a :class:`Plan`.
    targets: utilisations in (0, 1].
    latency: charge ``plan.latency_s`` (False: zero latency, the bandwidth
      term alone).

  Returns:
    float64 [len(targets)] bits/s; ``inf`` where no bandwidth suffices.

  Raises:
    ValueError: a target outside (0, 1].
  """
  return np.atleast_1d(network.wan_bandwidth_for_utilisation(
      plan.dc_bits, plan.iterations, plan.iteration_s, plan.iteration_s,
      plan.overlap_steps, plan.latency_s if latency else 0.0, tuple(targets)))


def step_time_s(params: int, tokens_per_step: float, peak_flops: float, mfu: float,
                devices_per_dc: int) -> float:
  """Seconds of one training step of one DC: 6 N tokens / (peak x MFU x devices).

  The 6 N FLOPs per token of a forward and backward pass (Kaplan et al. 2020,
  "Scaling Laws for Neural Language Models", Sec. 2.1).

  Args:
    params: N, parameters. tokens_per_step: tokens one DC processes per step.
    peak_flops: one device's peak FLOP/s. mfu: model FLOPs utilisation in (0, 1].
    devices_per_dc: devices of one DC.

  Returns:
    float seconds.
  """
  return 6.0 * params * tokens_per_step / (peak_flops * mfu * devices_per_dc)
