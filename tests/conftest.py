"""Test setup: 8 simulated CPU devices, set before anything touches the JAX backend."""

import os
import sys

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
import jax  # noqa: E402

jax.config.update('jax_num_cpu_devices', 8)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
