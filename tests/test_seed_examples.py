"""Every example of the seed pages runs as written, on the CPU, and agrees with the fp64 oracle.

The examples are read from tests/seed_docs (tests/_seed_text.py), with two edits only:
``flashinfer`` -> ``dispatch`` and ``"cuda:0"`` -> ``"cpu"``; sizes are the pages' own (all 32
layers run, the CPU handles them in seconds). Each expected output a page shows
(``torch.Size(...)``, ``True``, the first row of a printed mask) is compared with the value the
step produces, and the examples' own asserts run. The results of the layers in ORACLE_LAYERS
are checked against tests/oracle.py (fp16 band 1e-2, as test_agreement.py); a subset only for
CPU time: each layer's fp64 oracle costs more than the call it checks.
"""
from __future__ import annotations

import torch

from _calls import compare_out
from _seed_text import seed_examples
from oracle import attention_fp64

EXAMPLES = seed_examples()
LAYERS = 32  # as the pages write it
ORACLE_LAYERS = (0, 13, 31)


def _source(step: str) -> str:
    return step.replace("flashinfer", "dispatch").replace('"cuda:0"', '"cpu"')


def _run(name: str, edit=lambda src: src) -> dict:
    torch.manual_seed(0)
    ns: dict = {}
    for step, shown in EXAMPLES[name]:
        src = edit(_source(step))
        if shown:
            value = eval(compile(src, f"<{name} example>", "eval"), ns)
            _same_as_shown(value, shown)
        else:
            exec(compile(src, f"<{name} example>", "exec"), ns)
    return ns


def _same_as_shown(value, shown: str) -> None:
    if isinstance(value, torch.Tensor):  # a printed tensor: its first printed row
        first = shown.splitlines()[0].replace(", device='cuda:0'", "")
        assert repr(value).splitlines()[0] == first, f"{repr(value).splitlines()[0]!r} != {first!r}"
    else:
        assert repr(value) == shown, f"{value!r} != {shown!r}"


def _requests(ns, kv_len_of):
    qo = ns["qo_indptr"].tolist()
    return [(qo[b], qo[b + 1], kv_len_of(b)) for b in range(ns["batch_size"])]


def _check_layers(ns, outputs, kv_of):
    sm = ns["head_dim"] ** -0.5
    for i in ORACLE_LAYERS:
        q = ns["q_at_layer"][i]
        refs = []
        for b, (start, end, kv_len) in enumerate(_requests(ns, ns["kv_len"].__getitem__)):
            k, v = kv_of(i, b, kv_len)
            refs.append(attention_fp64(q[start:end], k, v, sm_scale=sm, causal=True)[0])
        compare_out(outputs[i], torch.cat(refs), torch.float16)


def test_paged_wrapper_example():
    ns = _run("paged")
    pages = ns["paged_kv_indptr"].tolist()
    ids = ns["paged_kv_indices"]

    def kv_of(i, b, kv_len):
        cache = ns["kv_cache_at_layer"][i][ids[pages[b]:pages[b + 1]].long()]  # (n, 2, P, Hkv, D)
        return (cache[:, 0].reshape(-1, *cache.shape[-2:])[:kv_len], cache[:, 1].reshape(-1, *cache.shape[-2:])[:kv_len])

    assert len(ns["outputs"]) == LAYERS
    _check_layers(ns, ns["outputs"], kv_of)
    assert ns["o_custom"].shape == (100, 64, 128)


def test_ragged_wrapper_example():
    """The page's last line reads ``outputs_custom_mask[0]`` from a list its loop never fills
    (an IndexError as written). FlashInfer's own code is the same loop, so we follow what the
    example means: the loop appends each ``o_custom``, and the shown shape is then checked."""
    def fill_list(src: str) -> str:
        if "o_custom = prefill_wrapper.run(q, k, v)" in src:
            src += "    outputs_custom_mask.append(o_custom)\n"
        return src

    ns = _run("ragged", fill_list)
    kv = ns["kv_indptr"].tolist()

    def kv_of(i, b, kv_len):
        return ns["k_at_layer"][i][kv[b]:kv[b + 1]], ns["v_at_layer"][i][kv[b]:kv[b + 1]]

    assert len(ns["outputs_custom_mask"]) == LAYERS
    _check_layers(ns, ns["outputs"], kv_of)
    _check_layers(ns, ns["outputs_custom_mask"], kv_of)


def test_single_prefill_example():
    """004's example at its full size (qo 128, kv 4096, 32/4 heads, head_dim 128)."""
    ns = _run("single")
    ref, _ = attention_fp64(ns["q"], ns["k"], ns["v"], sm_scale=128 ** -0.5, causal=True)
    compare_out(ns["o"], ref, torch.float16)
    compare_out(ns["o_custom"], ref, torch.float16)


def test_examples_found():
    assert set(EXAMPLES) == {"paged", "ragged", "single"}
    assert sum(len(s) for s in EXAMPLES.values()) > 60
