"""The call pipeline every entry point shares: signatures, keys, lanes, launch.

Glossary (one word per concept; a reader of the hot path needs these ten):

entry        a public function or wrapper method with FlashInfer's signature (``ENTRIES``).
declaration  what an entry module states once (``Declaration``): its spec's argument names in
             call order, how to build the problem, the sizes a repeat needs, which dims and
             scalars vary per call, which arguments nothing reads.
spec         the pydantic model of one entry's arguments, in that entry's module; its checks
             (static, size, value: ``dispatch.checks``) name the argument, its value, what is allowed.
key          the call key: every fact the spec's static checks read (types, dtypes, devices, fixed
             dims, options, the size class); it maps to a ``Proof`` (the problem, its decisions,
             the reusable plans), so a known key runs only the size checks.
problem      ``AttentionProblem``: the hashable facts that decide the backend (no per-call sizes).
decision     the router's choice for (problem, device, explicit choice, strict mode), with every
             backend's reasons; ``dispatch.last_decision()`` is this context's latest.
plan         a backend's prepared state for one problem (a vendor plan: a FlashInfer wrapper, a
             cuDNN graph); kept per key when the backend says it is reusable. FlashInfer's
             wrappers make theirs in ``plan()``; nothing else is called a plan.
lane         what an exact repeat finds by its lane key (every argument's type and value, every
             tensor's dtype, device, shape and strides): the proof, the sizes, the plan, the
             launcher, kept views of its tensors. Functions and wrapper runs alike:
             ``Declaration.lane`` finds it in a call cache (``Calls``: lanes and proofs, the
             latest lane's key compared before any hashing): one per function entry (sharing
             ``LANES`` and ``PROOFS``), one per wrapper plan.
batch        ``AttentionBatch``: this call's tensors and sizes, what a backend runs on.
launcher     the backend's closure that launches a kept plan on a new batch (no host work).

The call path (functions and wrapper runs alike)::

    entry(*args) -- values in declared order --> lane key --hit--> lane ------------+
                                                   | miss                          |
                                                   v                               |
              spec checks (static: once per key; size: every call)                 |
                                                   v                               |
              key -> proof: problem -> decision (router) -> plan (backend)          |
                                                   v                               v
                                           lane (kept) --> batch --> launcher or backend.run --> kernel

**Signatures.** The seed documents fix every parameter's name, order, kind and default. Newer
FlashInfer spellings are extra keyword-only parameters. Where a seed parameter has such an
alias, both default to the ``UNSET`` sentinel in the code (so "given twice" is detectable,
even when the value given equals the default) and ``seed_signature`` publishes the seed's own
defaults through ``__signature__`` (what ``inspect.signature`` and ``help`` show).

**What a repeat may skip.** A lane key holds every argument's type and value (tensors: dtype,
device, shape, strides), so an exact repeat skips every check; a call key holds what the static
checks read, and the dims that vary per call (``vary``) and per-call scalars (``per_call``) are
re-checked by the spec's size checks on every call. CPU tensors and ATTN_DISPATCH_VALIDATE=full
re-read device data on every call. Only these two keys decide what is skipped.
"""
from __future__ import annotations

import contextlib
import contextvars
import inspect
from types import MappingProxyType, SimpleNamespace
from typing import Any, Callable, Hashable, Iterator, Mapping, Optional

import torch

from backends import BoundedCache, get_backend
from backends.base import BackendRejected

from ..checks import cache_halves, full_validation, paged_nhd, split_kv

from .. import autotune, checks, devices, policy, router
from ..problem import AttentionProblem, size_class


class _Unset:
    """Default of a parameter that has two spellings (never a user value)."""

    _instance: Optional["_Unset"] = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "<unset>"


UNSET: Any = _Unset()
REQUIRED_SHOWN = inspect.Parameter.empty  # how seed_signature shows a required parameter


def seed_signature(fn: Callable, shown: Mapping[str, Any]) -> Callable:
    """Publish the seed's defaults for parameters the code defaults to UNSET.

    ``shown`` maps a parameter name to the default the seed shows (``inspect.Parameter.empty``
    for a required one); every UNSET default not listed shows as None (an alias).
    """
    sig = inspect.signature(fn)
    params = []
    for p in sig.parameters.values():
        if p.default is UNSET:
            p = p.replace(default=shown.get(p.name, None))
        params.append(p)
    fn.__signature__ = sig.replace(parameters=params)
    return fn


