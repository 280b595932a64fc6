"""Speculative decoding on the Qwen3.5 hybrid, eager and compiled: verifying K+1 tokens advances the
linear layers' recurrent and conv states, and a partial acceptance must restore them exactly.

The dense model's engine tests are rerun here on a hybrid with a fresh head: T=0 speculation equals
greedy (random head; an oracle drafter that makes rows accept 0..K raggedly; observations prefilled
mid-generation), and the sampled output follows the target exactly (chi-square, as the dense tests)."""

import pytest
import torch

from bebop.engine import generate
from bebop.engine import speculative as spec
from bebop.engine.compiled import compile_steps, compiled_steps
from bebop.errors import BebopError
from bebop.model import load_model
from bebop.sampling import SamplingParams
from qwen35_helpers import headed_hybrid, make_hf_qwen35
from test_live_batch import test_sampled_output_is_lossless_with_plain_steps_and_early_stops as _lossless_live
from test_speculative import test_observations_prefilled_then_drafting_resumes as _observations
from test_speculative import test_ragged_acceptance_keeps_greedy_output as _ragged
from test_speculative import test_sampled_output_is_lossless_end_to_end as _lossless

from spec_helpers import EOS, PROMPTS, ids_of, oracle_drafter


@pytest.fixture(scope="module", params=["eager", pytest.param("compiled", marks=pytest.mark.slow)])
def hybrid(request, tmp_path_factory):
    """The headed hybrid eager, and with its decoding steps compiled (static_cache.HybridStaticView; every test
    on it is slow: a hybrid's graphs are one per chunk length, so each k compiles its own)."""
    model = headed_hybrid(tmp_path_factory.mktemp("qwen35_spec"))
    if request.param == "compiled":
        assert compile_steps(model, "on")
    yield model


@pytest.mark.parametrize("mode", ["rs", "to"])
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_equals_plain_on_the_hybrid(hybrid, mode, k):
    prompts = ids_of(PROMPTS)
    ref = generate(hybrid, prompts, max_new_tokens=30, sampling=SamplingParams(0.0), stop_ids=[EOS])
    gens, metrics = spec.speculative_generate(hybrid, prompts, k=k, mode=mode, max_new_tokens=30,
                                              sampling=SamplingParams(0.0), stop_ids=[EOS])
    assert [g.token_ids for g in gens] == [g.token_ids for g in ref]
    assert metrics.num_drafts > 0
    steps = compiled_steps(hybrid)
    if steps is not None:  # the compiled path ran: plain decoding's trunk, the verify and the head's graphs (a whole
        # drafting step's, or the refresh's of a step that cannot run whole)
        assert steps.failed is None and steps.calls["trunk"] and steps.calls["verify"]
        assert steps.calls["step"] or steps.calls["refresh"]


@pytest.mark.slow
def test_compiled_hybrid_speculation_equals_eager_greedy(tmp_path, monkeypatch):
    """The compiled hybrid in the default suite: plain decoding and RS K=3 (a random head: rows accept raggedly, so
    the recurrent states roll back inside each verified chunk) both give eager greedy decoding's tokens."""
    eager = headed_hybrid(tmp_path / "eager")
    model = headed_hybrid(tmp_path / "compiled")
    assert compile_steps(model, "on")
    prompts = ids_of(PROMPTS)
    ref = generate(eager, prompts, max_new_tokens=24, sampling=SamplingParams(0.0), stop_ids=[EOS])
    plain = generate(model, prompts, max_new_tokens=24, sampling=SamplingParams(0.0), stop_ids=[EOS])
    gens, metrics = spec.speculative_generate(model, prompts, k=3, mode="rs", max_new_tokens=24,
                                              sampling=SamplingParams(0.0), stop_ids=[EOS])
    assert [g.token_ids for g in plain] == [g.token_ids for g in ref] == [g.token_ids for g in gens]
    assert 0 < metrics.acceptance_rate < 1  # partial acceptances: rollbacks inside verified chunks
    steps = compiled_steps(model)
    assert steps.failed is None and steps.calls["trunk"] and steps.calls["verify"]
    assert steps.calls["step"] or steps.calls["draft"]  # the head drafted through graphs, whole steps or forwards


