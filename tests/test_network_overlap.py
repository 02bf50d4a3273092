"""The overlapped-communication cost model (hfl.network) against closed forms."""

import math

import numpy as np

from hfl import network


def test_exposed_comm_time_is_the_excess_over_the_overlapped_compute():
  np.testing.assert_array_equal(network.exposed_comm_time([3.0, 1.0, 2.0], 2.0),
                                [1.0, 0.0, 0.0])


def test_utilisation_closed_form():
  # I = 4 iterations of t = 1 s (c = 0.9 s compute), C = 8e6 / 4e6 + 0.5 = 2.5 s,
  # τ = 1 hides 1 s: U = 3.6 / (4 + 1.5).
  u = network.event_utilisation(8e6, 4e6, 4, 1.0, 0.9, 1, 0.5)
  assert math.isclose(u, 3.6 / 5.5, rel_tol=1e-15)
  # No overlap: U = 3.6 / (4 + 2.5).
  assert math.isclose(network.event_utilisation(8e6, 4e6, 4, 1.0, 0.9, 0, 0.5), 3.6 / 6.5)


def test_bandwidth_for_utilisation_closed_form_and_round_trip():
  # u* = 0.8: S = 3.6 / 0.8 - 4 = 0.5; R = 1 + 0.5 - 0.1 = 1.4 -> B = 1e6 / 1.4.
  b = network.wan_bandwidth_for_utilisation(1e6, 4, 1.0, 0.9, 1, 0.1, target=0.8)
  assert math.isclose(b, 1e6 / 1.4, rel_tol=1e-12)
  assert math.isclose(network.event_utilisation(1e6, b, 4, 1.0, 0.9, 1, 0.1), 0.8,
                      rel_tol=1e-12)
  assert network.event_utilisation(1e6, 0.99 * b, 4, 1.0, 0.9, 1, 0.1) < 0.8
  # More overlap or more iterations per event: less bandwidth.
  assert network.wan_bandwidth_for_utilisation(1e6, 4, 1.0, 0.9, 2, 0.1, 0.8) < b
  assert network.wan_bandwidth_for_utilisation(1e6, 8, 1.0, 0.9, 1, 0.1, 0.8) < b


def test_bandwidth_for_utilisation_impossible_cases():
  # The LAN alone: c / t = 0.9 < 0.95.
  assert network.wan_bandwidth_for_utilisation(1e6, 4, 1.0, 0.9, 1, 0.0) == math.inf
  # The latency alone: S = 4/0.95 - 4 = 0.21 s, τ = 0, latency 1 s.
  assert network.wan_bandwidth_for_utilisation(1e6, 4, 1.0, 1.0, 0, 1.0) == math.inf
  assert network.wan_bandwidth_for_utilisation(0, 4, 1.0, 1.0, 0, 0.1) == 0.0