def one_of(seed_name: str, seed_value: Any, new_name: str, new_value: Any, default: Any) -> Any:
    """The value of a parameter spelled two ways; TypeError naming both when both are given."""
    if new_value is UNSET:
        return default if seed_value is UNSET else seed_value
    if seed_value is not UNSET:
        raise TypeError(f"{seed_name}= and {new_name}= are two spellings of one parameter "
                        f"(the seed's and FlashInfer's newer one): give one of them, not both")
    return new_value


def no_multi_item_scoring(prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len, max_item_len_ptr) -> None:
    """FlashInfer's multi-item scoring (a plan's prefix lengths and item positions) changes what is
    attended; no backend of ours serves it, so it is refused, never dropped."""
    given = {"prefix_len_ptr": prefix_len_ptr, "token_pos_in_items_ptr": token_pos_in_items_ptr,
             "max_item_len_ptr": max_item_len_ptr}
    for name, value in given.items():
        if value is not None:
            raise checks.bad(name, value, "None: multi-item scoring (FlashInfer's prefix and item masks) is not "
                             "served by any backend of attn-dispatch")
    if token_pos_in_items_len:
        raise checks.bad("token_pos_in_items_len", token_pos_in_items_len, "0: multi-item scoring is not served")


def required(name: str, value: Any, where: str) -> Any:
    if value is UNSET:
        raise TypeError(f"{where}() missing required argument: {name!r}")
    return value


# -- documented argument forms ----------------------------------------------------------------------
def int32_lengths(lengths: Any) -> Any:
    """uint32 lengths (the seed's dtype for ``seq_lens``) as an int32 view: no copy, and a value
    >= 2**31 shows as negative, which the value checks refuse."""
    if isinstance(lengths, torch.Tensor) and lengths.dtype == torch.uint32:
        return lengths.view(torch.int32)
    return lengths


def sinks_tensor(sinks: Any, query: Any) -> Any:
    """``sinks`` as the seed types it (a list: of floats, of one (Hq,) tensor, or of 0-dim
    tensors) -> one fp32 (Hq,) tensor on the query's device; other values pass through to the
    spec, which names what is allowed."""
    if not isinstance(sinks, (list, tuple)) or not sinks or not isinstance(query, torch.Tensor):
        return sinks
    if all(isinstance(s, torch.Tensor) for s in sinks):
        if len(sinks) == 1 and sinks[0].dim() == 1:
            return sinks[0]
        if all(s.dim() == 0 for s in sinks):
            return torch.stack(list(sinks))
        return sinks
    if all(isinstance(s, (int, float)) and not isinstance(s, bool) for s in sinks):
        return torch.tensor([float(s) for s in sinks], dtype=torch.float32, device=query.device)
    return sinks


# -- cache keys ---------------------------------------------------------------------------------
ROWS = (0,)  # the usual varying dim: tokens, pages or KV rows
ALL_DIMS = tuple(range(8))  # every dim varies (index tensors): dtype, device and rank only
FULL: tuple = ()  # no dim varies (a wrapper's run: the plan fixes every size)


def tensor_facts(t: torch.Tensor, vary: tuple[int, ...] = ROWS) -> tuple:
    """dtype, device (with index), the fixed dims (varying ones left out, the rank kept), and
    whether the last stride is 1. The two common cases skip the generic loop (hot path)."""
    unit = t.dim() == 0 or t.stride(-1) == 1
    if vary is FULL:
        return (t.dtype, t.device, t.shape, unit)
    if vary is ROWS:
        return (t.dtype, t.device, t.dim(), t.shape[1:], unit)
    if vary is ALL_DIMS:
        return (t.dtype, t.device, t.dim(), unit)
    return (t.dtype, t.device, t.dim(), tuple(n for i, n in enumerate(t.shape) if i not in vary), unit)


_PLAIN = (bool, int, float, str, torch.dtype, _Unset, type(None))
_PLAIN_TYPES = frozenset(_PLAIN)  # a type's membership in one hash (the keys' hot loops)


