"""The examples run as shipped, on the CPU with tiny configs, and agree with transformers' own forward.

examples/serving_loop.py: paged-KV prefill through the paged wrapper and decode through xqa, or
eagerly through the paged wrapper (plan per step, run per layer), teacher-forced against
LlamaForCausalLM (sdpa); examples/transformers_attention.py and the
helper it shows (dispatch.integrations.transformers): prefill and greedy generate equal sdpa's.
transformers is the `test` extra's; without it these tests skip (and say so).
"""
import copy
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers missing: pip install attn-dispatch[test]")

ROOT = Path(__file__).resolve().parent.parent


def load_example(name):
    spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def agreement_line(out: str):
    m = re.search(r"top-1 agreement ([\d.]+)% .* max \|logit diff\| ([\d.e+-]+)", out)
    assert m, out
    return float(m.group(1)) / 100, float(m.group(2))


def test_serving_loop_agrees_with_transformers(capsys):
    """8 ragged requests, fp32: every teacher-forced next token equals transformers' (100%), logits
    within fp32 rounding; prefill and decode both went through dispatch."""
    serving = load_example("serving_loop")
    rc = serving.main(["--requests", "8", "--new-tokens", "6", "--page-size", "8", "--seed", "1"])
    out = capsys.readouterr().out
    agreement, err = agreement_line(out)
    assert rc == 0, out
    assert agreement == 1.0, out
    assert err < 1e-4, out
    assert re.search(r"prefill: \d+ tokens .* tokens/s", out) and re.search(r"decode: 5 steps x 8 requests", out)


def test_serving_loop_check_catches_a_wrong_model(capsys, monkeypatch):
    """The check can fail: with RoPE left out of the loop's attention, predictions diverge from
    transformers' and main() returns 1."""
    serving = load_example("serving_loop")
    monkeypatch.setattr(serving, "rotate", lambda x, cos, sin: x)
    rc = serving.main(["--requests", "8", "--new-tokens", "6", "--seed", "1"])
    out = capsys.readouterr().out
    agreement, err = agreement_line(out)
    assert rc == 1 and "DISAGREE" in out, out
    assert agreement < 0.99 and err > 1e-2, out


def test_serving_loop_half_precision_is_held_to_the_fp32_model(capsys, monkeypatch):
    """At bf16 the loop is also measured against the fp32 model beside transformers' own bf16
    forward; a loop without RoPE fails both measures."""
    serving = load_example("serving_loop")
    assert serving.main(["--dtype", "bfloat16", "--requests", "8", "--new-tokens", "6", "--seed", "1"]) == 0
    good = capsys.readouterr().out
    fp32 = re.search(r"agreement with the fp32 model: dispatch ([\d.]+)%, transformers bfloat16 ([\d.]+)%: OK", good)
    assert fp32 and float(fp32.group(1)) >= float(fp32.group(2)) - 2, good
    monkeypatch.setattr(serving, "rotate", lambda x, cos, sin: x)
    assert serving.main(["--dtype", "bfloat16", "--requests", "8", "--new-tokens", "6", "--seed", "1"]) == 1
    bad = capsys.readouterr().out
    assert re.search(r"agreement with the fp32 model: .*: DISAGREE", bad), bad


def count_paged_wrapper(monkeypatch):
    """Calls of BatchPrefillWithPagedKVCacheWrapper.plan and .run (dispatch's class), counted."""
    import dispatch

    cls, counts = dispatch.BatchPrefillWithPagedKVCacheWrapper, {"plan": 0, "run": 0}
    for name in counts:
        def counted(self, *args, _real=getattr(cls, name), _name=name, **kwargs):
            counts[_name] += 1
            return _real(self, *args, **kwargs)
        monkeypatch.setattr(cls, name, counted)
    return counts


def no_xqa(monkeypatch):
    import dispatch

    def refuse(*args, **kwargs):
        raise AssertionError("the eager paged decode called xqa")
    monkeypatch.setattr(dispatch, "xqa_batch_decode_with_kv_cache", refuse)


EAGER = ["--decode", "eager-paged", "--requests", "4", "--new-tokens", "6", "--page-size", "8", "--seed", "2"]


def test_serving_loop_eager_paged_decode_plans_per_step_runs_per_layer(capsys, monkeypatch):
    """--decode eager-paged: the prefill plan, then one plan per decode step and one run per layer
    per step (2 layers x (1 + 5)), no xqa call; the tokens agree with transformers; without
    flashinfer, --compare-flashinfer says so and the loop's result stands."""
    serving = load_example("serving_loop")
    counts = count_paged_wrapper(monkeypatch)
    no_xqa(monkeypatch)
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # import flashinfer raises ImportError
    rc = serving.main(EAGER + ["--compare-flashinfer"])
    out = capsys.readouterr().out
    agreement, err = agreement_line(out)
    assert rc == 0 and agreement == 1.0 and err < 1e-4, out
    assert counts == {"plan": 1 + 5, "run": 2 * (1 + 5)}
    assert re.search(r"decode: 5 steps x 4 requests in [\d.]+ ms \([\d.]+ ms per step, .*eager paged wrapper: "
                     r"plan per step, run per layer\) on reference", out), out
    assert "flashinfer: not run: flashinfer not importable" in out


