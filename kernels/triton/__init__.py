"""GPU kernels in Triton: paged decode and shared-prefix attention with log-sum-exp, the reduction of split contexts,
the merge, and the KV write. Under TRITON_INTERPRET=1 they run on the CPU, which is how the tests run them."""