class _NothingVaries(dict):
    def get(self, name, default=None):
        return FULL


_NOTHING_VARIES = _NothingVaries()
NOTHING_VARIES: Mapping[str, tuple] = _NOTHING_VARIES  # a Declaration's vary when every size is fixed (a wrapper's run)


def value_facts(value: Any, vary: tuple[int, ...] = ROWS) -> Hashable:
    if type(value) in _PLAIN_TYPES:  # the type too: True and 1 are equal keys otherwise
        return (type(value), value)
    if isinstance(value, torch.Tensor):
        return tensor_facts(value, vary)
    if isinstance(value, (tuple, list)):
        return (type(value),) + tuple(value_facts(v, vary) for v in value)
    return type(value)


def call_key(entry: str, args: Mapping[str, Any], vary: Optional[Mapping[str, tuple[int, ...]]],
             per_call: tuple[str, ...] = ()) -> tuple:
    """The key of one call. ``vary``: per tensor argument, the dims whose size varies per call
    (default: ROWS, dim 0); ``per_call``: scalar arguments whose value varies per call (their
    type only: the spec's size checks test their values on every call). ``vary=None``: every
    tensor's whole shape is in the key (nothing varies)."""
    parts: list = [entry]
    if vary is None:
        vary = _NOTHING_VARIES
    for name, value in args.items():
        kind = type(value)
        if kind in _PLAIN_TYPES:  # inlined value_facts: the common case on the hot path
            parts.append(kind if name in per_call else (kind, value))
        elif kind is torch.Tensor:
            parts.append(tensor_facts(value, vary.get(name, ROWS)))
        else:
            parts.append(value_facts(value, vary.get(name, ROWS)))
    return tuple(parts)


class Proof:
    """What a call key proves, kept between calls: the problem, and its routing decisions per
    (explicit choice, strict mode) — so a repeated call neither rebuilds nor re-hashes the
    problem. The decision is the device's: the key holds the device index."""

    __slots__ = ("problem", "_decisions", "_planned", "wrapper")

    def __init__(self, problem: AttentionProblem, wrapper: Optional[str] = None):
        self.problem = problem
        self._decisions: dict = {}
        self._planned: dict = {}  # (explicit, strict) -> a backend plan the backend says is reusable
        # a wrapper's run (its class name): the wrapper's plan fixes every size, so the backend's
        # plan is always kept, and is never made inside a CUDA-graph capture
        self.wrapper = wrapper

    def decision(self, query: torch.Tensor, explicit, batch=None, strict: Optional[bool] = None) -> router.Decision:
        # a function entry's call inside a CUDA-graph capture is decided again (only backends a graph
        # can hold); a wrapper's plan decided already, with its use_cuda_graph. ``batch``: the call's,
        # whose lengths a decision that times (a warm-up's new bucket) is timed on
        key = (explicit, policy.strict_mode() if strict is None else strict,
               self.wrapper is None and query.is_cuda and torch.cuda.is_current_stream_capturing())
        decision = self._decisions.get(key)
        if decision is None:
            lengths = (lambda: router.batch_lengths(batch)) if batch is not None else None
            decision = router.decide(self.problem, devices.live_device(query), explicit, key[1], lengths=lengths)
            self._decisions[key] = decision
        return decision

    def keep(self, planned: router.Planned) -> router.Planned:
        """Keep a plan made before the first call (a wrapper's plan()) for its decision's key, and
        its decision for the runs of that explicit choice and strict mode (a wrapper's decision is
        its plan's: its runs' key never counts a capture), so a first run decides nothing again."""
        d = planned.decision
        self._planned[(d.explicit, d.strict, d.chosen)] = planned
        if self.wrapper is not None:
            self._decisions.setdefault((d.explicit, d.strict, False), d)
        return planned

    def keeps(self, planned: router.Planned) -> bool:
        """Whether ``planned`` is the plan kept for its (explicit, strict, chosen) key."""
        d = planned.decision
        return self._planned.get((d.explicit, d.strict, d.chosen)) is planned

    def planned(self, batch, explicit, strict: Optional[bool] = None) -> router.Planned:
        """The backend's plan: kept per call key when it reads nothing a later call could change."""
        decision = self.decision(batch.q, explicit, batch, strict)
        key = (decision.explicit, decision.strict, decision.chosen)  # a capture's decision may choose another
        planned = self._planned.get(key)
        if planned is None:
            if self.wrapper is not None and batch.q.is_cuda and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(f"{self.wrapper}.run() planned its backend inside CUDA-graph capture: "
                                   "call run() once outside the capture with the same arguments first")
            planned = router.plan(decision, batch)
            if self.wrapper is not None or get_backend(planned.backend).plan_reusable(self.problem):
                self._planned[key] = planned
        return planned


