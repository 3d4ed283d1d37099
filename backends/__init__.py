"""Backend adapters, one module per engine; loaded lazily by name.

Nothing in this package imports the router. A backend is declared once, in its data
file (capability_db/backends/<name>.json: name, aliases, ``adapter`` "module:Class",
extra, install line); REGISTRY is read from there. Adding a backend touches its
adapter module, its data file, its place in priorities.json and a pyproject extra -
never the router, never this file.
"""
from __future__ import annotations

import importlib

import capability_db

from .base import Backend, BackendRejected, DeviceDesc, Reason

# name -> "module:Class", from the data files; importing the module must never import a
# vendor package (a test imports every adapter with vendor imports blocked).
REGISTRY: dict[str, str] = capability_db.adapters()
_INSTANCES: dict[str, Backend] = {}


def get_backend(name: str) -> Backend:
    """The (singleton) adapter for a backend name or alias; ValueError lists the valid names."""
    name = capability_db.backend_aliases().get(name, name)
    inst = _INSTANCES.get(name)
    if inst is None:
        if name not in REGISTRY:
            raise ValueError(f"unknown backend {name!r}; valid options are: {', '.join(REGISTRY)}")
        module, cls = REGISTRY[name].split(":")
        inst = _INSTANCES[name] = getattr(importlib.import_module(module), cls)()
    return inst


def installed_defects(backend: Backend) -> list:
    """The known defects (capability_db/defects.json) of the provider versions behind ``backend``
    installed here (``attn-dispatch info``)."""
    from ._providers import installed_defects as of_installed
    return of_installed(backend)


__all__ = ["Backend", "BackendRejected", "DeviceDesc", "Reason", "REGISTRY", "get_backend", "installed_defects"]
