"""Linear attention for hybrid models: the gated delta rule, chunked for prompts and one step for decode
(gated_delta_rule.py), the causal short convolution before it (short_conv.py), Qwen3.5's Gated DeltaNet
layer that joins them over packed batches with per-sequence state carried in and out (gated_deltanet_layer.py),
and the pool that keeps that state for every live sequence beside the KV blocks (state_pool.py)."""
