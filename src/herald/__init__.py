"""Herald: a self-hosted event delivery engine."""

from __future__ import annotations

__version__ = "0.1.0"
