"""Pydantic models of the capability data; validated once, at load.

A backend file is a list of *constraints*. Each names a fact (a field of
``AttentionProblem.facts()`` or a device fact: ``sm``, ``family``, ``device_fp8``,
``device_kind``), what is allowed (a value list, a range, a multiple, a power of
two), an optional ``when`` (the constraint applies only where every named fact
takes one of the listed values) and the ``source`` the fact comes from.
The same constraints answer "can it?" (``check``) and "why not?" (the Reasons),
and render the support matrix.

Two derived facts compare dtypes (``kv_dtype_is_q_dtype``, ``out_dtype_is_q_dtype``):
rules such as "K/V dtype equals Q's" live in the data like any other, and a refusal
names the dtype itself, not the flag (``RELATIONS``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .vocabulary import DeviceDesc, Reason

if TYPE_CHECKING:  # pragma: no cover
    from .vocabulary import AttentionProblem

DEVICE_FACTS = ("sm", "family", "device_fp8", "device_kind")
# derived fact -> (the field it is about, the field it is compared with): a Reason names the first
RELATIONS = {"kv_dtype_is_q_dtype": ("kv_dtype", "q_dtype"), "out_dtype_is_q_dtype": ("out_dtype", "q_dtype")}


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
        if self.fact in RELATIONS and self.allowed != [True]:
            raise ValueError(f"constraint on {self.fact!r}: allowed must be [true] (the rule is 'equal'; "
                             f"list {RELATIONS[self.fact][0]} values for anything else)")
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
        return text + self.when_text()

    def when_text(self) -> str:
        if not self.when:
            return ""
        cond = ", ".join(f"{k} in {v}" for k, v in self.when.items())
        return f" (when {cond})"

    def reason(self, facts: dict, arch: str) -> Reason:
        """Why ``facts`` break this constraint (call only when it applies and refuses)."""
        if self.fact in RELATIONS and self.allowed == [True]:
            field, other = RELATIONS[self.fact]
            allowed = self.note or f"equal to {other} {facts[other]!r}{self.when_text()}"
            return Reason(field, facts[field], allowed, self.source)
        value = arch if self.fact == "sm" else facts[self.fact]
        return Reason(self.fact, value, self.allowed_text(), self.source)


BACKEND_NAME = r"^[a-z][a-z0-9-]*$"
ADAPTER_PATH = r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$"  # "backends.cudnn:CudnnBackend"


class Provider(_Frozen):
    module: str  # importable Python module, e.g. "cudnn", "flashinfer", "flash_attn"
    extra: str = ""  # pyproject extra that installs it; "" when none can (then ``install`` says how)
    install: str = ""  # the real install line where no extra installs the module
    api: str  # the vendor function(s) the adapter calls
    min_version: Optional[str] = None

    @model_validator(mode="after")
    def _installable(self) -> "Provider":
        if not self.extra and not self.install and self.module != "torch":
            raise ValueError(f"provider {self.module!r}: give the pyproject 'extra' that installs it or its 'install' line")
        return self

    def install_line(self) -> str:
        return self.install or (f"pip install 'attn-dispatch[{self.extra}]'" if self.extra else "pip install torch")


class Verification(_Frozen):
    status: Literal["verified", "partial", "not run on hardware", "cpu only"]
    where: str = ""  # e.g. "H100 (sm_90), cuDNN 9.19, 2026-11-21"
    report: str = ""  # repo path of the committed result backing the claim
    note: str = ""


class BackendCaps(_Frozen):
    """One backend, declared once: its name and spellings, where its adapter lives, how to
    install it, and what it accepts. Everything else (the registry, the aliases ``backend=``
    takes, ``info``'s install hints) is read from here."""

    name: str = Field(pattern=BACKEND_NAME)
    title: str
    adapter: str = Field(pattern=ADAPTER_PATH)  # imported by name, only when the backend is used
    aliases: list[str] = Field(default_factory=list)  # other spellings backend= accepts (FlashInfer's)
    extra: Optional[str] = None  # the pyproject extra that makes it usable; None: the base install has it
    install: str  # what `attn-dispatch info` tells a user for whom it is not installed
    providers: list[Provider] = Field(default_factory=list)
    cuda_graph: Literal["always", "after_warmup", "never"]
    cuda_graph_source: str
    hardware: Verification
    constraints: list[Constraint]

    @model_validator(mode="after")
    def _install_names_the_extra(self) -> "BackendCaps":
        # the install line is what a user copies: it must install the extra the data names
        if self.extra and f"attn-dispatch[{self.extra}]" not in self.install:
            raise ValueError(f"install {self.install!r} does not install the extra {self.extra!r}: "
                             f"expected it to contain \"pip install 'attn-dispatch[{self.extra}]'\"")
        if self.name in self.aliases or len(set(self.aliases)) != len(self.aliases):
            raise ValueError(f"aliases {self.aliases!r} repeat a spelling or the name {self.name!r}")
        return self

    def check(self, problem: "AttentionProblem", device: DeviceDesc) -> list[Reason]:
        """Every violated constraint, as Reasons (all of them, not the first)."""
        facts = problem.facts()
        facts.update(sm=device.sm, family=device.family, device_fp8=device.fp8, device_kind=device.kind)
        reasons = []
        for c in self.constraints:
            if c.fact not in facts:
                raise KeyError(f"capability_db/{self.name}: unknown fact {c.fact!r}")
            if c.applies(facts) and not c.accepts(facts[c.fact]):
                reasons.append(c.reason(facts, device.arch))
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
    # every backend once, in the order `info` and `matrix` list them (one line per new backend)
    order: list[str]
    # family -> phase -> ordered candidates
    families: dict[str, dict[str, list[PriorityEntry]]]
    # entry point -> the backend it routes to first (the seed's own engine)
    # Backends ahead of the family's list for one entry point, in order (its own engine first).
    entry_first: dict[str, list[PriorityEntry]] = Field(default_factory=dict)
