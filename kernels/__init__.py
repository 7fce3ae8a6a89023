"""Kernels sorted by kind: reference/ (plain PyTorch, the oracle), cpu/ (C sources and torch's CPU ops), triton/ (GPU).
backend.py picks the set that runs. Nothing here imports engine or swarm."""
