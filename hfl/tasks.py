"""What a run optimises and reports, per task: image classification or language modelling.

The task follows from the dataset (:func:`hfl.data.task_of`): a text dataset is
character-level language modelling, every other dataset image classification.
Both train with the same loss, softmax cross-entropy with integer targets
averaged over every prediction (images: logits [B, K], labels [B]; text:
logits [B, T, V], next characters [B, T]), which hfl.step computes without
knowing the task. What differs is what an evaluation reports and which metric
decides ``time_to_target_s`` / ``rounds_to_target``:

=================  ==========================  ==============================
task               metrics of an evaluation    headline metric (target field)
=================  ==========================  ==============================
classification     ``test_accuracy``,          ``test_accuracy``, higher is
                   ``test_loss`` (nats)        better (``train.target_accuracy``)
language_model     ``test_loss`` (nats/char),  ``test_loss``, lower is better
                   ``test_bits_per_char``,     (``train.target_loss``)
                   ``test_perplexity``,
                   ``test_accuracy`` (of the
                   next character)
=================  ==========================  ==============================

Bits per character = nats / ln 2; perplexity = exp(nats) (per character).
For text "test" is the validation split (the last 10% of the file).
"""

import math
from typing import NamedTuple

import jax.numpy as jnp
import optax

from hfl import data as data_lib

# Config fields holding each task's target, and their values for configs that
# predate them.
TARGET_FIELDS = {'classification': ('target_accuracy', 0.88),
                 'language_model': ('target_loss', 1.7)}


class Task(NamedTuple):
  """A run's task and its headline metric.

  Attributes:
    name: ``'classification'`` or ``'language_model'``.
    metric: key of the headline metric in a metrics record (``test_accuracy``
      or ``test_loss``).
    higher_is_better: True for accuracy, False for a loss.
    target: the headline metric's target (``train.target_accuracy`` or
      ``train.target_loss``).
  """
  name: str
  metric: str
  higher_is_better: bool
  target: float

  @property
  def target_field(self) -> str:
    """The config field of the target, e.g. ``'train.target_accuracy'``."""
    return 'train.' + TARGET_FIELDS[self.name][0]

  def reached(self, value: float) -> bool:
    """Whether a headline-metric value meets the target."""
    return value >= self.target if self.higher_is_better else value <= self.target

  def better(self, value: float, best: float | None) -> bool:
    """Whether ``value`` beats ``best`` (None: nothing yet)."""
    if best is None:
      return True
    return value > best if self.higher_is_better else value < best


def from_config(config) -> Task:
  """The Task of a config (``dataset.name`` and the target fields of ``train``)."""
  name = data_lib.task_of(config.dataset.name)
  field, default = TARGET_FIELDS[name]
  target = float(config.train.get(field, default))
  if name == 'language_model':
    return Task(name, 'test_loss', False, target)
  return Task(name, 'test_accuracy', True, target)


def eval_sums(logits, labels, mask):
  """Masked sums of one evaluation batch (inside jit).

  Args:
    logits: float32 [B, K] or [B, T, V].
    labels: int [B] or [B, T].
    mask: float32 [B], 1 for real examples, 0 for padding.

  Returns:
    (correct, loss) float32 scalars: sums over the batch of mask times each
    example's accuracy and cross-entropy (nats), each averaged over the example's
    T positions (T = 1 for images), so that dividing by the number of examples
    gives the per-prediction means (every text window has the same T).
  """
  loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
  per_example = lambda a: a.reshape(a.shape[0], -1).mean(axis=1)
  return jnp.sum(per_example(correct) * mask), jnp.sum(per_example(loss) * mask)


def eval_record(task: Task, accuracy: float, loss: float) -> dict:
  """The metric entries of an evaluation record.

  Args:
    task: the Task.
    accuracy: mean accuracy (per image, or per predicted character).
    loss: mean cross-entropy, nats (per image, or per character).

  Returns:
    ``{'test_accuracy', 'test_loss'}``, plus ``test_bits_per_char`` (loss / ln 2)
    and ``test_perplexity`` (exp(loss)) for language modelling.
  """
  rec = dict(test_accuracy=float(accuracy), test_loss=float(loss))
  if task.name == 'language_model':
    rec['test_bits_per_char'] = float(loss) / math.log(2)
    rec['test_perplexity'] = math.exp(min(float(loss), 700.0))
  return rec


def summary_fields(task: Task, final: dict, host: dict) -> dict:
  """The task's entries of summary.json.

  Args:
    task: the Task.
    final: the last evaluation record.
    host: the loop state as a dict (``hfl.cost.LoopState._asdict()`` or a
      checkpoint's host dict: ``best_test_accuracy``, ``best_test_loss``).

  Returns:
    ``final_test_accuracy``, ``best_test_accuracy``, ``final_test_loss``,
    ``target_metric``, ``target`` and ``target_accuracy`` (the config's, for
    readers of older summaries); for language modelling also ``best_test_loss``,
    ``final_test_bits_per_char`` and ``final_test_perplexity``.
  """
  out = dict(final_test_accuracy=final['test_accuracy'],
             best_test_accuracy=host['best_test_accuracy'],
             final_test_loss=final['test_loss'], target_metric=task.metric,
             target=task.target)
  if task.name == 'language_model':
    out.update(best_test_loss=host.get('best_test_loss'),
               final_test_bits_per_char=final.get('test_bits_per_char'),
               final_test_perplexity=final.get('test_perplexity'))
  else:
    out['target_accuracy'] = task.target
  return out


def result_rows(summary: dict) -> list:
  """The task's (label, value) rows of the results table printed at the end."""
  if summary.get('target_metric') == 'test_loss':
    target = f'loss {summary["target"]:.2f}'
    rows = [('final validation loss', f'{summary["final_test_loss"]:.4f} nats/char'),
            ('best validation loss', f'{summary["best_test_loss"]:.4f} nats/char'),
            ('final bits per char', f'{summary["final_test_bits_per_char"]:.4f}'),
            ('final perplexity', f'{summary["final_test_perplexity"]:.3f}')]
  else:
    target = f'{summary.get("target", summary.get("target_accuracy")):.0%}'
    rows = [('final test accuracy', f'{summary["final_test_accuracy"]:.4f}'),
            ('best test accuracy', f'{summary["best_test_accuracy"]:.4f}')]
  return rows, target


def progress(task: Task, last_eval: dict | None) -> str:
  """The headline metric's part of a progress line, e.g. ``'acc 0.8123'``."""
  label = 'acc' if task.higher_is_better else 'val_loss'
  if not last_eval or task.metric not in last_eval:
    return f'{label} -'
  return f'{label} {last_eval[task.metric]:.4f}'

