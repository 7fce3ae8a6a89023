"""The plain PyTorch kernels every fast path is checked against: paged attention over the block pool, the cascade
pieces (shared prefix, private tail, merge by log-sum-exp), and weights kept in GGUF blocks (quant_blocks): their
float values, bitwise gguf's (gguf_dequant), and the matmul through a reused scratch of dequantized tiles
(quant_matmul), the fallback on every device."""
