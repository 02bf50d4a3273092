"""Network and time model, and the simulated clock (the seed thesis' round time).

Topology. Inside DC d, the W workers talk to the DC's parameter server (PS) over a
LAN; the PS NIC is the bottleneck, so one intra-DC iteration of DC d takes

    t_d = compute_time_s / speed_d                       (compute, seconds)
        + up_bits_d / lan_bps + down_bits_d / lan_bps    (PS ingress of all W uplink
                                                          payloads, then PS egress of
                                                          the downlink to all W workers)
        + 2 * lan_latency_s

where ``up_bits_d``/``down_bits_d`` are the totals over the DC's workers, taken from
the payloads actually sent (hfl.accounting), never from a formula.

After an inter-DC round, the round's result reaches the DC's W workers over the
same LAN (``round_down_bits``: hfl.step's re-gather over 'worker' of the WAN result,
or, where ``compression.broadcast='downlink'`` and the downlink compressor is lossy,
the PS's correction through the downlink compressor, W x its payload): it costs
``round_down_bits_d / lan_bps + lan_latency_s`` (:func:`lan_time`), added to the
DC's round communication time.

Between DCs, the PSs exchange their (compressed) pseudo-gradients all-to-all (an
all-gather over the 'dc' axis): DC d sends its payload to each of the other D-1 DCs
and receives theirs. Its WAN link is full duplex at ``wan_bandwidth_mbps``, so

    C_d = max(egress_bits_d, ingress_bits_d) / wan_bps + H * wan_latency_s,

(max(egress, ingress): :func:`dc_link_bits`) with H =
``network.wan_latencies_per_round`` one-way latencies (default 2: one
message out and one back, the ideal of a combined collective). A real transport
pays what its algorithms need; :func:`gloo_round_latencies` counts them for gloo
over TCP (XLA:CPU's multi-process collectives, the transport of
``launch/emulated_wan.py``): a gloo message leaves only once the receiver has
announced a ready buffer, so every step of a collective costs two one-way
latencies (notification, then data). hfl's round sends all leaves' WAN payloads
in one collective per kind (``hfl.collectives``) — a ring all-reduce for
uncompressed (float32) payloads (4 latencies between 2 DCs), one all-gather of
bytes for all the others (2: casts, sparse and quantised payloads are gathered
and decoded before the float32 sum) — and the host loop gathers the round's
metrics once (2): H = 6 for an identity WAN, 4 for a compressed one, 8 for a mix,
with 2 DCs. ``bench/wan_model_check.py`` checks this against the emulated WAN at two
latencies (docs/benchmarks.md).

A round lasts T = max_d(K_d t_d + C_d) over the DCs present in it (the seed thesis;
hfl.sync.faults): every DC keeps its own clock, DCs that finish their K_d
iterations early wait for the slowest, and that wait is recorded as idle time; an
absent DC's work is discarded and it restarts at T with the others.
"""

from typing import NamedTuple, Sequence

import numpy as np


class NetworkModel(NamedTuple):
  """Per-DC time model. Arrays are float64 [D]."""
  compute_s: np.ndarray      # seconds of compute per intra-DC iteration, per DC
  lan_bps: float             # PS NIC bandwidth, bits per second
  lan_latency_s: float       # one-way LAN latency, seconds
  wan_bps: float             # per-DC WAN bandwidth, bits per second
  wan_latency_s: float       # one-way WAN latency, seconds
  wan_latencies_per_round: float = 2.0  # one-way latencies a round costs (H)


