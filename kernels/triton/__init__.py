"""GPU kernels in Triton: paged decode and shared-prefix attention with log-sum-exp, the reduction of split contexts,
the merge, and the KV write; and matmuls straight from GGUF blocks (`quant_matmul`: a float32 decode kernel for a few
rows, tiles expanded into tl.dot for many, each block expanded to exactly gguf's values). Under TRITON_INTERPRET=1
they run on the CPU, which is how the tests run them."""
import os


def interpreted() -> bool:
    """Triton runs its kernels in its interpreter (TRITON_INTERPRET=1): read as kernels are defined and launched."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
