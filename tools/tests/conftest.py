"""The tools' tests: as tests/conftest.py, Triton kernels run through Triton's interpreter without a GPU
(the variable must be set before any ``@triton.jit`` function is defined)."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
