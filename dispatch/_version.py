"""The installed package's version (one definition for the CLI and the benchmark's environment)."""
from __future__ import annotations


def version() -> str:
    from importlib import metadata

    try:
        return metadata.version("attn-dispatch")
    except metadata.PackageNotFoundError:  # a source tree used without `pip install -e .`
        return "unknown (not installed)"