PROOFS = BoundedCache(maxsize=4096)  # call key -> Proof (model configurations)
TYPED_KEYS = BoundedCache(maxsize=1024)  # keys of argument types a full (pydantic) validation accepted


class _EveryDimVaries(dict):
    """``call_key``'s ``vary`` for a typed key: every dim of every tensor varies (ALL_DIMS), so the
    key holds each tensor's dtype, device and rank, never a size."""

    def get(self, name, default=None):
        return ALL_DIMS


_EVERY_DIM_VARIES = _EveryDimVaries()


def validate_typed(spec_cls: type, args: dict) -> tuple:
    """(spec, derived) of a call without a proof yet: a wrapper's plan (an engine plans every step
    with new index values and the same kinds of arguments), a wrapper's first run after it, a
    function entry's new size class. The first call of a typed key is validated in full (pydantic's
    types, then every check); a call whose typed key was seen runs every check of the spec on its
    values without pydantic. The typed key proves what pydantic checked: each argument's type, each
    tensor's dtype, device and rank (their sizes vary), each scalar's value."""
    key = call_key(spec_cls.__name__, args, _EVERY_DIM_VARIES)
    if TYPED_KEYS.get(key) is None:
        validated = checks.validate(spec_cls, args)
        TYPED_KEYS.put(key, True)
        return validated
    return spec_cls.plain(spec_cls.with_defaults(args))


LANES = BoundedCache(maxsize=1024, refresh=False)  # lane key -> Lane; first in, first out: a hit is one lookup


_NO_LATEST = (object(), None)  # a Calls' latest before any lane: no key equals it


class Calls:
    """The call cache: lane key -> ``Lane`` (``lanes``), call key -> ``Proof`` (``proofs``), and the
    latest lane found (``latest``). One per function entry (its declaration's ``calls``: the shared
    ``LANES`` and ``PROOFS``, its own latest lane); one per wrapper plan, made by ``plan()``
    and dropped with it (its lanes hold that plan's backend plans): there ``fixed`` holds the
    arguments the plan fixes (the spec's ``planned``) and ``variants`` shares one proof per
    problem among the plan's call keys (one backend plan per variant of the plan's problem)."""

    __slots__ = ("lanes", "proofs", "fixed", "variants", "wrapper", "latest")

    def __init__(self, lanes: BoundedCache, proofs: BoundedCache, fixed: Optional[Mapping[str, Any]] = None,
                 variants: Optional[BoundedCache] = None, wrapper: Optional[str] = None):
        self.lanes, self.proofs, self.fixed, self.variants, self.wrapper = lanes, proofs, fixed, variants, wrapper
        # (lane key, lane) of the latest lane found: a repeat of it compares its key to that one,
        # without hashing it (~0.2 us); replaced whole (another thread reads one pair or the other)
        self.latest: tuple = _NO_LATEST

    def proof(self, problem: AttentionProblem) -> Proof:
        if self.variants is None:
            return Proof(problem)
        proof = self.variants.get(problem)
        if proof is None:
            proof = Proof(problem, self.wrapper)
            self.variants.put(problem, proof)
        return proof

    def clear(self) -> None:
        self.latest = _NO_LATEST
        self.lanes.clear()
        self.proofs.clear()
        if self.variants is not None:
            self.variants.clear()


# every declaration's own call cache (``Declaration.calls``; a wrapper's run passes its plan's)
FUNCTION_CALLS: list[Calls] = []


# CPU tensors re-run the device-data (value) checks on every call: they are cheap there. Tests turn
# this off to drive the GPU's cached path on the CPU.
CPU_VALUE_CHECKS = True


