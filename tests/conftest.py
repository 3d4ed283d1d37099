"""Test session set-up shared by every test module.

Without a GPU, Triton kernels run through Triton's interpreter on CPU tensors:
the variable must be set before any ``@triton.jit`` function is defined.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
