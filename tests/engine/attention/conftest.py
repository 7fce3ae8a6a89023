"""Runs before any test module of tests/engine/attention is imported: without a GPU, the Triton
kernels must be defined in interpreter mode (see tests/kernels/conftest.py)."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
