"""Registries filled by their own modules: import every module of a package folder.

hfl's extension points (compressors, :mod:`hfl.compress.registry`; sync strategies,
:mod:`hfl.sync.strategies.registry`) are registries that each module of a folder
fills with a ``register(...)`` call when it is imported. The package imports every
module of its folder with :func:`import_modules`, so a new compressor or strategy is
one new file in that folder: nothing else has to import it.
"""

import importlib
import pkgutil
from typing import Sequence


def import_modules(package: str, path: Sequence[str]) -> list[str]:
  """Imports every module of a package folder, so their ``register`` calls run.

  Modules whose name starts with ``_`` (and sub-packages) are skipped. An import
  error propagates: a broken module fails loudly rather than being left out of the
  registry.

  Args:
    package: the package's dotted name, e.g. ``'hfl.compress'``.
    path: the package's ``__path__``.

  Returns:
    the imported modules' dotted names, sorted.
  """
  names = sorted(m.name for m in pkgutil.iter_modules(list(path))
                 if not m.ispkg and not m.name.startswith('_'))
  for name in names:
    importlib.import_module(f'{package}.{name}')
  return [f'{package}.{name}' for name in names]
