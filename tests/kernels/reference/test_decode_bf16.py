"""The bfloat16 decode oracle against plain float32 attention: the same attention, to bfloat16's rounding."""
import torch

from kernels.reference import cascade_attention, decode_bf16


def test_the_oracle_is_attention_to_bfloat16s_rounding_chunk_by_chunk():
    gen = torch.Generator().manual_seed(0)
    k_cache, v_cache = torch.randn(6, 4, 2, 16, generator=gen), torch.randn(6, 4, 2, 16, generator=gen)
    q = torch.randn(3, 4, 16, generator=gen)
    tables, lengths = torch.tensor([[0, 1, 2, 3], [5, 4, 0, 0], [2, 0, 0, 0]]), torch.tensor([15, 7, 1])
    want_out, want_lse = cascade_attention.paged_decode_with_lse(q, k_cache, v_cache, tables, lengths, 0.25)
    for chunk in (4, 6, 256):   # chunks that split blocks, straddle them, or hold a whole row
        out, lse = decode_bf16.paged_decode_with_lse(q, k_cache, v_cache, tables, lengths, 0.25, chunk)
        torch.testing.assert_close(out, want_out, atol=3e-2, rtol=0)
        torch.testing.assert_close(lse, want_lse, atol=1e-2, rtol=0)
        assert not torch.equal(out, want_out)   # bfloat16's rounding is there to see
