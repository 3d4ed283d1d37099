"""``dispatch.explain(entry, *args, **kwargs)``: the router's Decision for a call, without running it.

``entry`` is an entry point (validated exactly as the call validates, then decided) or a
planned wrapper: ``explain(wrapper)`` returns the decision made at plan time;
``explain(wrapper, q, kv, ...)`` (run's arguments) returns the decision of the variant that
run would use (sinks / LSE / window override). Nothing is planned on a vendor or launched.
"""
from __future__ import annotations

import functools

from . import router
from .entries import ENTRIES, _base
from .entries._wrapper import PrefillWrapper


def explain(entry, *args, **kwargs) -> router.Decision:
    """Validate like ``entry`` would and return the router Decision (chosen, every backend's
    reasons, fallbacks). Raises the entry's ValueError/TypeError for bad arguments, and
    BackendRefusedError / NoBackendError when nothing can serve."""
    if isinstance(entry, PrefillWrapper):
        return _explain_wrapper(entry, args, kwargs)
    target = entry.func if isinstance(entry, functools.partial) else entry
    if not any(target is e.obj or (isinstance(e.obj, functools.partial) and target is e.obj.func)
               for e in ENTRIES.values() if e.kind == "function"):
        names = ", ".join(name for name, e in ENTRIES.items() if e.kind == "function")
        raise ValueError(f"entry={entry!r}: allowed one of {names}, or a planned wrapper")
    with _base.dry_run():
        entry(*args, **kwargs)
        return _base.last_decision()


def _explain_wrapper(wrapper: PrefillWrapper, args, kwargs) -> router.Decision:
    if wrapper.decision is None:
        raise ValueError(f"entry={type(wrapper).__name__}(...): allowed a wrapper after plan(...)")
    if not args and not kwargs:
        return wrapper.decision
    with _base.dry_run():
        wrapper.run(*args, **kwargs)
        return _base.last_decision()
