"""Synthetic choice tables for the router's tests: one key, the same times at every grid point."""
from __future__ import annotations

from capability_db.choice_table import ChoiceTable, grid_points, key_of


def synthetic_table(problem, ms: dict, host_us: dict | None = None, gpu: str = "h100") -> ChoiceTable:
    """A table where ``problem``'s key has GPU ``ms`` per backend at every size; ``host_us``:
    backend -> entry point -> host us per eager call."""
    names = sorted(ms)
    cell = " ".join(f"{names.index(n)} {t}" for n, t in sorted(ms.items(), key=lambda kv: kv[1]))
    data = {"gpu": gpu, "sm": 90, "backends": names, "host_us": host_us or {}, "launch_us": {}, "factors": {},
            "keys": {key_of(problem): {",".join(map(str, p)): cell for p in grid_points(problem)}}}
    return ChoiceTable(gpu, 90, data)


def use_table(monkeypatch, table: ChoiceTable) -> None:
    """The router ranks every CUDA device by ``table``."""
    from dispatch import choice
    monkeypatch.setattr(choice, "table_for", lambda device: table if device.kind == "cuda" else None)
