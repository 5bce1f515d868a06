"""Benchmark plug-ins, registered by the @register decorator when their module is imported.

The built-in ones are imported here, after base (which imports none of them), so the
registry is full once the package is imported and no module imports its importer.
"""
from . import collectives, moe, overlap, pairs  # noqa: F401,E402  (register on import)
from .base import Benchmark, Param, Point, Traffic, get, register, registry  # noqa: F401