def from_config(net, num_dcs: int) -> NetworkModel:
  """Builds the model from the ``network`` config section.

  Raises:
    ValueError: a bandwidth is not positive, a latency or compute time negative, a
      value not finite, or
      ``network.dc_speed`` does not hold ``num_dcs`` positive numbers.
  """
  try:
    speed = np.asarray(tuple(net.dc_speed), dtype=np.float64)
  except (TypeError, ValueError):
    raise ValueError(
        f'network.dc_speed={net.dc_speed!r} must be a tuple of mesh.num_dcs={num_dcs} '
        'positive relative speeds, e.g. (3.0, 1.0) (1.0 = the reference speed).') from None
  if speed.shape != (num_dcs,) or not np.all(speed > 0):
    raise ValueError(
        f'network.dc_speed={tuple(net.dc_speed)} must hold mesh.num_dcs={num_dcs} '
        'positive relative speeds (1.0 = the reference speed).')
  if not np.all(np.isfinite(speed)):
    raise ValueError(f'network.dc_speed={tuple(net.dc_speed)} must be finite.')
  for field in ('lan_bandwidth_gbps', 'wan_bandwidth_mbps'):
    if not 0 < float(net[field]) < np.inf:
      raise ValueError(f'network.{field}={net[field]} must be finite and > 0.')
  for field in ('lan_latency_s', 'wan_latency_s', 'compute_time_s'):
    if not 0 <= float(net[field]) < np.inf:
      raise ValueError(f'network.{field}={net[field]} must be finite and >= 0 (seconds).')
  hops = net.get('wan_latencies_per_round', 2.0)
  if (isinstance(hops, bool) or not isinstance(hops, (int, float))
      or not 0 <= hops < np.inf):
    raise ValueError(f'network.wan_latencies_per_round={hops!r} must be a finite number >= 0 (one-way '
                     'WAN latencies per inter-DC round; 2 = one exchange).')
  return NetworkModel(
      compute_s=float(net.compute_time_s) / speed,
      lan_bps=float(net.lan_bandwidth_gbps) * 1e9,
      lan_latency_s=float(net.lan_latency_s),
      wan_bps=float(net.wan_bandwidth_mbps) * 1e6,
      wan_latency_s=float(net.wan_latency_s),
      wan_latencies_per_round=float(hops))


def iteration_time(net: NetworkModel, up_bits: np.ndarray, down_bits: np.ndarray) -> np.ndarray:
  """Seconds of one intra-DC iteration per DC, float64 [D].

  Args:
    net: the network model.
    up_bits: float [D], bits of all the DC's workers' uplink payloads.
    down_bits: float [D], bits the PS sends to all its workers.

  Returns:
    float64 [D] seconds: compute_s + (up_bits + down_bits) / lan_bps + 2 LAN
    latencies (the uplink and the PS downlink, one after the other).
  """
  return (net.compute_s + (np.asarray(up_bits) + np.asarray(down_bits)) / net.lan_bps
          + 2 * net.lan_latency_s)


def lan_time(net: NetworkModel, bits: np.ndarray) -> np.ndarray:
  """Seconds of one LAN transfer per DC (PS egress), float64 [D]: bits / lan_bps
  plus one LAN latency where bits > 0, else 0.

  Args:
    net: the network model.
    bits: float or int [D], bits the DC's PS sends to its workers.
  """
  bits = np.asarray(bits, np.float64)
  return np.where(bits > 0, bits / net.lan_bps + net.lan_latency_s, 0.0)


def round_comm_time(net: NetworkModel, payload_bits: np.ndarray,
                    present: np.ndarray | None = None) -> np.ndarray:
  """Seconds of inter-DC communication per DC for one round, float64 [D].

  Args:
    net: the network model.
    payload_bits: float [D], bits of each DC's pseudo-gradient payload (0 for an
      absent DC).
    present: bool [D], DCs taking part (default: all).

  Returns:
    C_d = max(egress, ingress) / wan_bps + H * wan_latency_s for present DCs (H =
    ``net.wan_latencies_per_round``); 0 for absent ones.
  """
  bits = np.asarray(payload_bits, dtype=np.float64)
  present = np.ones(bits.shape, bool) if present is None else np.asarray(present, bool)
  c = (dc_link_bits(bits, present) / net.wan_bps
       + net.wan_latencies_per_round * net.wan_latency_s)
  return np.where(present & (present.sum() > 1), c, 0.0)


