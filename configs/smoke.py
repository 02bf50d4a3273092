"""Tiny config for tests and smoke runs: MLP, 2 DCs x 4 workers, a few steps.

  python main.py --config=configs/smoke.py --workdir=/tmp/hfl_smoke
"""

from configs import default


def get_config(arg: str | None = None):
  c = default.get_config(arg)
  c.model.name = 'mlp'
  c.optimizer.name = 'sgd'
  c.optimizer.learning_rate = 0.1
  c.train.num_steps = 12
  c.train.batch_size = 8
  c.train.eval_every = 1
  c.train.checkpoint_every = 1
  c.train.log_every = 4
  c.train.eval_batch_size = 1000
  c.sync.k = 2
  return c
