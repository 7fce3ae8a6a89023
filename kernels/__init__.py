"""Kernels sorted by kind: reference/ (plain PyTorch, the oracle), cpu/ (C sources and torch's CPU ops), triton/ (GPU).
Plain functions on tensors; which set runs is the engine's choice (engine.attention.select). Nothing here imports
engine or swarm."""
