"""The command line's description of a problem: the options of ``attn-dispatch query`` and
``explain`` (and each line of ``tune --shapes``) and the AttentionProblem they describe."""
from __future__ import annotations

import argparse
from typing import Callable

import capability_db
from backends import DeviceDesc

from .entries import ENTRIES

DTYPE_ALIASES = {
    "bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16", "half": "float16",
    "fp32": "float32", "float32": "float32", "fp8": "float8_e4m3fn", "e4m3": "float8_e4m3fn",
    "fp8_e4m3": "float8_e4m3fn", "float8_e4m3fn": "float8_e4m3fn", "e5m2": "float8_e5m2",
    "fp8_e5m2": "float8_e5m2", "float8_e5m2": "float8_e5m2",
}
ENTRY_POINTS = tuple(ENTRIES)  # the registry of dispatch/entries/
# Without --entry, the FlashInfer call that takes the KV storage given (a decode step through the
# paged wrapper is its one-token case): none of these puts an engine of its own first, so the
# device family's priority list applies as it is.
ENTRY_FOR_KV = {"paged": "BatchPrefillWithPagedKVCacheWrapper", "ragged": "BatchPrefillWithRaggedKVCacheWrapper",
                "dense": "single_prefill_with_kv_cache"}


# -- argument types (messages name the value and what is allowed) -------------------------
def _dtype(text: str) -> str:
    name = DTYPE_ALIASES.get(text.strip().lower())
    if name is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a dtype; valid options are: {', '.join(DTYPE_ALIASES)}")
    return name


def _pair(what: str) -> Callable[[str], tuple[int, int]]:
    """'32/8' -> (32, 8); '128' -> (128, 128)."""
    def parse(text: str) -> tuple[int, int]:
        parts = text.split("/")
        try:
            values = tuple(int(p) for p in parts)
        except ValueError:
            values = ()
        if len(values) not in (1, 2) or min(values) < 1:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a valid {what}; expected N or N/M with positive integers, e.g. 32/8")
        return (values[0], values[-1])
    return parse


def _gpu(text: str) -> DeviceDesc:
    try:
        return capability_db.resolve_device(text)
    except ValueError as exc:  # the message already lists every valid option
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--gpu ")) from exc


def _number(convert: Callable[[str], float], allowed: Callable[[float], bool], expected: str) -> Callable:
    """An option's number: ``convert(text)`` where ``allowed`` holds, else the value and what is expected."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not allowed(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not allowed; expected {expected}")
        return value
    return parse


_positive_int = _number(int, lambda n: n >= 1, "a positive integer")
_non_negative_int = _number(int, lambda n: n >= 0, "an integer >= 0 (window_left)")
_positive_float = _number(float, lambda x: x > 0, "a number > 0 (0 = off: omit the option)")


def add_problem_options(p: argparse.ArgumentParser, gpu_required: bool) -> None:
    """The options that describe a problem (``query``, ``explain``, the lines of ``tune --shapes``)."""
    p.add_argument("--gpu", type=_gpu, required=gpu_required, metavar="{sm_XX,h100,b200,a100,...,cpu}",
                   help="device to answer for: an arch (sm_90), a name (h100) or cpu"
                        + ("" if gpu_required else "; default: this machine's device"))
    p.add_argument("--phase", choices=("prefill", "decode", "spec_decode"), default="prefill")
    p.add_argument("--kv", choices=("paged", "ragged", "dense"), default="paged", help="KV storage")
    p.add_argument("--dtype", type=_dtype, default="bfloat16", help="query dtype: bf16|fp16|fp8|e5m2|fp32")
    p.add_argument("--kv-dtype", type=_dtype, help="KV dtype (default: --dtype)")
    p.add_argument("--out-dtype", type=_dtype, help="output dtype (default: --dtype; bf16 when --dtype is fp8)")
    p.add_argument("--heads", type=_pair("--heads"), default=(32, 8), help="qo/kv heads, e.g. 32/8")
    p.add_argument("--head-dim", type=_pair("--head-dim"), default=(128, 128), help="qk[/vo], e.g. 128 or 192/128")
    p.add_argument("--page-size", type=_positive_int, default=16, help="tokens per page (paged KV only)")
    p.add_argument("--layout", choices=("NHD", "HND"), default="NHD")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--window", type=_non_negative_int, default=-1, metavar="N", help="window_left (inclusive)")
    p.add_argument("--soft-cap", type=_positive_float, default=0.0, metavar="X")
    p.add_argument("--sinks", action="store_true")
    p.add_argument("--lse", action="store_true", help="return the log-sum-exp")
    p.add_argument("--custom-mask", action="store_true")
    pos = p.add_mutually_exclusive_group()
    pos.add_argument("--alibi", action="store_true")
    pos.add_argument("--rope", action="store_true", help="fused RoPE (ROPE_LLAMA)")
    p.add_argument("--q-len-per-req", type=_positive_int, default=0, metavar="N",
                   help="spec decode: fixed draft length (default: varies)")
    p.add_argument("--cuda-graph", action="store_true", help="the caller will capture run() in a CUDA graph")
    p.add_argument("--sizes", type=_positive_int, nargs=3, metavar=("BATCH", "MAX_Q", "MAX_KV"),
                   help="the call's sizes: the measured choice ranks the candidates at them (default: over the "
                        "measured sizes)")
    p.add_argument("--entry", choices=ENTRY_POINTS, metavar="NAME",
                   help="entry point (its own engine goes first): " + ", ".join(ENTRY_POINTS) + "; default: the "
                        "one --kv implies (" + ", ".join(f"{kv}: {name}" for kv, name in ENTRY_FOR_KV.items()) + ")")
    p.add_argument("--verbose", "-v", action="store_true", help="every reason with its source")
    p.add_argument("--json", action="store_true")


def build_problem(args: argparse.Namespace, device: DeviceDesc, parser: argparse.ArgumentParser):
    """The AttentionProblem the options describe; parser.error (exit 2) on inconsistent options."""
    from .problem import AttentionProblem, size_class

    hq, hkv = args.heads
    if hq % hkv:
        parser.error(f"argument --heads: {hq}/{hkv} is not allowed; qo heads must be a multiple of kv heads")
    kv_dtype = args.kv_dtype or args.dtype
    out_dtype = args.out_dtype or ("bfloat16" if args.dtype.startswith("float8") else args.dtype)
    return AttentionProblem(
        entry=args.entry or ENTRY_FOR_KV[args.kv], phase=args.phase, kv_storage=args.kv, kv_layout=args.layout,
        num_qo_heads=hq, num_kv_heads=hkv, head_dim_qk=args.head_dim[0], head_dim_vo=args.head_dim[1],
        q_dtype=args.dtype, kv_dtype=kv_dtype, out_dtype=out_dtype,
        page_size=args.page_size if args.kv == "paged" else 0,
        causal=args.causal, window_left=args.window, mask="custom" if args.custom_mask else "none",
        logits_soft_cap=args.soft_cap,
        pos_encoding="ALIBI" if args.alibi else ("ROPE_LLAMA" if args.rope else "NONE"),
        has_sinks=args.sinks, return_lse=args.lse, q_len_per_req=args.q_len_per_req,
        device_type="cpu" if device.kind == "cpu" else "cuda", cuda_graph=args.cuda_graph,
        sizes=size_class(*args.sizes) if args.sizes else (),
    )
