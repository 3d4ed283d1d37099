"""A paged-KV serving loop on dispatch: batched prefill, then greedy decode in one CUDA graph per step.

A Llama-shaped model from a transformers ``LlamaConfig`` with random weights serves a batch of
requests with ragged prompt lengths the way an engine does: one paged KV cache per layer (NHD
pages handed out in shuffled order), the prompts prefilled in one batch through
``dispatch.BatchPrefillWithPagedKVCacheWrapper`` (``plan`` once, ``run`` per layer), then greedy
decode, in one of two modes (``--decode``):

* ``graph-xqa`` (default): through ``dispatch.xqa_batch_decode_with_kv_cache``; on a GPU the whole
  decode step (every layer, the KV writes, the LM head and the argmax) is captured once in a CUDA
  graph and replayed; on the CPU it runs eagerly;
* ``eager-paged``: eagerly through a second ``BatchPrefillWithPagedKVCacheWrapper``, as an engine
  without CUDA graphs decodes: every step plans the batch (one query row per request, the pages
  that hold its keys, from the host's copy of the block table and lengths), then runs once per
  layer. With ``--compare-flashinfer`` (where flashinfer is importable) the same loop runs again
  with ``flashinfer.BatchPrefillWithPagedKVCacheWrapper`` for the prefill and the decode, and both
  times per step are printed.

RoPE, RMSNorm and the MLP are plain torch; attention goes through dispatch only.

On a GPU the warm-up pass (the slot an engine already has before it serves: vLLM's kernel warm-up,
SGLang's before graph capture) runs inside ``with dispatch.autotune(True, cache=...)``, as vLLM wraps
its warm-up in ``flashinfer.autotune``: each bucket the warm-up reaches times its leading backends
and compiles what it needs, and the decode graph is captured afterwards inside the context (lookups
only there). The times go to ``--tune-cache`` (default: the user's cache directory), so the next
start reads them and times nothing; the timed pass after the warm-up only looks up. On the CPU one
backend serves everything: there is nothing to time and no warm-up pass.

The check is teacher-forced: transformers' own ``LlamaForCausalLM`` (same weights, sdpa or eager
attention) reads each prompt followed by the tokens the loop generated, and its next-token
predictions are compared with the loop's at every generated position (top-1 agreement and the
largest logit difference). Exit status 1 when agreement is below ``--min-agreement`` (fp32, or
where it is given). At bf16/fp16 the predictions of a random-weight model sit on near-ties that any
change of summation order flips (a loop without RoPE still agrees with transformers in bf16 on 95%
of a tiny model's tokens), so there the loop is held to the model run in fp32: it must agree with it
at least as often as transformers' own forward in the loop's dtype does, less ``--fp32-slack``;
FlashInfer's loop is measured the same way where it runs.

    python examples/serving_loop.py                       # CPU, tiny model, fp32
    python examples/serving_loop.py --device cuda --dtype bfloat16 --model llama3-8b-4layers
    python examples/serving_loop.py --device cuda --dtype bfloat16 --model llama3-8b-4layers --layers 8 \
        --decode eager-paged --compare-flashinfer             # time per step, ours against FlashInfer's
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, LlamaConfig

import dispatch

MODELS = {
    "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, vocab_size=512, max_position_embeddings=1024),
    # Llama-3-8B's shapes (and its llama3 RoPE), 4 of its 32 layers
    "llama3-8b-4layers": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=4,
                              num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=128256,
                              max_position_embeddings=8192, rms_norm_eps=1e-5,
                              rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                                                   low_freq_factor=1.0, high_freq_factor=4.0,
                                                   original_max_position_embeddings=8192)),
}
PROMPT_LENS = {"tiny": (8, 48), "llama3-8b-4layers": (128, 1024)}  # ragged prompt lengths drawn from


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm: normalize in fp32, scale in the model's dtype."""
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on (tokens, heads, head_dim), rotate-half convention; cos/sin (tokens, head_dim)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


