"""Muon as the inner optimizer (optimizer.name='muon', issue 53): optax's Muon on the
matrices, AdamW on the other leaves, usable in a run; refused with a sliced state."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from hfl import config as config_lib
from hfl import optim, train
from tests.helpers import smoke_config


def _cfg(**kw):
  return ml_collections.ConfigDict(dict(dict(
      name='muon', learning_rate=0.02, momentum=0.95, weight_decay=0.0, schedule='constant',
      warmup_steps=0, decay_steps=0, final_lr_ratio=0.0), **kw))


def test_muon_is_optax_muon_with_adamw_on_non_matrices():
  rng = np.random.default_rng(0)
  params = {'w': jnp.asarray(rng.normal(size=(16, 8)), jnp.float32),
            'b': jnp.asarray(rng.normal(size=(8,)), jnp.float32)}
  grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
  tx = optim.make_optimizer(_cfg(), 10)
  ref = optax.contrib.muon(0.02, beta=0.95)
  ours, _ = tx.update(grads, tx.init(params), params)
  theirs, _ = ref.update(grads, ref.init(params), params)
  chex_equal = jax.tree.map(lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)), ours, theirs)
  assert all(jax.tree.leaves(chex_equal))
  # The bias gets the first step of optax's Nesterov AdamW (β1 0.9, β2 0.999): the
  # bias-corrected Nesterov mean β1 m / (1 − β1²) + (1 − β1) g / (1 − β1) with m = (1 −
  # β1) g is g (1 + 0.09 / 0.19), over sqrt(v̂) = |g|.
  np.testing.assert_allclose(np.asarray(ours['b']),
                             -0.02 * (1 + 0.09 / 0.19) * np.sign(np.asarray(grads['b'])),
                             rtol=1e-5)
  # The matrix gets an orthogonalised direction: its singular values are all of one
  # size (Newton-Schulz's quintic pushes them into about [0.7, 1.2] times that size).
  sv = np.linalg.svd(np.asarray(ours['w']), compute_uv=False)
  assert sv.max() / sv.min() < 2.0


def test_muon_needs_a_momentum_and_refuses_a_sliced_state(fake_data):
  with pytest.raises(ValueError, match='optimizer.momentum=0.0 must be in'):
    optim.make_optimizer(_cfg(momentum=0.0), 10)
  c = smoke_config(fake_data, **{'optimizer.name': 'muon', 'optimizer.shard_state': True})
  with pytest.raises(ValueError, match="optimizer.shard_state=True cannot be combined with "
                     "optimizer.name='muon'"):
    config_lib.validate(c)


@pytest.mark.slow
def test_a_run_trains_with_muon_inside_the_step(fake_data, tmp_path):
  summary = train.train_and_evaluate(smoke_config(fake_data, **{
      'optimizer.name': 'muon', 'optimizer.learning_rate': 0.02, 'optimizer.momentum': 0.95,
      'train.num_steps': 4}), str(tmp_path / 'run'))
  assert summary['intra_dc_iterations'] == 4 and np.isfinite(summary['final_test_loss'])
