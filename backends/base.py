"""The Backend protocol, Reason, DeviceDesc and the data-driven capability check.

Nothing here imports the router or a vendor package. A backend adapter is:
capability data (capability_db/backends/<name>.json) + ``available()`` +
``check(problem, device)`` + ``plan(problem, batch)`` + ``run(plan, batch)``.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Optional

from capability_db.vocabulary import AttentionBatch, AttentionProblem, DeviceDesc, Reason

if TYPE_CHECKING:  # pragma: no cover
    from capability_db.schema import BackendCaps


class BackendRejected(Exception):
    """Raised by ``plan`` when a vendor refuses a configuration before any launch.

    The router hands the problem to the next candidate (logged once); an error
    after a kernel launched must never be turned into this exception.
    """

    def __init__(self, backend: str, reasons: list[Reason]):
        self.backend = backend
        self.reasons = list(reasons)
        super().__init__(f"{backend} rejected the problem at plan time: " + "; ".join(map(str, reasons)))


class Backend:
    """Base class of every adapter. Subclasses set ``name`` and implement the rest.

    ``check`` is data first (the backend's capability file, evaluated by
    ``capability_db``), then ``extra_checks`` for what data cannot express.
    """

    name: ClassVar[str] = ""
    # Python modules whose import makes the backend available, first found wins.
    packages: ClassVar[tuple[str, ...]] = ()

    @functools.cached_property
    def caps(self) -> "BackendCaps":
        from capability_db import backend_caps

        return backend_caps(self.name)

    # -- availability -------------------------------------------------------
    def available(self) -> Reason | None:
        """None when usable on this machine, else the reason (cached by subclasses)."""
        return None

    def version(self) -> str | None:
        return None

    # Known defects (capability_db/defects.json ids) that this adapter's own code keeps from the
    # caller, and how: ``guarded`` says on which problems.
    guards: ClassVar[dict[str, str]] = {}

    def guarded(self, defect_id: str, problem: "AttentionProblem") -> bool:
        """True when this adapter keeps the known defect ``defect_id`` from reaching the caller on
        ``problem`` here: the defect then neither holds the backend back nor warns. The base: never."""
        return False

    # -- capability ---------------------------------------------------------
    def check(self, problem: "AttentionProblem", device: DeviceDesc) -> list[Reason]:
        reasons = self.caps.check(problem, device)
        reasons.extend(self.extra_checks(problem, device))
        return reasons

    def extra_checks(self, problem: "AttentionProblem", device: DeviceDesc) -> list[Reason]:
        return []

    # -- execution ----------------------------------------------------------
    def plan(self, problem: "AttentionProblem", batch: "AttentionBatch") -> Any:
        """Host-side preparation; may raise BackendRejected. Must not launch kernels
        that write caller memory."""
        return None

    def plans_before_run(self, problem: "AttentionProblem") -> bool:
        """True when ``plan`` reads from the batch only what a wrapper's plan() already knows (index
        tensors, sizes, dtypes, the device, the softmax scale), never the data or strides of q, k, v
        or out: the wrappers then plan this backend in their plan(), where FlashInfer plans, and the
        first run only launches. The base: False (it plans on the first run, with the real tensors)."""
        return False

    def reads_block_table(self, problem: "AttentionProblem") -> bool:
        """Whether a paged batch's ``block_table`` is read by this backend (a wrapper then makes it
        in plan(), not on a first read that could fall inside a CUDA-graph capture). The base: True."""
        return True

    def plan_reusable(self, problem: "AttentionProblem") -> bool:
        """True when ``plan`` reads from the batch nothing but what a call key proves (dtypes,
        devices, head counts and dims): the entry points then keep one plan per call key instead
        of planning every call. Per-call values (lengths, scales, masks) must be read in ``run``."""
        return False

    def run(self, plan: Any, batch: "AttentionBatch") -> None:
        """Write ``batch.out`` (and ``batch.lse`` when present). Errors propagate."""
        raise NotImplementedError(f"backend {self.name!r} cannot run yet")

    def captured(self, plan: Any) -> None:
        """A CUDA graph captured launches of ``plan``: from now on no other plan may write what they
        read (a buffer shared between plans, say). The base: a plan shares nothing."""

    def follow_refusal(self, plan: Any, batch: "AttentionBatch") -> Optional[str]:
        """Why the launches of ``plan`` that a CUDA graph captured cannot do ``batch``'s work, or
        None when ``follow`` can make them. Asked when a wrapper built with ``use_cuda_graph=True``
        is planned again after a capture: the graph replays its launches with the arguments it
        captured, reading the captured plan's index tensors (the wrapper writes the new values into
        them, after every backend said yes). Changes nothing. The base: no backend follows unless it
        says how."""
        return f"{self.name} cannot re-plan launches a CUDA graph captured"

    def follow(self, plan: Any, batch: "AttentionBatch") -> None:
        """Re-plan ``plan`` in place for ``batch`` (``follow_refusal`` said it can; ``batch``'s index
        tensors are the captured ones, now holding the new values)."""

    def launcher(self, plan: Any, batch: "AttentionBatch") -> Optional[Callable[["AttentionBatch"], None]]:
        """A launch for exact repeats of a call that ``run(plan, batch)`` just served, or None.

        The entry points ask for it after a successful run whose plan they keep, and call it
        instead of ``run`` for later calls with the same lane key: every tensor's dtype, device,
        shape and strides and every float scale and option are those of ``batch``; the tensors
        are other objects with other data. A wrapper's index tensors are the same objects
        (``batch.extras["static_indices"]``); a function entry's (lengths, block tables, indptrs)
        are per call, to be read from each batch. So a launcher skips what that proves (scale signs, layout conversions, writable
        copies, provider choice) and does the least a launch needs. It may still raise
        BackendRejected before launching (the router then hands the call over). None: keep ``run``.
        """
        return None


def import_reason(package: str, exc: BaseException) -> Reason:
    """The Reason shown by ``info``/``query`` when a vendor package is missing.

    ``package`` is a pyproject extra, a module or a backend name; what to run comes from
    the capability data (``install`` lines), so it is the line ``info`` and the README give.
    """
    from capability_db import install_hint

    missing = isinstance(exc, ModuleNotFoundError)
    allowed = install_hint(package) if missing else "an importable installation"
    what = "not installed" if missing else f"import failed: {type(exc).__name__}: {exc}"
    return Reason(field=f"package {package}", value=what, allowed=allowed)
