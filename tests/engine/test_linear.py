"""The linear layer kinds against F.linear, and swap_linears on a module tree."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine.linear import FEW_ROWS, Linear, PackedLinear, swap_linears
from kernels.cpu import onednn_linear

ROW_COUNTS = [1, 8, FEW_ROWS, FEW_ROWS + 1, 200]


def random_linear(in_features: int = 96, out_features: int = 80, bias: bool = True, seed: int = 0) -> Linear:
    torch.manual_seed(seed)
    layer = Linear(in_features, out_features, bias=bias)
    with torch.no_grad():
        for param in layer.parameters():
            param.uniform_(-0.5, 0.5)
    return layer.eval()


def rows(count: int, features: int = 96) -> torch.Tensor:
    return torch.randn(count, features, generator=torch.Generator().manual_seed(count))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("count", ROW_COUNTS)
def test_linear_multiplies_like_f_linear_at_every_row_count(count, bias):
    layer = random_linear(bias=bias)
    x = rows(count)
    with torch.no_grad():
        out = layer(x)
        expected = F.linear(x, layer.weight, layer.bias)
    if count > FEW_ROWS:
        assert torch.equal(out, expected)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert out.is_contiguous()


def test_linear_takes_batched_input_like_f_linear():
    layer = random_linear()
    x = torch.randn(2, 5, 96)
    with torch.no_grad():
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))


@pytest.mark.skipif(not onednn_linear.available(), reason="this torch build has no oneDNN linear")
@pytest.mark.parametrize("count", ROW_COUNTS)
def test_packed_linear_multiplies_like_the_linear_it_packs(count):
    layer = random_linear()
    packed = PackedLinear(layer, rows=16)
    assert packed.weight.layout == torch._mkldnn and packed.bias is layer.bias
    assert (packed.in_features, packed.out_features) == (96, 80)
    x = rows(count)
    with torch.no_grad():
        torch.testing.assert_close(packed(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


class Wrapped(nn.Module):
    """A stand-in replacement that keeps the layer it replaces."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = Linear(4, 4)
        self.torch_linear = nn.Linear(4, 4)   # not one of ours: never offered
        self.norm = nn.LayerNorm(4)


def test_swap_linears_replaces_each_layer_make_returns_a_module_for_under_its_dotted_name():
    model = nn.Module()
    model.layers = nn.ModuleList([Block(), Block()])
    model.head = Linear(4, 2)
    originals = [model.layers[0].proj, model.layers[1].proj, model.head]
    offered = {}

    def wrap_all_but_the_head(name, layer):
        offered[name] = layer
        return None if name == "head" else Wrapped(layer)

    assert swap_linears(model, wrap_all_but_the_head) == ["layers.0.proj", "layers.1.proj"]
    assert offered == dict(zip(["layers.0.proj", "layers.1.proj", "head"], originals))
    assert [model.layers[0].proj.inner, model.layers[1].proj.inner, model.head] == originals
    # a second pass reaches the layers inside the replacements, the way packing reaches a QuantizedLinear's
    assert swap_linears(model, lambda name, layer: Wrapped(layer) if "inner" in name else None) == [
        "layers.0.proj.inner", "layers.1.proj.inner"]
    assert model.layers[0].proj.inner.inner is originals[0]
