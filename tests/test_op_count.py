"""bench/hlo_ops.py (what bench/op_count.py counts) and the benchmark-only transformer
size of bench/step_throughput.py."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hfl import models

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'bench'))
import hlo_ops  # noqa: E402  pylint: disable=g-import-not-at-top

HLO = """HloModule jit_f, entry_computation_layout={(f32[8]{0})->(f32[8]{0}, s32[])}

%fused_computation (param_0: f32[8]) -> f32[8] {
  %param_0 = f32[8]{0} parameter(0)
  ROOT %add.1 = f32[8]{0} add(%param_0, %param_0)
}

ENTRY %main.5 (x.1: f32[8]) -> (f32[8]{0}, s32[]) {
  %x.1 = f32[8]{0} parameter(0), metadata={op_name="x"}
  %constant.2 = s32[] constant(3)
  %fusion = f32[8]{0} fusion(%x.1), kind=kLoop, calls=%fused_computation
  %bitcast.3 = f32[2,4]{1,0} bitcast(%fusion)
  %all-reduce = (f32[8]{0}, /*index=1*/f32[2,4]{1,0:T(2,128)}) all-reduce(%fusion, %bitcast.3), replica_groups={}
  %copy.4 = f32[8]{0} copy(%fusion)
  ROOT %tuple.5 = (f32[8]{0}, s32[]) tuple(%copy.4, %constant.2)
}
"""


def test_entry_opcodes_reads_the_entry_computation_only():
  """Tuple shapes (with comments and parenthesised layouts) are skipped to the opcode;
  the fused computation's instructions are not top-level."""
  ops = hlo_ops.entry_opcodes(HLO)
  assert dict(ops) == {'parameter': 1, 'constant': 1, 'fusion': 1, 'bitcast': 1,
                       'all-reduce': 1, 'copy': 1, 'tuple': 1}
  assert hlo_ops.op_count(ops) == 3  # fusion, all-reduce, copy
  with pytest.raises(ValueError, match='no ENTRY'):
    hlo_ops.entry_opcodes('HloModule m\n')
  with pytest.raises(ValueError, match='not an HLO instruction'):
    hlo_ops.entry_opcodes('ENTRY %m () -> f32[] {\n  garbage\n}\n')


def test_a_compiled_elementwise_chain_is_one_operation():
  compiled = jax.jit(lambda x: jnp.tanh(x * 2 + 1)).lower(jnp.zeros(16)).compile()
  assert hlo_ops.op_count(hlo_ops.entry_opcodes(compiled.as_text())) == 1


def test_transformer_large_is_a_benchmark_only_12_by_768_transformer():
  """Not a model a config can name; 12 blocks of width 768 at sequence 512 (built
  abstractly: 85.5M parameters, nothing allocated)."""
  import step_throughput as st  # pylint: disable=g-import-not-at-top
  assert 'transformer_large' not in models.MODELS and 'transformer_large' in st.CHOICES
  net, tokens = st.get_model('transformer_large')
  assert tokens and (net.num_layers, net.num_heads, net.embed_dim, net.seq_len) == (
      12, 12, 768, 512)
  shapes = jax.eval_shape(lambda: net.init(jax.random.PRNGKey(0),
                                           jnp.zeros((1, 512), jnp.int32)))['params']
  assert sum(int(np.prod(l.shape)) for l in jax.tree.leaves(shapes)) == 85_549_121
  with pytest.raises(ValueError, match="model.name='transformer_large' is unknown"):
    models.get_model('transformer_large', 65)
