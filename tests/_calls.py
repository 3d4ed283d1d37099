"""Valid calls of the seven entry points as editable argument lists, with their oracle results.

``make(entry, seed, **cfg)`` returns a ``Call``: the positional ``args`` and keyword ``kw`` of
the call (for the wrappers: of ``run``, plus ``ctor_args``/``ctor_kw`` and ``plan_args``/
``plan_kw``), NaN-poisoned ``out``/``lse`` buffers where the entry takes them, and the fp64
oracle's expected result. Tests edit the lists (a mutation, a documented alternative form) and
call ``invoke()``; ``check(result)`` compares with the oracle (the bands of test_agreement.py).
Entries: cudnn, trtllm, xqa, paged, ragged, single, single_lse.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

import dispatch
from oracle import attention_fp64

ENTRIES = ("cudnn", "trtllm", "xqa", "paged", "ragged", "single", "single_lse")
BAND = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}
LSE_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


@dataclass
class Cfg:
    q_lens: tuple = (3, 1, 5)
    kv_lens: tuple = (9, 4, 13)
    hq: int = 4
    hkv: int = 2
    d: int = 16
    dvo: Optional[int] = None
    page_size: int = 4
    dtype: torch.dtype = torch.float32
    layout: Optional[str] = None  # None: the entry's default, not passed
    causal: bool = True

    @property
    def dv(self) -> int:
        return self.dvo or self.d


@dataclass
class Call:
    entry: str
    cfg: Cfg
    args: list
    kw: dict
    expected: tuple  # (out fp64 packed, lse fp64 packed base 2)
    ctor_args: list = field(default_factory=list)
    ctor_kw: dict = field(default_factory=dict)
    plan_args: list = field(default_factory=list)
    plan_kw: dict = field(default_factory=dict)

    @property
    def wrapper(self) -> bool:
        return self.entry in ("paged", "ragged")

    def new_wrapper(self):
        cls = (dispatch.BatchPrefillWithPagedKVCacheWrapper if self.entry == "paged"
               else dispatch.BatchPrefillWithRaggedKVCacheWrapper)
        return cls(*self.ctor_args, **self.ctor_kw)

    def plan(self, w=None):
        w = w if w is not None else self.new_wrapper()
        w.plan(*self.plan_args, **self.plan_kw)
        return w

    def invoke(self, w=None):
        if self.wrapper:
            return self.plan(w).run(*self.args, **self.kw)
        return FUNCTIONS[self.entry]()(*self.args, **self.kw)

    def tensors(self) -> dict:
        """Every tensor the call receives, by a readable name (tuples and lists flattened)."""
        found = {}
        for where, items in (("ctor", enumerate(self.ctor_args)), ("ctor", self.ctor_kw.items()),
                             ("plan", enumerate(self.plan_args)), ("plan", self.plan_kw.items()),
                             ("arg", enumerate(self.args)), ("kw", self.kw.items())):
            for name, value in items:
                values = value if isinstance(value, (tuple, list)) else [value]
                for i, t in enumerate(values):
                    if isinstance(t, torch.Tensor):
                        found[f"{where}:{name}" + (f"[{i}]" if len(values) > 1 else "")] = t
        return found

    def check(self, result) -> None:
        out, lse = unpack(self.entry, result, self.kw)
        exp_out, exp_lse = self.expected
        compare_out(out, exp_out, self.cfg.dtype)
        if lse is not None:
            if self.entry == "cudnn":
                lse = torch.cat([lse[b, :n] for b, n in enumerate(self.cfg.q_lens)])
            compare_lse(lse, exp_lse, self.cfg.dtype)


FUNCTIONS = {"cudnn": lambda: dispatch.cudnn_batch_prefill_with_kv_cache,
             "trtllm": lambda: dispatch.trtllm_batch_context_with_kv_cache,
             "xqa": lambda: dispatch.xqa_batch_decode_with_kv_cache,
             "single": lambda: dispatch.single_prefill_with_kv_cache,
             "single_lse": lambda: dispatch.single_prefill_with_kv_cache_return_lse}


def unpack(entry, result, kw) -> tuple:
    if entry == "xqa":
        return result, None
    if entry in ("cudnn", "single_lse") or kw.get("return_lse"):
        return result[0], result[1]
    return result, None


def compare_out(out: torch.Tensor, ref: torch.Tensor, dtype) -> None:
    assert tuple(out.shape) == tuple(ref.shape), f"out shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
    got = out.double()
    assert not torch.isnan(got).any(), f"{int(torch.isnan(got).sum())} output elements NaN (unwritten?)"
    err = float(torch.linalg.vector_norm(got - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-30))
    assert err < BAND[dtype], f"rel. Frobenius error {err:.3e} >= {BAND[dtype]:g}"


def compare_lse(lse: torch.Tensor, ref: torch.Tensor, dtype) -> None:
    assert lse.dtype == torch.float32 and tuple(lse.shape) == tuple(ref.shape), f"lse {lse.dtype} {tuple(lse.shape)}"
    got, masked = lse.double(), torch.isneginf(ref)
    assert torch.equal(torch.isneginf(got), masked), "-inf LSE rows differ from the oracle's"
    tol = LSE_TOL[dtype]
    err = ((got - ref).abs() - tol * ref.abs())[~masked]
    assert err.numel() == 0 or float(err.max()) <= tol, f"LSE off by {float(err.max()) + tol:.3e}"


# -- random data ------------------------------------------------------------------------------------
def indptr(lens) -> torch.Tensor:
    return torch.tensor([0] + list(torch.tensor(list(lens), dtype=torch.int64).cumsum(0).tolist()),
                        dtype=torch.int32)


def poisoned(*shape) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=torch.float32)


@dataclass
class Pool:
    k: torch.Tensor  # (pages, P, Hkv, D) logical NHD
    v: torch.Tensor
    table: torch.Tensor  # (B, max_pages) int32
    ids: list  # per request page ids
    k_req: list  # per request (kv_len, Hkv, D)
    v_req: list


def make_pool(c: Cfg, g: torch.Generator) -> Pool:
    counts = [max(1, -(-n // c.page_size)) for n in c.kv_lens]
    pages = sum(counts) + 2
    order = torch.randperm(pages, generator=g).tolist()
    k = torch.randn(pages, c.page_size, c.hkv, c.d, generator=g).to(c.dtype)
    v = torch.randn(pages, c.page_size, c.hkv, c.dv, generator=g).to(c.dtype)
    table = torch.randint(0, pages, (len(counts), max(counts) + 1), generator=g, dtype=torch.int32)
    ids, start = [], 0
    for b, n in enumerate(counts):
        ids.append(order[start:start + n])
        table[b, :n] = torch.tensor(ids[-1], dtype=torch.int32)
        start += n
    k_req = [k[i].reshape(-1, c.hkv, c.d)[:n] for i, n in zip(ids, c.kv_lens)]
    v_req = [v[i].reshape(-1, c.hkv, c.dv)[:n] for i, n in zip(ids, c.kv_lens)]
    return Pool(k, v, table, ids, k_req, v_req)


def expected(c: Cfg, qs, ks, vs, sm_scale) -> tuple:
    outs, lses = [], []
    for q, k, v in zip(qs, ks, vs):
        o, lse = attention_fp64(q, k, v, sm_scale=sm_scale, causal=c.causal)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def ws(zero=False) -> torch.Tensor:
    return torch.zeros(1 << 16, dtype=torch.uint8) if zero else torch.empty(1 << 16, dtype=torch.uint8)


# -- builders -------------------------------------------------------------------------------------
def _queries(c: Cfg, g) -> torch.Tensor:
    return torch.randn(sum(c.q_lens), c.hq, c.d, generator=g).to(c.dtype)


def _paged_common(c: Cfg, g):
    q, pool = _queries(c, g), make_pool(c, g)
    exp = expected(c, q.split(list(c.q_lens)), pool.k_req, pool.v_req, c.d ** -0.5)
    return q, pool, exp


def _five_d(pool: Pool, layout: str) -> torch.Tensor:
    k, v = (pool.k, pool.v) if layout == "NHD" else (pool.k.transpose(1, 2), pool.v.transpose(1, 2))
    return torch.stack([k, v], 1)


def build_trtllm(c: Cfg, g) -> Call:
    q, pool, exp = _paged_common(c, g)
    layout = c.layout or "HND"
    n = q.shape[0]
    args = [q, _five_d(pool, layout), ws(), pool.table, torch.tensor(c.kv_lens, dtype=torch.int32), max(c.q_lens),
            max(c.kv_lens), c.d ** -0.5, 1.0, len(c.q_lens), indptr(c.q_lens), indptr([len(i) for i in pool.ids])]
    kw = dict(out=poisoned(n, c.hq, c.dv).to(c.dtype), lse=poisoned(n, c.hq), return_lse=True)
    if c.layout:
        kw["kv_layout"] = c.layout
    return Call("trtllm", c, args, kw, exp)


def build_xqa(c: Cfg, g) -> Call:
    c.q_lens = (1,) * len(c.kv_lens)
    q, pool, exp = _paged_common(c, g)
    layout = c.layout or "NHD"
    args = [q, _five_d(pool, layout), ws(zero=True), pool.table, torch.tensor(c.kv_lens, dtype=torch.int32),
            max(c.kv_lens), c.d ** -0.5, 1.0]
    kw = dict(out=poisoned(q.shape[0], c.hq, c.dv).to(c.dtype))
    if c.layout:
        kw["kv_layout"] = c.layout
    return Call("xqa", c, args, kw, exp)


def build_cudnn(c: Cfg, g) -> Call:
    q, pool, exp = _paged_common(c, g)
    b, n, max_q = len(c.q_lens), q.shape[0], max(c.q_lens)
    qo = indptr(c.q_lens)
    args = [q, pool.k.transpose(1, 2), pool.v.transpose(1, 2), c.d ** -0.5, ws()]
    kw = dict(max_token_per_sequence=max_q, max_sequence_kv=max(c.kv_lens),
              actual_seq_lens_q=torch.tensor(c.q_lens, dtype=torch.int32).view(b, 1, 1, 1),
              actual_seq_lens_kv=torch.tensor(c.kv_lens, dtype=torch.int32).view(b, 1, 1, 1),
              block_tables=pool.table, causal=c.causal, return_lse=True, batch_offsets_q=qo * c.hq * c.d,
              batch_offsets_o=qo * c.hq * c.dv, out=poisoned(n, c.hq, c.dv).to(c.dtype), lse=poisoned(b, max_q, c.hq))
    return Call("cudnn", c, args, kw, exp)


def build_paged(c: Cfg, g) -> Call:
    q, pool, exp = _paged_common(c, g)
    layout = c.layout or "NHD"
    n = q.shape[0]
    indices = torch.tensor([i for ids in pool.ids for i in ids], dtype=torch.int32)
    last = torch.tensor([(kl - 1) % c.page_size + 1 for kl in c.kv_lens], dtype=torch.int32)
    plan_args = [indptr(c.q_lens), indptr([len(i) for i in pool.ids]), indices, last, c.hq, c.hkv, c.d, c.page_size]
    plan_kw = dict(causal=c.causal, q_data_type=c.dtype)
    if c.dvo:
        plan_kw["head_dim_vo"] = c.dvo
    kw = dict(out=poisoned(n, c.hq, c.dv).to(c.dtype), lse=poisoned(n, c.hq), return_lse=True)
    return Call("paged", c, [q, _five_d(pool, layout)], kw, exp, [ws()], {"kv_layout": layout}, plan_args, plan_kw)


def build_ragged(c: Cfg, g) -> Call:
    q = _queries(c, g)
    k = torch.randn(sum(c.kv_lens), c.hkv, c.d, generator=g).to(c.dtype)
    v = torch.randn(sum(c.kv_lens), c.hkv, c.dv, generator=g).to(c.dtype)
    exp = expected(c, q.split(list(c.q_lens)), k.split(list(c.kv_lens)), v.split(list(c.kv_lens)), c.d ** -0.5)
    n = q.shape[0]
    plan_kw = dict(causal=c.causal, q_data_type=c.dtype)
    if c.dvo:
        plan_kw["head_dim_vo"] = c.dvo
    kw = dict(out=poisoned(n, c.hq, c.dv).to(c.dtype), lse=poisoned(n, c.hq), return_lse=True)
    plan_args = [indptr(c.q_lens), indptr(c.kv_lens), c.hq, c.hkv, c.d]
    return Call("ragged", c, [q, k, v], kw, exp, [ws()], {"kv_layout": "NHD"}, plan_args, plan_kw)


def build_single(c: Cfg, g, entry="single") -> Call:
    c.q_lens, c.kv_lens = c.q_lens[:1], c.kv_lens[:1]
    q = _queries(c, g)
    k = torch.randn(c.kv_lens[0], c.hkv, c.d, generator=g).to(c.dtype)
    v = torch.randn(c.kv_lens[0], c.hkv, c.dv, generator=g).to(c.dtype)
    exp = expected(c, [q], [k], [v], c.d ** -0.5)
    if c.layout == "HND":
        k, v = k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous()
    kw: dict[str, Any] = dict(causal=c.causal)
    if c.layout:
        kw["kv_layout"] = c.layout
    if entry == "single":
        kw["return_lse"] = True
    return Call(entry, c, [q, k, v], kw, exp)


BUILDERS = {"cudnn": build_cudnn, "trtllm": build_trtllm, "xqa": build_xqa, "paged": build_paged,
            "ragged": build_ragged, "single": build_single,
            "single_lse": lambda c, g: build_single(c, g, "single_lse")}


def make(entry: str, seed: int = 0, **cfg) -> Call:
    """A valid call of ``entry`` with fresh random inputs (seeded) and its expected result."""
    return BUILDERS[entry](Cfg(**cfg), torch.Generator().manual_seed(seed))


def clear_caches() -> None:
    """Fresh process state: every cache dispatch exposes a ``clear_caches`` for."""
    for name, module in list(sys.modules.items()):
        if name == "dispatch" or name.startswith(("dispatch.", "backends.")):
            fn = getattr(module, "clear_caches", None)
            if callable(fn):
                fn()


def same_bits(a: torch.Tensor, before: torch.Tensor) -> bool:
    """Bitwise equality (NaN poison compares equal to itself), shape and dtype included."""
    if a.shape != before.shape or a.dtype != before.dtype or a.device.type == "meta":
        return a.shape == before.shape and a.dtype == before.dtype
    x, y = a.detach().contiguous().reshape(-1), before.contiguous().reshape(-1)
    if x.dtype == torch.bool:
        return bool(torch.equal(x, y))
    return bool(torch.equal(x.view(torch.uint8), y.view(torch.uint8)))


def snapshot(call: Call) -> dict:
    return {name: (t, t.detach().clone()) for name, t in call.tensors().items()}


def changed(snap: dict) -> list:
    return [name for name, (t, before) in snap.items() if not same_bits(t, before)]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(a.double() - b.double()) /
                 torch.linalg.vector_norm(b.double()).clamp_min(1e-30))



def forced_or_skip(backend: str, entry: str, call):
    """``call()`` with ``backend`` forced by the test; a SKIP naming the reason where that backend does
    not serve the call: its refusal, or its own argument form (the cuDNN wrappers take element
    offsets: a ValueError naming ``backend=``). Any other error is the test's failure."""
    import pytest

    try:
        return call()
    except (dispatch.BackendRefusedError, dispatch.NoBackendError) as exc:
        pytest.skip(f"{backend} via {entry}: {str(exc).splitlines()[0][:200]}")
    except ValueError as exc:
        if f"with backend={backend!r}" not in str(exc):
            raise
        pytest.skip(f"{backend} via {entry}: {str(exc)[-160:]}")