def values_every_call(device: torch.device) -> bool:
    """Whether a known key still re-reads device data (lengths, page ids) on this call."""
    return (CPU_VALUE_CHECKS and device.type == "cpu") or full_validation()


def checked(spec_cls: type, args: dict, key: Optional[tuple], query: Any, build: Callable,
            proofs: BoundedCache = PROOFS, values: Optional[bool] = None):
    """(proof, spec, derived). A new key: the full spec (every check, device reads included)
    and its proof (``build``). A known key: the spec's size checks, plus its value checks for CPU
    tensors or under ATTN_DISPATCH_VALIDATE=full (the key proves the static checks still hold);
    ``values``: whether they run, when the caller knows already (``values_every_call``)."""
    proof = proofs.get(key)
    if proof is None:
        spec, derived = validate_typed(spec_cls, args)
        proof = build(spec, derived)
        proofs.put(key, proof)
        return proof, spec, derived
    # A known key proves ``query`` is a tensor (its facts are in the key).
    spec, derived = spec_cls.fast(args, values=values_every_call(query.device) if values is None else values)
    return proof, spec, derived


# -- the fast lane -------------------------------------------------------------------------------
# A call that repeats another exactly (every tensor's dtype, device, shape and strides; every other
# argument's value and type; the explicit choice and strict mode in force), as the layers of one
# decode step do, skips every check, the problem and the decision: its lane holds the call plan
# and the sizes the batch is built from. The key is built from the arguments as they arrive.
_TENSOR = torch.Tensor


def _facts(value: Any):
    """A lane key's part for one argument; None when the key cannot hold it (the call is checked)."""
    kind = type(value)
    if kind is _TENSOR:
        return (value.dtype, value.device, value.shape, value.stride())
    if kind in _PLAIN_TYPES:
        return (kind, value)
    if kind is tuple or kind is list:
        inner = tuple(_facts(v) for v in value)
        return None if None in inner else (kind,) + inner
    return None


def lanes_open(query: torch.Tensor) -> bool:
    """Whether a call with this query tensor may take a lane: not a CPU query while CPU value checks
    are on, not under ATTN_DISPATCH_VALIDATE=full, not a dry run (explain)."""
    return not (CPU_VALUE_CHECKS and query.is_cpu) and not _DRY.get() and not full_validation()


class _Form:
    """How a lane key reads one sequence of argument types (cached per types): the values of the
    plain ones, the dtype, device, shape and strides of the tensors, the facts of sequences (a
    (k, v) pair), nothing of the ``unread`` ones (a workspace: their type is the form's).
    ``match(values, explicit, strict)`` returns ``MISS`` when the values have another form, None when
    the key cannot hold an argument (the call is checked), else the key. A sequence of tensors (a (k,
    v) pair) is part of the form (its type, length and element types: ``form_kinds``): its tensors'
    facts are read in place, as an argument tensor's. Which positions hold what is worked out once,
    here; a call compares its types in one step and reads each group of positions."""

    __slots__ = ("types", "pairs", "tensors", "plain", "nested", "closed")

    def __init__(self, kinds: tuple, unread: frozenset):
        types, pairs, tensors, plain, nested, closed = [], [], [], [], [], False
        for i, kind in enumerate(kinds):
            inner = ()
            if type(kind) is tuple:  # (sequence type, element types...)
                kind, inner = kind[0], kind[1:]
            types.append(kind)
            pair = len(inner) if inner and all(k is _TENSOR for k in inner) else 0
            if pair:
                pairs.append((i, pair))
            if kind is _NONE or i in unread:  # None: the form (its types) says all there is
                continue
            if pair:
                continue
            if kind is _TENSOR:
                tensors.append(i)
            elif kind in _PLAIN_TYPES:
                plain.append(i)
            elif kind is tuple or kind is list:
                nested.append(i)
            else:
                closed = True
        self.types, self.pairs, self.tensors = tuple(types), tuple(pairs), tuple(tensors)
        self.plain, self.nested, self.closed = tuple(plain), tuple(nested), closed

    def match(self, values: tuple, explicit, strict):
        if tuple(map(type, values)) != self.types:
            return MISS
        key = [self, explicit, strict]
        for i, n in self.pairs:
            pair = values[i]
            if len(pair) != n or any(type(t) is not _TENSOR for t in pair):
                return MISS
            for t in pair:
                key += (t.dtype, t.device, t.shape, t.stride())
        if self.closed:
            return None
        for i in self.tensors:
            t = values[i]
            key += (t.dtype, t.device, t.shape, t.stride())
        key += [values[i] for i in self.plain]
        if self.nested:
            facts = [_facts(values[i]) for i in self.nested]
            if None in facts:
                return None
            key += facts
        return tuple(key)


