"""Linear attention for hybrid models: the gated delta rule, chunked for prompts and one step for decode
(gated_delta_rule.py), the causal short convolution before it (short_conv.py), and Qwen3.5's Gated DeltaNet
layer that joins them over packed batches with per-sequence state carried in and out (gated_deltanet_layer.py)."""