def test_a_compiled_hybrid_runs_compiled_at_every_batch_size(tmp_path):
    """The default suite's compiled hybrid (the full set, batched and speculative, is -m slow): a batch of rows and a
    single row both decode through the graphs (their states selected on the host after each), as eager does."""
    model = headed_hybrid(tmp_path / "compiled")
    assert compile_steps(model, "on")
    prompts = ids_of(PROMPTS)
    eager = headed_hybrid(tmp_path / "eager")
    for rows, calls in ((prompts[:3], 3), (prompts[:1], 6)):
        out = generate(model, rows, max_new_tokens=3, sampling=SamplingParams(0.0))
        assert compiled_steps(model).calls["trunk"] == calls  # every step compiled
        ref = generate(eager, rows, max_new_tokens=3, sampling=SamplingParams(0.0))
        assert [g.token_ids for g in out] == [g.token_ids for g in ref]


@pytest.mark.parametrize("mode", ["rs", "to"])
def test_ragged_acceptance_on_the_hybrid(hybrid, monkeypatch, mode):
    _ragged(hybrid, monkeypatch, mode)


def test_observations_on_the_hybrid(hybrid, monkeypatch):
    _observations(hybrid, monkeypatch)


def test_sampled_output_is_lossless_on_the_hybrid(hybrid, monkeypatch):
    _lossless(hybrid, monkeypatch)


def test_lossless_with_plain_steps_and_early_stops_on_the_hybrid(hybrid, monkeypatch):
    _lossless_live(hybrid, monkeypatch)


def test_oracle_drafts_are_mostly_accepted_on_the_hybrid(hybrid, monkeypatch):
    """The states restored after partial acceptance are the right ones: an oracle that is always
    right is always accepted (a wrong state after a rollback would make the target disagree)."""
    prompts = ids_of(PROMPTS)
    monkeypatch.setattr(spec, "_draft", oracle_drafter(hybrid, prompts, corrupt=0.0, seed=0))
    _, metrics = spec.speculative_generate(hybrid, prompts, k=3, mode="rs", max_new_tokens=24,
                                           sampling=SamplingParams(0.0))
    assert metrics.acceptance_rate == 1.0


def test_greedy_equals_plain_on_the_moe_hybrid(tmp_path):
    """The MoE variant: every MLP, the head's included, a sparse MoE block."""
    make_hf_qwen35(seed=4, moe=True).save_pretrained(tmp_path)
    model = load_model(tmp_path)
    model.attach_mtp(1, torch.Generator().manual_seed(0))
    prompts = ids_of(PROMPTS)
    ref = generate(model, prompts, max_new_tokens=20, sampling=SamplingParams(0.0), stop_ids=[EOS])
    gens, metrics = spec.speculative_generate(model, prompts, k=3, mode="rs", max_new_tokens=20,
                                              sampling=SamplingParams(0.0), stop_ids=[EOS])
    assert [g.token_ids for g in gens] == [g.token_ids for g in ref] and metrics.num_drafts > 0


