"""Training steps in flight: how far the host's dispatching may run ahead of the devices.

JAX dispatches a jitted step asynchronously: the call returns once the program is
enqueued, and the host can prepare and enqueue the next step while the devices still
run this one. On an accelerator a small model's step costs mostly launching its work
(docs/benchmarks.md, "On an accelerator"), so a loop that waits for every step's
results leaves the device idle while the host dispatches the next one. :class:`Window`
lets up to :func:`depth` steps be in flight and waits only for the oldest.

One exception: XLA:CPU's collectives deadlock with several steps in flight when the
simulated devices outnumber the cores (each device's program blocks a thread in a
collective that waits for devices whose programs cannot run). On CPU with a device
mesh of several devices the loop therefore waits for every step (depth 1); everywhere
else — one device (``mesh.simulate`` = vmap), or a GPU/TPU mesh — :data:`MAX_IN_FLIGHT`
steps may be in flight. The steps compute the same values either way: only when the
host waits changes.

Timing. With steps in flight, a step's dispatch-to-result time includes the steps
queued before it. The window therefore times each step from the later of its
dispatch and the previous step's completion to its own completion, observed when the
host waits for it in order (the oldest first). Waiting for every step, this is the
dispatch-to-result time; with the device busy, it is the interval between successive
completions, the step's share of the pipeline's time.
"""

import collections
import time
from typing import Any, Callable, Hashable

import jax

MAX_IN_FLIGHT = 3  # steps dispatched and not yet waited for, where the backend allows


def depth(backend: str, mode: str, num_devices: int) -> int:
  """Steps the loop may have in flight: 1 (wait for every step) on XLA:CPU's device
  mesh of several devices (its collectives deadlock with more), else
  :data:`MAX_IN_FLIGHT`.

  Args:
    backend: ``jax.default_backend()`` ('cpu', 'gpu', 'tpu').
    mode: the step's mode, 'mesh' (``shard_map`` over the device mesh) or 'vmap'
      (the hierarchy on one device).
    num_devices: devices of the step's mesh.
  """
  if backend == 'cpu' and mode == 'mesh' and num_devices > 1:
    return 1
  return MAX_IN_FLIGHT


class Window:
  """The dispatched steps not yet waited for, oldest first, at most ``depth``.

  Args:
    depth: steps that may be in flight (>= 1; 1: :meth:`push` waits for the step).
    done: ``done(program, start)`` is called once per step, in dispatch order, right
      after the step's results are ready; ``start`` (``time.perf_counter`` seconds) is
      the later of the step's dispatch and the previous step's completion (module
      docstring), so ``time.perf_counter() - start`` is the step's wall-clock.
    clock: the clock of ``start`` (seconds; default ``time.perf_counter``).
  """

  def __init__(self, depth: int, done: Callable[[Hashable, float], None],
               clock: Callable[[], float] = time.perf_counter):
    if depth < 1:
      raise ValueError(f'Window: depth={depth} must be >= 1')
    self.depth = int(depth)
    self._done = done
    self._clock = clock
    self._queue = collections.deque()  # (outputs, program, dispatch time)
    self._last = float('-inf')  # clock() when the last step was seen complete

  def __len__(self) -> int:
    return len(self._queue)

  def push(self, outputs: Any, program: Hashable, t_dispatch: float) -> None:
    """After a step was dispatched at ``t_dispatch`` (``outputs``: its result arrays,
    e.g. the metrics): waits for the oldest steps until fewer than ``depth`` remain
    in flight."""
    self._queue.append((outputs, program, t_dispatch))
    while len(self._queue) >= self.depth:
      self._retire()

  def drain(self) -> None:
    """Waits for every step in flight, oldest first."""
    while self._queue:
      self._retire()

  def _retire(self) -> None:
    outputs, program, t_dispatch = self._queue.popleft()
    jax.block_until_ready(outputs)
    self._done(program, max(t_dispatch, self._last))
    self._last = self._clock()
