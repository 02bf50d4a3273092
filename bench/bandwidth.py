"""WAN bandwidth each sync strategy needs for 50-99% compute utilisation, by model size.

For hfl's character LM (configs/shakespeare.py) and the GPT family of 125M to 13B
parameters (hfl.bandwidth.GPT_FAMILY, synthetic shapes), D equal DCs and a stated
WAN latency, prints the per-DC Gbit/s at which each strategy keeps the compute
busy 50, 75, 90, 95 and 99% of the time (hfl.bandwidth, the cost model of the
simulated clock; "none": no bandwidth suffices, the latency alone stalls
more), with the latency and at zero latency, as a Markdown or CSV table, and draws
the 90% and 99% columns against model size (log-log PNG).

The step time is --step_time_s for every model, or else one DC's
6 N tokens / (peak x MFU x devices) (hfl.bandwidth.step_time_s).

  python bench/bandwidth.py --png docs/bandwidth.png > table.md
"""

import argparse
import csv
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from arg_types import int_at_least, names_in, number_in  # noqa: E402

LM = 'hfl_lm'
FAMILY = ('125M', '350M', '760M', '1.3B', '2.7B', '6.7B', '13B')  # hfl.bandwidth.GPT_FAMILY
MODELS = (LM,) + FAMILY
STRATEGIES = ('data_parallel', 'data_parallel_topk', 'diloco', 'diloco_topk', 'semi_sync',
              'streaming', 'sparseloco', 'diloco_2bit')  # hfl.bandwidth.STRATEGIES
TARGETS = (0.5, 0.75, 0.9, 0.95, 0.99)  # hfl.bandwidth.TARGETS


