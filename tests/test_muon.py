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


def _attention_like(rng):
  """Leaves named as flax names them: a Dense kernel and bias, attention's query kernel
  [in, heads, head_dim] and bias [heads, head_dim], its out kernel [heads, head_dim,
  out], an embedding, a norm's scale."""
  n = lambda *s: jnp.asarray(rng.normal(size=s), jnp.float32)
  return {'Embed_0': {'embedding': n(10, 8)},
          'block': {'Dense_0': {'kernel': n(8, 16), 'bias': n(16)},
                    'attn': {'query': {'kernel': n(8, 2, 4), 'bias': n(2, 4)},
                             'out': {'kernel': n(2, 4, 8), 'bias': n(8)}},
                    'LayerNorm_0': {'scale': n(8)}},
          'Dense_0': {'kernel': n(8, 10)}}


def test_muon_kernels_orthogonalise_each_weight_as_its_matrix():
  """muon_leaves='kernels': the step of a 3-D attention kernel is the orthogonalised
  step of its matrix view ([in, heads * head_dim] for the query, [heads * head_dim,
  out] for the output), computed by optax's Muon on that 2-D matrix; embeddings excluded
  by muon_exclude, biases and norms take AdamW at muon_adam_learning_rate."""
  rng = np.random.default_rng(1)
  params = _attention_like(rng)
  grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
  tx = optim.make_optimizer(_cfg(muon_leaves='kernels', muon_adam_learning_rate=0.004,
                                 muon_exclude=r"^\['(Embed_0|Dense_0)'\]"), 10)
  ours, _ = tx.update(grads, tx.init(params), params)
  ref = optax.contrib.muon(0.02, beta=0.95, adam_learning_rate=0.004)

  def muon2d(g, shape2d):  # optax's Muon on the matrix view, reshaped back
    m = {'w': g.reshape(shape2d)}
    u, _ = ref.update(m, ref.init(m), m)
    return np.asarray(u['w']).reshape(g.shape)

  q, o = grads['block']['attn']['query']['kernel'], grads['block']['attn']['out']['kernel']
  np.testing.assert_allclose(np.asarray(ours['block']['attn']['query']['kernel']),
                             muon2d(q, (8, 8)), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(np.asarray(ours['block']['attn']['out']['kernel']),
                             muon2d(o, (8, 8)), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(np.asarray(ours['block']['Dense_0']['kernel']),
                             muon2d(grads['block']['Dense_0']['kernel'], (8, 16)),
                             rtol=1e-5, atol=1e-7)
  # AdamW's first step at 0.004 (see the test above): the embedding, the head, every
  # bias (the 2-D query bias included) and the norm's scale.
  adam = lambda g: -0.004 * (1 + 0.09 / 0.19) * np.sign(np.asarray(g))
  for path in (('Embed_0', 'embedding'), ('Dense_0', 'kernel'), ('block', 'Dense_0', 'bias'),
               ('block', 'attn', 'query', 'bias'), ('block', 'LayerNorm_0', 'scale')):
    got, g = ours, grads
    for k in path:
      got, g = got[k], g[k]
    np.testing.assert_allclose(np.asarray(got), adam(g), rtol=1e-5, err_msg=str(path))


def test_muon_adam_learning_rate_follows_the_schedule():
  """The AdamW fallback's rate is muon_adam_learning_rate on the same warm-up and decay:
  at the warm-up's midpoint, half of it."""
  params = {'b': jnp.ones((4,), jnp.float32)}
  grads = {'b': jnp.full((4,), 0.5, jnp.float32)}
  tx = optim.make_optimizer(_cfg(muon_adam_learning_rate=0.004, schedule='cosine',
                                 warmup_steps=4), 100)
  state = tx.init(params)
  for _ in range(2):  # counts 0 and 1: rates 0 and 0.001 (a quarter of the warm-up each)
    u, state = tx.update(grads, state, params)
  # The second update applies the rate at count 1, 0.004 / 4, to Nesterov AdamW's
  # direction for a constant gradient at t = 2: β1 (1 − β1²) / (1 − β1³) + (1 − β1) /
  # (1 − β1²) (bias-corrected; sqrt(v̂) = |g|).
  b1 = 0.9
  nesterov = b1 * (1 - b1**2) / (1 - b1**3) + (1 - b1) / (1 - b1**2)
  # float32: β1's powers and the bias corrections round at about 1e-7 each.
  np.testing.assert_allclose(np.asarray(u['b']), -0.001 * nesterov, rtol=1e-4)


@pytest.mark.parametrize('kw, match', [
    (dict(muon_leaves='all'), "optimizer.muon_leaves='all' is unknown"),
    (dict(muon_exclude='['), "optimizer.muon_exclude='\\[' is not a valid regular"),
    (dict(muon_adam_learning_rate=-1.0), 'optimizer.muon_adam_learning_rate=-1.0 must be'),
    (dict(name='adamw', muon_leaves='kernels'), "options of optimizer.name=muon, got 'adamw'"),
])
def test_muon_options_are_checked(kw, match):
  with pytest.raises(ValueError, match=match):
    optim.make_optimizer(_cfg(**kw), 10)
