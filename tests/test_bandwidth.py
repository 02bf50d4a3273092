"""The bandwidth-for-utilisation calculator (hfl.bandwidth, bench/bandwidth.py): hand
closed forms, abstract shapes, and agreement with the archived runs' summaries."""

import csv
import glob
import io
import json
import os
import resource
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from hfl import bandwidth as bw
from hfl import network
from hfl import train
from hfl import setup as setup_lib
from hfl.compress import base, sparse
from hfl.data import text

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = os.path.join(REPO, 'docs', 'results', 'runs')
SHAKESPEARE = os.path.join(REPO, '..', 'shared', 'data', 'tinyshakespeare.txt')
U = 2.0**-53  # float64 unit roundoff
sys.path.insert(0, os.path.join(REPO, 'bench'))
import bandwidth as bench  # noqa: E402  pylint: disable=g-import-not-at-top


def _plan(strategy, shapes, num_dcs=3, step=0.5, h=10, fragments=2, tau=1, latency=0.02):
  config = bw.calculator_config(num_dcs, latency, 2.0,
                                bw.strategy_overrides(strategy, h, fragments, tau, 0.02))
  return bw.planned_event(config, shapes, iteration_s=step)


def test_dc_link_bits_is_max_of_egress_and_ingress_exactly():
  bits = np.array([2**60, 3, 5], np.int64)
  got = network.dc_link_bits(bits)
  assert got.dtype == np.int64
  np.testing.assert_array_equal(got, [2**61, 2**60 + 5, 2**60 + 3])
  # Absent DC 0: DC 1 sends 3 and receives 5, DC 2 sends 5 and receives 3.
  np.testing.assert_array_equal(network.dc_link_bits(bits, np.array([False, True, True])),
                                [0, 5, 5])
  np.testing.assert_array_equal(network.dc_link_bits(bits, np.array([False, True, False])),
                                [0, 0, 0])


def test_bandwidth_for_several_targets_equals_one_at_a_time():
  args = (1e6, 4, 1.0, 0.9, 1, 0.1)
  many = network.wan_bandwidth_for_utilisation(*args, target=bw.TARGETS)
  assert many.shape == (5,)
  for b, u in zip(many, bw.TARGETS):
    assert b == network.wan_bandwidth_for_utilisation(*args, target=u)
  assert isinstance(network.wan_bandwidth_for_utilisation(*args), float)
  for bad in (0.0, 1.5, float('nan'), (0.5, -1)):
    with pytest.raises(ValueError, match=r'target=.*\(0, 1\]'):
      network.wan_bandwidth_for_utilisation(*args, target=bad)


def test_transformer_shapes_count_and_units():
  shapes = bw.transformer_shapes(8, 2, 16)
  assert bw.param_count(shapes) == 2 * (12 * 64 + 4 * 8) + 16 * 8 + 2 * 8 == 1744
  assert list(shapes) == ['Block_0', 'Block_1', 'Embed_0', 'LayerNorm_0']
  with pytest.raises(ValueError, match='layers=0'):
    bw.transformer_shapes(8, 0)


def test_data_parallel_and_diloco_against_the_closed_form():
  """D = 3 DCs, float32 WAN: a DC's link carries max(2 x payload out, 2 payloads in)
  = 2 x 32 N bits per event; DP: I = 1, DiLoCo: I = H = 10; t = 0.5 s, 2 x 20 ms.
  U = I t / (I t + b / B + L) >= u  <=>  B >= b / (I t (1/u - 1) - L)."""
  shapes = bw.transformer_shapes(8, 2, 16)
  bits = 2 * 32 * 1744
  for strategy, i in (('data_parallel', 1), ('diloco', 10), ('semi_sync', 10)):
    plan = _plan(strategy, shapes)
    assert plan == bw.Plan(bits, i, 0.5, 0, 0.04)
    for latency, got in ((0.04, bw.bandwidth_for_utilisation(plan)),
                         (0.0, bw.bandwidth_for_utilisation(plan, latency=False))):
      for u, b in zip(bw.TARGETS, got):
        room = i * 0.5 * (1 / u - 1) - latency
        if room <= 0:  # DP at 99%: 0.5 s x (1/0.99 - 1) = 5 ms < 40 ms
          assert b == np.inf, (strategy, u)
        else:
          assert b == pytest.approx(bits / room, rel=1e-12), (strategy, u, latency)
  assert bw.bandwidth_for_utilisation(_plan('data_parallel', shapes))[-1] == np.inf


