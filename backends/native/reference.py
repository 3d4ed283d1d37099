"""PyTorch reference backend: STUB, replaced by the real one."""
from __future__ import annotations

from backends.base import Backend


class ReferenceBackend(Backend):
    name = "reference"
