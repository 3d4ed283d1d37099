"""Backend adapters, one module per engine; loaded lazily by name.

Nothing in this package imports the router. Adding a backend touches its module,
its capability file, a priority entry and a pyproject extra - never the router.
"""
from __future__ import annotations

import importlib

from .base import Backend, BackendRejected, DeviceDesc, Reason

# name -> "module:Class"; importing the module must never import a vendor package.
REGISTRY = {
    "cudnn": "backends.cudnn:CudnnBackend",
    "trtllm-gen": "backends.trtllm:TrtllmGenBackend",
    "xqa": "backends.xqa:XqaBackend",
    "fa3": "backends.fa3:FA3Backend",
    "fa2": "backends.fa2:FA2Backend",
    "torch-flash": "backends.torch_flash:TorchFlashBackend",
    "native-triton": "backends.native.triton_backend:NativeTritonBackend",
    "reference": "backends.native.reference:ReferenceBackend",
}
_INSTANCES: dict[str, Backend] = {}


def get_backend(name: str) -> Backend:
    """The (singleton) adapter for a backend name; ValueError lists the valid names."""
    inst = _INSTANCES.get(name)
    if inst is None:
        if name not in REGISTRY:
            raise ValueError(f"unknown backend {name!r}; valid options are: {', '.join(REGISTRY)}")
        module, cls = REGISTRY[name].split(":")
        inst = _INSTANCES[name] = getattr(importlib.import_module(module), cls)()
    return inst


__all__ = ["Backend", "BackendRejected", "DeviceDesc", "Reason", "REGISTRY", "get_backend"]
