"""argparse ``type=`` checks shared by the benchmark scripts.

Each function returns a converter for ``ArgumentParser.add_argument(type=...)``:
it turns the flag's text into a value or raises ``argparse.ArgumentTypeError``,
so a bad value ends in argparse's ``error: argument --flag: ...`` line and exit
status 2 while the arguments are parsed, before anything is compiled. Checks
that a library owns (a model name, a config, a CO3 format) stay with the
library; these are only the plain ranges of counts and numbers.

No side effects on import (no JAX): the tests import it.
"""

import argparse
import math
import os


def _int(text: str) -> int:
  try:
    return int(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f'{text!r} is not an integer') from None


def int_at_least(lo: int):
  """Converter for an integer >= ``lo``."""
  def parse(text):
    value = _int(text)
    if value < lo:
      raise argparse.ArgumentTypeError(f'{value} must be an integer >= {lo}')
    return value
  return parse


def number_in(lo: float, hi: float = math.inf, lo_open: bool = False):
  """Converter for a finite float in [lo, hi] (in (lo, hi] when ``lo_open``)."""
  def parse(text):
    try:
      value = float(text)
    except ValueError:
      raise argparse.ArgumentTypeError(f'{text!r} is not a number') from None
    ok = math.isfinite(value) and (value > lo if lo_open else value >= lo) and value <= hi
    if not ok:
      where = (f'in {"(" if lo_open else "["}{lo:g}, {hi:g}]' if math.isfinite(hi) else
               f'{">" if lo_open else ">="} {lo:g}')
      raise argparse.ArgumentTypeError(f'{text} must be a finite number {where}')
    return value
  return parse


def int_list(lo: int = 1, multiple_of: int = 1):
  """Converter for comma-separated integers, each >= ``lo`` and a multiple of
  ``multiple_of``; returns the list."""
  def parse(text):
    values = [_int(v.strip()) for v in str(text).split(',')]
    bad = [v for v in values if v < lo or v % multiple_of]
    if bad:
      rule = f'>= {lo}' + (f' and a multiple of {multiple_of}' if multiple_of > 1 else '')
      raise argparse.ArgumentTypeError(f'{text!r}: each value must be an integer {rule} '
                                       f'(not {", ".join(map(str, bad))})')
    return values
  return parse


def number_list(lo: float = 0.0):
  """Converter for comma-separated finite floats, each >= ``lo``; returns the list."""
  one = number_in(lo)
  def parse(text):
    return [one(v.strip()) for v in str(text).split(',')]
  return parse


def names_in(allowed, what: str = 'name'):
  """Converter for comma-separated names, each one of ``allowed`` (an iterable of
  str, read when the converter is made); returns the list in the order given."""
  allowed = sorted(allowed)
  def parse(text):
    values = [v.strip() for v in str(text).split(',')]
    bad = [v for v in values if v not in allowed]
    if bad:
      raise argparse.ArgumentTypeError(
          f'unknown {what} {", ".join(map(repr, bad))} (allowed: {", ".join(allowed)})')
    return values
  return parse


def model_names(ap: argparse.ArgumentParser, text: str, choices, every) -> list[str]:
  """``--model``'s comma-separated names ('all': ``every``), each one of ``choices`` and
  given once; otherwise ``ap.error`` (exit status 2) naming the bad or repeated one."""
  names = list(every) if text == 'all' else text.split(',')
  for i, n in enumerate(names):
    if n not in choices:
      ap.error(f'--model={n!r} is not one of {", ".join(choices)}')
    if n in names[:i]:
      ap.error(f'argument --model: {n!r} is repeated in {text!r}; give each model once')
  return names


def existing_path(files_only: bool = False):
  """Converter for the path of something that exists (a file when ``files_only``);
  returns the path as given."""
  def parse(text):
    if not os.path.exists(text):
      raise argparse.ArgumentTypeError(f'{text!r} does not exist')
    if files_only and not os.path.isfile(text):
      raise argparse.ArgumentTypeError(f'{text!r} is not a file')
    return text
  return parse
