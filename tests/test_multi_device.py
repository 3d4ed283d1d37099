"""Two GPUs in one process: every entry point, on every backend that serves it, gives the same
answer on cuda:1 after the same call on cuda:0 (caches keyed on the device index, launches
under the tensors' device), and that answer agrees with the CPU reference.

Needs two CUDA devices (run on the GPU host: ``pytest tests/test_multi_device.py``); the CPU
side of the same property (keys hold the device index) is tests/test_backend_caches.py and
tests/test_fuzz.py's sibling calls.
"""
import pytest
import torch

import dispatch
import _api_cases
from _api_cases import HQ, cudnn_args, paged, ragged, trtllm_args, xqa_args
from _api_cases import on_device as to

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
D = 64
BACKENDS = ("native-triton", "xqa", "cudnn", "torch-flash", "fa2", None)  # None: the automatic choice


def calls():
    """name -> (cuda device -> output), each built as a user would on that device."""
    dt = torch.bfloat16
    # Pages of 16 and head_dim 64: sizes every backend takes (XQA pages 16..128; FlashInfer fa2 d >= 64).
    saved = _api_cases.P, _api_cases.D
    _api_cases.P, _api_cases.D = 16, D
    try:
        pc, rc = paged(kv_lens=(19, 4, 33), dtype=dt), ragged(dtype=dt)
        t_args, t_kw = trtllm_args(pc)
        x_args, x_kw = xqa_args(pc)
        c_args, c_kw = cudnn_args(pc)
    finally:
        _api_cases.P, _api_cases.D = saved

    def single(dev):
        return dispatch.single_prefill_with_kv_cache(*to(dev, [rc["q"][:5], rc["k"][:9], rc["v"][:9]]), causal=True)

    def paged_run(dev):
        w = dispatch.BatchPrefillWithPagedKVCacheWrapper(torch.empty(1 << 16, dtype=torch.uint8, device=dev), "NHD")
        w.plan(*to(dev, [pc["qo"], pc["kv_indptr"], pc["perm"], pc["last"]]), HQ, 2, D, 16, causal=True,
               q_data_type=dt)
        return w.run(to(dev, pc["q"]), to(dev, pc["cache"]))

    def ragged_run(dev):
        w = dispatch.BatchPrefillWithRaggedKVCacheWrapper(torch.empty(1 << 16, dtype=torch.uint8, device=dev))
        w.plan(to(dev, rc["qo"]), to(dev, rc["kv"]), HQ, 2, D, causal=True, q_data_type=dt)
        return w.run(*to(dev, [rc["q"], rc["k"], rc["v"]]))

    return {
        "single": single, "paged": paged_run, "ragged": ragged_run,
        "trtllm": lambda dev: dispatch.trtllm_batch_context_with_kv_cache(*to(dev, t_args), **to(dev, t_kw)),
        "xqa": lambda dev: dispatch.xqa_batch_decode_with_kv_cache(*to(dev, x_args), **to(dev, x_kw)),
        "cudnn": lambda dev: dispatch.cudnn_batch_prefill_with_kv_cache(*to(dev, c_args), **to(dev, c_kw))[0],
    }


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b or "auto")
@pytest.mark.parametrize("entry", ["single", "paged", "ragged", "trtllm", "xqa", "cudnn"])
def test_second_device_after_first(entry, backend):
    call = calls()[entry]
    with dispatch.use_backend("reference"):
        want = call("cpu").float()
    results = []
    for dev in ("cuda:0", "cuda:1"):
        torch.cuda.set_device(0)  # the current device stays cuda:0, as in a user's process
        try:
            if backend is None:
                results.append(call(dev))
            else:
                with dispatch.use_backend(backend):
                    results.append(call(dev))
        except (dispatch.BackendRefusedError, dispatch.NoBackendError) as exc:
            pytest.skip(f"{backend} does not serve {entry} here: {str(exc).splitlines()[0]}")
    first, second = results
    assert first.device == torch.device("cuda:0") and second.device == torch.device("cuda:1")
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    for got in (first, second):
        assert (got.float().cpu() - want).abs().max().item() < 2e-2  # bf16 band (METHOD.md)
    if backend is not None:  # one kernel on both GPUs: the same bits
        assert torch.equal(first.cpu(), second.cpu()), f"{entry} on {backend}: cuda:1 differs from cuda:0"