def dc_link_bits(payload_bits: np.ndarray, present: np.ndarray | None = None) -> np.ndarray:
  """Bits each DC's full-duplex WAN link carries in one round: max(egress, ingress).

  In the all-to-all exchange DC d sends its payload to each of the other present
  DCs (egress = payload_d (D_present - 1)) and receives theirs (ingress = the sum
  of the other present payloads). What :func:`round_comm_time` divides by the
  bandwidth and what ``hfl.cost.account_wan`` records as a run's peak.

  Args:
    payload_bits: int or float [D], bits of each DC's pseudo-gradient payload.
    present: bool [D], DCs taking part (default: all).

  Returns:
    [D] bits, the dtype of ``payload_bits`` (int64 stays exact); 0 for absent DCs
    and when fewer than 2 DCs are present.
  """
  bits = np.asarray(payload_bits)
  present = np.ones(bits.shape, bool) if present is None else np.asarray(present, bool)
  bits = np.where(present, bits, bits.dtype.type(0))
  peers = max(int(present.sum()) - 1, 0)
  return np.where(present, np.maximum(bits * peers, bits.sum() - bits), bits.dtype.type(0))


def link_bits(payload_bits: np.ndarray, present: np.ndarray | None = None) -> int:
  """Total bits put on the WAN in one round (each payload goes to D_present - 1 peers).

  Args:
    payload_bits: int [D], bits of each DC's pseudo-gradient payload.
    present: bool [D], DCs taking part (default: all).

  Returns:
    Python int (exact).
  """
  bits = [int(b) for b in np.asarray(payload_bits).reshape(-1)]
  present = [True] * len(bits) if present is None else [bool(p) for p in present]
  peers = max(sum(present) - 1, 0)
  return sum(b for b, p in zip(bits, present) if p) * peers


# gloo's ring all-reduce cuts its buffer into segments of at most this many
# bytes (gloo AllreduceOptions::kMaxSegmentSize) and keeps two in flight.
GLOO_MAX_SEGMENT_BYTES = 1 << 20