class Engine:
    """The model's weights (shared with the transformers model), a paged KV cache per layer and the
    static buffers a captured decode step reads and writes."""

    def __init__(self, model, prompt_lens: list[int], new_tokens: int, page_size: int, decode: str = "graph-xqa",
                 wrappers=dispatch):
        """``decode``: graph-xqa or eager-paged (module docstring); ``wrappers``: the module whose
        ``BatchPrefillWithPagedKVCacheWrapper`` serves the prefill and the eager paged decode
        (dispatch, or flashinfer for the comparison)."""
        cfg, dev = model.config, model.device
        self.decode = decode
        self.cfg, self.dtype, self.device, self.page_size = cfg, model.dtype, dev, page_size
        self.hq, self.hkv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.scale = self.head_dim ** -0.5
        self.model = model.model
        self.lm_head = model.lm_head.weight
        self.inv_freq = self.model.rotary_emb.inv_freq.float()
        self.rope_scaling = self.model.rotary_emb.attention_scaling
        batch = len(prompt_lens)
        self.max_seq_len = max(prompt_lens) + new_tokens
        pages_per = [-(-(n + new_tokens) // page_size) for n in prompt_lens]
        num_pages = sum(pages_per)
        order = torch.randperm(num_pages).tolist()  # pages handed out in no particular order, as after churn
        self.block_tables = torch.zeros(batch, max(pages_per), dtype=torch.int32)
        for r, n in enumerate(pages_per):
            self.block_tables[r, :n] = torch.tensor(order[:n], dtype=torch.int32)
            order = order[n:]
        self.block_tables_host = self.block_tables  # an engine's scheduler keeps the table on the host
        self.block_tables = self.block_tables.to(dev)
        self.lens_host = list(prompt_lens)  # keys each request has in the cache before the next step
        self.caches = [torch.zeros(num_pages, 2, page_size, self.hkv, self.head_dim, dtype=self.dtype, device=dev)
                       for _ in range(cfg.num_hidden_layers)]
        workspace = 128 << 20 if dev.type == "cuda" else 1 << 20
        self.prefill_wrapper = wrappers.BatchPrefillWithPagedKVCacheWrapper(
            torch.empty(workspace, dtype=torch.uint8, device=dev), "NHD")
        self.decode_wrapper = wrappers.BatchPrefillWithPagedKVCacheWrapper(
            torch.empty(workspace, dtype=torch.uint8, device=dev), "NHD") if decode == "eager-paged" else None
        self.decode_workspace = torch.zeros(workspace, dtype=torch.uint8, device=dev)  # xqa: zeroed once
        # static buffers of the decode step (a CUDA graph replays against these addresses)
        self.tokens = torch.zeros(batch, dtype=torch.long, device=dev)
        self.positions = torch.zeros(batch, dtype=torch.long, device=dev)
        self.seq_lens = torch.zeros(batch, dtype=torch.int32, device=dev)
        self.rows = torch.arange(batch, device=dev)
        self.logits = torch.zeros(batch, cfg.vocab_size, dtype=self.dtype, device=dev)
        self.graph = None

    def forward(self, tokens, positions, rows, attend):
        """The layers on a flat list of tokens (token j of request ``rows[j]`` at ``positions[j]``):
        writes each layer's K/V into its pages, then ``attend(layer, q)`` reads them. Returns the
        final hidden states (after the last norm)."""
        t, eps = tokens.shape[0], self.cfg.rms_norm_eps
        freqs = positions[:, None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.rope_scaling).to(self.dtype)
        sin = (emb.sin() * self.rope_scaling).to(self.dtype)
        pages = self.block_tables[rows, positions // self.page_size].long()
        offsets = positions % self.page_size
        h = F.embedding(tokens, self.model.embed_tokens.weight)
        for i, layer in enumerate(self.model.layers):
            att, mlp = layer.self_attn, layer.mlp  # their weights; the arithmetic is ours
            x = rms_norm(h, layer.input_layernorm.weight, eps)
            q = F.linear(x, att.q_proj.weight, att.q_proj.bias).view(t, self.hq, self.head_dim)
            k = F.linear(x, att.k_proj.weight, att.k_proj.bias).view(t, self.hkv, self.head_dim)
            v = F.linear(x, att.v_proj.weight, att.v_proj.bias).view(t, self.hkv, self.head_dim)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            self.caches[i][pages, 0, offsets] = k
            self.caches[i][pages, 1, offsets] = v
            o = attend(i, q)
            h = h + F.linear(o.reshape(t, self.hq * self.head_dim), att.o_proj.weight, att.o_proj.bias)
            x = rms_norm(h, layer.post_attention_layernorm.weight, eps)
            gate = F.linear(x, mlp.gate_proj.weight, mlp.gate_proj.bias)
            up = F.linear(x, mlp.up_proj.weight, mlp.up_proj.bias)
            h = h + F.linear(F.silu(gate) * up, mlp.down_proj.weight, mlp.down_proj.bias)
        return rms_norm(h, self.model.norm.weight, eps)

    def prefill(self, prompts: list[torch.Tensor]) -> torch.Tensor:
        """All prompts in one ragged batch; returns the logits of each prompt's last token (B, vocab)."""
        dev, p = self.device, self.page_size
        lens = torch.tensor([len(x) for x in prompts])
        pages = (lens + p - 1) // p
        qo_indptr = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)])
        kv_indptr = torch.cat([torch.zeros(1, dtype=torch.long), pages.cumsum(0)])
        kv_indices = torch.cat([self.block_tables[r, :n].cpu() for r, n in enumerate(pages.tolist())])
        last_page_len = (lens - 1) % p + 1
        i32 = dict(dtype=torch.int32, device=dev)
        self.prefill_wrapper.plan(qo_indptr.to(**i32), kv_indptr.to(**i32), kv_indices.to(**i32),
                                  last_page_len.to(**i32), self.hq, self.hkv, self.head_dim, p, causal=True,
                                  sm_scale=self.scale, q_data_type=self.dtype)
        tokens = torch.cat(prompts).to(dev)
        positions = torch.cat([torch.arange(n) for n in lens.tolist()]).to(dev)
        rows = torch.repeat_interleave(torch.arange(len(prompts)), lens).to(dev)
        h = self.forward(tokens, positions, rows, lambda i, q: self.prefill_wrapper.run(q, self.caches[i]))
        return F.linear(h[qo_indptr[1:].to(dev) - 1], self.lm_head)

    def decode_step(self) -> None:
        """One token per request at ``positions``: writes ``logits``. Graph-safe (no host syncs)
        with xqa; with the paged wrapper, ``plan_decode`` has planned the step."""
        self.seq_lens.copy_(self.positions + 1)  # the new token's K/V is in the cache before attention
        if self.decode_wrapper is not None:
            def attend(i, q):
                return self.decode_wrapper.run(q, self.caches[i])
        else:
            def attend(i, q):
                return dispatch.xqa_batch_decode_with_kv_cache(q, self.caches[i], self.decode_workspace,
                                                               self.block_tables, self.seq_lens, self.max_seq_len,
                                                               bmm1_scale=self.scale)
        h = self.forward(self.tokens, self.positions, self.rows, attend)
        self.logits.copy_(F.linear(h, self.lm_head))

    def plan_decode(self) -> None:
        """Plan the paged wrapper for the next step: one query row per request over its keys (the
        new token's included), from the host's block table and lengths."""
        p, i32 = self.page_size, dict(dtype=torch.int32, device=self.device)
        kv_lens = torch.tensor(self.lens_host) + 1
        pages = (kv_lens + p - 1) // p
        kv_indptr = torch.cat([torch.zeros(1, dtype=torch.long), pages.cumsum(0)])
        kv_indices = torch.cat([self.block_tables_host[r, :n] for r, n in enumerate(pages.tolist())])
        qo_indptr = torch.arange(len(self.lens_host) + 1)
        self.decode_wrapper.plan(qo_indptr.to(**i32), kv_indptr.to(**i32), kv_indices.to(**i32),
                                 ((kv_lens - 1) % p + 1).to(**i32), self.hq, self.hkv, self.head_dim, p,
                                 causal=True, sm_scale=self.scale, q_data_type=self.dtype)

    def step(self) -> None:
        """A decode step. eager-paged: plan, then run per layer, eagerly. graph-xqa: eager on the CPU;
        on a GPU the first one runs eagerly (dispatch decides and plans), is then captured once, and
        every later step replays the graph."""
        if self.decode_wrapper is not None:
            self.plan_decode()
            self.decode_step()
        elif self.device.type != "cuda":
            self.decode_step()
        elif self.graph is not None:
            self.graph.replay()
        else:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.decode_step()
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):  # recorded, not run: the eager step above was the real one
                self.decode_step()

    def generate(self, prompts: list[torch.Tensor], new_tokens: int):
        """Greedy: returns (tokens (B, new_tokens), logits (B, new_tokens, vocab) fp32, prefill s, decode s)."""
        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        sync()
        t0 = time.perf_counter()
        logits = [self.prefill(prompts).to(torch.float32, copy=True)]
        sync()
        t1 = time.perf_counter()
        self.lens_host = [len(x) for x in prompts]
        self.positions.copy_(torch.tensor(self.lens_host))
        for _ in range(new_tokens - 1):
            self.tokens.copy_(logits[-1].argmax(-1))
            self.step()
            logits.append(self.logits.to(torch.float32, copy=True))  # the next step overwrites it
            self.positions += 1
            self.lens_host = [n + 1 for n in self.lens_host]
        sync()
        t2 = time.perf_counter()
        logits = torch.stack(logits, dim=1)
        return logits.argmax(-1), logits, t1 - t0, t2 - t1


