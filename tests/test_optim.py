"""hfl.optim's frozen-variance Adam (1-bit Adam's second stage) against a numpy loop."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from hfl import optim
from configs import default


def _numpy_adam(grads, lr, freeze_after, wd=0.0, b1=0.9, b2=0.999, eps=1e-8, x0=None):
  """Plain float64 loop: Adam (Kingma & Ba, Alg. 1) with v and its bias correction
  frozen after step ``freeze_after``; decoupled weight decay as optax.adamw."""
  x = np.array(x0, np.float64)
  m = np.zeros_like(x)
  v = np.zeros_like(x)
  for t, g in enumerate(grads, start=1):
    m = b1 * m + (1 - b1) * g
    if t <= freeze_after:
      v = b2 * v + (1 - b2) * g * g
    t_v = min(t, freeze_after)
    upd = (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t_v)) + eps) + wd * x
    x = x - lr * upd
  return x


def _cfg(**kw):
  d = dict(default.get_config().optimizer.to_dict(), name='adamw', learning_rate=0.01,
           momentum=0.9)
  return ml_collections.ConfigDict(dict(d, **kw))  # any type: what a config file may hold


@pytest.mark.parametrize('name,wd', [('adam', 0.0), ('adamw', 0.1)])
def test_frozen_variance_matches_a_numpy_loop(name, wd):
  rng = np.random.default_rng(0)
  # Sparse, bursty gradients after the warm-up: the case the option exists for.
  grads = [rng.normal(size=(3, 4)) for _ in range(5)]
  grads += [rng.normal(size=(3, 4)) * (rng.random((3, 4)) < 0.2) * 5 for _ in range(7)]
  x0 = rng.normal(size=(3, 4))
  opt = optim.make_optimizer(_cfg(name=name, weight_decay=wd, freeze_second_moment_after=5))
  x = jnp.asarray(x0, jnp.float32)
  state = opt.init(x)
  for g in grads:
    u, state = opt.update(jnp.asarray(g, jnp.float32), state, x)
    x = optax.apply_updates(x, u)
  want = _numpy_adam(grads, 0.01, 5, wd=wd if name == 'adamw' else 0.0, x0=x0)
  # float32 against float64 over 12 steps of size <= lr: |error| << lr.
  np.testing.assert_allclose(np.asarray(x), want, rtol=0, atol=1e-5)
  frozen = _numpy_adam(grads, 0.01, 12, wd=wd if name == 'adamw' else 0.0, x0=x0)
  assert np.abs(want - frozen).max() > 1e-3  # the freeze changes the trajectory


def test_frozen_variance_equals_adam_before_the_freeze():
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.normal(size=(5,)), jnp.float32)
  a = optim.make_optimizer(_cfg(freeze_second_moment_after=100))
  b = optim.make_optimizer(_cfg())  # optax.adamw
  sa, sb, xa, xb = a.init(x), b.init(x), x, x
  for _ in range(6):
    g = jnp.asarray(rng.normal(size=(5,)), jnp.float32)
    ua, sa = a.update(g, sa, xa)
    ub, sb = b.update(g, sb, xb)
    xa, xb = optax.apply_updates(xa, ua), optax.apply_updates(xb, ub)
  # Same formula, different float32 operation order: a few ulps of the parameters.
  np.testing.assert_allclose(np.asarray(xa), np.asarray(xb), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize('kw,match', [
    (dict(freeze_second_moment_after=-1), 'integer >= 0'),
    (dict(freeze_second_moment_after=2.5), 'integer >= 0'),
    (dict(freeze_second_moment_after=10, name='momentum'), 'adam or adamw'),
])
def test_frozen_variance_refusals_name_the_field(kw, match):
  with pytest.raises(ValueError, match=r'optimizer\.freeze_second_moment_after.*' + match):
    optim.make_optimizer(_cfg(**kw))


def test_absent_field_is_off():
  c = ml_collections.ConfigDict(dict(_cfg()))
  del c['freeze_second_moment_after']
  assert isinstance(optim.make_optimizer(c).init(jnp.zeros(2))[0], optax.ScaleByAdamState)
