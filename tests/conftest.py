"""Test session set-up shared by every test module.

Without a GPU, Triton kernels run through Triton's interpreter on CPU tensors:
the variable must be set before any ``@triton.jit`` function is defined.
"""
import os

import pytest
import torch

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
