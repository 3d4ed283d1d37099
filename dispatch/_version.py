"""The package's version: the one definition (pyproject reads it: ``version = {attr = ...}``)."""
from __future__ import annotations

__version__ = "0.1.0"


def version() -> str:
    """``__version__`` (the CLI's ``--version`` and the benchmark's environment record)."""
    return __version__
