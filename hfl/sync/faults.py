"""Simulated datacenter outages: the ``sync.faults`` spec.

Syntax. ``sync.faults`` is a comma-separated list of ``dc:round`` or
``dc:first-last`` entries; DC ids count from 0 (``mesh.num_dcs`` DCs: 0..D-1),
rounds from 1, ranges are inclusive, whitespace is ignored, and the empty string
means no outages. Entries may overlap (their union is taken). Example::

    '1:10-12,2:5'   # DC 1 misses rounds 10, 11, 12; DC 2 misses round 5

A *round* is one inter-DC round, numbered from 1 as everywhere a run shows one
(round r is the r-th; its aggregation produces the r-th global model; after it
the run has done r rounds: metrics.jsonl's ``round`` and ``dc_rounds[*].round``,
the progress line). Configs written before this numbering counted them from 0:
``'1:0'`` is refused, ``'1:2'`` now names the round that was ``'1:1'``, and a
run with outages checkpointed then is not continued (hfl.workdir.check_fault_rounds).

Semantics of an absent DC ``d`` in round ``r``:

- its local work in round r is discarded: it does not contribute to the
  inter-DC aggregate (weight 0), and the weights of the present DCs are
  renormalised to sum to 1 (:func:`hfl.sync.aggregation.fedavg_weights` with
  ``present``);
- at the end of round r it restarts from the new global model, like every DC;
  discarded work leaves no trace: the loop rolls the DC's per-DC state (inner
  optimizer state, uplink, downlink and WAN error-feedback residuals and
  compressor states, DGC velocity) back to its start-of-round values
  (hfl.step.round_start / discard_absent);
- it sends nothing on the WAN in round r (no inter-DC bytes are counted for it)
  and the round time is the max over present DCs only
  (hfl.network.advance_round). Its LAN traffic in round r did happen and is
  counted.

A spec that makes every DC absent in some round is rejected: there would be
nothing to aggregate.

How the training loop uses it: build ``present = make_present_fn(
config.sync.faults, config.mesh.num_dcs)`` once; at the start of each round r,
if ``present(r)`` (bool [D]) has an absent DC, copy the per-DC state; pass the
weights masked by ``present(r)`` into the jitted round; after it, restore the
absent DCs' per-DC state from the copy. Host-side numpy; pure.
"""

import re
from typing import Callable, NamedTuple

import numpy as np

_ENTRY = re.compile(r'^([0-9]+):([0-9]+)(?:-([0-9]+))?$')


class Outage(NamedTuple):
  """DC ``dc`` is absent in rounds ``first..last`` (inclusive, numbered from 1)."""
  dc: int
  first: int
  last: int


def parse_faults(spec: str, num_dcs: int) -> tuple[Outage, ...]:
  """Parses a ``sync.faults`` string into outages.

  Args:
    spec: e.g. ``'1:10-12,2:5'`` (see the module docstring); '' for none.
    num_dcs: number of DCs D (``mesh.num_dcs``), >= 1.

  Returns:
    The outages, in the order written.

  Raises:
    ValueError: naming ``sync.faults`` if the string is malformed, a DC id is
      outside ``[0, num_dcs)``, a round is 0 (rounds are numbered from 1), a
      range is reversed, or some round would have every DC absent; or naming
      ``mesh.num_dcs`` if ``num_dcs < 1``.
  """
  if isinstance(num_dcs, bool) or not isinstance(num_dcs, (int, np.integer)):
    raise ValueError(f'mesh.num_dcs must be an integer, got {num_dcs!r}.')
  if num_dcs < 1:
    raise ValueError(f'mesh.num_dcs must be >= 1, got {num_dcs}.')
  if not isinstance(spec, str):
    raise ValueError(
        f'sync.faults must be a string like "1:10-12,2:5", got {spec!r}.')
  text = re.sub(r'\s+', '', spec)
  if not text:
    return ()
  outages = []
  for entry in text.split(','):
    m = _ENTRY.match(entry)
    if m is None:
      raise ValueError(
          f'sync.faults: malformed entry {entry!r} in {spec!r}; expected '
          '"dc:round" or "dc:first-last" (DC ids from 0, rounds from 1), e.g. '
          '"1:10-12,2:5".')
    dc, first = int(m.group(1)), int(m.group(2))
    last = int(m.group(3)) if m.group(3) is not None else first
    if dc >= num_dcs:
      raise ValueError(
          f'sync.faults: DC id {dc} in {entry!r} is out of range; DC ids are '
          f'0..{num_dcs - 1} (mesh.num_dcs = {num_dcs}).')
    if last < first:
      raise ValueError(
          f'sync.faults: reversed round range in {entry!r} ({first} > {last}).')
    if first < 1:
      raise ValueError(
          f'sync.faults: round 0 in {entry!r}: rounds are numbered from 1 (round 1 is '
          'the first; metrics.jsonl\'s dc_rounds show the same numbers), e.g. "1:1-2".')
    outages.append(Outage(dc, first, last))
  # If some round has every DC absent, the earliest such round is the start
  # of one of the outages, so it suffices to check those starts.
  for r in sorted({o.first for o in outages}):
    absent = {o.dc for o in outages if o.first <= r <= o.last}
    if len(absent) == num_dcs:
      raise ValueError(
          f'sync.faults: every DC is absent in round {r} ({spec!r}); at least '
          'one DC must be present in every round.')
  return tuple(outages)


def present_mask(outages: tuple[Outage, ...], num_dcs: int,
                 round_number: int) -> np.ndarray:
  """Which DCs take part in a round.

  Args:
    outages: from :func:`parse_faults`.
    num_dcs: number of DCs D.
    round_number: the inter-DC round's number, >= 1 (the first round is 1).

  Returns:
    bool [D], True where the DC is present.

  Raises:
    ValueError: if ``round_number`` is not a positive integer.
  """
  if (isinstance(round_number, bool)
      or not isinstance(round_number, (int, np.integer)) or round_number < 1):
    raise ValueError(
        f'round number must be a positive integer (rounds are numbered from 1), got '
        f'{round_number!r}.')
  mask = np.ones((num_dcs,), dtype=bool)
  for o in outages:
    if o.first <= round_number <= o.last:
      mask[o.dc] = False
  return mask


def unreached(spec: str, num_dcs: int, num_rounds: int) -> tuple[Outage, ...]:
  """The outages of ``spec`` that a run of ``num_rounds`` rounds (1..num_rounds)
  never reaches, wholly or in part (``last > num_rounds``): a configured fault
  that did not happen, which the run warns about at its end.

  Raises:
    ValueError: as :func:`parse_faults`.
  """
  return tuple(o for o in parse_faults(spec, num_dcs) if o.last > num_rounds)


def make_present_fn(spec: str, num_dcs: int) -> Callable[[int], np.ndarray]:
  """Parses ``sync.faults`` and returns ``present(round_number) -> bool [D]``.

  Args:
    spec: the ``sync.faults`` string.
    num_dcs: number of DCs D (``mesh.num_dcs``).

  Returns:
    A pure function of the round's number (from 1) returning a fresh bool [D]
    array (True = present); at least one entry is always True.

  Raises:
    ValueError: as :func:`parse_faults` (at construction), and from the
      returned function for a round number below 1 or not an integer.
  """
  outages = parse_faults(spec, num_dcs)

  def present(round_number: int) -> np.ndarray:
    return present_mask(outages, num_dcs, round_number)

  return present