def test_serving_loop_compare_flashinfer_runs_the_same_loop_on_its_wrapper(capsys, monkeypatch):
    """--compare-flashinfer repeats the loop on flashinfer.BatchPrefillWithPagedKVCacheWrapper (here a
    stand-in module holding dispatch's class: FlashInfer runs on CUDA only) and prints both times per
    step; the same computation gives the same greedy tokens."""
    import types

    import dispatch

    serving = load_example("serving_loop")
    counts = count_paged_wrapper(monkeypatch)
    stand_in = types.ModuleType("flashinfer")
    stand_in.BatchPrefillWithPagedKVCacheWrapper = dispatch.BatchPrefillWithPagedKVCacheWrapper
    monkeypatch.setitem(sys.modules, "flashinfer", stand_in)
    assert serving.main(EAGER + ["--compare-flashinfer"]) == 0
    out = capsys.readouterr().out
    assert counts == {"plan": 2 * (1 + 5), "run": 2 * 2 * (1 + 5)}
    assert re.search(r"flashinfer decode: 5 steps x 4 requests .* on flashinfer.BatchPrefillWithPagedKVCacheWrapper",
                     out), out
    assert re.search(r"eager paged decode per step: dispatch [\d.]+ ms, flashinfer [\d.]+ ms .*greedy tokens equal "
                     r"on 100.00%", out), out


def test_serving_loop_compare_flashinfer_needs_the_eager_paged_decode(capsys):
    serving = load_example("serving_loop")
    with pytest.raises(SystemExit) as exc:
        serving.main(["--compare-flashinfer"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--compare-flashinfer with --decode graph-xqa: allowed only with --decode eager-paged" in err


def count_calls(monkeypatch):
    """Every call the integration makes to dispatch.single_prefill_with_kv_cache, by its keywords."""
    import dispatch

    real, calls = dispatch.single_prefill_with_kv_cache, []
    monkeypatch.setattr(dispatch, "single_prefill_with_kv_cache", lambda *a, **k: calls.append(k) or real(*a, **k))
    return calls


def test_transformers_example_runs(monkeypatch):
    """The ~15-line example: prefill logits and greedy generate equal sdpa's (it returns 0), with
    attention on dispatch: 2 layers x 2 rows for the prefill, then for the prompt and each of
    the 15 decode steps of generate."""
    calls = count_calls(monkeypatch)
    assert load_example("transformers_attention").main() == 0
    assert len(calls) == 2 * 2 * (1 + 1 + 15)


def tiny_pair(seed=0):
    from transformers import AutoModelForCausalLM, LlamaConfig

    from dispatch.integrations.transformers import register

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, vocab_size=256)
    ours = AutoModelForCausalLM.from_config(cfg, attn_implementation=register()).eval()
    sdpa = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="sdpa").eval()
    assert ours.config._attn_implementation == "dispatch" and sdpa.config._attn_implementation == "sdpa"
    sdpa.load_state_dict(ours.state_dict())
    return ours, sdpa


def test_padded_batch_generate_equals_sdpa(monkeypatch):
    """Left-padded batch: the padding mask goes through custom_mask; logits at real tokens and
    greedy generate equal sdpa's; attention ran on dispatch (the call is counted)."""
    ours, sdpa = tiny_pair(1)
    ids = torch.randint(1, 256, (3, 20))
    mask = torch.ones(3, 20, dtype=torch.long)
    mask[1, :5] = 0
    mask[2, :11] = 0
    calls = count_calls(monkeypatch)
    kw = dict(attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        a, b = ours(ids, attention_mask=mask).logits, sdpa(ids, attention_mask=mask).logits
        assert len(calls) == 2 * 3 and all(k["custom_mask"] is not None for k in calls)  # 2 layers x 3 rows
        assert (a - b)[mask.bool()].abs().max().item() < 1e-4
        assert torch.equal(ours.generate(ids, **kw), sdpa.generate(ids, **kw))


def test_static_cache_generate_equals_sdpa():
    """A static cache hands the attention more key slots than the prompt on prefill (unwritten)."""
    ours, sdpa = tiny_pair(2)
    ids = torch.randint(1, 256, (1, 12))
    kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=0, cache_implementation="static")
    with torch.no_grad():
        assert torch.equal(ours.generate(ids, **kw), sdpa.generate(ids, **kw))


def test_masks_additive_or_refused():
    """An additive 0/-inf mask equals its bool form; biases, per-head masks and sinks are refused."""
    from dispatch.integrations.transformers import dispatch_attention_forward

    module = torch.nn.Module()
    q, k = torch.randn(1, 4, 3, 16), torch.randn(1, 2, 3, 16)
    keep = torch.tensor([[1, 0, 0], [1, 1, 0], [0, 1, 1]], dtype=torch.bool).view(1, 1, 3, 3)
    additive = torch.zeros(1, 1, 3, 3).masked_fill(~keep, torch.finfo(torch.float32).min)
    want, _ = dispatch_attention_forward(module, q, k, k, keep)
    got, _ = dispatch_attention_forward(module, q, k, k, additive)
    assert want.shape == (1, 3, 4, 16) and torch.equal(got, want)
    bias = torch.zeros(1, 1, 3, 3)
    bias[0, 0, 0, 1] = 0.5
    with pytest.raises(ValueError, match="biases other than 0"):
        dispatch_attention_forward(module, q, k, k, bias)
    with pytest.raises(ValueError, match=r"attention_mask of shape \(1, 4, 3, 3\)"):
        dispatch_attention_forward(module, q, k, k, torch.ones(1, 4, 3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="s_aux"):
        dispatch_attention_forward(module, q, k, k, None, s_aux=torch.zeros(4))


def test_readme_python_blocks_run():
    """examples/README.md's python blocks run as written."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "examples" / "README.md").read_text(), re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, "examples/README.md", "exec"), {})


def test_import_dispatch_does_not_import_transformers():
    code = "import sys, dispatch; assert 'transformers' not in sys.modules and 'dispatch.integrations' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
