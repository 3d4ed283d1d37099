"""``dispatch.explain(entry, *args, **kwargs)``: the router's Decision for a call, without running it.

``entry`` is one of the entry-point functions (validated exactly as the function validates,
then decided) or a planned wrapper: ``explain(wrapper)`` returns the decision made at plan time;
``explain(wrapper, q, kv, ...)`` (run's arguments) validates the run and returns the decision of
the variant that run would use (sinks / LSE / window override), without launching anything.
"""
from __future__ import annotations

import functools
import inspect

from . import policy, router
from .decode import _xqa_prepare, xqa_batch_decode_with_kv_cache
from .prefill import (_cudnn_prepare, _single_prepare, _trtllm_prepare, cudnn_batch_prefill_with_kv_cache,
                      single_prefill_with_kv_cache, trtllm_batch_context_with_kv_cache)
from .wrappers import _Wrapper

_FUNCTIONS = {
    trtllm_batch_context_with_kv_cache: (_trtllm_prepare, None),
    xqa_batch_decode_with_kv_cache: (_xqa_prepare, None),
    cudnn_batch_prefill_with_kv_cache: (_cudnn_prepare, "backend"),
    single_prefill_with_kv_cache: (_single_prepare, "backend"),
}


def explain(entry, *args, **kwargs) -> router.Decision:
    """Validate like ``entry`` would and return the router Decision (chosen, rejected with reasons,
    fallbacks). Raises the same ValueError/TypeError as the entry point for bad arguments, and
    BackendRefusedError / NoBackendError when nothing can serve."""
    if isinstance(entry, _Wrapper):
        return _explain_wrapper(entry, args, kwargs)
    if isinstance(entry, functools.partial):
        kwargs = {**entry.keywords, **kwargs}
        args = entry.args + args
        entry = entry.func
    if entry not in _FUNCTIONS:
        names = ", ".join(f.__name__ for f in _FUNCTIONS)
        raise ValueError(f"entry={entry!r}: allowed one of {names}, or a planned wrapper")
    prepare, backend_arg = _FUNCTIONS[entry]
    bound = inspect.signature(entry).bind(*args, **kwargs)
    bound.apply_defaults()
    call = dict(bound.arguments)
    explicit = policy.explicit_choice(call.get(backend_arg) if backend_arg else None)
    problem, batch = prepare(call)[:2]
    return router.decide(problem, router.live_device(batch.q), explicit)


def _explain_wrapper(wrapper: _Wrapper, args, kwargs) -> router.Decision:
    if wrapper._plan is None:
        raise ValueError(f"entry={type(wrapper).__name__}(...): allowed a wrapper after plan(...)")
    if not args and not kwargs:
        return wrapper.decision
    captured = {}

    def fake_launch(q, k, v, out, lse, return_lse, sinks, window_left, sm_scale, out_scale):
        p = wrapper._plan
        window = p.window_left if window_left is None else window_left
        key = (sinks is not None, return_lse or lse is not None, window)
        problem = wrapper._plan.problem
        if key != (False, False, problem.window_left):
            problem = type(problem)(**{**vars(problem), "has_sinks": key[0], "return_lse": key[1],
                                       "window_left": window})
        captured["decision"] = router.decide(problem, router.live_device(q), wrapper._explicit)

    wrapper._launch, saved = fake_launch, None  # instance attribute shadows the method for one call
    try:
        wrapper.run(*args, **kwargs)
    finally:
        del wrapper._launch
    return captured["decision"]
