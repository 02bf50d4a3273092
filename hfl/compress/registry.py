"""The compressor registry: ``compression.*.name`` -> factory, hyper-parameters, example.

Each compressor module of :mod:`hfl.compress` registers its own compressors when it
is imported::

    registry.register('topk', topk, hyper=('density', 'threshold_variant'),
                      example={'density': 0.05})

and the package (``hfl/compress/__init__.py``) imports every module of its folder
(:func:`hfl.plugins.import_modules`), so a new file in ``hfl/compress/`` with a ``register``
call is all a new compressor needs: config validation (:func:`hfl.config.validate`
through :func:`hfl.compress.policy.check_spec`), :func:`hfl.compress.policy.build`
and the registry-wide tests (error feedback on every link in
``tests/test_links.py``, non-finite and float32-max inputs in
``tests/test_links.py`` / ``tests/test_numerics.py``, collective bytes against the
lowered program in ``tests/test_step.py``) then all see it. The tests build each
compressor from its ``example`` spec, so a registration declares how to test it.

This is the bottom layer of the package's registry: it imports only
:mod:`hfl.compress.base` and the standard library, so every compressor module can
import it.
"""

from typing import Any, Callable, Mapping, NamedTuple, Sequence

from hfl.compress import base
from hfl.plugins import import_modules  # noqa: F401 (the package imports its modules with it)


class Entry(NamedTuple):
  """One registered compressor.

  Attributes:
    factory: ``factory(shape, **hyper) -> base.Compressor``.
    hyper: names of the spec fields passed to ``factory`` as keyword arguments.
    example: ``{field: value}``, a small valid setting of (some of) ``hyper`` that
      the registry-wide tests build the compressor with (leaves of 100 to a few
      thousand entries).
  """
  factory: Callable[..., base.Compressor]
  hyper: tuple[str, ...]
  example: dict


# name -> Entry; entry[0] is the factory, entry[1] the hyper-parameter names.
REGISTRY: dict[str, Entry] = {}


def register(name: str, factory: Callable[..., base.Compressor],
             hyper: Sequence[str] = (), example: Mapping[str, Any] | None = None) -> None:
  """Registers a compressor factory under ``name`` (overwrites an existing one).

  Args:
    name: the value of ``spec.name`` that selects it.
    factory: ``factory(shape, **hyper) -> Compressor``; raise ValueError on bad
      hyper-parameters (the policy prefixes the config field).
    hyper: spec fields passed as keyword arguments (those absent from the spec
      are not passed, so the factory's defaults apply). ``density``, ``levels``,
      ``bucket_size``, ``rank``, ``chunk_size`` and ``threshold_variant`` are
      range-checked by the policy before the factory is called.
    example: hyper-parameter values the registry-wide tests use, e.g.
      ``{'density': 0.05}``; None or ``{}``: the factory's defaults. Keep the
      compressor cheap on small leaves (e.g. 12 x 10 entries).

  Raises:
    ValueError: ``name`` is not a non-empty str, or ``example`` sets a field not
      in ``hyper``.
  """
  if not isinstance(name, str) or not name:
    raise ValueError(f'register: name must be a non-empty str, got {name!r}')
  hyper = tuple(hyper)
  example = dict(example or {})
  extra = sorted(set(example) - set(hyper))
  if extra:
    raise ValueError(f'register({name!r}): example sets {", ".join(extra)}, which are not '
                     f'among its hyper-parameters ({", ".join(hyper) or "none"})')
  REGISTRY[name] = Entry(factory, hyper, example)


def lookup(name: str) -> Entry:
  """The entry registered under ``name``.

  Raises:
    KeyError: ``name`` is not registered (the message lists the registered names).
  """
  try:
    return REGISTRY[name]
  except KeyError:
    raise KeyError(f'unknown compressor {name!r}; registered: '
                   f'{", ".join(sorted(REGISTRY))}') from None


def example_spec(name: str) -> dict:
  """``{'name': name, **example}``: the spec the registry-wide tests build ``name`` with.

  Raises:
    KeyError: as :func:`lookup`.
  """
  return dict(name=name, **lookup(name).example)


def distinct_names() -> list[str]:
  """Sorted registered names, one per distinct (factory, example) pair.

  Aliases that register the same factory object with the same example (e.g.
  ``float32`` for ``identity``, ``bfloat16`` for ``bf16``) build the same
  compressors; the name registered first stands for them. For tests whose cases
  are expensive (compiling a whole step per name).
  """
  seen, out = set(), []
  for name, entry in REGISTRY.items():  # in registration order
    key = (id(entry.factory), tuple(sorted((k, repr(v)) for k, v in entry.example.items())))
    if key not in seen:
      seen.add(key)
      out.append(name)
  return sorted(out)
