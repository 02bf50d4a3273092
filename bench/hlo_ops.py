"""Top-level operations of a compiled XLA program, from its HLO text (bench/op_count.py).

A program's top-level operations are the instructions of its ENTRY computation after
XLA's optimisations (a fusion is one operation); those in :data:`FREE` launch no work.
No JAX import: the text comes from ``jax.jit(f).lower(...).compile().as_text()``.
"""

import collections
import re

# ENTRY instructions that launch no work.
FREE = frozenset({'parameter', 'constant', 'tuple', 'get-tuple-element', 'bitcast'})
_COMMENT = re.compile(r'/\*.*?\*/')
_NAME = re.compile(r'^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*')
_OPCODE = re.compile(r'\s*([\w\-]+)\(')


def _opcode(line: str) -> str | None:
  """The opcode of one instruction line ``%name = <shape> opcode(...)``, whose shape
  may be a tuple ``(...)`` (parentheses nest in layouts), or None."""
  m = _NAME.match(line)
  if m is None:
    return None
  i = m.end()
  if line[i:i + 1] == '(':  # a tuple shape: skip to its closing parenthesis
    depth = 0
    for j in range(i, len(line)):
      depth += {'(': 1, ')': -1}.get(line[j], 0)
      if depth == 0:
        i = j + 1
        break
  else:  # an array shape: up to the first space
    i = line.find(' ', i)
  op = _OPCODE.match(line, i) if i > 0 else None
  return op.group(1) if op else None


def entry_opcodes(hlo_text: str) -> collections.Counter:
  """Opcode -> instructions of the ENTRY computation of an HLO module's text (the
  first module when the text holds several).

  Raises:
    ValueError: the text has no ENTRY computation, or a line of it is not an
      instruction.
  """
  lines = hlo_text.splitlines()
  start = next((i for i, l in enumerate(lines) if l.startswith('ENTRY')), None)
  if start is None:
    raise ValueError('no ENTRY computation in the HLO text')
  ops = collections.Counter()
  for line in lines[start + 1:]:
    if line.startswith('}'):
      break
    if not line.strip():
      continue
    op = _opcode(_COMMENT.sub('', line))
    if op is None:
      raise ValueError(f'not an HLO instruction: {line.strip()[:120]}')
    ops[op] += 1
  return ops


def op_count(ops: collections.Counter) -> int:
  """Top-level operations that launch work: every opcode of ``ops`` but :data:`FREE`."""
  return sum(n for op, n in ops.items() if op not in FREE)
