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

from ._device import BoundedCache, kept_views, made_to_keep
from ._numerics import alibi_slopes
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


def defects_for(backend: Backend, problem, device) -> list:
    """The known defects (with the installed version each was found in) of the provider that would
    serve ``problem`` on ``device``, less those the backend guards (the router's candidates)."""
    from ._providers import defects_for as of_provider
    return of_provider(backend, problem, device)


def defect_reason(defect, version: str) -> Reason:
    """What the router shows for a candidate held back by a known defect."""
    from ._providers import defect_reason as reason
    return reason(defect, version)


__all__ = ["Backend", "BackendRejected", "BoundedCache", "DeviceDesc", "Reason", "REGISTRY", "alibi_slopes",
           "defect_reason", "defects_for", "get_backend", "installed_defects", "kept_views", "made_to_keep"]
