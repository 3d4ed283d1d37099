"""Test session set-up shared by every test module.

Without a GPU, Triton kernels run through Triton's interpreter on CPU tensors:
the variable must be set before any ``@triton.jit`` function is defined.

One intra-op thread: the suite's tensors are small (a few thousand elements), so torch's
thread pool only adds hand-offs, and on the 2-core CI machine its threads (one per core, in
every test process and subprocess) oversubscribe the cores: the suite took 25 minutes there,
6 with one thread. OMP_NUM_THREADS is set before torch is imported (it sizes the pool at
start, and subprocesses inherit it); set_num_threads covers a torch imported earlier. An
OMP_NUM_THREADS given by the caller is kept.
"""
import os
import tempfile

os.environ.setdefault("OMP_NUM_THREADS", "1")
# The autotune's default cache is read at first use: the suite keeps its own (empty at the start),
# never the user's tuned times, which would change decisions the tests assert.
os.environ["ATTN_DISPATCH_CACHE_DIR"] = tempfile.mkdtemp(prefix="attn-dispatch-test-cache-")

import pytest  # noqa: E402
import torch  # noqa: E402

if os.environ["OMP_NUM_THREADS"].isdigit() and int(os.environ["OMP_NUM_THREADS"]) > 0:
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def gpu_like(monkeypatch):
    """The path CUDA tensors take (device data not re-read, the fast lanes), driven with CPU tensors."""
    import dispatch
    from dispatch.entries import _base

    monkeypatch.setattr(_base, "CPU_VALUE_CHECKS", False)
    dispatch.entries.clear_caches()
    yield
    dispatch.entries.clear_caches()
