"""kvferry's reference engine: a small engine on host memory that drives a kvferry node through
the engine port in vLLM's order (see engine.py), with an OpenAI-compatible HTTP endpoint.

Run it with ``python -m kvferry.reference --help``.
"""

from .engine import ReferenceEngine, Request
from .model import Geometry

__all__ = ["ReferenceEngine", "Request", "Geometry"]
