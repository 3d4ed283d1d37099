"""A backend served by one of several vendor packages ("providers"), first usable one wins.

fa2 is served by ``flash_attn`` or by FlashInfer's own fa2 kernels, fa3 by
``flash_attn_interface`` or FlashInfer's fa3 kernels. The backend's capability
file declares what the backend accepts with *some* provider; each provider adds
the few limits only it has (``limits``: a list of Reasons, empty = it serves the
problem). ``plan`` picks the first installed provider without limits, or raises
BackendRejected with every provider's reasons, so the router falls back.
Planning and launching run under the tensors' GPU (backends/_device.py).

``active_provider`` names the package (and its installed version) that would serve a problem
on any backend, so the known defects of capability_db/defects.json, gated by that version,
reach the router (``defects_for``) and ``info`` (``installed_defects``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Optional

from backends import _vendor
from backends._device import on_device, on_device_launch
from backends.base import Backend, BackendRejected, Reason
import capability_db
from capability_db import KnownDefect, install_hint


class Provider:
    """One vendor package behind a backend."""

    label: ClassVar[str] = ""  # "flash_attn", "flashinfer fa2", ...
    module: ClassVar[str] = ""  # what must import
    extra: ClassVar[str] = ""  # pyproject extra that installs it

    def loaded(self) -> _vendor.Loaded:
        return _vendor.load(self.module, self.extra)

    def version(self) -> Optional[str]:
        top = _vendor.load(self.module.split(".")[0], self.extra)
        return top.version if top.ok else None

    def limits(self, problem) -> list[Reason]:
        return []

    def data_limits(self, backend: str, problem) -> list[Reason]:
        """The constraints this provider's entry in capability_db/backends/<backend>.json declares
        for the installed version (e.g. FlashInfer fa2's head dims, 512 from 0.6.14)."""
        version = self.version()
        top = self.module.split(".")[0]
        entries = [p for p in capability_db.backend_caps(backend).providers if p.module == top]
        if version is None or not entries:
            return []
        return entries[0].limits(problem.facts(), version)

    def plan(self, problem, batch) -> Any:
        return None

    def plan_reusable(self, problem) -> bool:
        return False

    def plans_before_run(self, problem) -> bool:
        """Backend.plans_before_run for this provider."""
        return False

    def reads_block_table(self, problem) -> bool:
        """Backend.reads_block_table for this provider."""
        return True

    def run(self, problem, state: Any, batch) -> None:
        raise NotImplementedError

    def launcher(self, problem, state: Any, batch) -> Any:
        """A launch for exact repeats of ``batch`` (Backend.launcher), or None. It runs under
        the tensors' GPU, made current by the backend's launcher."""
        return None

    def captured(self, problem, state: Any) -> None:
        """Backend.captured for this provider's plan."""

    def follow_refusal(self, problem, state: Any, batch) -> Optional[str]:
        """Backend.follow_refusal for this provider's plan."""
        return f"{self.label} cannot re-plan launches a CUDA graph captured"

    def follow(self, problem, state: Any, batch) -> None:
        """Backend.follow for this provider's plan."""


@dataclass
class ProviderPlan:
    provider: Provider
    problem: Any
    state: Any


class MultiProviderBackend(Backend):
    providers: ClassVar[tuple[Provider, ...]] = ()

    def available(self) -> Reason | None:
        reasons = [p.loaded().reason for p in self.providers]
        if any(r is None for r in reasons):
            return None
        labels = " / ".join(p.label for p in self.providers)
        return Reason(f"package {labels}", "not installed",
                      " or ".join(install_hint(p.module.split(".")[0]) for p in self.providers))  # the data's lines

    def version(self) -> str | None:
        found = [f"{p.label} {p.version()}" for p in self.providers if p.loaded().ok]
        return ", ".join(found) or None

    def choose(self, problem) -> Provider:
        """The first installed provider that serves the problem, else BackendRejected."""
        why: list[Reason] = []
        for p in self.providers:
            loaded = p.loaded()
            if not loaded.ok:
                why.append(Reason(f"provider {p.label}", loaded.reason.value, loaded.reason.allowed))
                continue
            limits = p.limits(problem)
            if not limits:
                return p
            why.extend(Reason(f"{p.label}: {r.field}", r.value, r.allowed, r.source) for r in limits)
        raise BackendRejected(self.name, why)

    def plan_reusable(self, problem) -> bool:
        try:
            return self.choose(problem).plan_reusable(problem)
        except BackendRejected:
            return False

    def plans_before_run(self, problem) -> bool:
        try:
            return self.choose(problem).plans_before_run(problem)
        except BackendRejected:
            return False

    def reads_block_table(self, problem) -> bool:
        try:
            return self.choose(problem).reads_block_table(problem)
        except BackendRejected:
            return True

    def plan(self, problem, batch) -> ProviderPlan:
        _vendor.refuse_negative_scale(self.name, batch.sm_scale, self.name)
        provider = self.choose(problem)
        try:
            with on_device(batch.q.device):
                state = provider.plan(problem, batch)
        except BackendRejected:
            raise
        except _vendor.VENDOR_ERRORS as exc:  # the vendor refused while planning: nothing launched
            raise _vendor.vendor_refused(self.name, provider.label, exc) from exc
        return ProviderPlan(provider, problem, state)

    def run(self, plan: ProviderPlan, batch) -> None:
        # Before any launch, so the router may still hand the call over (router.run).
        _vendor.refuse_negative_scale(self.name, batch.sm_scale, self.name)
        with on_device(batch.q.device):
            plan.provider.run(plan.problem, plan.state, batch)

    def captured(self, plan: ProviderPlan) -> None:
        plan.provider.captured(plan.problem, plan.state)

    def follow_refusal(self, plan: ProviderPlan, batch) -> Optional[str]:
        return plan.provider.follow_refusal(plan.problem, plan.state, batch)

    def follow(self, plan: ProviderPlan, batch) -> None:
        with on_device(batch.q.device):
            plan.provider.follow(plan.problem, plan.state, batch)

    def launcher(self, plan: ProviderPlan, batch):
        launch = plan.provider.launcher(plan.problem, plan.state, batch)
        if launch is None:
            return None
        return on_device_launch(batch.q.device, launch)


# -- the provider that serves a problem, and its known defects ---------------------------------
def active_provider(backend: Backend, problem=None) -> Optional[tuple[str, str]]:
    """(package, installed version) of what serves ``problem`` on ``backend`` (any problem when None),
    or None: no vendor package behind it, none installed, or every provider refuses the problem."""
    if isinstance(backend, MultiProviderBackend):
        if problem is None:
            found = [p for p in backend.providers if p.loaded().ok]
            provider = found[0] if len(found) == 1 else None  # several: only a problem says which serves
        else:
            try:
                provider = backend.choose(problem)
            except BackendRejected:
                return None
        version = provider.version() if provider is not None else None
        return (provider.module.split(".")[0], version) if version else None
    if isinstance(backend, _vendor.FlashInferModuleBackend):
        version = backend.version()
        return ("flashinfer", version) if version else None
    return None  # native, reference, torch-flash: no versioned vendor package (cuDNN: none recorded yet)


def defects_for(backend: Backend, problem, device) -> list[tuple[KnownDefect, str]]:
    """The known defects, each with the installed version it was found in, of the provider that
    would serve ``problem`` on ``device``, less those the backend guards on it (Backend.guarded)."""
    active = active_provider(backend, problem)
    if active is None:
        return []
    facts = defect_facts(problem, device)
    return [(d, active[1]) for d in capability_db.defects_affecting(backend.name, active[0], active[1], facts)
            if not backend.guarded(d.id, problem)]


def defect_facts(problem, device) -> dict:
    """What a known defect's ``when`` may name: the problem's facts and the device's."""
    return {**problem.facts(), "sm": device.sm, "family": device.family, "device_fp8": device.fp8,
            "device_kind": device.kind}


def installed_defects(backend: Backend) -> list[KnownDefect]:
    """The known defects of every installed provider version behind ``backend`` (``info``)."""
    out: list[KnownDefect] = []
    if isinstance(backend, MultiProviderBackend):
        versions = [(p.module.split(".")[0], p.version()) for p in backend.providers if p.loaded().ok]
    else:
        active = active_provider(backend)
        versions = [active] if active else []
    for package, version in versions:
        if version:
            out.extend(d for d in capability_db.defects_of_version(backend.name, package, version) if d not in out)
    return out


def defect_reason(defect: KnownDefect, version: str) -> Reason:
    """What the router shows for a candidate held back by a known defect."""
    fixed = f"{defect.provider} >= {defect.versions.fixed}" if defect.versions.fixed else "no fixed version yet"
    return Reason("known defect", f"{defect.id} ({defect.provider} {version})",
                  f"a provider version without it: {fixed}; force it with backend= to run it anyway",
                  (defect.sources or [defect.report])[0])