MISS = object()  # a form's match: the values have another form
_NONE = type(None)


class _NoForm:
    """The latest form before any call: every values tuple has another form."""

    @staticmethod
    def match(values, explicit, strict):
        return MISS


class Forms:
    """The forms of one caller's lane keys, per sequence of argument types (a few per entry), with
    the latest kept aside (``latest``, read by ``Declaration.lane``): a repeat's values match it
    (one compiled guard, no hashing of types)."""

    __slots__ = ("unread", "_forms", "latest")

    def __init__(self, unread: frozenset = frozenset()):
        self.unread, self._forms, self.latest = unread, {}, _NoForm

    def new_form(self, values: tuple, explicit, strict: bool) -> Optional[tuple]:
        """The key of values of another form than the latest's (that form becomes the latest)."""
        kinds = form_kinds(values)
        form = self._forms.get(kinds)
        if form is None:
            form = self._forms[kinds] = _Form(kinds, self.unread)
        self.latest = form  # one attribute: another thread replaces it whole
        return form.match(values, explicit, strict)


def form_kinds(values: tuple) -> tuple:
    """Every value's type; a short tuple or list (a (k, v) pair): (its type, its elements' types),
    a form holds both (longer ones: their type; the key reads their facts through ``_facts``)."""
    return tuple((type(v),) + tuple(map(type, v)) if (type(v) is tuple or type(v) is list) and len(v) <= 4
                 else type(v) for v in values)


def size_key(batch: Any, max_q: Any, max_kv: Any) -> Optional[tuple]:
    """The size class of a call (``size_class``), or None while a size is not a positive int (an
    invalid call: its checks name the argument). It joins the call key and the problem."""
    if type(batch) is int and type(max_q) is int and type(max_kv) is int and min(batch, max_q, max_kv) > 0:
        return size_class(batch, max_q, max_kv)
    return None


def rows(t: Any, dim: int = 0) -> Any:
    """``t.shape[dim]`` of a tensor of rank > dim, else None (the checks name a bad argument)."""
    return t.shape[dim] if isinstance(t, torch.Tensor) and t.dim() > dim else None


class Lane:
    """What a lane key proves: the proof of its call key, the explicit choice and strict mode of
    the key, the sizes the batch is built from, the backend's plan once it is known to be reusable, and the
    backend's launcher for repeats once the lane repeats (``Backend.launcher``): a serving stream's
    new batches each make a lane that is called once, and a launcher nobody calls is host time lost.
    ``early``: the lane before it repeated (an engine's step calls each new batch once per layer), so
    this one asks for its launcher on its first call, when its backend can give one without a run."""

    __slots__ = ("proof", "explicit", "strict", "sizes", "planned", "fast", "asked", "ran", "kept", "early")

    def __init__(self, proof: Proof, explicit, sizes: SimpleNamespace, strict: Optional[bool] = None,
                 early: bool = False):
        self.proof, self.explicit, self.sizes, self.early = proof, explicit, sizes, early
        self.strict = policy.strict_mode() if strict is None else strict  # the mode its key was made in
        # kept views of its tensors (backends._device.kept_views' store) once kept under its lane key,
        # which proves their dtype, device, shape and strides on every call that finds it
        self.kept: Optional[dict] = None
        self.planned: Optional[router.Planned] = None
        self.fast: Optional[Callable] = None
        self.asked = False  # the backend was asked for a launcher (it may have none)
        self.ran = False  # its kept plan served a call: the next one asks for the launcher

    def launch(self, batch) -> router.Planned:
        """The backend's launcher on a repeat; else its plan (kept when reusable) and the launch;
        only the decision when dry. The decision that served is this context's last decision."""
        fast = self.fast
        if fast is not None:
            try:
                fast(batch)
                decision = self.planned.decision
                if _LAST.get() is not decision:  # a set costs ~0.1 us; a repeat's is usually in place
                    _LAST.set(decision)
                return self.planned
            except BackendRejected:  # refused before launching: the router hands the call over
                return remember(router.run(self.planned, batch))
        planned = self.planned
        if planned is None:
            if is_dry():
                decision = self.proof.decision(batch.q, self.explicit)
                return remember(router.Planned(decision, decision.chosen, None))
            planned = self.proof.planned(batch, self.explicit, self.strict)
            if self.proof.keeps(planned):
                self.planned = planned
        if (self.ran or self.early) and not self.asked and planned is self.planned and not _capturing(batch.q):
            # asked on the lane's first repeat, after a run of its plan (or on its first call when
            # ``early``), never inside a CUDA-graph capture (a launcher may allocate what it fixes:
            # the capture's replays run what it recorded); the call itself takes it (an engine's
            # second layer: a run and then a launcher would cost both)
            self.asked = True
            self.fast = get_backend(planned.backend).launcher(planned.plan, batch)
            if self.fast is not None:
                return self.launch(batch)
            self.asked = self.ran  # declined before any run (a launcher recorded by a run): asked again then
        ran = router.run(planned, batch)
        if ran is self.planned:
            self.ran = True
        return remember(ran)


