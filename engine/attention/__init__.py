"""Attention as the model calls it: the `AttentionBackend` interface (base.py), the per-step plan of which rows
share a trunk and which are private (plan.py), the one forward that runs it (cascade.py) over the reference, CPU
or Triton kernel set (kernel_sets.py), and the choice of set (select.py, SWARM_ATTENTION_BACKEND)."""
