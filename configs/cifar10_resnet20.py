"""CIFAR-10 with ResNet-20 (He et al. 2016; GroupNorm): configs/cifar10.py with the deeper model.

ResNet-20 costs about 4x the fast CNN per image on CPU (docs/benchmarks.md); it
is the model family of the CO3 paper's CIFAR-10 experiments. The schedule (25.6
epochs, cosine) is sized to finish in about two hours on a 2-core CPU; on a GPU
raise ``train.num_steps`` for the last points of accuracy. Interrupt and rerun
the same command to resume.

  python main.py --config=configs/cifar10_resnet20.py --workdir=workdirs/cifar10_resnet20
"""

from configs import cifar10


def get_config(arg: str | None = None):
  c = cifar10.get_config(arg)
  c.model.name = 'resnet20'
  c.optimizer.learning_rate = 0.1
  c.train.num_steps = 5000            # x 8 workers x 32 = 25.6 epochs
  c.train.eval_every = 125            # rounds (500 iterations)
  c.train.checkpoint_every = 50
  c.train.target_accuracy = 0.85
  return c