def _capturing(query: torch.Tensor) -> bool:
    return query.is_cuda and torch.cuda.is_current_stream_capturing()


class Declaration:
    """One entry point's per-call facts, declared once in its module (see the glossary above).

    ``params``: the spec's argument names in the order the entry passes their values; ``spec``:
    its pydantic model; ``problem(spec, derived, size)`` -> AttentionProblem; ``sizes(args,
    derived)``: what a repeat builds its batch from; ``size(args)`` -> (batch, max q, max kv);
    ``vary`` (a mapping, or a function of the arguments): per tensor, the dims that vary per
    call; ``per_call``: scalars whose value varies per call; ``facts(args)``: more call-key
    facts; ``unread``: arguments nothing reads (their type alone joins the keys)."""

    __slots__ = ("entry", "spec", "params", "problem", "sizes", "size", "vary", "per_call", "facts", "forms",
                 "calls")

    def __init__(self, entry: str, spec: type, params: tuple, *, problem: Callable, sizes: Callable,
                 size: Optional[Callable] = None, vary: Any = None, per_call: tuple = (),
                 facts: Optional[Callable] = None, unread: tuple = ()):
        unknown = set(params) - set(spec.model_fields)
        if unknown:
            raise TypeError(f"{entry}: {sorted(unknown)} are not fields of {spec.__name__}")
        self.entry, self.spec, self.params = entry, spec, params
        self.problem, self.sizes, self.size = problem, sizes, size
        self.vary, self.per_call, self.facts = vary if vary is not None else {}, per_call, facts
        self.forms = Forms(frozenset(params.index(name) for name in unread))
        # a function's call cache (a wrapper's run passes its plan's): entries called in turn keep
        # their own latest lanes
        self.calls = Calls(LANES, PROOFS)
        FUNCTION_CALLS.append(self.calls)

    def lane(self, values: tuple, explicit, calls: Optional[Calls] = None) -> "Lane":
        """The lane of the call whose argument values are ``values`` (in ``params`` order; a wrapper's
        run: the arguments its plan fixes are ``calls.fixed``): an exact repeat's, else a checked
        call's (the full checks once per call key, the size checks on every call), kept under its
        lane key in ``calls`` (default: the declaration's)."""
        if calls is None:
            calls = self.calls
        # The lane key (None: the call is checked): every argument's type (through its form), every
        # plain value, every tensor's dtype, device, shape and strides, the explicit choice and strict
        # mode. None for a CPU query while CPU value checks are on, under ATTN_DISPATCH_VALIDATE=full,
        # or in a dry run (explain). Inline (a repeat's frames count): the latest form's compiled match.
        query, key, strict = values[0], None, None
        if type(query) is _TENSOR and not ((CPU_VALUE_CHECKS and query.is_cpu) or _DRY.get() or full_validation()):
            strict = policy.strict_mode()
            forms = self.forms
            key = forms.latest.match(values, explicit, strict)
            if key is MISS:
                key = forms.new_form(values, explicit, strict)
            if key is not None:
                latest = calls.latest
                if key == latest[0]:
                    return latest[1]
                found = calls.lanes.get(key)
                if found is not None:
                    calls.latest = (key, found)
                    return found
        args = dict(zip(self.params, values))
        if calls.fixed:
            args.update(calls.fixed)
        size = self.size_class(args)
        # a lane key was made: neither CPU value checks nor ATTN_DISPATCH_VALIDATE=full are in force
        proof, _, derived = checked(self.spec, args, self.call_key(args, size), values[0],
                                    lambda spec, d: calls.proof(self.problem(spec, d, size or ())), calls.proofs,
                                    values=False if key is not None else None)
        # a kept lane after one that repeated asks for its launcher early; an unkept one (checked on
        # every call) never builds one
        early = key is not None and calls.latest[1] is not None and calls.latest[1].asked
        found = Lane(proof, explicit, self.sizes(args, derived), strict, early)
        if key is not None:
            found.kept = {}
            calls.lanes.put(key, found)
        return found

    def size_class(self, args: dict) -> Optional[tuple]:
        return size_key(*self.size(args)) if self.size is not None else None

    def call_key(self, args: dict, size: Optional[tuple]) -> tuple:
        vary = self.vary(args) if callable(self.vary) else self.vary
        key = call_key(self.entry, args, vary, self.per_call)
        return key + self.facts(args) + (size,) if self.facts is not None else key + (size,)


