"""Example sweep: sync strategy x uplink compressor x 3 seeds (12 runs).

Run (from the repository root):
  python -m hfl.sweep --sweep=configs/sweeps/example.py --root=/tmp/hfl_sweep_example
List the runs without training:
  python -m hfl.sweep --sweep=configs/sweeps/example.py --root=/tmp/x --dry_run

``get_sweep()`` returns ``(base, grid)``. ``base`` is a config path (or a
ConfigDict); ``grid`` maps dotted config keys to a *list* of options (cartesian
product) — any non-list value, e.g. a tuple for ``network.dc_speed``, is one
fixed value. A list of such dicts concatenates their expansions.
"""


def get_sweep():
  """Returns (base config path, grid of overrides)."""
  base = 'configs/default.py'
  grid = {
      'sync.strategy': ['sync', 'periodic'],
      'compression.uplink.name': ['identity', 'topk'],
      'train.num_steps': 400,  # a fixed value (not a list): one option
      'seed': [0, 1, 2],
  }
  return base, grid
