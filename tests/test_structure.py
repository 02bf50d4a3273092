"""hfl's structure, checked statically (AST only: no hfl module is imported).

* Imports point down the layers listed in docs/architecture.md ("## Layers", read
  from there): a module imports only modules of its own layer or lower ones, at
  module level and inside functions alike.
* No import cycle, between modules nor between the layers' packages and modules.
* A function-level (lazy) import is only for a heavy or optional dependency and names
  it on its line (``# lazy: pandas``; :data:`LAZY`); for an hfl module, the named
  dependency must be one that module imports. So no lazy import breaks a cycle: the
  two checks above count lazy imports too.
* No function or method of hfl/ is longer than :data:`MAX_FUNCTION_LINES` lines (its
  ``def`` line to its last, docstring included).
"""

import ast
import functools
import pathlib
import re
from typing import NamedTuple

REPO = pathlib.Path(__file__).resolve().parents[1]
ARCHITECTURE = REPO / 'docs' / 'architecture.md'
SOURCES = sorted((REPO / 'hfl').rglob('*.py')) + [REPO / 'main.py']

# The dependencies a function may import lazily (the word after ``# lazy:``), and why.
LAZY = {
    'jax': 'JAX or a part of it (mesh_utils, multihost_utils): keeps JAX out of '
           'hfl.metrics and hfl.distributed (so out of the report), the sweep launcher '
           "and main.py's --help and flag errors",
    'pandas': "hfl.report's tables: hfl.sweep reads runs and writes the report with them",
    'matplotlib': "the report's plots (not needed with --no-plots)",
    'tensorboardX': 'TensorBoard event files, written only by a run',
    'tensorflow_datasets': 'optional: TFDS datasets only',
    'PIL': 'optional: image-folder datasets only',
    'constriction': "optional: CO3's ANS entropy coder only",
}
_LAZY_COMMENT = re.compile(r'#.*\blazy: ([\w.]+)')

# The longest function may have this many lines: the smallest round number the code
# met once hfl.step.make_step and hfl.compress.chunked.chunked_topk (93 lines each)
# were split; the longest now are hfl.compress.quantize.qsgd (78) and hfl.data.load (77).
MAX_FUNCTION_LINES = 80


def _module_name(path: pathlib.Path) -> str:
  parts = list(path.relative_to(REPO).with_suffix('').parts)
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


MODULES = {_module_name(p): p for p in SOURCES}


class Import(NamedTuple):
  """One imported name: ``target`` an hfl module (or 'main'), else ``external`` the
  top-level package; ``lazy``: inside a function."""
  path: pathlib.Path
  line: int
  target: str | None
  external: str | None
  lazy: bool
  text: str


def _known(name: str) -> str | None:
  """The longest prefix of dotted ``name`` that is an hfl module, or None."""
  parts = name.split('.')
  for n in range(len(parts), 0, -1):
    if '.'.join(parts[:n]) in MODULES:
      return '.'.join(parts[:n])
  return None


def _resolve(module: str, path: pathlib.Path, node: ast.AST) -> list[tuple[str | None, str | None]]:
  """(hfl target, external package) of each name ``node`` imports."""
  if isinstance(node, ast.Import):
    names = [a.name for a in node.names]
  else:
    base = node.module or ''
    if node.level:  # relative: from the importing module's package
      package = module.split('.')[:len(module.split('.')) - (path.name != '__init__.py')]
      package = package[:len(package) - node.level + 1]
      base = '.'.join(package + ([node.module] if node.module else []))
    names = [f'{base}.{a.name}' if f'{base}.{a.name}' in MODULES else base for a in node.names]
  out = []
  for name in names:
    top = name.split('.')[0]
    out.append((_known(name), None) if top in ('hfl', 'main') else (None, top))
  return out


@functools.cache
def imports(module: str) -> tuple[Import, ...]:
  """Every import of ``module``, module-level and inside functions."""
  path = MODULES[module]
  source = path.read_text(encoding='utf-8')
  lines = source.splitlines()
  found = []

  def visit(node, lazy):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      text = '\n'.join(lines[node.lineno - 1:node.end_lineno])
      found.extend(Import(path, node.lineno, t, e, lazy, text)
                   for t, e in _resolve(module, path, node))
    inner = lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
    for child in ast.iter_child_nodes(node):
      visit(child, inner)

  visit(ast.parse(source, str(path)), False)
  return tuple(found)


def _where(i: Import) -> str:
  return f'{i.path.relative_to(REPO)}:{i.line}'


@functools.cache
def layers() -> tuple[tuple[str, ...], ...]:
  """The layers of docs/architecture.md's "## Layers" list, bottom first: module and
  package names (``main.py`` as ``main``)."""
  text = ARCHITECTURE.read_text(encoding='utf-8')
  section = text.split('\n## Layers\n', 1)[1].split('\n## ', 1)[0]
  items = re.findall(r'^\d+\. (.*(?:\n(?!\d+\. |\n).*)*)', section, re.M)
  return tuple(tuple('main' if n == 'main.py' else n
                     for n in re.findall(r'`((?:hfl\.)?[\w.]+|main\.py)`', item)
                     if n == 'main.py' or n.startswith('hfl.')) for item in items)


