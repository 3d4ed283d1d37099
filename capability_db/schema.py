"""Pydantic models of the capability data; validated once, at load.

A backend file is a list of *constraints*. Each names a fact (a field of
``AttentionProblem.facts()`` or a device fact: ``sm``, ``family``, ``device_fp8``,
``device_kind``), what is allowed (a value list, a range, a multiple, a power of
two), an optional ``when`` (the constraint applies only where every named fact
takes one of the listed values) and the ``source`` the fact comes from.
The same constraints answer "can it?" (``check``) and "why not?" (the Reasons),
and render the support matrix.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .vocabulary import DeviceDesc, Reason

if TYPE_CHECKING:  # pragma: no cover
    from .vocabulary import AttentionProblem

DEVICE_FACTS = ("sm", "family", "device_fp8", "device_kind")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Constraint(_Frozen):
    fact: str
    allowed: Optional[list[Any]] = None
    min: Optional[float] = None
    max: Optional[float] = None
    multiple_of: Optional[int] = None
    power_of_two: bool = False
    when: dict[str, list[Any]] = Field(default_factory=dict)
    source: str
    note: str = ""  # replaces the generated "allowed" text where that reads better

    @model_validator(mode="after")
    def _says_something(self) -> "Constraint":
        if self.allowed is None and self.min is None and self.max is None and not (
            self.multiple_of or self.power_of_two
        ):
            raise ValueError(f"constraint on {self.fact!r} allows everything: give allowed/min/max/multiple_of")
        return self

    def applies(self, facts: dict) -> bool:
        return all(facts.get(name) in values for name, values in self.when.items())

    def accepts(self, value: Any) -> bool:
        if self.allowed is not None and value not in self.allowed:
            return False
        if self.min is not None and value < self.min:
            return False
        if self.max is not None and value > self.max:
            return False
        if self.multiple_of and value % self.multiple_of:
            return False
        if self.power_of_two and (value <= 0 or value & (value - 1)):
            return False
        return True

    def allowed_text(self) -> str:
        if self.note:
            return self.note
        parts = []
        if self.allowed is not None:
            parts.append("one of " + ", ".join(map(repr, self.allowed)))
        if self.multiple_of:
            parts.append(f"a multiple of {self.multiple_of}")
        if self.power_of_two:
            parts.append("a power of two")
        if self.min is not None and self.max is not None:
            parts.append(f"in [{self.min:g}, {self.max:g}]")
        elif self.min is not None:
            parts.append(f">= {self.min:g}")
        elif self.max is not None:
            parts.append(f"<= {self.max:g}")
        text = " and ".join(parts)
        if self.when:
            cond = ", ".join(f"{k} in {v}" for k, v in self.when.items())
            text += f" (when {cond})"
        return text


class Provider(_Frozen):
    module: str  # importable Python module, e.g. "cudnn", "flashinfer", "flash_attn"
    extra: str  # pyproject extra that installs it
    api: str  # the vendor function(s) the adapter calls
    min_version: Optional[str] = None


class Verification(_Frozen):
    status: Literal["verified", "partial", "not run on hardware", "cpu only"]
    where: str = ""  # e.g. "H100 (sm_90), cuDNN 9.19, 2026-11-21"
    report: str = ""  # repo path of the committed result backing the claim
    note: str = ""


class BackendCaps(_Frozen):
    name: str
    title: str
    providers: list[Provider] = Field(default_factory=list)
    cuda_graph: Literal["always", "after_warmup", "never"]
    cuda_graph_source: str
    hardware: Verification
    constraints: list[Constraint]

    def check(self, problem: "AttentionProblem", device: DeviceDesc) -> list[Reason]:
        """Every violated constraint, as Reasons (all of them, not the first)."""
        facts = problem.facts()
        facts.update(sm=device.sm, family=device.family, device_fp8=device.fp8, device_kind=device.kind)
        reasons = []
        for c in self.constraints:
            if c.fact not in facts:
                raise KeyError(f"capability_db/{self.name}: unknown fact {c.fact!r}")
            if c.applies(facts) and not c.accepts(facts[c.fact]):
                value = device.arch if c.fact == "sm" else facts[c.fact]
                reasons.append(Reason(c.fact, value, c.allowed_text(), c.source))
        return reasons

    def facts_about(self, fact: str) -> list[Constraint]:
        return [c for c in self.constraints if c.fact == fact]


class DeviceEntry(_Frozen):
    arch: str  # "sm_90"
    sm: int
    family: str
    fp8: bool
    names: list[str]
    source: str

    def desc(self, name: Optional[str] = None) -> DeviceDesc:
        return DeviceDesc(name=name or self.arch, kind="cuda", sm=self.sm, family=self.family, fp8=self.fp8)


class DeviceTable(_Frozen):
    devices: list[DeviceEntry]


class PriorityEntry(_Frozen):
    backend: str
    why: str


class Priorities(_Frozen):
    # family -> phase -> ordered candidates
    families: dict[str, dict[str, list[PriorityEntry]]]
    # entry point -> the backend it routes to first (the seed's own engine)
    entry_first: dict[str, PriorityEntry] = Field(default_factory=dict)
