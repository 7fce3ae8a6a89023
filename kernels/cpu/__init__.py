"""CPU kernels: the C sources in csrc/, built once per machine and loaded by native.py, each entry point called
with checked tensors (entry_points.py) and registered as a torch op, swarm::<name> (ops.py); cascade decode and
prefill attention in C or on torch's fused CPU attention; RMSNorm and rotary; the quantized decode matmul; oneDNN
matmuls."""
