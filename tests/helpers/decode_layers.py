"""A decode layer of random GGUF blocks and norms, and a step's rows, for the tests of the C decode kernels."""
import torch

from kernels.cpu.decode_layer import DecodeLayer, LayerNorms
from kernels.cpu.weight_set import WeightSet
from tests.helpers.random_blocks import random_weight

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE, EPS = 256, 4, 2, 64, 512, 1e-5


def layer_parts(qk_norm: bool, seed: int = 0):
    """Weights in the formats a Q4_K_M file mixes, a bias on q and v (Qwen2), random norms."""
    shapes = {"q": ("Q4_K", HEADS * HEAD_DIM, HIDDEN), "k": ("Q5_0", KV_HEADS * HEAD_DIM, HIDDEN),
              "v": ("Q8_0", KV_HEADS * HEAD_DIM, HIDDEN), "o": ("Q4_1", HIDDEN, HEADS * HEAD_DIM),
              "gate": ("Q4_K", INTERMEDIATE, HIDDEN), "up": ("Q6_K", INTERMEDIATE, HIDDEN),
              "down": ("Q8_0", HIDDEN, INTERMEDIATE)}
    weights = {name: random_weight(format, rows, cols, seed=seed + i)
               for i, (name, (format, rows, cols)) in enumerate(shapes.items())}
    generator = torch.Generator().manual_seed(seed)
    biases = {"q": torch.randn(HEADS * HEAD_DIM, generator=generator), "k": None,
              "v": torch.randn(KV_HEADS * HEAD_DIM, generator=generator)}
    def norm(width):
        return torch.rand(width, generator=generator) * 2 - 0.5
    norms = LayerNorms(norm(HIDDEN), norm(HIDDEN), norm(HEAD_DIM) if qk_norm else None,
                       norm(HEAD_DIM) if qk_norm else None, EPS)
    return weights, biases, norms


def decode_layer(weights, biases, norms) -> DecodeLayer:
    w = weights
    return DecodeLayer(WeightSet([w["q"], w["k"], w["v"]], [biases["q"], biases["k"], biases["v"]]),
                       WeightSet([w["o"]], [None]), WeightSet([w["gate"], w["up"]], [None, None]),
                       WeightSet([w["down"]], [None]), norms, HEADS, KV_HEADS, HEAD_DIM)


def step_inputs(rows: int):
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, HIDDEN, generator=generator)
    angles = torch.rand(rows, HEAD_DIM // 2, generator=generator) * 1000
    emb = torch.cat((angles, angles), -1)
    return x, emb.cos(), emb.sin()