@torch.inference_mode()  # as the engine runs its steps
def test_a_compiled_chunk_writes_its_states_into_the_caches_kept_storage(tmp_path):
    """A compiled chunk is given the storage an eager one writes its states into (the cache's kept buffers: a
    graph allocating its own would map tens of MB afresh each step at 64 rows), and stages there what the eager
    chunk stages: a one-token chunk's states become the recurrent state, a verify's stay rollback-able."""
    model, eager = headed_hybrid(tmp_path / "compiled"), headed_hybrid(tmp_path / "eager")
    assert compile_steps(model, "on")
    steps = compiled_steps(model)
    ids = torch.randint(3, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    caches = [m.new_cache(2, 32) for m in (model, eager)]
    for m, cache in zip((model, eager), caches):
        m(ids[:, :8], cache, torch.tensor([8, 8]))  # the prompt, eager in both
    for chunk in (ids[:, 8:9], ids[:, 9:12]):
        counts = torch.full((2,), chunk.shape[1])
        got = steps.forward(model, chunk, caches[0], counts)
        torch.testing.assert_close(got, eager(chunk, caches[1], counts), rtol=1e-4, atol=1e-4)
        linear = caches[0].linear
        for slot, kept in enumerate(linear.buffers):
            staged = linear.states[slot]
            assert staged is not None and staged.shape[0] == chunk.shape[1]
            storages = {b.untyped_storage().data_ptr() for b in kept}
            assert staged.untyped_storage().data_ptr() in storages
            if chunk.shape[1] == 1:  # the state after the chunk is its staged one, not a copy
                assert linear.recurrent[slot].untyped_storage().data_ptr() in storages
    assert steps.calls["trunk"] == 2
    for cache in caches:
        cache.rollback([10, 11])  # row 0 keeps one of the verify's three tokens, row 1 two
    for mine, theirs in zip(caches[0].linear.recurrent, caches[1].linear.recurrent):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_bfloat16_states_keep_speculation_lossless_and_rollback_exact(tmp_path, monkeypatch, compiled):
    """CausalLM.state_dtype = bfloat16 (vLLM's default precision for the states): the caches keep the recurrent
    states in bfloat16, a verify rounds each position's state as a decode step does, so T=0 speculation equals
    greedy and ragged acceptances roll back exactly; the logits stay near the float32 states' and differ from them
    (the states are used in bfloat16, not widened and kept)."""
    model = headed_hybrid(tmp_path / "m")
    if compiled:
        assert compile_steps(model, "on")
    prompts = ids_of(PROMPTS)
    wide = model(torch.tensor([prompts[0]]))  # no cache: the float32 rule
    model.state_dtype = torch.bfloat16
    cache = model.new_cache(1, 64)
    assert all(s.dtype == torch.bfloat16 for s in cache.linear.recurrent)
    with torch.inference_mode():
        head, *rest = prompts[0]
        steps = [model(torch.tensor([[head]]), cache, torch.tensor([1]))]
        steps += [model(torch.tensor([[t]]), cache, torch.tensor([1])) for t in rest]
    narrow = torch.cat(steps, dim=1)
    torch.testing.assert_close(narrow, wide, rtol=0.05, atol=0.05)
    assert not torch.equal(narrow, wide)
    test_greedy_equals_plain_on_the_hybrid(model, "rs", 4)
    _ragged(model, monkeypatch, "rs")  # last: it replaces the drafter


def test_a_state_dtype_other_than_float32_or_bfloat16_is_refused(tmp_path):
    model = headed_hybrid(tmp_path / "m")
    model.state_dtype = torch.float16
    with pytest.raises(BebopError, match="float32 or bfloat16, not torch.float16"):
        model.new_cache(1, 8)


def test_an_rl_run_keeps_its_samplers_states_in_its_state_dtype(tmp_path):
    """rl --state-dtype: the rollout engine's caches keep the recurrent states in it, and a vLLM server is asked
    for the same (its mamba_ssm_cache_dtype)."""
    from bebop.policy import Policy
    from bebop.rl.config import RLConfig
    from bebop.rl.sampler import RolloutSampler
    from bebop.tasks import get_task

    from conftest import CHAR_CODEC

    model = headed_hybrid(tmp_path / "m")
    cfg = RLConfig(model="m", state_dtype="bfloat16")
    engine = RolloutSampler(get_task("math"), Policy(model, CHAR_CODEC), cfg).rollout_model(model)
    assert all(s.dtype == torch.bfloat16 for s in engine.new_cache(1, 8).linear.recurrent)
    assert cfg.vllm_server()["state_dtype"] == "bfloat16"
    with pytest.raises(BebopError, match="state_dtype|state-dtype"):
        RLConfig(model="m", state_dtype="float16")
