"""The oracle of the prompt attention in integer products (kernels/cpu/csrc/rows_attention_i8.h, which
csrc/rows_attention.c runs with products 2), in plain PyTorch.

k and v are rounded to bfloat16, then each row's head quantized as GGUF's Q8_0 quantizes (q8_codes): q and k in
sub-blocks of 64 dims (32 where the heads are no multiple of 64), v in sub-blocks of 32. A row's keys are cut into
chunks of `chunk` from key 0. In each chunk, over the keys the row sees:

    s = scale * sum over sub-blocks of dq * dk * (q's codes . k's codes)
    e = exp(s - max s);  sum = sum of e
    o = per sub-block g of v:  step * (codes of e * dv_g / step) . (v's codes),  step = (the largest dv_g of the
        chunk's keys up to the row's last one) / 255, the codes rounded to nearest, ties to even

and the chunks' (max, sum, o) are merged by log-sum-exp. Quantizing in float32 as the kernel does, the rest in
float64: the kernel's exp is its own, so a weight's code may land one step apart, and the two agree to a few
thousandths, not bit for bit. The quantizer itself is gguf's (tests check q8_codes against gguf.quants).
"""
from __future__ import annotations

import torch
from torch import Tensor

CHUNK = 256


def q8_codes(x: Tensor, block: int) -> tuple[Tensor, Tensor]:
    """x [..., n] (n a multiple of block) -> codes [..., n] (int8 values, as float64) and scales [..., n / block]
    (float16's values): d = max |x| / 127 and each code x / d rounded half away from zero, in float32 as gguf's
    Q8_0 quantizer computes them; the scale is d rounded to float16."""
    blocks = x.float().reshape(*x.shape[:-1], -1, block)
    d = blocks.abs().amax(-1, keepdim=True) / 127
    inverse = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    scaled = (blocks * inverse).abs()
    floored = scaled.floor()
    codes = (floored + (2 * (scaled - floored)).floor()) * (blocks * inverse).sign()
    return codes.reshape(x.shape).double(), d[..., 0].half().double()


def scores_block(dim: int) -> int:
    return 64 if dim % 64 == 0 else 32


def rows_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, causal: bool,
                   chunk: int = CHUNK) -> tuple[Tensor, Tensor]:
    """q [tokens, heads, dim]; k, v [keys, kv_heads, dim]; causal: token i sits at key position keys - tokens + i.
    Returns out [tokens, heads, dim] and lse [tokens, heads] (float64)."""
    tokens, heads, dim = q.shape
    keys, kv_heads, _ = k.shape
    k, v = (t.to(torch.bfloat16).float() for t in (k, v))
    block = scores_block(dim)
    q_codes, q_scales = q8_codes(q, block)
    k_codes, k_scales = q8_codes(k, block)
    v_codes, v_scales = q8_codes(v, 32)
    positions = torch.arange(keys - tokens, keys) if causal else torch.full((tokens,), keys - 1)
    out = torch.zeros(tokens, heads, dim, dtype=torch.float64)
    lse = torch.zeros(tokens, heads, dtype=torch.float64)
    for head in range(heads):
        kv = head // (heads // kv_heads)
        scores = _scores(q_codes[:, head], q_scales[:, head], k_codes[:, kv], k_scales[:, kv], block) * scale
        parts = [_chunk(scores[:, first:first + chunk], v_codes[first:first + chunk, kv],
                        v_scales[first:first + chunk, kv], positions - first)
                 for first in range(0, keys, chunk)]
        out[:, head], lse[:, head] = _merged(parts)
    return out, lse


def _scores(q_codes, q_scales, k_codes, k_scales, block) -> Tensor:
    """[tokens, keys]: per sub-block, the codes' exact sum times dq * dk (their product rounded to float32)."""
    tokens, dim = q_codes.shape
    products = torch.einsum("tsb,ksb->tks", q_codes.reshape(tokens, -1, block),
                            k_codes.reshape(k_codes.shape[0], -1, block))
    steps = (q_scales.float()[:, None, :] * k_scales.float()[None, :, :]).double()
    return (products * steps).sum(-1)


def _chunk(scores: Tensor, v_codes: Tensor, v_scales: Tensor, last: Tensor):
    """One chunk's (max, sum, output) per row: scores [tokens, n], the chunk's values' codes [n, dim] and scales
    [n, dim / 32]; last [tokens]: each row's last key of the chunk (< 0: it sees none)."""
    n = scores.shape[1]
    seen = torch.arange(n)[None, :] <= last[:, None]
    masked = scores.masked_fill(~seen, float("-inf"))
    top = masked.amax(-1).clamp_min(-1e30)
    weights = torch.exp(masked - top[:, None]).masked_fill(~seen, 0.0)
    outputs = []
    for g in range(v_scales.shape[1]):
        dv = v_scales[:, g]
        bound = torch.cummax(dv, 0).values[last.clamp(0, n - 1)].masked_fill(last < 0, 0.0)
        step = bound.float() / 255
        inverse = torch.where(step > 0, 1 / step, torch.zeros_like(step))
        codes = torch.round(weights.float() * dv.float()[None, :] * inverse[:, None]).double()
        outputs.append(step.double()[:, None] * (codes @ v_codes[:, 32 * g:32 * g + 32]))
    return top, weights.sum(-1), torch.cat(outputs, -1)


def _merged(parts) -> tuple[Tensor, Tensor]:
    tops = torch.stack([p[0] for p in parts], -1)
    most = tops.amax(-1)
    factors = torch.exp(tops - most[:, None])
    total = sum(factors[:, i] * p[1] for i, p in enumerate(parts))
    output = sum(factors[:, i, None] * p[2] for i, p in enumerate(parts))
    return output / total[:, None], most + torch.log(total)