def test_streaming_peak_is_the_largest_fragment_in_e3m0():
  """L = 4, d = 8, vocab 16, P = 2: units Block_0..3 (800 entries each), Embed_0
  (128), LayerNorm_0 (16); the best cut is [B0, B1] | [B2, B3, Embed, LN]. E3M0
  bits of a matrix of n entries: 8 ceil(n / 2) + 32; vectors stay float32.
  A block: 4 x (8 x 32 + 32) + 2 x (8 x 128 + 32) + 4 x 8 x 32 = 4288."""
  shapes = bw.transformer_shapes(8, 4, 16)
  block = 4 * (8 * 32 + 32) + 2 * (8 * 128 + 32) + 4 * 8 * 32
  assert block == 4288
  peak = 2 * block + (8 * 64 + 32) + 2 * 8 * 32
  plan = _plan('streaming', shapes, num_dcs=2, h=10, fragments=2, tau=1)
  assert plan == bw.Plan(peak, 5, 0.5, 1, 0.04)
  # Overlap: the event's transfer may last τ t + I t (1/u - 1) - L.
  u = 0.9
  got = bw.bandwidth_for_utilisation(plan, (u,))[0]
  assert got == pytest.approx(peak / (0.5 + 5 * 0.5 * (1 / u - 1) - 0.04), rel=1e-12)


