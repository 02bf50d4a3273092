"""Sync strategies, one module each, registered by name (:mod:`.registry`).

Importing the package imports every module of this folder
(:func:`hfl.plugins.import_modules`), so a new strategy is one new file here with a
``registry.register(...)`` call; the built-in ones are imported first, so that
``sync.strategy``'s listings start with them.
"""

from hfl import plugins
from hfl.sync.strategies import registry
from hfl.sync.strategies import sync, periodic, semi_sync, adacomm  # noqa: F401 (first)
from hfl.sync.strategies.registry import (REGISTRY, RoundPlan, ScheduleState, Settings,
                                          Strategy, get, hyper_defaults, register,
                                          round_masks)

plugins.import_modules(__name__, __path__)

__all__ = ['REGISTRY', 'RoundPlan', 'ScheduleState', 'Settings', 'Strategy', 'get',
           'hyper_defaults', 'register', 'registry', 'round_masks']
