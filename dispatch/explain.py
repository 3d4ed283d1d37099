"""``dispatch.explain(entry, *args, **kwargs)``: the router's Decision for a call, without running it.

``entry`` is an entry point, given as the function or by its name
(``explain("single_prefill_with_kv_cache", q, k, v)``): the arguments are validated exactly as
the call validates them, then decided. Or a planned wrapper: ``explain(wrapper)`` returns the
decision made at plan time; ``explain(wrapper, q, kv, ...)`` (run's arguments) returns the
decision of the variant that run would use (sinks / LSE / window override). Nothing is planned
on a vendor or launched.
"""
from __future__ import annotations

import functools

from . import router
from .entries import ENTRIES, PrefillWrapper, dry_run, last_decision

FUNCTIONS = tuple(name for name, e in ENTRIES.items() if e.kind == "function")


def explain(entry, *args, **kwargs) -> router.Decision:
    """Validate like ``entry`` would and return the router Decision (chosen, every backend's
    reasons, fallbacks). ``entry``: an entry function, its name, or a planned wrapper. Raises the
    entry's ValueError/TypeError for bad arguments, and BackendRefusedError / NoBackendError when
    nothing can serve."""
    if isinstance(entry, PrefillWrapper):
        return _explain_wrapper(entry, args, kwargs)
    entry = _entry_function(entry)
    with dry_run():
        entry(*args, **kwargs)
        return last_decision()


def _entry_function(entry):
    """The entry function ``entry`` names or is; ValueError naming what is allowed otherwise."""
    allowed = f"allowed an entry function or its name ({', '.join(FUNCTIONS)}), or a planned wrapper"
    if isinstance(entry, str):
        record = ENTRIES.get(entry)
        if record is None:
            raise ValueError(f"entry={entry!r}: {allowed}")
        if record.kind != "function":
            raise ValueError(f"entry={entry!r}: a wrapper is explained as an instance after plan(...): "
                             f"explain(wrapper) or explain(wrapper, *run_args)")
        return record.obj
    target = entry.func if isinstance(entry, functools.partial) else entry
    if not any(target is e.obj or (isinstance(e.obj, functools.partial) and target is e.obj.func)
               for e in ENTRIES.values() if e.kind == "function"):
        raise ValueError(f"entry={entry!r}: {allowed}")
    return entry


def _explain_wrapper(wrapper: PrefillWrapper, args, kwargs) -> router.Decision:
    if wrapper.decision is None:
        raise ValueError(f"entry={type(wrapper).__name__}(...): allowed a wrapper after plan(...)")
    if not args and not kwargs:
        return wrapper.decision
    with dry_run():
        wrapper.run(*args, **kwargs)
        return last_decision()
