"""Runs one hfl experiment.

  python main.py --config=configs/default.py --workdir=/tmp/hfl_default \
      [--config.sync.k=8 ...]

Rerunning the same command on an existing workdir resumes from its last checkpoint.
"""

import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Experiment config file.',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for checkpoints, metrics and summary.')
flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  config = _CONFIG.value
  # The CPU device count must be set before anything touches the JAX backend.
  from hfl import mesh  # pylint: disable=g-import-not-at-top
  mesh.configure_cpu_devices(config.mesh.num_dcs * config.mesh.workers_per_dc)
  from hfl import train  # pylint: disable=g-import-not-at-top
  logging.set_verbosity(logging.INFO)
  try:
    train.train_and_evaluate(config, _WORKDIR.value)
  except (ValueError, FileNotFoundError) as e:
    logging.error('%s', e)
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)


if __name__ == '__main__':
  app.run(main)
