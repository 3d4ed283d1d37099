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

    def reason(self, facts: dict) -> Reason:
        """Why ``facts`` break this constraint (call only when it applies and refuses). The value is
        the fact as the constraint states it (``sm=90: allowed one of 100, 103``), never a rendering."""
        if self.fact in RELATIONS and self.allowed == [True]:
            field, other = RELATIONS[self.fact]
            allowed = self.note or f"equal to {other} {facts[other]!r}{self.when_text()}"
            return Reason(field, facts[field], allowed, self.source)
        return Reason(self.fact, facts[self.fact], self.allowed_text(), self.source)


BACKEND_NAME = r"^[a-z][a-z0-9-]*$"
ADAPTER_PATH = r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$"  # "backends.cudnn:CudnnBackend"


class ProviderConstraint(Constraint):
    """A limit of one provider, in the provider versions ``versions`` (introduced <= v < fixed:
    ``fixed`` is where the limit was lifted); checked by the adapter against the installed version."""

    versions: "VersionRange" = Field(default_factory=lambda: VersionRange())


class Provider(_Frozen):
    module: str  # importable Python module, e.g. "cudnn", "flashinfer", "flash_attn"
    extra: str = ""  # pyproject extra that installs it; "" when none can (then ``install`` says how)
    install: str = ""  # the real install line where no extra installs the module
    api: str  # the vendor function(s) the adapter calls
    min_version: Optional[str] = None
    constraints: list[ProviderConstraint] = Field(default_factory=list)  # limits only this provider has

    def limits(self, facts: dict, version: str) -> list[Reason]:
        """Every constraint of this provider that applies at ``version`` and refuses ``facts``; the
        Reason names the provider and its version."""
        out = []
        for c in self.constraints:
            if c.versions.contains(version) and c.applies(facts) and not c.accepts(facts[c.fact]):
                allowed = f"{c.allowed_text()} with {self.module} {version}"
                out.append(Reason(c.fact, facts[c.fact], allowed, c.source))
        return out

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
    # How the kernel spreads one call over the GPU's SMs, for the cost model (dispatch/choice.py):
    # "split_kv" splits the keys of a request over several blocks (few queries over many keys still
    # fill the GPU); "query_tiles" runs one block per (request, head, tile of queries), so a call with
    # fewer such blocks than SMs leaves the rest idle. None: not stated (no occupancy term).
    parallelism: Optional[Literal["split_kv", "query_tiles"]] = None
    parallelism_source: str = ""
    # Entry points whose calling convention makes this backend plan again on every call (FlashInfer's
    # fa2/fa3 read device-side lengths on the host): a time measured there holds its host syncs and
    # says nothing of the backend on another entry point, nor the reverse (dispatch/choice.py).
    plans_per_call: list[str] = Field(default_factory=list)
    plans_per_call_source: str = ""

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
                reasons.append(c.reason(facts))
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
    why: str  # the reason in the product's terms: the measured figure, the GPU, the shape
    source: str = ""  # where the why's figures come from: the measurement (GPU, tool, date) or a public URL


class Priorities(_Frozen):
    # every backend once, in the order `info` and `matrix` list them (one line per new backend)
    order: list[str]
    # family -> phase -> ordered candidates
    families: dict[str, dict[str, list[PriorityEntry]]]
    # entry point -> the backend it routes to first (the seed's own engine)
    # Backends ahead of the family's list for one entry point, in order (its own engine first).
    entry_first: dict[str, list[PriorityEntry]] = Field(default_factory=dict)


# -- known defects: vendor versions with a wrong answer, or a measured error outside the contract --
# The contract's relative-error bands (METHOD; dispatch/benchmark/oracle.py BANDS says the same: a test pins it).
CONTRACT_BANDS = {"float32": 1e-5, "float16": 1e-2, "bfloat16": 1e-2, "fp8": 6e-2}


def contract_band(q_dtype: str, kv_dtype: str) -> float:
    """The relative-error band a problem with these dtypes is held to (fp8 K/V: the fp8 band)."""
    return CONTRACT_BANDS["fp8"] if kv_dtype.startswith("float8") else CONTRACT_BANDS.get(q_dtype, 1e-2)


def version_tuple(text: str) -> tuple[int, ...]:
    """(0, 7, 2) from '0.7.2', '0.7.2.post1', '0.7.2+cu130' or 'v0.7.2rc1': the release numbers only
    (so a pre-release of a fixed version reads as fixed, a post-release of a defective one as defective)."""
    import re

    match = re.match(r"v?(\d+(?:\.\d+)*)", text.strip())
    if not match:
        raise ValueError(f"version {text!r} is not a version; expected digits and dots, e.g. '0.7.2'")
    return tuple(int(part) for part in match.group(1).split("."))


