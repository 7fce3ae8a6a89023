"""Runs before any test module of tests/kernels is imported: without a GPU, the Triton kernels
must be defined in interpreter mode, and a module collected earlier may already import triton
(tests/kernels/cpu/test_fused_ops.py does, through transformers)."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
