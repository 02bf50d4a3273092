"""bench/flops.py: model FLOPs against hand counts, and the peak FLOP/s derivation."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from hfl import models

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                'bench'))
import flops  # noqa: E402  pylint: disable=g-import-not-at-top


def cnn_flops_per_example() -> int:
  """hfl's CNN on 28x28x1 by hand: 2 x multiply-adds of each layer."""
  conv1 = 28 * 28 * 32 * (3 * 3 * 1)     # SAME padding, 32 filters
  conv2 = 14 * 14 * 64 * (3 * 3 * 32)    # after 2x2 max-pooling
  dense1 = (7 * 7 * 64) * 128
  dense2 = 128 * 10
  forward = 2 * (conv1 + conv2 + dense1 + dense2)
  # Backward: the weight gradient of every layer costs its forward pass, the input
  # gradient too, except the first layer's (the images need none).
  return forward + forward + (forward - 2 * conv1)


def test_cnn_train_step_flops_equal_hand_count():
  net = models.get_model('cnn', 10)
  x = jnp.zeros((3, 28, 28, 1))
  y = jnp.zeros((3,), jnp.int32)
  params = net.init(jax.random.PRNGKey(0), x[:1])['params']
  loss = lambda p: optax.softmax_cross_entropy_with_integer_labels(
      net.apply({'params': p}, x), y).mean()
  assert flops.jaxpr_flops(jax.make_jaxpr(jax.value_and_grad(loss))(params)) == (
      3 * cnn_flops_per_example())
  assert cnn_flops_per_example() == 24_995_328


def test_strided_conv_gradients_count_only_nonzero_taps():
  """Stride 2: the kernel and input gradients each cost exactly the forward pass."""
  x = jnp.ones((2, 8, 8, 3))
  k = jnp.ones((3, 3, 3, 5))
  conv = lambda x, k: jax.lax.conv_general_dilated(x, k, (2, 2), 'SAME',
                                                   dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
  forward = 2 * (2 * 4 * 4 * 5) * (3 * 3 * 3)
  assert flops.jaxpr_flops(jax.make_jaxpr(conv)(x, k)) == forward
  grads = jax.make_jaxpr(jax.grad(lambda x, k: conv(x, k).sum(), argnums=(0, 1)))(x, k)
  assert flops.jaxpr_flops(grads) == 3 * forward


def test_scan_body_counts_length_times():
  a = jnp.ones((4, 6))
  b = jnp.ones((6, 7))
  body = lambda c, _: (c + a @ b, None)
  jaxpr = jax.make_jaxpr(lambda: jax.lax.scan(body, jnp.zeros((4, 7)), None, length=5))()
  assert flops.jaxpr_flops(jaxpr) == 5 * 2 * 4 * 7 * 6
  assert flops.jaxpr_flops(jax.make_jaxpr(jnp.tanh)(a)) == 0


# lscpu and /proc/cpuinfo of this project's machine until 2026-12-01 (AMD EPYC, Zen 3
# under KVM).
EPYC = {'Vendor ID': 'AuthenticAMD', 'Model name': 'AMD EPYC', 'CPU family': '25',
        'Model': '1', 'Thread(s) per core': '1', 'Flags': 'fpu sse sse2 avx fma avx2'}
EPYC_CPUINFO = 'processor\t: 0\ncpu MHz\t\t: 2445.404\nprocessor\t: 1\ncpu MHz\t\t: 2445.404\n'


def test_peak_of_this_projects_cpu():
  peak, text = flops.peak_flops(EPYC, EPYC_CPUINFO, cpus=2)
  # 2 cores x 2.445404 GHz x 8 fp32 lanes x 2 FMA pipes x 2 FLOPs per FMA.
  assert peak == pytest.approx(2 * 2.445404e9 * 8 * 2 * 2, rel=1e-12)
  assert '156.5 GFLOP/s' in text and '/proc/cpuinfo' in text


@pytest.mark.parametrize('info, cpus, per_core_cycle', [
    (dict(EPYC, **{'CPU family': '23', 'Model': '1'}), 2, 8 * 1 * 2),  # Zen 1: one 256-bit FMA
    (dict(EPYC, **{'Thread(s) per core': '2'}), 4, 8 * 2 * 2),  # SMT: 4 CPUs = 2 cores
    ({'Vendor ID': 'GenuineIntel', 'CPU family': '6', 'Model': '85', 'CPU max MHz': '3000.0',
      'Flags': 'sse avx avx2 fma avx512f'}, 2, 16 * 2 * 2),
    # Zen 4: 512-bit FMAs double-pumped on 256-bit pipes; Zen 5 server (EPYC 9005,
    # family 1Ah model 2h, the project's machine since 2026-12-02): two 512-bit pipes.
    (dict(EPYC, **{'Flags': 'fma avx2 avx512f', 'Model': '17'}), 2, 16 * 1 * 2),
    (dict(EPYC, **{'Flags': 'fma avx2 avx512f', 'CPU family': '26', 'Model': '2'}), 2,
     16 * 2 * 2),
    (dict(EPYC, **{'Flags': 'fma avx2 avx512f', 'CPU family': '26', 'Model': '36'}), 2,
     16 * 1 * 2),
    ({'Vendor ID': 'GenuineIntel', 'Flags': 'sse sse2'}, 2, 4),  # no FMA: one op per lane
])
def test_peak_derivation(info, cpus, per_core_cycle):
  peak, _ = flops.peak_flops(info, EPYC_CPUINFO, cpus=cpus)
  clock = float(info.get('CPU max MHz', 2445.404)) * 1e6
  assert peak == pytest.approx(2 * clock * per_core_cycle, rel=1e-12)
  assert np.isfinite(peak)
