"""oneDNN's float32 linear on packed weights against the product computed in float64."""
import pytest
import torch

from kernels.cpu import onednn_linear

pytestmark = pytest.mark.skipif(not onednn_linear.available(), reason="this torch build has no oneDNN linear")


@pytest.mark.parametrize("rows,inputs,outputs", [(1, 576, 1536), (8, 1536, 576), (77, 64, 200), (300, 96, 49)])
def test_packed_linear_is_the_float32_product(rows, inputs, outputs):
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, inputs, generator=generator)
    weight, bias = torch.randn(outputs, inputs, generator=generator), torch.randn(outputs, generator=generator)
    packed = onednn_linear.pack(weight, 2048)
    expected = x.double() @ weight.double().T + bias.double()
    out = onednn_linear.linear(x, packed, bias)
    assert out.dtype == torch.float32 and packed.layout == torch._mkldnn
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5 * inputs ** 0.5)
    torch.testing.assert_close(onednn_linear.linear(x.view(1, rows, inputs), packed), (x @ weight.T).view(1, rows, -1),
                               rtol=1e-5, atol=1e-5 * inputs ** 0.5)


def test_a_rows_result_does_not_depend_on_the_rows_beside_it():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(700, 576, generator=generator)
    packed = onednn_linear.pack(torch.randn(1536, 576, generator=generator), 2048)
    together = onednn_linear.linear(x, packed)
    for start, count in [(0, 2), (3, 8), (100, 64), (5, 513)]:
        assert torch.equal(onednn_linear.linear(x[start:start + count].clone(), packed), together[start:start + count])
