"""Gradient compressors in the style of optax: per-leaf pure functions, payloads, policy.

Re-exports the public API of the submodules; see each module for the algorithms.

Importing the package imports every module of this folder
(:func:`hfl.plugins.import_modules`), so each compressor module's
``register(...)`` call has run before anything reads the registry: a new
compressor is one new file here (see :mod:`hfl.compress.registry`).
"""

from hfl.compress import dgc
from hfl.compress import registry
from hfl.compress.base import Compressor, EmptyState, Payload, cast, identity, payload_bits
from hfl.compress.ef import aggregate, ef_step, tree_ef_step
from hfl.compress.lowrank import PowerSGDState, matrix_shape, powersgd
from hfl.compress.policy import REGISTRY, build, describe, register, static_bits
from hfl.compress.quantize import level_bits, pack_bits, qsgd, sign, unpack_bits
from hfl.compress.sparse import index_dtype, num_kept, randk, topk

# Every module of the package, so that their register(...) calls run (compressor
# modules nothing else imports included).
registry.import_modules(__name__, __path__)

__all__ = [
    'Compressor', 'EmptyState', 'Payload', 'PowerSGDState', 'REGISTRY', 'aggregate',
    'build', 'cast', 'describe', 'dgc', 'ef_step', 'identity', 'index_dtype',
    'level_bits', 'matrix_shape', 'num_kept', 'pack_bits', 'payload_bits', 'powersgd',
    'qsgd', 'randk', 'register', 'registry', 'sign', 'static_bits', 'topk', 'tree_ef_step',
    'unpack_bits',
]
