"""The network/time model and the simulated clock against hand-computed values."""

import ml_collections
import numpy as np
import pytest

from hfl import network


def _net(**kw):
  c = ml_collections.ConfigDict(dict(
      compute_time_s=0.1, dc_speed=(1.0, 2.0), lan_bandwidth_gbps=1.0, lan_latency_s=0.001,
      wan_bandwidth_mbps=100.0, wan_latency_s=0.02))
  c.update(kw)
  return network.from_config(c, 2)


def test_iteration_time_is_compute_plus_ps_nic_plus_latency():
  net = _net()
  t = network.iteration_time(net, up_bits=np.array([8e6, 8e6]), down_bits=np.array([2e6, 0.0]))
  # DC0: 0.1 s compute + 10 Mbit over 1 Gbit/s + 2 ms; DC1: 0.05 s + 8 Mbit / 1 Gbit/s + 2 ms.
  np.testing.assert_allclose(t, [0.1 + 0.01 + 0.002, 0.05 + 0.008 + 0.002])


def test_round_comm_time_all_gather_over_wan():
  net = _net()
  c = network.round_comm_time(net, np.array([1e6, 3e6]))
  # Each DC sends its payload to the 1 other DC and receives the other's: full duplex.
  np.testing.assert_allclose(c, [3e6 / 1e8 + 0.04, 3e6 / 1e8 + 0.04])
  assert network.link_bytes(np.array([1e6, 3e6])) == 4e6 / 8
  # An absent DC neither sends nor waits.
  c = network.round_comm_time(net, np.array([1e6, 3e6]), present=np.array([True, False]))
  np.testing.assert_allclose(c, [0.0, 0.0])
  # H one-way latencies per round instead of the default 2.
  c = network.round_comm_time(_net(wan_latencies_per_round=26.0), np.array([1e6, 3e6]))
  np.testing.assert_allclose(c, [3e6 / 1e8 + 26 * 0.02] * 2)


def test_idle_times_add_up():
  clock = network.new_clock(3)
  dt = np.array([0.1, 0.2, 0.4])
  k = np.array([4, 2, 1])
  for i in range(4):
    clock = network.advance_iteration(clock, dt, active=i < k)
  np.testing.assert_allclose(clock.time_s, [0.4, 0.4, 0.4])
  comm = np.array([0.05, 0.1, 0.2])
  clock = network.advance_round(clock, comm)
  t_round = max(0.4 + 0.05, 0.4 + 0.1, 0.4 + 0.2)
  assert clock.now == pytest.approx(t_round)
  # Busy (compute + communication) + idle = the round's length, for every DC.
  busy = k * dt + comm
  np.testing.assert_allclose(busy + clock.idle_s, t_round)


@pytest.mark.parametrize('field,value', [('lan_bandwidth_gbps', 0.0), ('wan_bandwidth_mbps', -1.0),
                                         ('wan_latency_s', -0.1), ('dc_speed', (1.0,)),
                                         ('wan_latencies_per_round', -1.0),
                                         ('wan_latencies_per_round', 'two'),
                                         ('wan_latencies_per_round', float('inf')),
                                         ('wan_latency_s', float('inf')),
                                         ('compute_time_s', float('inf')),
                                         ('wan_bandwidth_mbps', float('inf')),
                                         ('dc_speed', (1.0, float('inf'))),
                                         ('dc_speed', (1.0, 0.0)),
                                         ('dc_speed', ('fast',)), ('dc_speed', (1.0, 'x'))])
def test_bad_network_config_names_the_field(field, value):
  with pytest.raises(ValueError, match=f'network.{field}'):
    _net(**{field: value})


def test_round_time_is_the_max_over_present_dcs():
  """An absent DC's (discarded) work does not hold the round up (hfl.sync.faults):
  the round ends at the present DCs' max; the absent DC restarts with them."""
  clock = network.Clock(np.array([1.0, 3.0, 2.0]), np.zeros(3))
  clock = network.advance_round(clock, np.array([0.5, 0.0, 0.5]),
                                present=np.array([True, False, True]))
  np.testing.assert_allclose(clock.time_s, [2.5] * 3)
  np.testing.assert_allclose(clock.idle_s, [1.0, 0.0, 0.0])


def test_lan_time_and_exact_link_bits():
  net = _net()
  np.testing.assert_allclose(network.lan_time(net, np.array([8e6, 0])), [8e6 / 1e9 + 0.001, 0])
  big = 2**60 + 1  # beyond float64's integers
  assert network.link_bits(np.array([big, 8]), np.array([True, True])) == big + 8
  assert network.link_bits(np.array([big, 8, 16]), np.array([True, False, True])) == big + 16
  assert network.link_bits(np.array([big, 8, 16])) == 2 * (big + 24)


def test_gloo_collective_latencies_follow_the_ring_algorithms():
  mib = network.GLOO_MAX_SEGMENT_BYTES
  # 2 ranks, small buffer: 4 segments, 2 per phase, both in flight: one
  # notification + data (2 latencies) per phase.
  assert network.gloo_allreduce_latencies(2, 100_000) == 4
  assert network.gloo_allreduce_latencies(2, 4 * mib) == 4
  # 5 segments -> 6 (a multiple of 2 ranks), 3 per phase: 2 pairs per phase.
  assert network.gloo_allreduce_latencies(2, 4 * mib + 1) == 8
  # 3 ranks: 6 segments, 4 sent per phase: 2 pairs per phase.
  assert network.gloo_allreduce_latencies(3, 1000) == 8
  assert network.gloo_allreduce_latencies(1, 1000) == 0
  assert network.gloo_allreduce_latencies(2, 0) == 0
  assert [network.gloo_allgather_latencies(p) for p in (1, 2, 4)] == [0, 2, 6]


def test_gloo_round_latencies_of_hfl_rounds():
  # Identity / fp16 WAN, 2 DCs: one fused all-reduce + the metrics gather.
  assert network.gloo_round_latencies(2, allreduce_bytes=[235_000]) == 6
  # Sparse / quantised WAN: one fused all-gather + the metrics gather.
  assert network.gloo_round_latencies(2, allgathers=1) == 4
  # The per-leaf exchange this replaced: 6 leaves, one all-reduce each.
  assert network.gloo_round_latencies(2, allreduce_bytes=[1000] * 6) == 26
  assert network.gloo_round_latencies(2, host_gathers=0) == 0