def layer_of(module: str) -> tuple[int, str] | None:
  """(index, layer entry) of ``module``: the entry naming it or its package."""
  best = None
  for i, entries in enumerate(layers()):
    for e in entries:
      if (module == e or module.startswith(e + '.')) and (best is None or len(e) > len(best[1])):
        best = (i, e)
  return best


def test_layers_list_every_module_once():
  """Every module (but the empty ``hfl`` package) is in one layer; every entry exists."""
  entries = [e for layer in layers() for e in layer]
  assert len(layers()) >= 5 and len(entries) == len(set(entries)), layers()
  assert not [e for e in entries if e not in MODULES], 'layer entries naming no module'
  assert not [m for m in MODULES if m != 'hfl' and layer_of(m) is None], (
      'modules in no layer of docs/architecture.md ("## Layers"): add them there')
  assert not [i for i in imports('hfl') if i.target], 'hfl/__init__.py imports hfl modules'


def test_imports_point_down():
  """No module imports one of a higher layer (lazy imports included)."""
  up = []
  for m in MODULES:
    if m == 'hfl':
      continue
    for i in imports(m):
      if i.target and i.target != 'hfl' and layer_of(i.target)[0] > layer_of(m)[0]:
        up.append(f'{_where(i)}: {m} (layer {layer_of(m)[0] + 1}) imports {i.target} '
                  f'(layer {layer_of(i.target)[0] + 1})')
  assert not up, 'imports pointing up the layers of docs/architecture.md:\n' + '\n'.join(up)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One cycle of ``graph`` (its nodes, the first repeated at the end), or None."""
  state, stack = {}, []

  def visit(n):
    state[n] = 'open'
    stack.append(n)
    for d in sorted(graph.get(n, ())):
      if state.get(d) == 'open':
        return stack[stack.index(d):] + [d]
      if d not in state and (found := visit(d)):
        return found
    stack.pop()
    state[n] = 'done'
    return None

  for n in sorted(graph):
    if n not in state and (found := visit(n)):
      return found
  return None


def test_no_import_cycle():
  """The import graph (lazy imports included) has no cycle: neither between modules
  nor between the layers' entries (packages such as hfl.compress, or modules)."""
  modules = {m: {i.target for i in imports(m) if i.target and i.target != m}
             for m in MODULES}
  cycle = _cycle(modules)
  assert cycle is None, 'import cycle between modules: ' + ' -> '.join(cycle)
  unit = lambda m: layer_of(m)[1] if layer_of(m) else m
  units = {}
  for m, targets in modules.items():
    units.setdefault(unit(m), set()).update(unit(t) for t in targets if unit(t) != unit(m))
  cycle = _cycle(units)
  assert cycle is None, 'import cycle between packages: ' + ' -> '.join(cycle)
  assert _cycle({'a': {'b'}, 'b': {'c'}, 'c': {'a'}}) == ['a', 'b', 'c', 'a']  # the checker


def external_closure(module: str) -> set[str]:
  """The packages outside hfl that importing ``module`` imports (module level, through
  hfl modules and their parent packages)."""
  out, seen, todo = set(), set(), [module]
  while todo:
    m = todo.pop()
    if m in seen:
      continue
    seen.add(m)
    parts = m.split('.')
    todo += ['.'.join(parts[:n]) for n in range(1, len(parts))]  # its parent packages
    for i in imports(m):
      if not i.lazy:
        out |= {i.external} if i.external else set()
        todo += [i.target] if i.target else []
  return out


def test_lazy_imports_name_their_reason():
  """A function-level import carries ``# lazy: DEP`` on its line, DEP one of :data:`LAZY`:
  the package it imports, or (an hfl module) one that module imports."""
  bad = []
  for m in MODULES:
    for i in imports(m):
      if not i.lazy:
        continue
      named = _LAZY_COMMENT.search(i.text)
      dep = named and named.group(1)
      if dep not in LAZY:
        bad.append(f'{_where(i)}: no "# lazy: DEP" with DEP one of {sorted(LAZY)}: {i.text}')
      elif i.external and i.external != dep:
        bad.append(f'{_where(i)}: imports {i.external}, but names {dep}')
      elif i.target and dep not in external_closure(i.target):
        bad.append(f'{_where(i)}: {i.target} does not import {dep}; import it at the top '
                   '(or, if that makes a cycle, move the shared code to a lower layer)')
  assert not bad, 'function-level imports:\n' + '\n'.join(bad)


def function_lengths() -> list[tuple[int, str]]:
  """(lines, 'path:line name') of every function and method in hfl/, longest first."""
  out = []
  for path in SOURCES:
    if path.name == 'main.py' and path.parent == REPO:
      continue
    for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        out.append((node.end_lineno - node.lineno + 1,
                    f'{path.relative_to(REPO)}:{node.lineno} {node.name}'))
  return sorted(out, reverse=True)


def test_functions_are_short():
  """No function of hfl/ exceeds MAX_FUNCTION_LINES lines: split a longer one."""
  lengths = function_lengths()
  assert len(lengths) > 500, len(lengths)
  long = [f'{where}: {n} lines' for n, where in lengths if n > MAX_FUNCTION_LINES]
  assert not long, f'functions over {MAX_FUNCTION_LINES} lines:\n' + '\n'.join(long)