class VersionRange(_Frozen):
    """Versions ``introduced <= v < fixed``; a missing bound is open (no ``fixed``: every later version)."""

    introduced: Optional[str] = None
    fixed: Optional[str] = None

    @model_validator(mode="after")
    def _parses(self) -> "VersionRange":
        for bound in (self.introduced, self.fixed):
            if bound is not None:
                version_tuple(bound)
        if self.introduced and self.fixed and version_tuple(self.introduced) >= version_tuple(self.fixed):
            raise ValueError(f"versions: introduced {self.introduced!r} must be below fixed {self.fixed!r}")
        return self

    def contains(self, version: str) -> bool:
        v = version_tuple(version)
        if self.introduced is not None and v < version_tuple(self.introduced):
            return False
        return self.fixed is None or v < version_tuple(self.fixed)

    def text(self) -> str:
        low = f">= {self.introduced}" if self.introduced else ""
        high = f"< {self.fixed}" if self.fixed else "every version so far"
        return f"{low}, {high}" if low and self.fixed else (high if not low else f"{low} (no fixed version)")


class KnownDefect(_Frozen):
    """A provider version that gives a wrong answer where the capability data says 'accepts'.

    Either a vendor bug with its public source (issue / PR), or a measured error outside the
    contract's band (``measured_error``: the relative L2 error against the fp64 oracle, with the
    ``report`` holding the measurement). The router never chooses an affected backend
    automatically; an explicit choice runs it with a one-time warning; ``info`` lists it."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    provider: str  # top-level Python package whose version gates it: "flashinfer"
    versions: VersionRange
    backends: list[str] = Field(min_length=1)  # backends served through the defective code
    paths: list[str] = Field(min_length=1)  # the vendor code paths affected (human-readable)
    when: dict[str, list[Any]] = Field(default_factory=dict)  # problem facts it affects ({} = every problem)
    measured_error: Optional[float] = None  # applies only where it exceeds the problem's contract band
    where_measured: str = ""  # device, versions, date of the measurement
    report: str = ""  # repo path of the committed measurement
    sources: list[str] = Field(default_factory=list)  # public URLs (vendor issue, PR, release)
    description: str = Field(min_length=1)  # one line
    note: str = ""  # how the version range was established

    @model_validator(mode="after")
    def _sourced(self) -> "KnownDefect":
        if not self.sources and not self.report:
            raise ValueError(f"defect {self.id!r}: give its public sources (URLs) or the report of its measurement")
        bad = [s for s in self.sources if not s.startswith("https://")]
        if bad:
            raise ValueError(f"defect {self.id!r}: sources must be public https URLs, got {bad}")
        if self.measured_error is not None and not (self.measured_error > 0 and self.where_measured and self.report):
            raise ValueError(f"defect {self.id!r}: measured_error {self.measured_error!r} needs a value > 0, "
                             "'where_measured' and the 'report' that holds it")
        if "\n" in self.description:
            raise ValueError(f"defect {self.id!r}: the description is one line")
        return self

    def affects(self, backend: str, provider: str, version: str, facts: dict) -> bool:
        """True where this record applies: the backend, its active provider's version, the problem."""
        if backend not in self.backends or provider != self.provider or not self.versions.contains(version):
            return False
        if not all(facts.get(name) in values for name, values in self.when.items()):
            return False
        if self.measured_error is not None:
            return self.measured_error > contract_band(facts.get("q_dtype", ""), facts.get("kv_dtype", ""))
        return True

    def summary(self) -> str:
        """One line for info, a Reason and the warning: what, which versions, where it is fixed."""
        fix = f"fixed in {self.provider} {self.versions.fixed}" if self.versions.fixed else "no fixed version"
        err = f"; measured error {self.measured_error:g} ({self.where_measured})" if self.measured_error else ""
        return f"{self.id}: {self.description} ({self.provider} {self.versions.text()}; {fix}{err})"


class DefectTable(_Frozen):
    defects: list[KnownDefect]

    @model_validator(mode="after")
    def _unique(self) -> "DefectTable":
        ids = [d.id for d in self.defects]
        if len(set(ids)) != len(ids):
            raise ValueError(f"defect ids repeat: {ids}")
        return self


ProviderConstraint.model_rebuild()
Provider.model_rebuild()
BackendCaps.model_rebuild()
