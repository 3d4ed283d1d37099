"""The capability matrix as data (JSON files beside this module) and its loader.

Files are validated with pydantic once, at first use, and cached:

* ``devices.json``   SM -> family, fp8, names (h100, b200, ...)
* ``priorities.json`` per GPU family and phase, the ordered candidates with the why
* ``backends/<name>.json`` each engine, declared once: its name and aliases, its adapter
  (``"backends.cudnn:CudnnBackend"``), the pyproject extra and install line, and what it
  accepts, each fact with its source
* ``defects.json``   known defects: provider versions with a wrong answer (vendor bugs with
  their public sources, or a measured error outside the contract's band), never chosen
  automatically (``defects_affecting``)

A backend's name is its data file's name; ``priorities.json`` lists every one in ``order``
(the order ``info`` and ``matrix`` show). This package never imports ``backends`` or
``dispatch``: they read the names, aliases and adapter paths from here.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

from .vocabulary import DeviceDesc

from .schema import (BackendCaps, DefectTable, DeviceEntry, DeviceTable, KnownDefect, PriorityEntry, Priorities,
                     version_tuple)

DATA_DIR = Path(__file__).resolve().parent


def _discover_backend_names() -> tuple[str, ...]:
    """The data files' names, in priorities.json's ``order`` (read raw: validation comes at first use)."""
    files = sorted(p.stem for p in (DATA_DIR / "backends").glob("*.json"))
    try:
        order = json.loads((DATA_DIR / "priorities.json").read_text())["order"]
    except (OSError, ValueError, KeyError) as exc:
        raise RuntimeError(f"capability_db: priorities.json needs an 'order' list of every backend: {exc}") from exc
    missing, unknown = [n for n in files if n not in order], [n for n in order if n not in files]
    if missing or unknown or len(set(order)) != len(order):
        raise RuntimeError(f"capability_db: priorities.json 'order' {order} must name every backends/<name>.json "
                           f"once; files not listed: {missing}; listed without a file: {unknown}")
    return tuple(order)


BACKEND_NAMES = _discover_backend_names()
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


def adapters() -> dict[str, str]:
    """name -> "module:Class" of its adapter, in BACKEND_NAMES order (backends.REGISTRY)."""
    return {caps.name: caps.adapter for caps in all_backend_caps()}


@functools.lru_cache(maxsize=None)
def backend_aliases() -> dict[str, str]:
    """alias -> backend name, from every data file's ``aliases``; one spelling names one backend."""
    out: dict[str, str] = {}
    for caps in all_backend_caps():
        for alias in caps.aliases:
            taken = out.get(alias) or (alias if alias in BACKEND_NAMES or alias == "auto" else None)
            if taken is not None:
                raise RuntimeError(f"capability_db/backends/{caps.name}.json: alias {alias!r} already names {taken!r}")
            out[alias] = caps.name
    return out


def install_hint(package: str) -> str:
    """How to install ``package``: a pyproject extra, a provider's module or a backend name.

    Read from the data files, so an import failure, ``info`` and the README say the same.
    """
    for caps in all_backend_caps():
        for p in caps.providers:
            if package in {p.module, p.module.split(".")[0]} | ({p.extra} if p.extra else set()):
                return p.install_line()
    name = backend_aliases().get(package, package)
    if name in BACKEND_NAMES:
        return backend_caps(name).install
    return f"an importable installation of {package!r}"


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


@functools.lru_cache(maxsize=None)
def known_defects() -> tuple[KnownDefect, ...]:
    """Every record of defects.json, its backends and ``when`` facts checked against the data."""
    from dataclasses import fields

    from .vocabulary import AttentionProblem

    table = _load(DATA_DIR / "defects.json", DefectTable)
    facts = {f.name for f in fields(AttentionProblem)} | {
        "gqa_group", "has_window", "has_soft_cap", "same_head_dims", "kv_dtype_is_q_dtype", "out_dtype_is_q_dtype"}
    for d in table.defects:
        unknown = [b for b in d.backends if b not in BACKEND_NAMES] + [f for f in d.when if f not in facts]
        if unknown:
            raise RuntimeError(f"capability_db/defects.json: {d.id!r} names unknown backends or facts {unknown}")
    return tuple(table.defects)


def defects_affecting(backend: str, provider: str, version: str, facts: dict) -> list[KnownDefect]:
    """The known defects of ``provider`` ``version`` serving ``backend`` for a problem with ``facts``."""
    return [d for d in known_defects() if d.affects(backend, provider, version, facts)]


def defects_of_version(backend: str, provider: str, version: str) -> list[KnownDefect]:
    """The known defects of ``provider`` ``version`` behind ``backend`` for some problem (``info``)."""
    return [d for d in known_defects()
            if backend in d.backends and provider == d.provider and d.versions.contains(version)]


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
    """Ordered candidates for a device family and phase; the entry's own list (its engine first) ahead."""
    prio = priorities()
    family = prio.families.get(device.family) or prio.families["default"]
    ordered = list(family.get(phase) or family["prefill"])
    first = prio.entry_first.get(entry, [])
    if first and device.kind == "cuda":
        ahead = {e.backend for e in first}
        ordered = list(first) + [e for e in ordered if e.backend not in ahead]
    return ordered


def priority_list_name(device: DeviceDesc, phase: str) -> str:
    """'hopper/decode': the list ``candidates`` reads (a missing family or phase falls back
    to 'default' and 'prefill', as ``candidates`` does)."""
    families = priorities().families
    family = device.family if families.get(device.family) else "default"
    return f"{family}/{phase if families[family].get(phase) else 'prefill'}"


__all__ = [
    "BACKEND_NAMES", "BackendCaps", "CPU_DEVICE", "DeviceEntry", "KnownDefect", "adapters", "all_backend_caps",
    "backend_aliases", "backend_caps", "candidates", "defects_affecting", "defects_of_version",
    "device_for_capability", "device_names", "device_table", "install_hint", "known_defects", "priorities",
    "priority_list_name", "resolve_device", "version_tuple",
]