def paged_kv(kv_cache, layout: str) -> tuple:
    """The logical NHD (k, v) views of a paged cache that passed the checks (as the specs make)."""
    if type(kv_cache) is _TENSOR and kv_cache.dim() == 5 and kv_cache.shape[1] == 2:
        return cache_halves(kv_cache, layout)  # the common cache
    if type(kv_cache) is tuple and layout == "NHD":
        return kv_cache  # a checked (k, v) pair of 4-D NHD pages: the logical views already
    k, v, squeezed = split_kv(kv_cache, "kv_cache", False)
    return paged_nhd(k, layout, squeezed), paged_nhd(v, layout, squeezed)


NO_EXTRAS: Mapping[str, Any] = MappingProxyType({})  # a batch's extras when the entry has none (read-only)


def new_out(out, rows: int, heads: int, dim: int, dtype, device) -> torch.Tensor:
    return out if out is not None else torch.empty(rows, heads, dim, dtype=dtype, device=device)


def new_lse(lse, rows: int, heads: int, device, wanted: bool):
    if lse is not None or not wanted:
        return lse
    return torch.empty(rows, heads, dtype=torch.float32, device=device)


# -- explain without launching -------------------------------------------------------------------
_DRY: contextvars.ContextVar[bool] = contextvars.ContextVar("attn_dispatch_dry_run", default=False)


@contextlib.contextmanager
def dry_run() -> Iterator[None]:
    """Inside the block an entry validates, decides and records its decision, but neither
    plans a vendor nor launches (``dispatch.explain``)."""
    token, last = _DRY.set(True), _LAST.get()
    try:
        yield
    finally:
        _DRY.reset(token)
        _LAST.set(last)


is_dry: Callable[[], bool] = _DRY.get  # whether this context is a dry run (explain); no Python frame per call


_LAST: contextvars.ContextVar[Optional[router.Decision]] = contextvars.ContextVar("attn_dispatch_last_decision",
                                                                             default=None)


def remember(planned: router.Planned) -> router.Planned:
    """Make ``planned``'s decision this context's last decision (``last_decision``)."""
    if _LAST.get() is not planned.decision:
        _LAST.set(planned.decision)
    return planned


def last_decision() -> Optional[router.Decision]:
    """The router's decision that served the latest call of an entry point or a wrapper's run in
    this context (this thread, this asyncio task); None before any. ``dispatch.explain`` leaves it
    as it was."""
    return _LAST.get()


def clear_caches() -> None:
    for calls in FUNCTION_CALLS:
        calls.clear()


autotune.on_switch(clear_caches)  # the proofs hold decisions: a switch makes them stale
