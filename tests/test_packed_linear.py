"""model/packed_linear.py: inference on oneDNN's packed weights equals F.linear to rounding, never runs on a
stale copy after the weight changes, stays out of autograd, and is never saved or copied with the model."""

import copy
import gc
import threading

import pytest
import torch
import torch.nn.functional as F

from bebop.engine import generate
from bebop.model import load_model, packed_linear
from bebop.model.packed_linear import PackedLinear
from bebop.sampling import SamplingParams

from conftest import make_hf_model
from spec_helpers import PROMPTS, ids_of


@pytest.fixture(autouse=True)
def always_packed(monkeypatch):
    """Every CPU product packed, however small (the default leaves small float32 ones to F.linear), as inside the
    engine's decoding."""
    monkeypatch.setattr(packed_linear, "MIN_WEIGHT", 0)
    with packed_linear.decoding():
        yield


def _layer(dtype=torch.float32, bias=True):
    torch.manual_seed(0)
    return PackedLinear(64, 96, bias=bias).to(dtype)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("shape", [(5, 64), (3, 4, 64)])
def test_packed_inference_equals_f_linear(dtype, tol, shape):
    layer = _layer(dtype)
    x = torch.randn(shape, dtype=dtype)
    with torch.no_grad():
        got = layer(x)
    assert got.shape == (*shape[:-1], 96)
    packs = packed_linear._onednn(dtype)  # oneDNN's bfloat16 needs AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT
    assert (packed_linear._COPIES.get(id(layer.weight)) is not None) == packs  # the packed path ran where it can
    want = F.linear(x.float(), layer.weight.float(), layer.bias.float())
    assert (got.float() - want).abs().max().item() <= tol * want.abs().max().item()


def test_a_changed_weight_is_packed_again():
    """An optimizer step and a load_state_dict write the weight in place: the next inference uses the new one."""
    layer = _layer()
    x = torch.randn(2, 64)
    opt = torch.optim.SGD(layer.parameters(), lr=0.5)
    with torch.no_grad():
        layer(x)  # packs the first weight
    layer(x).square().sum().backward()
    opt.step()
    with torch.no_grad():
        assert torch.allclose(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-5)
        layer.load_state_dict({"weight": torch.zeros(96, 64), "bias": torch.ones(96)})
        assert torch.equal(layer(x), torch.ones(2, 96))


def test_small_float32_products_keep_f_linear(monkeypatch):
    monkeypatch.setattr(packed_linear, "MIN_WEIGHT", 300_000)
    layer = _layer()
    with torch.no_grad():
        layer(torch.randn(packed_linear.MIN_ROWS - 1, 64))
        assert id(layer.weight) not in packed_linear._COPIES
        layer(torch.randn(2, packed_linear.MIN_ROWS // 2, 64))  # rows counted over every leading dimension
        assert id(layer.weight) in packed_linear._COPIES
        big = PackedLinear(600, 500, bias=False)
        big(torch.randn(1, 600))
        assert id(big.weight) in packed_linear._COPIES


def test_training_takes_f_linear_and_gets_gradients():
    layer = _layer()
    x = torch.randn(2, 64)
    out = layer(x)
    assert out.requires_grad and id(layer.weight) not in packed_linear._COPIES
    out.sum().backward()
    assert layer.weight.grad is not None and torch.allclose(layer.weight.grad, x.sum(0).expand(96, 64))


def test_copies_are_not_saved_copied_or_kept():
    layer = _layer()
    with torch.no_grad():
        layer(torch.randn(2, 64))
    key = id(layer.weight)
    assert key in packed_linear._COPIES
    assert set(layer.state_dict()) == {"weight", "bias"}
    twin = copy.deepcopy(layer)
    assert id(twin.weight) not in packed_linear._COPIES
    del layer
    gc.collect()
    assert key not in packed_linear._COPIES


def test_rollouts_after_an_update_use_the_updated_weights(tmp_path):
    """Greedy decoding after the policy's weights were replaced in place equals a model built with those
    weights: no rollout runs on a stale packed copy (the RL loop's update, a weight sync)."""
    make_hf_model(seed=0).save_pretrained(tmp_path / "a")
    make_hf_model(seed=1).save_pretrained(tmp_path / "b")
    policy, other = load_model(tmp_path / "a"), load_model(tmp_path / "b")
    prompts = ids_of(PROMPTS)
    greedy = SamplingParams(0.0)
    before = [g.token_ids for g in generate(policy, prompts, max_new_tokens=8, sampling=greedy)]
    policy.load_state_dict(other.state_dict())
    after = [g.token_ids for g in generate(policy, prompts, max_new_tokens=8, sampling=greedy)]
    assert after == [g.token_ids for g in generate(other, prompts, max_new_tokens=8, sampling=greedy)]
    assert after != before  # the two models decode differently, so a stale copy would show


def test_a_layer_made_under_inference_mode_keeps_f_linear():
    """Its weight is an inference tensor, which keeps no version counter: a packed copy could go stale unseen."""
    with torch.inference_mode(), packed_linear._small_op.disabled():  # (small_linear would serve this small product)
        layer = _layer()
        x = torch.randn(2, 64)
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
    assert id(layer.weight) not in packed_linear._COPIES


def test_no_grad_passes_outside_decoding_keep_f_linear():
    """A learner's no-grad pass (old log-probs, an anchor) is not decoding: its weights may be gathered anew."""
    layer = _layer()
    x = torch.randn(2, 64)

    def learner_pass():
        with torch.no_grad():
            layer(x)

    done = threading.Thread(target=learner_pass)  # a thread of its own starts outside decoding()
    done.start()
    done.join()
    assert id(layer.weight) not in packed_linear._COPIES
    with torch.no_grad():
        layer(x)  # this test's thread is inside decoding() (the fixture)
    assert id(layer.weight) in packed_linear._COPIES


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_compiled_graph_calls_the_native_op_which_computes_what_the_python_op_does(dtype):
    """Where the native library built, a graph multiplies by the packed copy through its C++ op (no trip through
    Python a call), which makes the same oneDNN call as the Python custom op: bit for bit the same result."""
    from bebop.model import native

    if not native.load():
        pytest.skip("no C++ compiler or ninja: graphs call the Python op")
    if not packed_linear._onednn(dtype):
        pytest.skip("oneDNN runs no bfloat16 matmul on this CPU: its layers keep F.linear")
    torch.manual_seed(0)
    layer = PackedLinear(256, 384, bias=True).to(dtype)
    x = torch.randn(3, 2, 256, dtype=dtype)
    with torch.no_grad():
        packed = packed_linear.packed_weight(layer.weight)
        ours = torch.ops.bebop_native.packed_linear(x, packed, layer.bias, 384)
        theirs = packed_linear.packed_linear(x, packed, layer.bias, 384)
        assert torch.equal(ours, theirs) and ours.shape == (3, 2, 384)
        packed_linear.prepare_graphs(layer)
        assert packed_linear._graph_op is torch.ops.bebop_native.packed_linear
        assert layer.graph_weight is not None or dtype == torch.float32  # small float32 products keep F.linear
        torch._dynamo.reset()
        compiled = torch.compile(layer, fullgraph=True)(x)
    torch.testing.assert_close(compiled, theirs, rtol=0, atol=0)
