"""Benchmark plug-ins, registered by the @register decorator."""
from .base import Benchmark, Param, Point, Traffic, get, register, registry  # noqa: F401
