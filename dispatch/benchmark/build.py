"""Inputs and public calls of one bench problem (dispatch/benchmark/cases.py's builders), and its fp64 check.

``build`` draws the problem's tensors once (pages in a random order, fresh random values) and
copies the K/V operand until the copies together outgrow the L2 (``kv_copies``), so that a
timed call never reads K/V the previous call left in the L2. ``Built.call(backend)`` returns
the entry point's public call, FlashInfer's spelling, taking one K/V operand; a wrapper is
made and planned there, so call it inside ``dispatch.use_backend(name)`` to force a backend.
``Built.check`` compares a sample of output rows (and LSE rows) with the fp64 oracle.

The cache's form follows the problem: NHD or HND (a paged cache (pages, 2, P, Hkv, D) or
(pages, 2, Hkv, P, D); single prefill's k/v (kv_len, Hkv, D) or (Hkv, kv_len, D)), one 5-D
tensor or a (K, V) pair of contiguous 4-D tensors (``kv_pair``), and a custom mask drawn from
the seed (each key kept with probability 3/4, every query's own key kept) where asked.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from . import cases as lab
from ..entries import ENTRIES
from ..entries import last_decision
from ..inputs import random_mask
from ..problem import NAME_DTYPES
from .oracle import attention_fp64, band, relative_error
from .problems import CUDNN, PAGED, RAGGED, SINGLE, SINGLE_LSE, TRTLLM, XQA, BenchProblem

L2_READS = 3  # the K/V copies together hold >= 3x the L2 (as the host-cost kernel table)
MAX_KV_COPIES = 8
SAMPLE_ROWS = 16  # query rows checked per sampled request (its last rows)


def kv_bytes_stored(p: BenchProblem) -> int:
    """Bytes of one K/V operand: every key of every request, K and V."""
    elem = torch.empty((), dtype=NAME_DTYPES[p.kv_type]).element_size()
    return 2 * p.batch * p.kv_len * p.num_kv_heads * p.head_dim * elem


def kv_copies(p: BenchProblem, l2_bytes: int) -> int:
    if l2_bytes <= 0:
        return 1
    return min(MAX_KV_COPIES, max(1, math.ceil(L2_READS * l2_bytes / kv_bytes_stored(p))))


@dataclass
class Built:
    problem: BenchProblem
    case: dict  # dispatch.benchmark's paged or ragged case
    operands: list  # the K/V operand each call takes, in copies (operands[0] is checked)
    sinks: Optional[torch.Tensor]
    out: Optional[torch.Tensor]  # the caller's out buffer (None: the entry allocates)
    lse: Optional[torch.Tensor]
    scale: float
    wrappers: list = field(default_factory=list)
    masks: Optional[list] = None  # per request (q_len, kv_len) bool, True keeps (custom_mask problems)

    def call(self, api: Optional[dict] = None) -> Callable[[Any], Any]:
        """The public call taking a K/V operand (a wrapper is made and planned now); ``api``:
        entry name -> another implementation of it (FlashInfer's own, ``flashinfer_api``)."""
        return _CALLS[self.problem.entry](self, (api or OURS)[self.problem.entry])

    def served(self) -> Optional[str]:
        """The backend that served the latest call (a fallback included)."""
        if self.wrappers:
            decision = self.wrappers[-1].decision
        else:
            decision = last_decision()
        return None if decision is None else (decision.ran or decision.chosen)

    def poison(self) -> None:
        for t in (self.out, self.lse):
            if t is not None:
                t.fill_(float("nan"))

    def check(self, result: Any) -> tuple[float, Optional[float], float]:
        """(out rel. error, LSE rel. error or None, band) on a sample of requests and rows."""
        out, lse = result if isinstance(result, tuple) else (result, None)
        p, q = self.problem, self.case["q"]
        n = min(p.q_len, SAMPLE_ROWS)
        got_o, ref_o, got_l, ref_l = [], [], [], []
        for r in sorted({0, p.batch // 2, p.batch - 1}):
            rows = slice(r * p.q_len + p.q_len - n, (r + 1) * p.q_len)
            k, v = self.request_kv(r)
            mask = None if self.masks is None else self.masks[r][p.q_len - n:]
            o, l2 = attention_fp64(q[rows], k, v, sm_scale=self.scale, causal=p.causal, window_left=p.window_left,
                                   soft_cap=p.soft_cap, sinks=self.sinks, mask=mask)
            got_o.append(out[rows])
            ref_o.append(o)
            if lse is not None:
                got_l.append(lse[r, p.q_len - n:] if p.entry == CUDNN else lse[rows])
                ref_l.append(l2)
        err = relative_error(torch.cat(got_o), torch.cat(ref_o))
        lse_err = relative_error(torch.cat(got_l), torch.cat(ref_l)) if got_l else None
        return err, lse_err, band(p.dtype, p.kv_type)

    def request_kv(self, r: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Request r's keys and values (kv_len, Hkv, D), read from operands[0]."""
        p, c = self.problem, self.case
        if not p.paged:
            k, v = self.operands[0]
            if p.kv_layout == "HND":  # single prefill's (Hkv, kv_len, D)
                k, v = k.transpose(0, 1), v.transpose(0, 1)
            return k[r * p.kv_len:(r + 1) * p.kv_len], v[r * p.kv_len:(r + 1) * p.kv_len]
        pages = c["table"][r, : math.ceil(p.kv_len / p.page_size)].long()
        kv = self.operands[0]
        halves = kv if isinstance(kv, tuple) else (kv[:, 0], kv[:, 1])  # (pages, P, Hkv, D) or HND's (pages, Hkv, P, D)
        return tuple((t[pages].transpose(1, 2) if p.kv_layout == "HND" else t[pages])
                     .reshape(-1, p.num_kv_heads, p.head_dim)[: p.kv_len] for t in halves)


def build(p: BenchProblem, device: str, l2_bytes: int = 0, seed: int = 0) -> Built:
    dtype, kv_dtype = NAME_DTYPES[p.dtype], NAME_DTYPES[p.kv_type]
    sizes = dict(num_qo_heads=p.num_qo_heads, num_kv_heads=p.num_kv_heads, head_dim=p.head_dim, device=device)
    q_lens, kv_lens = (p.q_len,) * p.batch, (p.kv_len,) * p.batch
    if p.paged:
        c = lab.paged(q_lens, kv_lens, p.kv_layout, dtype, seed, page_size=p.page_size, kv_dtype=kv_dtype, **sizes)
        first: Any = (c["cache"][:, 0].contiguous(), c["cache"][:, 1].contiguous()) if p.kv_pair else c["cache"]
    else:
        c = lab.ragged(q_lens, kv_lens, dtype, seed, **sizes)
        first = (c["k"], c["v"])
        if p.kv_layout == "HND":  # single prefill only (check_entry)
            first = tuple(t.transpose(0, 1).contiguous() for t in first)
    c["kv_tokens"] = lab.indptr(kv_lens, device)
    copies = [first] + [tuple(t.clone() for t in first) if isinstance(first, tuple) else first.clone()
                        for _ in range(kv_copies(p, l2_bytes) - 1)]
    gen = torch.Generator(device="cpu").manual_seed(seed + 1)
    sinks = _sinks(p, gen).to(device) if p.sinks else None
    total_q = p.batch * p.q_len
    out = None if p.entry in (SINGLE, SINGLE_LSE) else torch.empty(total_q, p.num_qo_heads, p.head_dim,
                                                                      dtype=dtype, device=device)
    lse = (torch.empty(total_q, p.num_qo_heads, dtype=torch.float32, device=device)
           if p.lse and p.entry in (PAGED, RAGGED, TRTLLM) else None)
    masks = _masks(p, gen, device) if p.custom_mask else None
    return Built(p, c, copies, sinks, out, lse, p.head_dim ** -0.5, masks=masks)


def _sinks(p: BenchProblem, gen: torch.Generator) -> torch.Tensor:
    """Per query head, a sink logit that carries weight: ln(keys visible) + N(0, 1). Random q.k
    logits are about N(0, 1), so n keys add up to about 1.6 n in the softmax's denominator and the
    sink's e^s is of that order. A sink of N(0, 1) alone shrinks to 1/n of the row, under the
    check's band beyond ~100 keys: a call that dropped the sinks passed (FlashInfer 0.7.2's paged
    wrapper on the H200 disagreed only where the KV was that short)."""
    keys = min(p.kv_len, p.window_left + 1) if p.window_left >= 0 else p.kv_len
    return torch.randn(p.num_qo_heads, generator=gen) + math.log(keys)


def _masks(p: BenchProblem, gen: torch.Generator, device: str) -> list:
    """One (q_len, kv_len) bool mask per request (``inputs.random_mask``: no row fully masked)."""
    return [random_mask(p.q_len, p.kv_len, gen).to(device) for _ in range(p.batch)]


# -- the public calls, FlashInfer's spelling ------------------------------------------------------
def _single(b: Built, fn: Any) -> Callable[[Any], Any]:
    p, q = b.problem, b.case["q"]
    kw = dict(causal=p.causal, window_left=p.window_left, logits_soft_cap=p.soft_cap or None)
    if p.kv_layout != "NHD":
        kw["kv_layout"] = p.kv_layout
    if b.masks is not None:
        kw["custom_mask"] = b.masks[0]
    return lambda kv: fn(q, kv[0], kv[1], **kw)


def _ragged(b: Built, cls: Any) -> Callable[[Any], Any]:
    p, c = b.problem, b.case
    w = lab.ragged_wrapper(c, cls, causal=p.causal, window_left=p.window_left, logits_soft_cap=p.soft_cap or None,
                           **_mask_kw(b))
    b.wrappers.append(w)
    return lambda kv: w.run(c["q"], kv[0], kv[1], return_lse=p.lse, out=b.out, lse=b.lse)


def _paged(b: Built, cls: Any) -> Callable[[Any], Any]:
    p, c = b.problem, b.case
    w = lab.paged_wrapper(c, cls, causal=p.causal, window_left=p.window_left, logits_soft_cap=p.soft_cap or None,
                          **_mask_kw(b))
    b.wrappers.append(w)
    return lambda kv: w.run(c["q"], kv, return_lse=p.lse, out=b.out, lse=b.lse, sinks=b.sinks)


def _mask_kw(b: Built) -> dict:
    """The wrappers' plan keyword for a custom mask: every request's mask flattened, concatenated."""
    return {} if b.masks is None else {"custom_mask": torch.cat([m.reshape(-1) for m in b.masks])}


def _trtllm(b: Built, fn: Any) -> Callable[[Any], Any]:
    p, c = b.problem, b.case
    ws = lab.ws(c["device"])
    options = dict(causal=p.causal, return_lse=p.lse, lse=b.lse)
    # FlashInfer 0.5.3's function (flashinfer/prefill.py) has none of these: it is causal and returns no LSE
    taken = inspect.signature(fn).parameters
    needed = {"causal": not p.causal, "return_lse": p.lse, "lse": b.lse is not None}  # unlike that default
    missing = [name for name, need in needed.items() if need and name not in taken]
    if missing:
        raise NotImplementedError(f"{getattr(fn, '__module__', '')}.{fn.__name__} takes no {', '.join(missing)}=")
    options = {name: value for name, value in options.items() if name in taken}
    return lambda kv: fn(c["q"], kv, ws, c["table"], c["seq"], p.q_len, p.kv_len, b.scale, 1.0, p.batch, c["qo"],
                         c["kv_tokens"], window_left=p.window_left, out=b.out, kv_layout=p.kv_layout, sinks=b.sinks,
                         **options)


def _xqa(b: Built, fn: Any) -> Callable[[Any], Any]:
    p, c = b.problem, b.case
    ws = lab.ws(c["device"])
    return lambda kv: fn(c["q"], kv, ws, c["table"], c["seq"], p.kv_len, b.scale, 1.0, window_left=p.window_left,
                         out=b.out, sinks=b.sinks, kv_layout=p.kv_layout)


def _cudnn(b: Built, fn: Any) -> Callable[[Any], Any]:
    p, c = b.problem, b.case
    ws = lab.ws(c["device"])
    lens_q = torch.full((p.batch, 1, 1, 1), p.q_len, dtype=torch.int32, device=c["device"])
    row = p.num_qo_heads * p.head_dim

    hnd = p.kv_layout == "HND"

    def call(kv):  # K and V as (pages, Hkv, P, D): the HND cache's halves, or views of the NHD cache (no copy)
        k, v = (kv[:, 0], kv[:, 1]) if hnd else (kv[:, 0].transpose(1, 2), kv[:, 1].transpose(1, 2))
        return fn(c["q"], k, v, b.scale, ws, max_token_per_sequence=p.q_len, max_sequence_kv=p.kv_len,
                  actual_seq_lens_q=lens_q, actual_seq_lens_kv=c["seq"].view(p.batch, 1, 1, 1),
                  block_tables=c["table"], causal=p.causal, return_lse=p.lse, batch_offsets_q=c["qo"] * row,
                  batch_offsets_o=c["qo"] * row, out=b.out)
    return call


def _ours() -> dict:
    from ..wrappers import BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper
    functions = {name: ENTRIES[name].obj for name in (SINGLE, SINGLE_LSE, TRTLLM, XQA, CUDNN)}
    return {**functions, PAGED: BatchPrefillWithPagedKVCacheWrapper, RAGGED: BatchPrefillWithRaggedKVCacheWrapper}


OURS = _ours()


def flashinfer_api() -> tuple[Optional[dict], str]:
    """FlashInfer's own implementation of each entry point (the names are the same), or the
    reason there is none here."""
    try:
        from flashinfer import decode, prefill
    except Exception as exc:  # noqa: BLE001 - not installed, or a CUDA-less build failing at import
        return None, f"flashinfer not importable ({type(exc).__name__}: {str(exc).strip()[:120]})"
    names = {SINGLE: (prefill, "single_prefill_with_kv_cache"),
             SINGLE_LSE: (prefill, "single_prefill_with_kv_cache_return_lse"),
             PAGED: (prefill, "BatchPrefillWithPagedKVCacheWrapper"), RAGGED: (prefill, "BatchPrefillWithRaggedKVCacheWrapper"),
             XQA: (decode, "xqa_batch_decode_with_kv_cache"), TRTLLM: (prefill, "trtllm_batch_context_with_kv_cache"),
             CUDNN: (prefill, "cudnn_batch_prefill_with_kv_cache")}
    api = {entry: getattr(module, attr, None) for entry, (module, attr) in names.items()}
    return api, ""


def flashinfer_own_not_run(p: BenchProblem) -> Optional[str]:
    """Why FlashInfer's own call of ``p`` is not made on this GPU, or None. Seen on the H200 with
    0.7.2:
    - single prefill with an HND K/V on its default sm_90 backend, fa3, dies of SIGFPE in
      single_prefill_*_sm90.so (as 0.5.3's did on the H100: its fa3 binding reads kv_len /
      num_kv_heads as k.size(0) / k.size(1) whatever the layout). Ours hands fa3 the NHD view of
      the same storage (backends/_fi_prefill.py);
    - ``trtllm_batch_context_with_kv_cache`` runs trtllm-gen kernels, SM100+ only: it failed on
      all 71 calls on the H200, 65 of them after fetching the kernels' cubins from the network,
      which a machine without network cannot reach (each fetch held the sweep, and the workers
      compiling beside it, until it timed out)."""
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    if p.entry in (SINGLE, SINGLE_LSE) and p.kv_layout == "HND" and major == 9:
        return "not run: FlashInfer's own fa3 single prefill with HND K/V dies of SIGFPE on sm_90"
    if p.entry == TRTLLM and major < 10:
        return f"not run: FlashInfer's trtllm-gen kernels need SM100+ (this GPU: sm_{major}{minor})"
    return None


# FlashInfer's own calls measured computing another function than the problem's: (version, sm, entry,
# feature) -> what was seen. The bench's check says DISAGREES once its inputs show the difference; the
# rows of older sweeps, whose inputs could not (sinks of N(0, 1) at long KV: ``_sinks``), are read
# through this list (``flashinfer_own_wrong``): their FlashInfer times compare with nothing.
OWN_CALL_WRONG = {
    ("0.7.2", "sm_90", PAGED, "sinks"):
        "FlashInfer 0.7.2's paged wrapper run(sinks=...) on sm_90 is 42-67% away from the fp64 oracle once the "
        "sinks carry weight, as if it dropped them (H200; H100: 5 of 5 problems with sinks in a random sweep)",
}


def flashinfer_own_wrong(p: BenchProblem, environment: dict) -> Optional[str]:
    """Why FlashInfer's own call of ``p`` on the run's environment (its FlashInfer version and GPU
    capability) computed something else (``OWN_CALL_WRONG``), or None."""
    facts = ("sinks",) if p.sinks else ()
    for fact in facts:
        seen = OWN_CALL_WRONG.get((environment.get("flashinfer"), environment.get("capability"), p.entry, fact))
        if seen:
            return seen
    return None


_CALLS = {SINGLE: _single, SINGLE_LSE: _single, RAGGED: _ragged, PAGED: _paged, TRTLLM: _trtllm, XQA: _xqa,
          CUDNN: _cudnn}
