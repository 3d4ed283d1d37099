"""How FlashInfer's kernels store an fp8 e4m3 output past its range, beside native-triton (a GPU machine).

    python -m tools.check_fp8_stores

Two cases, fresh random inputs (the seed drawn at run time and printed unless given): FlashInfer's fa2
single prefill with o_dtype e4m3 (fp16 q * ``--q-gain``, v * 300: a sharp softmax puts outputs past 448)
against native-triton on the same inputs; FlashInfer's XQA decode with an fp8 cache and fp8 output at
bmm2_scale 20000. Prints, against the fp64 oracle, how many outputs pass 464, how many of those each side
stored as +-448, and each side's NaN count (inside the range and past it).
"""
from __future__ import annotations

import argparse
import math
import os

import torch

import dispatch
import dispatch.decode  # xqa's entry
from dispatch.benchmark.oracle import attention_fp64

FP8 = torch.float8_e4m3fn


def stores(label: str, got: torch.Tensor, ref: torch.Tensor) -> None:
    got, past, inside = got.cpu().double(), ref.abs() > 464, ref.abs() < 440
    nan = got.isnan()
    print(f"  {label}: NaN {int(nan.sum())} ({int((nan & inside).sum())} inside the range, {int((nan & past).sum())} "
          f"past it); +-448 for {int((got[past].abs() == 448).sum())} of {int(past.sum())} outputs past 464")


def fa2_single(gain: float) -> None:
    import flashinfer

    q = (torch.randn(256, 8, 128, device="cuda") * gain).half()
    k = torch.randn(1024, 2, 128, device="cuda").half()
    v = (torch.randn(1024, 2, 128, device="cuda") * 300).half()
    ref = attention_fp64(q.cpu(), k.cpu(), v.cpu(), sm_scale=128 ** -0.5, causal=True)[0]
    print(f"single prefill 256 x 1024, q * {gain}, v * 300 (outputs up to {ref.abs().max().item():.0f}):")
    stores("flashinfer fa2", flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True, o_dtype=FP8,
                                                                      backend="fa2"), ref)
    stores("native-triton", dispatch.single_prefill_with_kv_cache(q, k, v, causal=True, o_dtype=FP8,
                                                                  backend="native-triton"), ref)


def xqa_decode(bmm2: float) -> None:
    import flashinfer.decode

    batch, hkv, group, d, page, kv_len = 4, 4, 8, 128, 16, 2500
    per = -(-kv_len // page)
    q = torch.randn(batch, hkv * group, d, device="cuda").to(torch.bfloat16)
    k, v = (torch.randn(batch * per, page, hkv, d, device="cuda").to(FP8) for _ in range(2))
    table = torch.arange(batch * per, dtype=torch.int32, device="cuda").reshape(batch, per)
    lens = torch.full((batch,), kv_len, dtype=torch.int32, device="cuda")
    ref = torch.cat([attention_fp64(q[b:b + 1].cpu(), k[b * per:(b + 1) * per].flatten(0, 1)[:kv_len].cpu().double(),
                                    v[b * per:(b + 1) * per].flatten(0, 1)[:kv_len].cpu().double(),
                                    sm_scale=d ** -0.5, causal=True)[0] for b in range(batch)]) * bmm2
    print(f"xqa decode 4 x 2500 keys, fp8 cache, bmm2_scale {bmm2:g}:")
    for label, fn in (("flashinfer xqa", flashinfer.decode.xqa_batch_decode_with_kv_cache),
                      ("native-triton", dispatch.decode.xqa_batch_decode_with_kv_cache)):
        out = torch.full(q.shape, math.nan, dtype=FP8, device="cuda")
        with dispatch.use_backend("native-triton"):  # ours only; FlashInfer's function ignores it
            fn(q, (k, v), torch.zeros(128 << 20, dtype=torch.uint8, device="cuda"), table, lens, kv_len,
               d ** -0.5, bmm2, out=out)
        stores(label, out, ref)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=None, help="default: drawn at run time")
    parser.add_argument("--q-gain", type=float, nargs="+", default=[1.0, 8.0])
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    print(f"seed {seed}; GPU {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for gain in args.q_gain:
        fa2_single(gain)
    xqa_decode(20000.0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