def gloo_allreduce_latencies(num_ranks: int, buffer_bytes: int) -> int:
  """One-way latencies of one gloo ring all-reduce over TCP (gloo/allreduce.cc, ring()).

  The buffer is cut into S segments, S = max(ceil(bytes / 1 MiB), 2p) rounded up
  to a multiple of p (p ranks); a reduce-scatter and an all-gather phase each
  send S - S/p segments to the ring neighbour, two in flight. A segment is sent
  when the receiver's ready notification arrives, and the receiver posts the
  next receive only when the one two places earlier has arrived, so each pair
  of segments costs 2 one-way latencies (notification, data): 2 * 2 *
  ceil((S - S/p) / 2) per all-reduce; 4 for 2 ranks and a buffer <= 4 MiB.

  Args:
    num_ranks: p, members of the collective (e.g. DCs).
    buffer_bytes: bytes of each rank's buffer.

  Returns:
    int one-way latencies (0 for a single rank or an empty buffer).
  """
  p = int(num_ranks)
  if p <= 1 or buffer_bytes <= 0:
    return 0
  segments = max(-(-int(buffer_bytes) // GLOO_MAX_SEGMENT_BYTES), 2 * p)
  segments = -(-segments // p) * p
  return 2 * 2 * (-(-(segments - segments // p) // 2))


def gloo_allgather_latencies(num_ranks: int) -> int:
  """One-way latencies of one gloo ring all-gather over TCP (gloo/allgather.cc).

  p - 1 steps, each sending the previously received block on to the next rank
  once it has announced its receive: 2 one-way latencies per step.

  Returns:
    int, 2 (p - 1) (0 for a single rank).
  """
  return 2 * max(int(num_ranks) - 1, 0)


def gloo_round_latencies(num_dcs: int, allreduce_bytes: Sequence[int] = (),
                         allgathers: int = 0, host_gathers: int = 1) -> int:
  """H for gloo over TCP: one-way WAN latencies of one inter-DC round.

  The collectives of one round run one after the other; their latencies add up.

  Args:
    num_dcs: DCs taking part (the ranks of every inter-DC collective).
    allreduce_bytes: per-rank buffer bytes of each inter-DC all-reduce of the
      round (hfl: one per dtype of linear payloads, each worker sending its
      1/W slice).
    allgathers: inter-DC all-gathers of the round (hfl: one for all non-linear
      payloads).
    host_gathers: the host loop's cross-process gathers per round (hfl: 1, the
      round's per-iteration metrics).

  Returns:
    int H, for ``network.wan_latencies_per_round``.
  """
  return (sum(gloo_allreduce_latencies(num_dcs, b) for b in allreduce_bytes)
          + (allgathers + host_gathers) * gloo_allgather_latencies(num_dcs))


def link_bytes(payload_bits: np.ndarray, present: np.ndarray | None = None) -> float:
  """Total bytes put on the WAN in one round: :func:`link_bits` / 8."""
  return link_bits(payload_bits, present) / 8


class Clock(NamedTuple):
  """Simulated wall clock. Arrays float64 [D], seconds."""
  time_s: np.ndarray   # each DC's clock
  idle_s: np.ndarray   # each DC's accumulated waiting time

  @property
  def now(self) -> float:
    """Simulated wall-clock of the whole system: the slowest DC's clock (seconds)."""
    return float(np.max(self.time_s))


def new_clock(num_dcs: int) -> Clock:
  """A :class:`Clock` at 0 s for ``num_dcs`` DCs (time and idle time, float64 [D])."""
  return Clock(np.zeros(num_dcs), np.zeros(num_dcs))


def advance_iteration(clock: Clock, dt: np.ndarray, active: Sequence[bool]) -> Clock:
  """Charges each active DC one iteration of ``dt[d]`` seconds; inactive DCs stand still."""
  return Clock(clock.time_s + np.where(np.asarray(active, bool), dt, 0.0), clock.idle_s)


def advance_round(clock: Clock, comm_s: np.ndarray, present: np.ndarray | None = None,
                  waits: np.ndarray | None = None) -> Clock:
  """Ends a round: every DC finishes its communication, then all wait for the slowest.

  Args:
    clock: the clock after the round's iterations.
    comm_s: float [D], each DC's communication time C_d of the round.
    present: bool [D], DCs taking part (default: all; hfl.sync.faults).
    waits: bool [D], the DCs that wait for the round's result (default: all). A DC
      that neither takes part nor adopts the new global model (a partial strategy,
      hfl.sync.strategies) keeps training on its own timeline.

  Returns a clock where every waiting DC reads T = max_d(time_d + C_d) over the
  present DCs; each waiting DC's idle time grows by max(0, T - (time_d + C_d)) (an
  absent DC later than T abandons its discarded work at T); the others' clocks are
  unchanged.
  """
  done = clock.time_s + np.asarray(comm_s, np.float64)
  present = np.ones(done.shape, bool) if present is None else np.asarray(present, bool)
  waits = np.ones(done.shape, bool) if waits is None else np.asarray(waits, bool)
  t = float(np.max(done[present]))
  return Clock(np.where(waits, t, clock.time_s),
               clock.idle_s + np.where(waits, np.maximum(t - done, 0.0), 0.0))


# ------------------------------------------------------------------------------
# Overlapped communication (Streaming DiLoCo, Douillard et al. 2025, arXiv:2501.18512,
# Sec. 2: a fragment's exchange runs during the next τ inner iterations).
# ------------------------------------------------------------------------------

def exposed_comm_time(comm_s, overlap_s):
  """Seconds of a WAN transfer the compute does not hide: max(0, comm_s - overlap_s).

  Args:
    comm_s: float or float [D], the transfer's time C_d (:func:`round_comm_time`).
    overlap_s: float or float [D], the compute that runs meanwhile (τ iterations
      of t_d seconds; 0 without overlap).

  Returns:
    float64 like the broadcast of the inputs.
  """
  return np.maximum(np.asarray(comm_s, np.float64) - np.asarray(overlap_s, np.float64), 0.0)


def advance_overlapped_round(clock: Clock, comm_s: np.ndarray, overlap_s: np.ndarray,
                             present: np.ndarray | None = None,
                             waits: np.ndarray | None = None) -> tuple[Clock, Clock]:
  """Ends a round whose communication overlaps the next iterations (Streaming DiLoCo).

  Args:
    clock: the clock after the round's iterations.
    comm_s: float [D], each DC's communication time C_d of the round.
    overlap_s: float [D], the compute that runs meanwhile (τ iterations of t_d).
    present: bool [D], DCs taking part (default: all).
    waits: bool [D], DCs that wait for the round's result (default: all; :func:`advance_round`).

  Returns:
    ``(running, stopped)``: the clock the run goes on with, charged only the
    :func:`exposed_comm_time` (:func:`advance_round`); and the clock of a run that
    stops after this round, where no iteration follows to hide the transfer, charged
    all of ``comm_s``. Only a summary reads ``stopped``: a run that goes on (or is
    extended) goes on from ``running``. Equal when ``overlap_s`` is 0.
  """
  return (advance_round(clock, exposed_comm_time(comm_s, overlap_s), present, waits),
          advance_round(clock, comm_s, present, waits))


def event_utilisation(dc_bits: float, wan_bps: float, iterations: int, iteration_s: float,
                      compute_s: float, overlap_steps: int, latency_s: float) -> float:
  """Compute utilisation of a steady state of sync events (compute / wall).

  One period: ``iterations`` iterations of ``iteration_s`` seconds (of which
  ``compute_s`` compute), then the exposed part of the event's transfer
  C = dc_bits / wan_bps + latency_s beyond ``overlap_steps`` iterations:
  U = I c / (I t + max(0, C - τ t)).

  Args:
    dc_bits: bits a DC's WAN link carries in one event (max of egress, ingress).
    wan_bps: per-DC WAN bandwidth (bits/s).
    iterations: I, iterations per sync event (K / P; K for DiLoCo; 1 for data
      parallel).
    iteration_s: t, seconds of one iteration (compute + LAN).
    compute_s: c, seconds of compute in one iteration.
    overlap_steps: τ.
    latency_s: the event's latency term (H one-way WAN latencies, seconds).

  Returns:
    float in [0, 1].
  """
  comm = dc_bits / wan_bps + latency_s
  wall = iterations * iteration_s + float(exposed_comm_time(comm, overlap_steps * iteration_s))
  return iterations * compute_s / wall


def wan_bandwidth_for_utilisation(dc_bits: float, iterations: int, iteration_s: float,
                                  compute_s: float, overlap_steps: int, latency_s: float,
                                  target=0.95):
  """The smallest per-DC WAN bandwidth (bits/s) at which :func:`event_utilisation`
  reaches ``target`` (the figure DiLoCo's bandwidth simulator plots and the DiLoCo
  scaling-law paper's appendix tabulates, Charles et al. 2025, arXiv:2503.09799;
  closed form).

  U >= u* holds iff the exposed time E <= S = I c / u* - I t, i.e. iff
  C <= τ t + S, i.e. dc_bits / B <= R = τ t + S - latency_s: B = dc_bits / R.

  Args:
    dc_bits: bits a DC's WAN link carries in one event (:func:`dc_link_bits`).
    iterations, iteration_s, compute_s, overlap_steps, latency_s: as for
      :func:`event_utilisation` (I, t and c in seconds, τ, latency in seconds).
    target: u*, a utilisation in (0, 1], or a sequence / array of them (one
      bandwidth each, e.g. 0.5, 0.75, 0.9, 0.95, 0.99).

  Returns:
    bits/s: a float for a scalar ``target``, else float64 of ``target``'s shape;
    0.0 when nothing is sent and the latency fits; ``inf`` when no bandwidth
    suffices (S < 0: the LAN alone keeps utilisation below the target, or
    R <= 0: the latency alone does).

  Raises:
    ValueError: a target outside (0, 1] (or not finite).
  """
  u = np.asarray(target, np.float64)
  if not np.all((u > 0) & (u <= 1)):
    raise ValueError(f'target={target!r}: a utilisation must lie in (0, 1].')
  slack = iterations * compute_s / u - iterations * iteration_s
  room = overlap_steps * iteration_s + slack - latency_s
  if dc_bits <= 0:
    need = np.where(room >= 0, 0.0, np.inf)
  else:
    need = np.where(room > 0, dc_bits / np.where(room > 0, room, 1.0), np.inf)
  need = np.where(slack < 0, np.inf, need)
  return float(need) if need.ndim == 0 else need
