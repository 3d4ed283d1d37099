"""What ``attn-dispatch bench`` measures: one problem = one entry point on uniform requests.

A ``BenchProblem`` names the entry point (FlashInfer's name; wrappers as ``<Wrapper>.run``),
the batch, the query and KV length of every request, heads, head dim, dtypes, the KV cache's
form (``kv_layout`` NHD or HND; a paged cache as one 5-D tensor or a (K, V) pair of 4-D
tensors, ``kv_pair``) and the features (causal, window, soft cap, sinks, LSE, fp8 KV, a
random custom mask). ``problem_from_json`` reads one from a user's
file (short entry names accepted: single, single_lse, cudnn, trtllm, xqa, paged, ragged);
``check_entry`` says, before anything runs, what an entry point cannot express (cuDNN takes
no window, xqa is decode only, ...), naming the field, its value and what is allowed;
``problem_of`` is the AttentionProblem the entry point builds for the problem's call.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from ..problem import AttentionProblem, size_class

SINGLE, SINGLE_LSE = "single_prefill_with_kv_cache", "single_prefill_with_kv_cache_return_lse"
CUDNN, TRTLLM = "cudnn_batch_prefill_with_kv_cache", "trtllm_batch_context_with_kv_cache"
XQA = "xqa_batch_decode_with_kv_cache"
PAGED, RAGGED = "BatchPrefillWithPagedKVCacheWrapper.run", "BatchPrefillWithRaggedKVCacheWrapper.run"
ENTRY_NAMES = (SINGLE, SINGLE_LSE, CUDNN, TRTLLM, XQA, PAGED, RAGGED)
SHORT_NAMES = {"single": SINGLE, "single_lse": SINGLE_LSE, "cudnn": CUDNN, "trtllm": TRTLLM, "xqa": XQA,
               "paged": PAGED, "ragged": RAGGED}
SHORT_OF = {full: short for short, full in SHORT_NAMES.items()}

# what each entry point's FlashInfer signature can say (the rest is refused by check_entry)
# (hnd: the KV layout HND; kv_pair: a paged cache as a (K, V) tuple; custom_mask: a boolean mask)
_FEATURES = {
    SINGLE: {"window", "soft_cap", "causal", "hnd", "custom_mask"},
    SINGLE_LSE: {"window", "soft_cap", "causal", "hnd", "custom_mask"},
    CUDNN: {"causal", "lse", "hnd"}, TRTLLM: {"window", "sinks", "causal", "lse", "hnd", "kv_pair"},
    XQA: {"window", "sinks", "fp8_kv", "hnd", "kv_pair"},
    PAGED: {"window", "soft_cap", "sinks", "causal", "lse", "fp8_kv", "hnd", "kv_pair", "custom_mask"},
    RAGGED: {"window", "soft_cap", "causal", "lse", "custom_mask"},
}


@dataclass(frozen=True)
class BenchProblem:
    entry: str
    batch: int
    q_len: int
    kv_len: int
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    dtype: str = "bfloat16"
    kv_dtype: str = ""  # "" = dtype
    page_size: int = 16
    causal: bool = False
    window_left: int = -1
    soft_cap: float = 0.0
    sinks: bool = False
    lse: bool = False
    kv_layout: str = "NHD"  # NHD or HND (single prefill: k/v (Hkv, kv_len, D); paged: the page cache's)
    kv_pair: bool = False  # paged: K and V as two 4-D tensors, not one 5-D cache
    custom_mask: bool = False  # a random boolean mask (seeded; every row keeps its own key)
    backends: tuple = ()  # () = force every available backend; else only these (and auto)

    @property
    def kv_type(self) -> str:
        return self.kv_dtype or self.dtype

    @property
    def decode(self) -> bool:
        return self.q_len == 1

    @property
    def paged(self) -> bool:
        return self.entry in (CUDNN, TRTLLM, XQA, PAGED)

    def features(self) -> list[str]:
        out = ["causal"] if self.causal and not self.decode else []
        out += [f"window {self.window_left}"] if self.window_left >= 0 else []
        out += [f"soft cap {self.soft_cap:g}"] if self.soft_cap > 0 else []
        out += ["sinks"] if self.sinks else []
        out += ["lse"] if self.lse or self.entry == SINGLE_LSE else []
        out += [f"{short_dtype(self.kv_type)} KV"] if self.kv_type != self.dtype else []
        out += ["HND"] if self.kv_layout == "HND" else []
        out += ["KV pair"] if self.kv_pair else []
        out += ["mask"] if self.custom_mask else []
        return out

    @property
    def name(self) -> str:
        shape = f"{self.batch}x{self.q_len}x{self.kv_len}"
        heads = f"h{self.num_qo_heads}/{self.num_kv_heads} d{self.head_dim}"
        feats = ",".join(f.replace(" ", "") for f in self.features())
        return f"{SHORT_OF[self.entry]} {shape} {heads} {short_dtype(self.dtype)}" + (f" {feats}" if feats else "")

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["backends"] = list(self.backends)
        return d


def short_dtype(name: str) -> str:
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float8_e4m3fn": "e4m3",
            "float8_e5m2": "e5m2"}.get(name, name)


def check_entry(p: BenchProblem) -> Optional[str]:
    """Why ``p.entry`` cannot express ``p`` (field, value, what is allowed), or None."""
    allowed = _FEATURES[p.entry]
    asked = {"window": p.window_left >= 0, "soft_cap": p.soft_cap > 0, "sinks": p.sinks,
             "lse": p.lse, "fp8_kv": p.kv_type != p.dtype, "causal": p.causal and not p.decode,
             "hnd": p.kv_layout == "HND", "kv_pair": p.kv_pair, "custom_mask": p.custom_mask}
    if p.kv_layout not in ("NHD", "HND"):
        return f"kv_layout={p.kv_layout!r}: allowed 'NHD' or 'HND'"
    missing = [f for f, on in asked.items() if on and f not in allowed]
    if missing:
        return f"{', '.join(missing)}: {p.entry} takes only {', '.join(sorted(allowed)) or 'none of them'}"
    if p.entry in (SINGLE, SINGLE_LSE) and p.batch != 1:
        return f"batch={p.batch}: {p.entry} serves one request (batch 1)"
    if p.entry == XQA and p.q_len != 1:
        return f"q_len={p.q_len}: {XQA} is decode (q_len 1)"
    if p.q_len > p.kv_len:
        return f"q_len={p.q_len}: at most kv_len={p.kv_len} (queries are the last keys)"
    if p.custom_mask and (p.causal or p.window_left >= 0):
        return "custom_mask: a custom mask replaces causal and window (give neither with it)"
    if p.num_qo_heads % p.num_kv_heads:
        return f"heads={p.num_qo_heads}/{p.num_kv_heads}: qo heads must be a multiple of kv heads"
    return None


FIELDS = {f.name for f in dataclasses.fields(BenchProblem)}


def problem_from_json(item: dict) -> BenchProblem:
    """A problem from a user's JSON object (ValueError naming the field, value and what is allowed)."""
    unknown = sorted(set(item) - FIELDS - {"heads"})
    if unknown:
        raise ValueError(f"unknown field(s) {unknown}; allowed: {', '.join(sorted(FIELDS | {'heads'}))}")
    data = dict(item)
    data["entry"] = SHORT_NAMES.get(data.get("entry", ""), data.get("entry", ""))
    if data["entry"] not in ENTRY_NAMES:
        raise ValueError(f"entry={item.get('entry')!r}: allowed one of {', '.join(SHORT_NAMES)} or "
                         f"{', '.join(ENTRY_NAMES)}")
    if "heads" in data:  # "32/8"
        hq, _, hkv = str(data.pop("heads")).partition("/")
        data["num_qo_heads"], data["num_kv_heads"] = int(hq), int(hkv or hq)
    data["backends"] = tuple(data.get("backends", ()))
    try:
        p = BenchProblem(**data)
    except TypeError as exc:
        raise ValueError(f"{item}: {exc}") from exc
    why = check_entry(p)
    if why:
        raise ValueError(f"{p.name}: {why}")
    return p


