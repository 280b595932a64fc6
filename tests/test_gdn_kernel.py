"""The Gated DeltaNet recurrent rule's CPU kernel (model/gdn_kernel.cpp) against the pure-torch rule it replaces:
the same outputs and states on every width it dispatches on, a decode step and a verify that round alike, and a
failed build that leaves the torch rule serving, with a warning."""

import subprocess
import sys

import pytest
import torch

from bebop.model import gdn_kernel
from bebop.model.gated_deltanet import recurrent_rule
from native_helpers import built_or_skip


def _operands(b, h, t, dk, dv, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(b, h, t, dk, generator=gen), dim=-1) * dk ** -0.5
    k = torch.nn.functional.normalize(torch.randn(b, h, t, dk, generator=gen), dim=-1)
    v = torch.randn(b, h, t, dv, generator=gen)
    g = -3 * torch.rand(b, h, t, generator=gen)  # decays from 1 to e^-3
    beta = torch.rand(b, h, t, generator=gen)
    state = torch.randn(b, h, dk, dv, generator=gen)
    return q, k, v, g, beta, state


def _torch_rule(*operands, out=None):
    with gdn_kernel.cpu_kernel.disabled():
        return recurrent_rule(*operands, out=out)


@pytest.fixture(scope="module")
def kernel():
    return built_or_skip(gdn_kernel.cpu_kernel)


# widths: the compile-time ones (64, 128, 256) and the run-time loop (8, 24); streaming stores where 16 divides Dv
@pytest.mark.parametrize("b, h, t, dk, dv", [(1, 4, 1, 128, 128), (3, 4, 5, 128, 128), (2, 2, 3, 8, 8),
                                             (2, 3, 4, 16, 24), (2, 2, 2, 64, 64), (1, 1, 2, 32, 256)])
