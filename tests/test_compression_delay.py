"""bench/compression_delay.py: the trailing mean, the delay and the pairing by seed."""

import json
import os
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'bench'))
import compression_delay  # noqa: E402  pylint: disable=g-import-not-at-top


def test_trailing_mean_equals_the_windowed_means():
  x = np.array([3.0, 1.0, 4.0, 1.0, 5.0, 9.0])
  want = [np.mean(x[max(0, i - 2):i + 1]) for i in range(len(x))]
  np.testing.assert_allclose(compression_delay.trailing_mean(x), want, rtol=1e-15)


@pytest.mark.parametrize('final,higher,want', [
    (0.80, True, 0.5),    # first reached at step 20 of 40
    (0.95, True, np.nan),  # never reached
    (0.30, False, 0.75),  # a loss: first at or below 0.30 at step 30
])
def test_delay_is_the_first_step_reaching_the_value_over_the_last(final, higher, want):
  steps = np.array([10.0, 20.0, 30.0, 40.0])
  base = np.array([0.7, 0.8, 0.85, 0.9]) if higher else np.array([0.5, 0.4, 0.3, 0.2])
  np.testing.assert_equal(compression_delay.delay_fraction(steps, base, final, higher), want)


def _run(root, name, seed, density, accs):
  d = root / name
  d.mkdir(parents=True)
  comp = {'uplink': {'name': 'topk' if density else 'identity', 'density': density},
          'downlink': {'density': density}, 'broadcast': 'downlink'}
  config = {'seed': seed, 'compression': comp, 'train': {'num_steps': 10 * len(accs)},
            'optimizer': {'schedule': 'constant'}, 'network': {'lan_bandwidth_gbps': 1.0}}
  (d / 'config.json').write_text(json.dumps(config))
  (d / 'summary.json').write_text(json.dumps({'final_test_accuracy': accs[-1]}))
  (d / 'metrics.jsonl').write_text(''.join(
      json.dumps({'step': 10 * (i + 1), 'test_accuracy': a}) + '\n' for i, a in enumerate(accs)))


def test_pairs_each_seed_with_its_uncompressed_run(tmp_path):
  base = [[0.5, 0.7, 0.8, 0.9], [0.6, 0.7, 0.8, 0.9]]
  comp = [[0.4, 0.5, 0.6, 0.8], [0.5, 0.6, 0.7, 0.9]]
  for seed in (0, 1):
    _run(tmp_path, f'u{seed}', seed, None, base[seed])
    _run(tmp_path, f'c{seed}', seed, 0.02, comp[seed])
  _run(tmp_path, 'c2', 2, 0.02, [0.1, 0.2, 0.3, 0.4])  # no uncompressed run of seed 2
  (row,) = compression_delay.analyse(str(tmp_path), 'test_accuracy')
  label, training, n, mid, final, delays = row
  assert 'uplink.density=0.02' in label and training == (40, 'constant', 1.0) and n == 2
  np.testing.assert_allclose(mid, np.mean([0.6 - 0.8, 0.7 - 0.8]), rtol=1e-12)
  np.testing.assert_allclose(final, np.mean([0.8 - 0.9, 0.9 - 0.9]), atol=1e-12)
  # Smoothed finals: seed 0 (0.5+0.6+0.8)/3 = 0.633, reached by the uncompressed run's
  # smoothed (0.5, 0.6, 0.667, 0.8) at step 30; seed 1 0.733: (0.6, 0.65, 0.7, 0.8) at 40.
  assert delays == [0.75, 1.0]