def parse_args(argv=None) -> argparse.Namespace:
  """The command line, checked (argparse exits with status 2 naming the flag)."""
  ap = argparse.ArgumentParser(
      description=__doc__.split('\n\n')[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  ap.add_argument('--dcs', type=int_at_least(2), default=2, help='D, equal DCs')
  ap.add_argument('--wan_latency_s', type=number_in(0), default=0.02,
                  help='one-way WAN latency, s (configs/default.py)')
  ap.add_argument('--wan_latencies_per_round', type=number_in(0), default=2.0,
                  help='H, one-way latencies one sync event costs (configs/default.py)')
  ap.add_argument('--step_time_s', type=number_in(0, lo_open=True), default=None,
                  help='seconds of one step of one DC, every model (default: from FLOPs, '
                  'the next four flags)')
  ap.add_argument('--tokens_per_step', type=number_in(0, lo_open=True), default=2.0**19,
                  help='tokens one DC processes per step')
  ap.add_argument('--peak_flops', type=number_in(0, lo_open=True), default=989e12,
                  help='peak FLOP/s of one device (H100 SXM, dense bf16)')
  ap.add_argument('--mfu', type=number_in(0, 1, lo_open=True), default=0.4,
                  help='model FLOPs utilisation')
  ap.add_argument('--devices_per_dc', type=int_at_least(1), default=128, help='devices per DC')
  ap.add_argument('--h', type=int_at_least(1), default=100,
                  help='H: inner steps per sync of diloco, diloco_topk, semi_sync (K_base), '
                  'streaming, sparseloco and diloco_2bit')
  ap.add_argument('--fragments', type=int_at_least(1), default=4,
                  help='P, streaming fragments (must divide --h)')
  ap.add_argument('--overlap_steps', type=int_at_least(0), default=1,
                  help='τ, streaming overlap iterations (< --h / --fragments)')
  ap.add_argument('--topk_density', type=number_in(0, 1, lo_open=True), default=0.02,
                  help='fraction of entries the top-k strategies send')
  ap.add_argument('--lm_vocab', type=int_at_least(1), default=65,
                  help="hfl LM's vocabulary (Tiny Shakespeare's characters)")
  ap.add_argument('--models', type=names_in(MODELS, 'model'), default=','.join(MODELS),
                  help='comma-separated models')
  ap.add_argument('--strategies', type=names_in(STRATEGIES, 'strategy'),
                  default=','.join(STRATEGIES), help='comma-separated strategies')
  ap.add_argument('--format', choices=('markdown', 'csv'), default='markdown',
                  help='table format on stdout')
  ap.add_argument('--png', default='bandwidth.png',
                  help="the figure's path ('' for none)")
  args = ap.parse_args(argv)
  streams = 'streaming' in args.strategies
  if streams and args.h % args.fragments:
    ap.error(f'argument --fragments: {args.fragments} must divide --h={args.h}')
  if streams and not args.overlap_steps < args.h // args.fragments:
    ap.error(f'argument --overlap_steps: {args.overlap_steps} must be < --h / --fragments = '
             f'{args.h // args.fragments}')
  if args.png and not os.path.isdir(os.path.dirname(os.path.abspath(args.png))):
    ap.error(f"argument --png: the directory of {args.png!r} does not exist")
  # The fewest layer units of the models asked for: hfl's LM has 8 (4 blocks, the
  # embeddings, the head, the final norm), a GPT model L + 2 (>= 14).
  units = min(8 if m == LM else 14 for m in args.models)
  if streams and args.fragments > units:
    ap.error(f'argument --fragments: {args.fragments} exceeds the {units} layer units of '
             f'the smallest model asked for ({", ".join(args.models)}); a unit is never split')
  return args


def model_shapes(name: str, lm_vocab: int):
  """The params ShapeDtypeStructs of a model of MODELS."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from hfl import bandwidth, config as config_lib  # pylint: disable=g-import-not-at-top
  if name == LM:
    model = config_lib.load_file('configs/shakespeare.py').model
    return bandwidth.model_shapes(model, lm_vocab, (1, model.seq_len), jnp.int32)
  d, layers = {n: (d, l) for n, d, l in bandwidth.GPT_FAMILY}[name]
  return bandwidth.transformer_shapes(d, layers)


def compute(args) -> list[dict]:
  """One row per (model, strategy): sizes, the event and the bits/s per target."""
  from hfl import bandwidth  # pylint: disable=g-import-not-at-top
  rows = []
  for m in args.models:
    shapes = model_shapes(m, args.lm_vocab)
    n = bandwidth.param_count(shapes)
    step = args.step_time_s or bandwidth.step_time_s(
        n, args.tokens_per_step, args.peak_flops, args.mfu, args.devices_per_dc)
    for s in args.strategies:
      config = bandwidth.calculator_config(
          args.dcs, args.wan_latency_s, args.wan_latencies_per_round,
          bandwidth.strategy_overrides(s, args.h, args.fragments, args.overlap_steps,
                                       args.topk_density))
      plan = bandwidth.planned_event(config, shapes, iteration_s=step)
      rows.append(dict(model=m, params=n, step_s=step, strategy=s, plan=plan,
                       bps=bandwidth.bandwidth_for_utilisation(plan, TARGETS),
                       bps_no_latency=bandwidth.bandwidth_for_utilisation(
                           plan, TARGETS, latency=False)))
  return rows


def _num(x: float) -> str:
  """A number for the Markdown table: 3 significant digits below 1000, else whole
  with thousands separators; 'none' for inf (no bandwidth suffices)."""
  if not np.isfinite(x):
    return 'none'
  return f'{x:,.0f}' if x >= 1000 else f'{x:.3g}'


def _pct(u: float) -> str:
  return f'{100 * u:g}%'


def markdown(rows, latency_s: float) -> str:
  """The Markdown table (Gbit/s per DC)."""
  head = (['model', 'params', 'step s', 'strategy', 'I', 'τ', 'MB/event/DC']
          + [_pct(u) for u in TARGETS] + [f'{_pct(u)} @0' for u in TARGETS])
  lines = [f'Gbit/s per DC for each utilisation, with {1e3 * latency_s:g} ms of WAN latency '
           'per sync event, then ("@0") at zero latency; "none": no bandwidth suffices.', '',
           '| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for r in rows:
    p = r['plan']
    cells = [r['model'], f'{_num(r["params"] / 1e6)}M', f'{r["step_s"]:.3g}', r['strategy'],
             str(p.iterations), str(p.overlap_steps), _num(p.dc_bits / 8e6)]
    cells += [_num(b / 1e9) for b in r['bps']] + [_num(b / 1e9) for b in r['bps_no_latency']]
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def write_csv(rows, out) -> None:
  """The CSV table: Gbit/s per DC ('inf': no bandwidth suffices)."""
  w = csv.writer(out)
  w.writerow(['model', 'params', 'step_s', 'strategy', 'iterations_per_event', 'overlap_steps',
              'dc_bits_per_event', 'latency_s']
             + [f'gbps_{_pct(u)[:-1]}' for u in TARGETS]
             + [f'gbps_{_pct(u)[:-1]}_no_latency' for u in TARGETS])
  for r in rows:
    p = r['plan']
    w.writerow([r['model'], r['params'], repr(r['step_s']), r['strategy'], p.iterations,
                p.overlap_steps, p.dc_bits, repr(p.latency_s)]
               + [repr(float(b / 1e9)) for b in r['bps']]
               + [repr(float(b / 1e9)) for b in r['bps_no_latency']])


def plot(rows, path: str, args) -> None:
  """Gbit/s for 90% and 99% utilisation vs parameters, log-log, one line per strategy
  (solid: with the latency; dashed: zero latency; a missing point: none suffices)."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  fig = Figure(figsize=(11, 4.6), layout='constrained')
  FigureCanvasAgg(fig)
  latency = rows[0]['plan'].latency_s
  step = (f'step {args.step_time_s:g} s' if args.step_time_s else
          f'step = 6N x {args.tokens_per_step:g} tokens / ({args.peak_flops:.3g} FLOP/s x '
          f'MFU {args.mfu:g} x {args.devices_per_dc} devices)')
  fig.suptitle(f'WAN bandwidth per DC for a compute utilisation: {args.dcs} DCs, '
               f'{1e3 * latency:g} ms latency per event (dashed: 0 ms), {step}', fontsize=9)
  colours = dict(zip(STRATEGIES, ('C0', 'C1', 'C2', 'C3', 'C4', 'C5', 'C6', 'C7')))
  for i, u in enumerate((0.9, 0.99)):
    ax = fig.add_subplot(1, 2, i + 1)
    j = TARGETS.index(u)
    for s in args.strategies:
      mine = [r for r in rows if r['strategy'] == s]
      x = np.array([r['params'] for r in mine], np.float64)
      for key, style in (('bps', '-'), ('bps_no_latency', '--')):
        y = np.array([r[key][j] / 1e9 for r in mine])
        y[~np.isfinite(y)] = np.nan
        ax.plot(x, y, style, marker='o' if style == '-' else None, ms=3, color=colours[s],
                label=s if style == '-' else None,
                lw=2.5 if s == 'semi_sync' else 1.2, alpha=0.5 if s == 'semi_sync' else 1.0)
    ax.set_xscale('log')
    ax.set_yscale('log')
    ax.set_xlabel('parameters')
    ax.set_ylabel('Gbit/s per DC')
    ax.set_title(f'{_pct(u)} utilisation', fontsize=10)
    ax.grid(True, which='both', alpha=0.3)
    if i == 0:
      ax.legend(fontsize=8)
  fig.savefig(path, dpi=110)


def main(argv=None) -> None:
  args = parse_args(argv)
  rows = compute(args)
  if args.format == 'csv':
    write_csv(rows, sys.stdout)
  else:
    print(markdown(rows, rows[0]['plan'].latency_s))
  if args.png:
    plot(rows, args.png, args)


if __name__ == '__main__':
  main()