def test_kernel_computes_the_torch_rule(kernel, b, h, t, dk, dv):
    operands = _operands(b, h, t, dk, dv, seed=dv + t)
    expected_out, expected_states = _torch_rule(*operands)
    out, states = recurrent_rule(*operands)
    assert out.shape == (b, h, t, dv) and states.shape == (t, b, h, dk, dv)
    torch.testing.assert_close(out, expected_out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(states, expected_states, rtol=1e-5, atol=1e-6)


def test_kernel_takes_strided_operands_and_a_staging_view(kernel):
    """What GatedDeltaNet hands it: q, k, v transposed from (B, T, Hv, D), and states written into a view of
    kept storage."""
    b, h, t, dk, dv = 2, 4, 3, 128, 128
    q, k, v, g, beta, _ = _operands(b, t, h, dk, dv, seed=1)  # (B, T, Hv, D): transposed below
    q, k, v, g, beta = (x.transpose(1, 2) for x in (q, k, v, g, beta))
    state = _operands(b, h, t, dk, dv, seed=3)[-1]  # (B, Hv, Dk, Dv)
    storage = torch.empty(t * b * h * dk * dv + 100)
    staging = storage[:t * b * h * dk * dv].view(t, b, h, dk, dv)
    expected_out, expected_states = _torch_rule(q, k, v, g, beta, state)
    out, states = recurrent_rule(q, k, v, g, beta, state, out=staging)
    assert states.data_ptr() == storage.data_ptr()
    torch.testing.assert_close(out, expected_out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(staging, expected_states, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("b, h, t, dk, dv", [(3, 4, 5, 128, 128), (2, 3, 4, 16, 24), (1, 1, 2, 32, 256)])
def test_a_bfloat16_state_is_computed_in_float32_and_rounded_as_written(kernel, b, h, t, dk, dv):
    """States kept in bfloat16 (CausalLM.state_dtype): the kernel widens, computes in float32 and rounds each
    position's state as torch rounds, as the torch rule does; both stay near the float32 rule, and far from it
    where the state is not used (a check that the test can fail)."""
    *rest, state = _operands(b, h, t, dk, dv, seed=dv + t)
    state = state.bfloat16()
    expected_out, expected_states = _torch_rule(*rest, state)
    out, states = recurrent_rule(*rest, state)
    assert states.dtype == torch.bfloat16 and out.dtype == torch.float32
    # one bfloat16 step (2^-8 relative) where the float32 arithmetic rounds the other way at a boundary
    torch.testing.assert_close(states.float(), expected_states.float(), rtol=2 ** -7, atol=1e-4)
    torch.testing.assert_close(out, expected_out, rtol=1e-3, atol=1e-4)
    assert (states != expected_states).float().mean() < 1e-3  # such boundaries are rare
    wide_out, wide_states = _torch_rule(*rest, state.float())
    torch.testing.assert_close(out, wide_out, rtol=0.05, atol=0.02)
    assert not torch.allclose(out, _torch_rule(*rest, torch.zeros_like(state))[0], rtol=0.05, atol=0.02)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_verify_rounds_as_its_decode_steps(kernel, dtype):
    """Speculation at T=0 equals greedy decoding only if a verify of k+1 tokens computes each position as the
    decode step would: bit for bit, whatever the chunk's length (a bfloat16 state rounded at every position)."""
    q, k, v, g, beta, state = _operands(3, 4, 4, 128, 128, seed=2)
    state = state.to(dtype)
    chunk_out, chunk_states = recurrent_rule(q, k, v, g, beta, state)
    s = state
    for i in range(4):
        out, states = recurrent_rule(q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1], g[:, :, i:i + 1],
                                     beta[:, :, i:i + 1], s)
        assert torch.equal(out[:, :, 0], chunk_out[:, :, i]) and torch.equal(states[0], chunk_states[i])
        s = states[0]


# widths: the 64-column blocks (128, 256), 16-column ones (48), the per-position path (24); one position at T=1
@pytest.mark.parametrize("b, h, t, dk, dv", [(3, 4, 15, 128, 128), (2, 2, 7, 16, 48), (2, 3, 4, 16, 24),
                                             (1, 1, 9, 32, 256), (2, 2, 1, 64, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_chunk_that_keeps_its_end_only_ends_where_every_position_does(kernel, b, h, t, dk, dv, dtype):
    """A prefill keeps only its chunk's end state (every_position=False): the kernel runs it a column block at a
    time over every position, bit for bit the last of every position's states, with its outputs; written over the
    state it started from (a prefill's scratch) alike; and the torch rule's end equals its own last position."""
    *rest, state = _operands(b, h, t, dk, dv, seed=dv + t)
    state = state.to(dtype)
    out, states = recurrent_rule(*rest, state)
    end_out, ends = recurrent_rule(*rest, state, every_position=False)
    assert ends.shape == (1, b, h, dk, dv) and ends.dtype == dtype
    assert torch.equal(end_out, out) and torch.equal(ends[0], states[-1])
    over = state.clone()
    over_out, over_ends = recurrent_rule(*rest, over, over[None], every_position=False)
    assert over_ends.data_ptr() == over.data_ptr() and torch.equal(over, states[-1]) and torch.equal(over_out, out)
    ref_out, ref_states = _torch_rule(*rest, state)
    with gdn_kernel.cpu_kernel.disabled():
        torch_out, torch_ends = recurrent_rule(*rest, state.clone(), every_position=False)
    assert torch.equal(torch_out, ref_out) and torch.equal(torch_ends[0], ref_states[-1])
    torch.testing.assert_close(ends.float(), ref_states[-1:].float(), rtol=2 ** -7 if dtype != torch.float32 else 1e-5,
                               atol=1e-4 if dtype != torch.float32 else 1e-6)


def test_a_compiled_verify_calls_the_kernel_and_a_decode_step_the_torch_rule(kernel):
    """In a graph, a chunk of more than one token (a verify) or one given the storage for its states (a compiled
    step's: the cache's kept buffers) runs the kernel, which computes it bit for bit as eagerly; a one-token chunk
    that allocates its states traces the torch rule (inductor fuses it), equal to rounding."""
    for t, given, exact in ((3, False, True), (1, True, True), (1, False, False)):
        operands = _operands(2, 4, t, 64, 64, seed=t)
        expected = recurrent_rule(*operands)
        out = torch.full_like(expected[1], float("nan")) if given else None
        torch._dynamo.reset()
        got = torch.compile(recurrent_rule, fullgraph=True)(*operands, out)
        if given:
            assert got[1].data_ptr() == out.data_ptr()  # written where it was told
        for a, b in zip(got, expected):
            if exact:
                assert torch.equal(a, b)
            else:
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_failed_build_warns_and_leaves_the_torch_rule(tmp_path):
    """A source that does not compile (standing in for a missing compiler): a warning naming the error, no
    kernel, and the rule still answers. In a process of its own (the kernel is built once a process)."""
    broken = tmp_path / "gdn_kernel.cpp"
    broken.write_text("this is not C++;\n")
    script = f"""
import warnings
from pathlib import Path
import torch
from bebop.model import gdn_kernel
from bebop.model.gated_deltanet import recurrent_rule
from bebop.model import native
native.SOURCES = (Path({str(broken)!r}),)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    assert gdn_kernel.cpu_kernel() is None
assert any("did not build" in str(w.message) for w in caught), [str(w.message) for w in caught]
q = torch.randn(1, 2, 1, 8)
out, states = recurrent_rule(q, q, q, -torch.rand(1, 2, 1), torch.rand(1, 2, 1), torch.zeros(1, 2, 8, 8))
assert out.shape == (1, 2, 1, 8)
"""
    env = {"TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_bebop_native_0_never_builds(tmp_path):
    script = "from bebop.model import gdn_kernel; assert gdn_kernel.cpu_kernel() is None"
    env = {"BEBOP_NATIVE": "0", "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (tmp_path / "ext").exists()
