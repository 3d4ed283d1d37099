"""The capability matrix as data (JSON files beside this module) and its loader.

Files are validated with pydantic once, at first use, and cached:

* ``devices.json``   SM -> family, fp8, names (h100, b200, ...)
* ``priorities.json`` per GPU family and phase, the ordered candidates with the why
* ``backends/<name>.json`` what each engine accepts, each fact with its source
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

from .vocabulary import DeviceDesc

from .schema import BackendCaps, DeviceEntry, DeviceTable, PriorityEntry, Priorities

DATA_DIR = Path(__file__).resolve().parent
BACKEND_NAMES = ("cudnn", "trtllm-gen", "xqa", "fa3", "fa2", "torch-flash", "native-triton", "reference")
CPU_DEVICE = DeviceDesc(name="cpu", kind="cpu", sm=0, family="cpu", fp8=False)


def _load(path: Path, model):
    try:
        return model.model_validate(json.loads(path.read_text()))
    except Exception as exc:  # a broken data file must say which file
        raise RuntimeError(f"capability_db: {path.relative_to(DATA_DIR)} is invalid: {exc}") from exc


@functools.lru_cache(maxsize=None)
def backend_caps(name: str) -> BackendCaps:
    if name not in BACKEND_NAMES:
        raise ValueError(f"unknown backend {name!r}; valid options are: {', '.join(BACKEND_NAMES)}")
    caps = _load(DATA_DIR / "backends" / f"{name}.json", BackendCaps)
    if caps.name != name:
        raise RuntimeError(f"capability_db/backends/{name}.json declares name {caps.name!r}")
    return caps


def all_backend_caps() -> list[BackendCaps]:
    return [backend_caps(n) for n in BACKEND_NAMES]


@functools.lru_cache(maxsize=None)
def device_table() -> DeviceTable:
    return _load(DATA_DIR / "devices.json", DeviceTable)


@functools.lru_cache(maxsize=None)
def priorities() -> Priorities:
    prio = _load(DATA_DIR / "priorities.json", Priorities)
    for family, phases in prio.families.items():
        for phase, entries in phases.items():
            for e in entries:
                if e.backend not in BACKEND_NAMES:
                    raise RuntimeError(f"priorities.json: {family}/{phase} names unknown backend {e.backend!r}")
    return prio


def device_names() -> list[str]:
    names = []
    for d in device_table().devices:
        names.append(d.arch)
        names.extend(d.names)
    return names + ["cpu"]


def resolve_device(spec: str) -> DeviceDesc:
    """'h100', 'sm_90', 'sm90', '90', '9.0' or 'cpu' -> DeviceDesc. ValueError lists the options."""
    text = spec.strip().lower()
    if text == "cpu":
        return CPU_DEVICE
    digits = text.removeprefix("sm_").removeprefix("sm").replace(".", "")
    for d in device_table().devices:
        if text in d.names or digits == str(d.sm):
            return d.desc(text if text in d.names else d.arch)
    raise ValueError(f"--gpu {spec!r} is not a known device; valid options are: {', '.join(device_names())}")


def device_for_capability(major: int, minor: int, name: str = "") -> DeviceDesc:
    """The DeviceDesc of a live GPU (called once per device by the router)."""
    sm = major * 10 + minor
    for d in device_table().devices:
        if d.sm == sm:
            return d.desc(name or d.arch)
    # Unknown SM: keep it usable by the generic backends, with the nearest family below.
    known = [d for d in device_table().devices if d.sm <= sm]
    base = max(known, key=lambda d: d.sm) if known else None
    return DeviceDesc(name=name or f"sm_{sm}", kind="cuda", sm=sm,
                      family=base.family if base else "unknown", fp8=base.fp8 if base else False)


def candidates(device: DeviceDesc, phase: str, entry: str) -> list[PriorityEntry]:
    """Ordered candidates for a device family and phase; the entry's own engine first."""
    prio = priorities()
    family = prio.families.get(device.family) or prio.families["default"]
    ordered = list(family.get(phase) or family["prefill"])
    first = prio.entry_first.get(entry)
    if first is not None and device.kind == "cuda":
        ordered = [first] + [e for e in ordered if e.backend != first.backend]
    return ordered


__all__ = [
    "BACKEND_NAMES", "BackendCaps", "CPU_DEVICE", "DeviceEntry", "all_backend_caps", "backend_caps",
    "candidates", "device_for_capability", "device_names", "device_table", "priorities", "resolve_device",
]