def teacher_forced(model, prompts, tokens, logits):
    """transformers' forward over prompt + generated tokens: (top-1 agreement, max |logit diff|, its
    top-1 predictions per request)."""
    agree, total, err, predicted = 0, 0, 0.0, []
    with torch.no_grad():
        for prompt, gen, ours in zip(prompts, tokens, logits):
            seq = torch.cat([prompt.to(gen.device), gen[:-1]])[None]
            theirs = model(seq).logits[0, len(prompt) - 1:].float()
            predicted.append(theirs.argmax(-1))
            agree += (predicted[-1] == gen).sum().item()
            total += gen.numel()
            err = max(err, (theirs - ours).abs().max().item())
    return agree / total, err, predicted


def agreement_with(truth: list[torch.Tensor], predicted) -> float:
    """Top-1 agreement of per-request predictions with the fp32 model's."""
    same = sum((t == p.to(t.device)).sum().item() for t, p in zip(truth, predicted))
    return same / sum(t.numel() for t in truth)


def against_fp32(model, prompts, runs: dict) -> dict:
    """At half precision greedy argmaxes of a random-weight model sit on near-ties, so a loop's
    predictions are held to the fp32 model's: ``runs`` maps a name to (the generated tokens the
    sequences are made of, the predictions at their positions) — the loop's own greedy tokens, or
    transformers' predictions in the loop's dtype on the loop's sequences. Returns each one's top-1
    agreement with the fp32 model on the same sequences. Converts ``model`` to fp32 in place (its
    last use)."""
    model.float()
    out, no_logits = {}, [torch.zeros(()) for _ in prompts]
    for name, (generated, predicted) in runs.items():
        _, _, truth = teacher_forced(model, prompts, generated, no_logits)
        out[name] = agreement_with(truth, predicted)
    return out


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="tiny")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: the model's)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--decode", choices=["graph-xqa", "eager-paged"], default="graph-xqa",
                    help="graph-xqa: xqa decode in one CUDA graph per step (eager on the CPU); eager-paged: the "
                         "paged wrapper, plan per step and run per layer, eagerly")
    ap.add_argument("--compare-flashinfer", action="store_true",
                    help="with --decode eager-paged: run the loop again with flashinfer's paged wrapper and print "
                         "both times per step (where flashinfer is importable)")
    ap.add_argument("--reference-attn", choices=["sdpa", "eager"], default="sdpa")
    ap.add_argument("--min-agreement", type=float, default=None,
                    help="top-1 agreement with transformers required (default 0.99 at fp32; at bf16/fp16 "
                         "without it the loop is held to the fp32 model, see --fp32-slack)")
    ap.add_argument("--fp32-slack", type=float, default=0.02,
                    help="at bf16/fp16: how much less often than transformers' own forward in that dtype the "
                         "loop may agree with the fp32 model")
    ap.add_argument("--tune-cache", type=Path, default=None, metavar="FILE",
                    help="the warm-up autotune's cache file (default: the user's cache directory, "
                         "$ATTN_DISPATCH_CACHE_DIR or ~/.cache/attn-dispatch)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.compare_flashinfer and args.decode != "eager-paged":
        ap.error(f"--compare-flashinfer with --decode {args.decode}: allowed only with --decode eager-paged "
                 "(the loop it runs again with FlashInfer's paged wrapper)")
    if args.layers is not None and args.layers < 1:
        ap.error(f"--layers {args.layers}: allowed an integer >= 1")
    return args


def run_loop(model, prompts, args, wrappers=dispatch):
    """An engine on ``wrappers``' paged wrapper; on a GPU a warm-up pass first (dispatch tunes and
    decides each bucket, kernels compile, the decode graph is captured). Returns (engine, generate's
    results)."""
    engine = Engine(model, [len(x) for x in prompts], args.new_tokens, args.page_size, args.decode, wrappers)
    with torch.no_grad():
        if engine.device.type == "cuda":
            tuning = dispatch.autotune(True, cache=args.tune_cache) if wrappers is dispatch else contextlib.nullcontext()
            t0 = time.perf_counter()
            with tuning as session:  # the warm-up slot: time here, look up afterwards
                engine.generate(prompts, args.new_tokens)
            if session is not None:
                kept = f"kept in {session.file}" if session.file else "not kept (ATTN_DISPATCH_AUTOTUNE=0)"
                print(f"warm-up autotune: {len(session.new)} buckets timed, {time.perf_counter() - t0:.1f} s with the "
                      f"warm-up pass; {kept}")
            # after the warm-up an engine freezes the collector's heap (SGLang's freeze_gc, vLLM's
            # freeze_gc_heap): a full collection then walks what serving allocates, not the libraries
            gc.collect()
            gc.freeze()
        return engine, engine.generate(prompts, args.new_tokens)


def decode_line(engine, requests: int, steps: int, t_decode: float, backend: str) -> str:
    if engine.decode_wrapper is not None:
        mode = "eager paged wrapper: plan per step, run per layer"
    else:
        mode = "CUDA graph replays" if engine.graph is not None else "eager"
    return (f"decode: {steps} steps x {requests} requests in {t_decode * 1e3:.1f} ms "
            f"({t_decode * 1e3 / max(steps, 1):.2f} ms per step, {steps * requests / max(t_decode, 1e-9):,.0f} "
            f"tokens/s, {mode}) on {backend}")


def compare_flashinfer(model, prompts, args, tokens, t_decode: float):
    """The same loop on flashinfer.BatchPrefillWithPagedKVCacheWrapper: its time per step beside ours.
    Returns its greedy tokens (None where it did not run)."""
    try:
        import flashinfer
    except Exception as exc:  # not installed, or no GPU build: say so and go on
        print(f"flashinfer: not run: flashinfer not importable ({type(exc).__name__}: {exc})")
        return None
    try:
        engine, (fi_tokens, _, _, fi_decode) = run_loop(model, prompts, args, flashinfer)
    except Exception as exc:  # a configuration FlashInfer refuses (fp32, say) is a result
        print(f"flashinfer: failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        return None
    steps = args.new_tokens - 1
    print("flashinfer " + decode_line(engine, args.requests, steps, fi_decode,
                                      "flashinfer.BatchPrefillWithPagedKVCacheWrapper"))
    ours, theirs = t_decode * 1e3 / max(steps, 1), fi_decode * 1e3 / max(steps, 1)
    same = (fi_tokens.cpu() == tokens.cpu()).float().mean().item()
    print(f"eager paged decode per step: dispatch {ours:.2f} ms, flashinfer {theirs:.2f} ms "
          f"(dispatch / flashinfer {ours / max(theirs, 1e-9):.2f}); greedy tokens equal on {same:.2%}")
    return fi_tokens


def main(argv=None) -> int:
    args = parse_args(argv)
    dtype, device = getattr(torch, args.dtype), torch.device(args.device)
    min_agreement = args.min_agreement if args.min_agreement is not None else (
        0.99 if dtype == torch.float32 else 0.95)
    torch.manual_seed(args.seed)
    layers = {} if args.layers is None else {"num_hidden_layers": args.layers}
    cfg = LlamaConfig(**{**MODELS[args.model], **layers})
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=args.reference_attn)
    model = model.to(device).eval()  # a no-op where the device context already placed it
    lo, hi = PROMPT_LENS[args.model]
    prompts = [torch.randint(0, cfg.vocab_size, (n,)) for n in torch.randint(lo, hi + 1, (args.requests,)).tolist()]
    engine, (tokens, logits, t_prefill, t_decode) = run_loop(model, prompts, args)
    decode_backend = dispatch.last_decision().chosen  # generate's last dispatch call is a decode step
    agreement, err, transformers_top1 = teacher_forced(model, prompts, tokens, logits)
    n_prompt = sum(len(x) for x in prompts)
    print(f"model {args.model} ({cfg.num_hidden_layers} layers, {cfg.num_attention_heads}/{cfg.num_key_value_heads} "
          f"heads, head_dim {cfg.head_dim}) on {device.type} {args.dtype}; {args.requests} requests, prompts "
          f"{min(len(x) for x in prompts)}..{max(len(x) for x in prompts)} tokens, page size {args.page_size}")
    print(f"prefill: {n_prompt} tokens in {t_prefill * 1e3:.1f} ms ({n_prompt / t_prefill:,.0f} tokens/s) "
          f"on {engine.prefill_wrapper.decision.chosen}")
    print(decode_line(engine, args.requests, args.new_tokens - 1, t_decode, decode_backend))
    held_to_fp32 = dtype != torch.float32 and args.min_agreement is None
    ok = agreement >= min_agreement
    need = "shown, the fp32 model decides" if held_to_fp32 else f"need {min_agreement:.0%}"
    print(f"teacher-forced vs transformers ({args.reference_attn}): top-1 agreement {agreement:.2%} "
          f"({need}), max |logit diff| {err:.2e}: {'OK' if ok or held_to_fp32 else 'DISAGREE'}")
    fi_tokens = compare_flashinfer(model, prompts, args, tokens, t_decode) if args.compare_flashinfer else None
    if held_to_fp32:
        runs = {"dispatch": (tokens, tokens), f"transformers {args.dtype}": (tokens, transformers_top1)}
        if fi_tokens is not None:
            runs["flashinfer"] = (fi_tokens, fi_tokens)
        fp32 = against_fp32(model, prompts, runs)
        ok = fp32["dispatch"] >= fp32[f"transformers {args.dtype}"] - args.fp32_slack
        print("top-1 agreement with the fp32 model: " + ", ".join(f"{k} {v:.2%}" for k, v in fp32.items())
              + f": {'OK' if ok else 'DISAGREE'} (dispatch within {args.fp32_slack:.0%} of transformers)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