def test_13b_payloads_stay_abstract():
  """13B parameters as ShapeDtypeStructs: every strategy's payload is counted
  without materialising anything (52 GB of float32 would show in the peak RSS)."""
  name, d, layers = bw.GPT_FAMILY[-1]
  shapes = bw.transformer_shapes(d, layers)
  assert name == '13B' and bw.param_count(shapes) == 12_841_057_280
  before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
  plans = {s: _plan(s, shapes, num_dcs=2, h=100, fragments=4, tau=1) for s in bw.STRATEGIES}
  assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 2**20  # < 1 GiB
  assert plans['diloco'].dc_bits == 32 * 12_841_057_280
  # SparseLoCo: per matrix ceil(size / 4096) chunks of k = 82 uint16 offsets, two packed
  # bit-planes and two bf16 scales each; vectors float32 (1 peer: dc_bits = one payload).
  def sparse_bits(shape):
    size = int(np.prod(shape))
    if len(shape) < 2:
      return 32 * size
    chunk = min(4096, size)
    n, k = -(-size // chunk), sparse.num_kept(chunk, 0.02)
    return n * k * (8 if chunk <= 256 else 16) + 2 * 8 * (-(-n * k // 8)) + 32 * n
  assert plans['sparseloco'].dc_bits == sum(sparse_bits(l.shape) for l in jax.tree.leaves(shapes))
  # MuLoCo's 2-bit pseudo-gradients: every entry of a matrix's chunks (the last one
  # padded to the chunk) as two bit-planes, no offsets at density 1, and two bf16 scales
  # per chunk; vectors float32.
  def two_bit(shape):
    size = int(np.prod(shape))
    chunk = min(4096, size)
    n = -(-size // chunk)
    return 32 * size if len(shape) < 2 else 2 * 8 * (-(-n * chunk // 8)) + 32 * n
  assert plans['diloco_2bit'].dc_bits == sum(two_bit(l.shape) for l in jax.tree.leaves(shapes))


# ------------------------------------------------------------------------------
# Agreement with the archived runs (docs/results/runs/*/*/summary.json).
# ------------------------------------------------------------------------------

SAMPLES = {'fashion_mnist': ((1, 28, 28, 1), jnp.float32, 10),
           'cifar10': ((1, 32, 32, 3), jnp.float32, 10)}


def _runs():
  return sorted(os.path.dirname(p) for p in glob.glob(os.path.join(RUNS, '*', '*', 'summary.json')))


def _finite(run):
  with open(os.path.join(run, 'summary.json')) as f:
    s = json.load(f)
  return (s.get('wan_mbps_for_95pct_utilisation') is not None
          or s.get('wan_mbps_for_95pct_without_latency') is not None)


def _params_shape(config):
  name = config.dataset.name
  if name == 'tiny_shakespeare':
    if not os.path.isfile(SHAKESPEARE):
      pytest.skip(f'{SHAKESPEARE} (the vocabulary) is not here')
    vocab = text.encode(text.read_text(SHAKESPEARE)).num_tokens
    return bw.model_shapes(config.model, vocab, (1, config.model.seq_len), jnp.int32)
  shape, dtype, classes = SAMPLES[name]
  return bw.model_shapes(config.model, classes, shape, dtype)


def _not_derivable(config, params_shape) -> str:
  """Why the run's figure cannot be derived from its config exactly ('' if it can)."""
  comps = setup_lib.build_compressors(config, params_shape)
  if any(c.wire_bits is not base.payload_bits for link in comps if link is not None for c in link):
    return ('a variable-length code (CO3): the run charged the coded lengths, '
            'static_bits is the fixed-width payload')
  if config.sync.strategy == 'adacomm' or config.sync.progress_aware:
    return 'K follows the train loss (adacomm / progress_aware)'
  if config.compression.dgc.warmup_steps or config.sync.faults:
    return 'payloads or DCs change during the run (DGC warm-up / faults)'
  return ''


@pytest.mark.parametrize('run', [r for r in _runs() if _finite(r)],
                         ids=lambda r: os.path.relpath(r, RUNS)[:90])
def test_calculator_reproduces_the_archived_runs(run):
  """The run's t = (sim_time_s - exposed_wan_s) / iterations, its iterations per
  event and its peak WAN bytes equal the planned ones, and the recorded
  wan_mbps_for_95pct_* equal the calculator's, within the float64 rounding of
  the run's clock.

  Tolerance: the clock adds N = iterations + rounds positive terms (error <= N u
  sim_time), the exposed total R terms (<= R u exposed); so |δt| <= u (N sim +
  R exposed) / n + 8 u t. The figure is bits / room, room = τ t + I t / 0.95 -
  I t - L: |δroom| <= (τ + I / 0.95 + I) |δt| + 8 u (τ t + I t / 0.95 + I t + L),
  and the relative error of the figure is |δroom| / room (+ 4 u)."""
  with open(os.path.join(run, 'summary.json')) as f:
    s = json.load(f)
  with open(os.path.join(run, 'config.json')) as f:
    config = ml_collections.ConfigDict(json.load(f))
  shapes = _params_shape(config)
  why = _not_derivable(config, shapes)
  if why:
    pytest.skip(why)
  plan = bw.planned_event(config, shapes)
  n, rounds = s['intra_dc_iterations'], s['inter_dc_rounds']
  if n != rounds * plan.iterations:
    pytest.skip(f'{n} iterations in {rounds} rounds of {plan.iterations}: a partial last '
                'round (train.num_steps not a multiple of the round)')
  d = config.mesh.num_dcs
  assert s['peak_wan_bytes_per_sync'] * 8 == d * plan.dc_bits  # equal payloads: D x per DC
  sim, exposed = s['sim_time_s'], s['exposed_wan_s']
  t_run = (sim - exposed) / n
  dt = U * ((n + rounds) * sim + rounds * exposed) / n + 8 * U * plan.iteration_s
  assert abs(t_run - plan.iteration_s) <= dt, (t_run, plan.iteration_s, dt)
  for key, latency in (('wan_mbps_for_95pct_utilisation', True),
                       ('wan_mbps_for_95pct_without_latency', False)):
    got = bw.bandwidth_for_utilisation(plan, (0.95,), latency=latency)[0] / 1e6
    if s[key] is None:
      assert got == np.inf, key
      continue
    t, i, tau = plan.iteration_s, plan.iterations, plan.overlap_steps
    lat = plan.latency_s if latency else 0.0
    room = tau * t + i * t / 0.95 - i * t - lat
    rtol = ((tau + i / 0.95 + i) * dt + 8 * U * (tau * t + i * t / 0.95 + i * t + lat)) / room
    assert abs(got - s[key]) <= (rtol + 4 * U) * s[key], (key, got, s[key], rtol)


def test_the_runs_of_the_streaming_comparison_are_all_checked():
  """Data parallel, DiLoCo and Streaming DiLoCo of shakespeare_streaming each have
  a finite figure (so the test above covers them)."""
  runs = [r for r in _runs() if '/shakespeare_streaming/' in r + '/']
  kinds = {('e3m0' in r, 'sync.k=1_' in r) for r in runs if _finite(r)}
  assert kinds == {(True, False), (False, False), (False, True)}


# ------------------------------------------------------------------------------
# The command.
# ------------------------------------------------------------------------------

def _cli(*flags, timeout=120):
  return subprocess.run([sys.executable, os.path.join(REPO, 'bench', 'bandwidth.py'), *flags],
                        cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False)


def test_command_names_match_the_module():
  assert bench.STRATEGIES == tuple(bw.STRATEGIES)
  assert bench.TARGETS == bw.TARGETS
  assert bench.FAMILY == tuple(n for n, _, _ in bw.GPT_FAMILY)


@pytest.mark.parametrize('flags, needle', [
    (['--fragments=3'], 'argument --fragments: 3 must divide --h=100'),
    (['--overlap_steps=25'], 'argument --overlap_steps: 25 must be < --h / --fragments = 25'),
    (['--mfu=0'], 'argument --mfu: 0 must be a finite number in (0, 1]'),
    (['--dcs=1'], 'argument --dcs: 1 must be an integer >= 2'),
    (['--strategies=diloco,sparse_loco'], "unknown strategy 'sparse_loco'"),
    (['--models=hfl_lm', '--h=20', '--fragments=10', '--overlap_steps=0'],
     'argument --fragments: 10 exceeds the 8 layer units'),
    (['--png=/nonexistent/x.png'], 'argument --png:'),
])
def test_bad_flags_end_while_parsing(flags, needle):
  proc = _cli(*flags)
  assert proc.returncode == 2, proc.stderr[-2000:]
  errors = [l for l in proc.stderr.splitlines() if 'error:' in l]
  assert len(errors) == 1 and needle in errors[0], proc.stderr[-2000:]
  assert 'Traceback' not in proc.stderr


def test_help_shows_the_defaults():
  out = _cli('--help').stdout
  for default in ('(default: 2)', '(default: 0.02)', '(default: 524288.0)',
                  '(default: 989000000000000.0)', '(default: 0.4)', '(default: 128)',
                  '(default: 100)', '(default: 65)'):
    assert default in ' '.join(out.split()), default


def test_command_csv_and_png(tmp_path):
  png = tmp_path / 'bw.png'
  proc = _cli('--models=125M', '--strategies=data_parallel,diloco', '--step_time_s=0.5',
              '--h=10', '--format=csv', f'--png={png}')
  assert proc.returncode == 0, proc.stderr[-2000:]
  rows = list(csv.DictReader(io.StringIO(proc.stdout)))
  assert [r['strategy'] for r in rows] == ['data_parallel', 'diloco']
  n = int(rows[0]['params'])
  assert n == bw.param_count(bw.transformer_shapes(768, 12))
  for r, i in zip(rows, (1, 10)):
    assert int(r['dc_bits_per_event']) == 32 * n and int(r['iterations_per_event']) == i
    assert float(r['gbps_90']) == pytest.approx(32 * n / (i * 0.5 * (1 / 0.9 - 1) - 0.04) / 1e9,
                                                rel=1e-12)
  assert rows[0]['gbps_99'] == 'inf'
  assert png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
