"""native-triton keeps its plan and takes its launcher on repeats, through every entry point (every
path fast: a single prefill of q=1 over 8k keys cost 215 us of host time for an 18 us kernel,
because native's plan() ran on every call and the kernel went through Triton's JIT dispatch).

Driven on the CPU through Triton's interpreter with the entries' GPU path (``gpu_like``): plan() and
launcher() are counted; the repeats' outputs are checked against the fp64 oracle."""
from __future__ import annotations

import pytest
import torch

import dispatch
import oracle
from backends import get_backend
from dispatch.benchmark.cases import cudnn_args, paged, paged_wrapper, ragged, ragged_wrapper, trtllm_args, xqa_args

BAND = 1e-2
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on a GPU host the kernels run on it


@pytest.fixture
def counted(monkeypatch):
    """native-triton's plan() and launcher() counted, and each launch its launcher makes."""
    backend = get_backend("native-triton")
    calls = {"plan": 0, "launcher": 0, "launched": 0}
    plan, launcher = backend.plan, backend.launcher

    def counting_plan(*args, **kwargs):
        calls["plan"] += 1
        return plan(*args, **kwargs)

    def counting_launcher(*args, **kwargs):
        calls["launcher"] += 1
        launch = launcher(*args, **kwargs)
        assert launch is not None, "native gave no launcher for an exact repeat"

        def counting_launch(batch):
            calls["launched"] += 1
            launch(batch)
        return counting_launch

    monkeypatch.setattr(backend, "plan", counting_plan)
    monkeypatch.setattr(backend, "launcher", counting_launcher)
    return calls


def _dense(c: dict, b: int, which: str) -> torch.Tensor:
    """Request b's keys or values (kv_lens[b], Hkv, D) of a paged or ragged case."""
    if "cache" in c:
        half = c["cache"][:, 0 if which == "k" else 1]
        if c["layout"] == "HND":
            half = half.transpose(1, 2)
        pages = c["table"][b].long()
        return half[pages].reshape(-1, *half.shape[2:])[: c["kv_lens"][b]]
    start = int(c["kv"][b])
    return c[which][start: start + c["kv_lens"][b]]


def _expected(c: dict, q: torch.Tensor, causal: bool = True, one_row: bool = False) -> torch.Tensor:
    lens = [1] * len(c["kv_lens"]) if one_row else c["q_lens"]
    starts = [0, *torch.tensor(lens).cumsum(0).tolist()]
    qs = [q[a:b] for a, b in zip(starts[:-1], starts[1:])]
    ks = [_dense(c, b, "k") for b in range(len(lens))]
    vs = [_dense(c, b, "v") for b in range(len(lens))]
    out, _ = oracle.batch_attention_fp64(qs, ks, vs, sm_scale=c["head_dim"] ** -0.5, causal=causal)
    return out


def _calls():
    """entry -> (call(q) -> out, the case, the query shape, whether one row per request)."""
    c, r = paged(device=DEVICE), ragged(device=DEVICE)

    def single(q):
        return dispatch.single_prefill_with_kv_cache(q, r["k"][: r["kv_lens"][0]], r["v"][: r["kv_lens"][0]],
                                                     causal=True)

    def wrapper_run(make, case, run):
        w = make(case)
        return lambda q: run(w, q)

    def entry(args_of, fn, case):
        args, kw = args_of(case)
        return lambda q: (lambda res: res[0] if isinstance(res, tuple) else res)(fn(q, *args[1:], **kw))

    one = dict(r, q_lens=r["q_lens"][:1], kv_lens=r["kv_lens"][:1])
    # built on demand: a wrapper plans its backend in plan(), which the counts include
    return {
        "single": lambda: (single, one, (r["q_lens"][0],) + tuple(r["q"].shape[1:]), False),
        "paged_run": lambda: (wrapper_run(paged_wrapper, c, lambda w, q: w.run(q, c["cache"])), c,
                              tuple(c["q"].shape), False),
        "ragged_run": lambda: (wrapper_run(ragged_wrapper, r, lambda w, q: w.run(q, r["k"], r["v"])), r,
                               tuple(r["q"].shape), False),
        "cudnn": lambda: (entry(cudnn_args, dispatch.cudnn_batch_prefill_with_kv_cache, c), c, tuple(c["q"].shape),
                          False),
        "trtllm": lambda: (entry(trtllm_args, dispatch.trtllm_batch_context_with_kv_cache, c), c,
                           tuple(c["q"].shape), False),
        "xqa": lambda: (entry(xqa_args, dispatch.xqa_batch_decode_with_kv_cache, c), c,
                        (len(c["kv_lens"]),) + tuple(c["q"].shape[1:]), True),
    }


@pytest.mark.parametrize("entry", ["single", "paged_run", "ragged_run", "cudnn", "trtllm", "xqa"])
def test_native_plans_once_and_launches_repeats(gpu_like, counted, entry):
    with dispatch.use_backend("native-triton"):  # the wrappers choose at plan()
        call, case, shape, one_row = _calls()[entry]()
        dtype = case["q"].dtype
        for i in range(3):
            q = torch.randn(shape, dtype=dtype, device=DEVICE)
            out = call(q)
            expected = _expected(case, q.double(), one_row=one_row)
            assert (out.double() - expected).norm() / expected.norm() < BAND
    # the first call plans, the first repeat asks for the launcher and launches through it, as the second
    assert counted == {"plan": 1, "launcher": 1, "launched": 2}


def test_single_prefill_lanes_of_one_call_key_share_the_plan(gpu_like, counted):
    """Two key lengths of one size class share the call key's kept plan; each lane is served by the
    plan of its own sizes (the second derived from the first: one plan made) and takes its own
    launcher on repeats (asked on the first and launched from it on)."""
    r = ragged(device=DEVICE)
    k, v = r["k"], r["v"]
    with dispatch.use_backend("native-triton"):
        for n in (9, 12, 9, 12, 9, 12, 9, 12):
            q = torch.randn(1, *r["q"].shape[1:], dtype=r["q"].dtype, device=DEVICE)
            out = dispatch.single_prefill_with_kv_cache(q, k[:n], v[:n], causal=True)
            expected, _ = oracle.batch_attention_fp64([q.double()], [k[:n].double()], [v[:n].double()],
                                                      sm_scale=r["head_dim"] ** -0.5, causal=True)
            assert (out.double() - expected).norm() / expected.norm() < BAND
    assert counted == {"plan": 1, "launcher": 2, "launched": 6}
