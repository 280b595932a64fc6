"""A float32 linear layer over a few rows as a CPU kernel (model/small_linear.cpp) against a float64 reference: every
row count it takes and past it, widths with and without whole vectors, a last block of fewer features, bias or none,
strided inputs; each row's numbers the same whatever the other rows (a verify's position equals a decode step's,
through a whole trunk); torch's own linear wherever it does not apply; PackedLinear calling it only where it should."""

import pytest
import torch
import torch.nn.functional as F

from bebop.engine.compiled import EagerSteps
from bebop.model import load_model, packed_linear
from bebop.model.packed_linear import SMALL_ROWS, PackedLinear
from native_helpers import built_or_skip

from conftest import make_hf_model


@pytest.fixture(scope="module")
def kernel():
    return built_or_skip(packed_linear._small_op)


def _operands(rows, k_dim, n_dim, seed, bias=True):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k_dim, generator=gen)
    w = torch.randn(n_dim, k_dim, generator=gen) / k_dim ** 0.5
    b = torch.randn(n_dim, generator=gen) if bias else None
    return x, w, b


def _reference(x, w, b):
    return F.linear(x.double(), w.double(), None if b is None else b.double()).float()


# widths: whole AVX2 and AVX-512 vectors (128, 384), a tail past them (13, 72), none whole (5); features: a last
# block of 1-3 (1, 3, 5, 103), whole blocks (4, 768)
@pytest.mark.parametrize("k_dim, n_dim", [(128, 768), (384, 128), (13, 103), (72, 5), (5, 3), (128, 4), (64, 1)])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8])
def test_kernel_computes_the_linear_layer(kernel, rows, k_dim, n_dim):
    for bias in (True, False):
        x, w, b = _operands(rows, k_dim, n_dim, seed=rows * 1000 + k_dim + n_dim, bias=bias)
        out = kernel(x, w, b)
        assert out.shape == (rows, n_dim) and out.dtype == torch.float32
        torch.testing.assert_close(out, _reference(x, w, b), rtol=1e-5, atol=1e-5)


def test_a_rows_numbers_do_not_depend_on_the_other_rows(kernel):
    """Bit for bit: each row alone, in any company of up to SMALL_ROWS rows, in a (B, T, K) layout or a strided view."""
    x, w, b = _operands(SMALL_ROWS, 384, 103, seed=1)
    alone = torch.cat([kernel(x[i:i + 1], w, b) for i in range(SMALL_ROWS)])  # (8, 103)
    for rows in range(2, SMALL_ROWS + 1):
        assert torch.equal(kernel(x[:rows], w, b), alone[:rows]), rows
    assert torch.equal(kernel(x.reshape(2, 4, 384), w, b), alone.reshape(2, 4, 103))
    wide = torch.randn(SMALL_ROWS, 500)
    wide[:, 7:391] = x
    assert torch.equal(kernel(wide[:, 7:391], w, b), alone)  # rows 500 apart: copied to contiguous rows first


def test_past_its_rows_and_types_it_is_torchs_linear(kernel):
    x, w, b = _operands(SMALL_ROWS + 1, 128, 96, seed=2)
    assert torch.equal(kernel(x, w, b), F.linear(x, w, b))  # more rows: torch's call itself
    xb, wb, bb = x[:2].bfloat16(), w.bfloat16(), b.bfloat16()
    assert torch.equal(kernel(xb, wb, bb), F.linear(xb, wb, bb))
    wt = w.t().contiguous().t()  # a weight not in row-major order
    assert torch.equal(kernel(x[:2], wt, b), F.linear(x[:2], wt, b))
    assert kernel(x[:0], w, b).shape == (0, 96)


def test_packed_linear_calls_it_only_in_decoding_without_autograd(kernel):
    torch.manual_seed(0)
    layer = PackedLinear(128, 96)
    x = torch.randn(3, 128)
    small, torchs = kernel(x, layer.weight, layer.bias), F.linear(x, layer.weight, layer.bias)
    assert not torch.equal(small, torchs)  # the two round differently here, so the path taken shows
    with torch.no_grad():
        assert torch.equal(layer(x), torchs)  # not decoding: a learner's no-grad pass
        with packed_linear.decoding():
            assert torch.equal(layer(x), small)
            many = torch.randn(SMALL_ROWS + 1, 128)
            assert torch.equal(layer(many), F.linear(many, layer.weight, layer.bias))
    with packed_linear.decoding():
        y = layer(x.requires_grad_())  # autograd: torch's linear, differentiable
        assert torch.equal(y.detach(), torchs)
        y.sum().backward()
        assert layer.weight.grad is not None


def test_a_verifys_positions_equal_decode_steps_through_the_trunk(kernel, tmp_path):
    """A dense trunk's chunk of four tokens at two rows (eight rows of products) gives, bit for bit, the logits the
    same tokens give fed one decode step at a time: the products, the attention kernel and the rest compute each
    position alone."""
    make_hf_model(seed=0).save_pretrained(tmp_path)
    model = load_model(tmp_path).eval()
    steps = EagerSteps()
    ids = torch.randint(3, 60, (2, 9))  # (B, prompt 5 + chunk 4)
    with torch.no_grad(), packed_linear.decoding():
        logits = {}
        for chunked in (True, False):
            cache = model.new_cache(2, 16)
            steps.forward(model, ids[:, :5], cache, torch.full((2,), 5))
            if chunked:
                hidden = steps.forward(model, ids[:, 5:], cache, torch.full((2,), 4))  # (B, 4, H)
            else:
                hidden = torch.cat([steps.forward(model, ids[:, 5 + i:6 + i], cache, torch.ones(2, dtype=torch.long))
                                    for i in range(4)], dim=1)
            logits[chunked] = model.logits(hidden)  # (B, 4, V)
    assert torch.equal(logits[True], logits[False])
