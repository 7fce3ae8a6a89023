"""The plain PyTorch attention every fast path is checked against: paged attention over the block pool, and the cascade
pieces (shared prefix, private tail, merge by log-sum-exp)."""
