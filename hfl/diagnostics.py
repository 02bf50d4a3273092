"""What the loop tells about a run while it trains: the progress line, and why a
diverging run stops.

:func:`log_progress` writes the progress line (step, round, K, loss, the last
evaluation, simulated time, bytes per link, steps/s, ETA); :func:`check_finite`
stops a run whose iteration has a non-finite train loss, gradient, payload or
error-feedback residual (:func:`hfl.links.first_nonfinite` names the leaf, link,
DC and worker), and :func:`diverged` builds the error with
:func:`divergence_advice`. ``rt`` is the loop's hfl.train.Runtime.
"""

import time

import numpy as np
from absl import logging

from hfl import cost
from hfl import metrics as metrics_lib
from hfl import links as link_lib
from hfl import tasks
from hfl.compress import policy
from hfl.sync import schedule as schedule_lib


def divergence_advice(config, workdir: str, last_checkpoint: int | None) -> str:
  """What a diverged run keeps and which config changes may help.

  Args:
    config: the run's config.
    workdir: its workdir.
    last_checkpoint: step of its latest checkpoint, None when it has none.

  Returns:
    The checkpoints kept (only if there are any), then only changes that differ
    from ``config``: a lower learning rate, and milder compression of the links
    that are compressed.
  """
  kept = (f'The checkpoints in {workdir} (up to step {last_checkpoint}, before the '
          'divergence) are kept. ' if last_checkpoint is not None else '')
  compressed = [f'compression.{link}.name={config.compression[link].name!r}'
                for link in ('uplink', 'downlink', 'wan')
                if config.compression[link].name not in policy.LOSSLESS_NAMES]
  milder = f' or use milder compression than {", ".join(compressed)}' if compressed else ''
  return (f'{kept}Lower optimizer.learning_rate (now {config.optimizer.learning_rate}){milder} '
          'in a new --workdir (a workdir keeps its config).')


def diverged(rt, step: int, rnd: int, what: str) -> FloatingPointError:
  """The error that stops a run diverged at ``step`` (round ``rnd``): ``what``
  happened, then :func:`divergence_advice`."""
  return FloatingPointError(f'{what} at step {step}, round {rnd}: training diverged. '
                            + divergence_advice(rt.s.config, rt.workdir, rt.mngr.latest_step()))


def check_finite(rt, m, at: int, step: int, rnd: int) -> None:
  """Stops the run on a non-finite train loss, gradient, payload or residual of
  iteration ``at`` (round ``rnd``, numbered from 1, ends at ``step``)."""
  where = link_lib.first_nonfinite(m['flags'], rt.leaf_names)
  where = f'the first non-finite value is the {where}' if where else ''
  if not np.all(np.isfinite(m['loss'])):
    raise diverged(rt, step, rnd, f'the train loss is {m["loss"].tolist()} (per DC) at '
                    f'iteration {at}' + (f'; {where}' if where else ''))
  if where:
    raise diverged(rt, step, rnd, f'at iteration {at} {where}')


def k_text(plan: schedule_lib.RoundPlan) -> str:
  """The progress line's K: one number when every DC runs K_base iterations, else
  the per-DC K_d (semi-sync) with K_base, e.g. ``'[9,7,5,4] (K_base 4)'``."""
  k_d = [int(k) for k in np.asarray(plan.k_d).reshape(-1)]
  if all(k == plan.k_base for k in k_d):
    return str(plan.k_base)
  return f'[{",".join(map(str, k_d))}] (K_base {plan.k_base})'


def log_progress(rt, ls: cost.LoopState, at: int, loss: float) -> None:
  """The progress line of iteration ``at`` (``loss``: its train loss)."""
  now = time.time()
  rate = (at - rt.log_at[1]) / max(now - rt.log_at[0], 1e-9)
  first = rt.log_at[2]  # since the loop started: compilation included
  rt.log_at = (now, at, False)
  stop = rt.s.loop.stop
  if stop.governed_by == 'num_steps':
    total, eta = str(stop.num_steps), f'{(stop.num_steps - at) / max(rate, 1e-9):.0f}s'
    eta = f'<{eta} (this rate includes compiling)' if first and at < stop.num_steps else eta
  elif stop.governed_by == 'sim_time_budget_s':  # no iteration count: the budget instead
    total, eta = '?', f'at sim {stop.sim_time_budget_s:g}s'
  else:  # samples counted at each round's end
    total, eta = '?', f'at {stop.sample_budget} samples ({ls.samples} done)'
  fmt = lambda link: metrics_lib.format_bytes(cost.to_bytes(ls.bits[link]), digits=1)
  logging.info(
      'step %d/%s round %d K=%s loss %.4f %s sim %.1fs bytes intra_up %s intra_down %s '
      'inter_dc %s | %.1f steps/s ETA %s', at, total, ls.round, k_text(ls.plan), loss,
      tasks.progress(rt.s.task, ls.evals.last_eval), ls.clock.now, fmt('intra_up'),
      fmt('intra_down'), fmt('inter_dc'), rate, eta)