def entry_of(bench_entry: str) -> str:
    """The AttentionProblem's entry name: wrappers without '.run'; the LSE variant is single prefill."""
    name = bench_entry.removesuffix(".run")
    return SINGLE if name == SINGLE_LSE else name


def problem_of(p: BenchProblem) -> AttentionProblem:
    """The AttentionProblem the entry point builds for the bench problem's call."""
    storage = "dense" if p.entry in (SINGLE, SINGLE_LSE) else ("ragged" if p.entry == RAGGED else "paged")
    return AttentionProblem(
        entry=entry_of(p.entry), phase="decode" if p.decode or p.entry == XQA else "prefill", kv_storage=storage,
        kv_layout="HND" if p.entry == CUDNN else p.kv_layout, num_qo_heads=p.num_qo_heads, num_kv_heads=p.num_kv_heads,
        head_dim_qk=p.head_dim, head_dim_vo=p.head_dim, q_dtype=p.dtype, kv_dtype=p.kv_type, out_dtype=p.dtype,
        page_size=p.page_size if storage == "paged" else 0, causal=p.causal or p.entry == XQA,
        window_left=p.window_left, logits_soft_cap=p.soft_cap, has_sinks=p.sinks,
        mask="custom" if p.custom_mask else "none",
        return_lse=p.lse or p.entry == SINGLE_LSE or (p.entry in (CUDNN, TRTLLM) and p.lse),
        sizes=size_class(p.batch, p.q_len, p.kv_len))
