"""Bad inputs across the seven entry points, each "cold" and "warm".

Cold: fresh process state (every ``clear_caches`` dispatch exposes), then the bad call.
Warm: the same valid call first (same shapes, fresh buffers; for a wrapper, on the same
object; a row's ``base`` changes made to both), then the bad one, so a cache keyed on too little shows up as a missing check.
Each case asserts the exception type, that the message names the argument, its bad value and
what is allowed (and no internal name instead of the caller's), and that the caller's poisoned
out/lse buffers and every input tensor are bitwise unchanged. The rows: tests/_mutation_table.py.
"""
from __future__ import annotations

import pytest

from _calls import changed, clear_caches, make, snapshot
from _mutation_table import ROWS, apply

SEED = 11
ALLOWED = ("allowed", "valid options")


def _raise_bad(row, warm: bool):
    clear_caches()
    bad = make(row.entry, SEED)
    apply(bad, dict(row.base))
    stages = apply(bad, row.changes)
    wrapper = None
    if warm:
        good = make(row.entry, SEED)
        apply(good, dict(row.base))
        if good.wrapper:
            wrapper = good.new_wrapper()
            good.check(good.invoke(wrapper))
        else:
            good.check(good.invoke())
    before = snapshot(bad)
    with pytest.raises((ValueError, TypeError)) as info:
        if not bad.wrapper:
            bad.invoke()
        elif "ctor" in stages or wrapper is None:
            bad.invoke()
        elif "plan" in stages:
            bad.invoke(wrapper)
        else:  # run-only change: the warm wrapper runs again without a new plan
            wrapper.run(*bad.args, **bad.kw)
    return info.value, before


def _check(row, exc, before):
    msg = str(exc)
    assert type(exc) is row.exc, f"{type(exc).__name__} instead of {row.exc.__name__}: {msg}"
    missing = [w for w in row.words if w not in msg]
    assert not missing, f"message lacks {missing}: {msg}"
    assert any(w in msg for w in ALLOWED), f"message does not say what is allowed: {msg}"
    internal = [w for w in row.forbid if w in msg]
    assert not internal, f"message blames an internal name {internal}: {msg}"
    modified = changed(before)
    assert not modified, f"the failed call modified {modified}"


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
@pytest.mark.parametrize("state", ["cold", "warm"])
def test_bad_input(row, state):
    exc, before = _raise_bad(row, warm=state == "warm")
    _check(row, exc, before)


def test_battery_size():
    ids = [r.id for r in ROWS]
    assert len(set(ids)) == len(ids), "duplicate kinds"
    assert len(ids) >= 150
    assert {r.entry for r in ROWS} == {"cudnn", "trtllm", "xqa", "paged", "ragged", "single", "single_lse"}
