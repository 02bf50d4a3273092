"""CIFAR-10 with ResNet-20 (He et al. 2016; GroupNorm): configs/cifar10.py with the deeper model.

ResNet-20 costs about 4x the fast CNN per image on CPU (docs/benchmarks.md) and
needs more epochs: the same schedule over 5,000 iterations (25.6 epochs) ended at
80.0% (docs/benchmarks.md, "ResNet-20"). It is the model family of the CO3 paper's
CIFAR-10 experiments. A long run (about 3.5 hours on a 2-core CPU): interrupt and
rerun the same command to resume.

  python main.py --config=configs/cifar10_resnet20.py --workdir=workdirs/cifar10_resnet20
"""

from configs import cifar10


def get_config(arg: str | None = None):
  c = cifar10.get_config(arg)
  c.model.name = 'resnet20'
  c.optimizer.learning_rate = 0.1
  c.train.num_steps = 20000           # x 8 workers x 32 = 102 epochs
  c.train.eval_every = 250            # rounds (1000 iterations)
  c.train.checkpoint_every = 50
  c.train.target_accuracy = 0.85
  return c
