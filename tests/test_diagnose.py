"""`bebop mtp diagnose` (bebop.mtp.exact, bebop.mtp.diagnose, bebop.mtp.rollout_files): the expected acceptance
along the head's own chains predicts what the engine measures; other engines' dumps are read as given."""

import json
import math

import numpy as np
import pytest
import torch

from bebop.cli import main
from bebop.engine import generate
from bebop.engine.speculative import speculative_generate
from bebop.mtp.diagnose import diagnose, engine_view, renewal_weights
from bebop.mtp.exact import expected_chains
from bebop.mtp.rollout_files import RolloutIds, read_rollouts
from bebop.policy import load_policy
from bebop.sampling import SamplingParams, warp_probs
from bebop.stats.entropy_bins import wilson

from spec_helpers import PROMPTS, ids_of

FAMILY_Z = 2.807  # 95% for the family of the 10 checks of one temperature and its neighbour (Bonferroni: 0.005 each)


@pytest.fixture(scope="module")
def policy(headed):
    return load_policy(headed, device="cpu")


def test_renewal_weights_follow_the_accepted_runs():
    never = np.zeros((6, 3))  # every step accepts nothing: a step at every position
    assert renewal_weights(never, 3).tolist() == [1.0] * 6
    always = np.ones((7, 3))  # every step accepts all 3 drafts and emits 4 tokens
    assert renewal_weights(always, 3).tolist() == [1, 0, 0, 0, 1, 0, 0]
    half = np.full((3, 1), 0.5)  # K = 1: a step accepts with 1/2
    assert renewal_weights(half, 1).tolist() == [1.0, 0.5, 0.75]


def test_the_engine_view_counts_the_steps_a_run_takes():
    """K = 1 over starts whose drafts are accepted surely, never, never: the run's steps are at starts 0 and 2
    (start 1 is skipped by the accepted draft), so it measures 1 accepted of 2 drafts, not 1 of 3."""
    view = engine_view([torch.tensor([[1.0], [0.0], [0.0]], dtype=torch.float64)], 1)
    assert view["per_depth"][0]["value"] == pytest.approx(0.5)
    assert view["mean_acceptance_length"]["value"] == pytest.approx(1.5)


def test_depth_one_follows_the_token_that_came_next(policy):
    """Depth 1's conditioning is the rollout's own prefix; given the token x that followed, the draft was accepted
    with probability min(p, q)(x) / p(x) under RS and [x = argmax q] under TO; the depth-1 law's averages
    (alpha_1 = sum_v min(p, q), p(argmax q)) come from the same teacher-forced pass."""
    model = policy.model
    prompt, response = ids_of(PROMPTS[:1])[0], [5, 9, 12, 7]
    sampling = SamplingParams(1.0)
    chains = expected_chains(model, [(prompt, response)], depth=2, sampling=sampling)
    full = torch.tensor([prompt + response])
    with torch.no_grad():
        hidden = model(full)  # (1, T, H)
        head = model.require_mtp()(hidden[:, :-1], model.embed(full[:, 1:]), 1, model.require_mtp().new_cache(
            1, full.shape[1], dtype=model.dtype, device=model.device), torch.tensor([full.shape[1] - 1]))
    for j in range(len(response) - 1):  # the step whose last emitted token is response[j]
        t = len(prompt) + j  # its position
        p = warp_probs(model.logits(hidden[0, t]), sampling)
        q = warp_probs(model.mtp_logits(head[0, t - 1]), sampling)
        x = response[j + 1]
        assert chains.rs_reach[0][j, 0].item() == pytest.approx(min(p[x], q[x]).item() / p[x].item(), abs=1e-5)
        assert chains.to_reach[0][j, 0].item() == float(int(q.argmax()) == x)
        assert chains.tv_1[0][j].item() == pytest.approx(1 - torch.minimum(p, q).sum().item(), abs=1e-5)
        assert chains.to_1[0][j].item() == pytest.approx(p[q.argmax()].item(), abs=1e-5)


def _measured(model, prompts, k, sampling, seed):
    _, m = speculative_generate(model, prompts, k=k, mode="rs", max_new_tokens=40, sampling=sampling,
                                generator=torch.Generator().manual_seed(seed))
    reached = [m.num_drafts] + m.accepted_per_position[:-1]
    return [(a, n) for a, n in zip(m.accepted_per_position, reached)], m


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_the_prediction_lies_within_what_the_engine_measures(policy, temperature):
    """Rollouts sampled plainly; their diagnosis predicts RS's per-depth acceptance (depths 1-4) and mean
    acceptance length within the binomial intervals of a speculative run on the same prompts (95% for the whole
    family of checks; measured on the tiny random policy, whose acceptance is ~0.9 a depth: 8 x 4 repeats of this
    gave predictions within a point of the measured means at both temperatures)."""
    model, k = policy.model, 4
    sampling = SamplingParams(temperature)
    prompts = ids_of(PROMPTS) * 16  # 96 rows
    gens = generate(model, prompts, max_new_tokens=40, sampling=sampling, generator=torch.Generator().manual_seed(1))
    pairs = [RolloutIds(i, p, g.token_ids) for i, (p, g) in enumerate(zip(prompts, gens))]
    report = diagnose(policy, pairs, k=k, sampling=sampling, progress=False)
    measured, metrics = _measured(model, prompts, k, sampling, seed=2)
    for d, (accepted, reached) in enumerate(measured):
        low, high = wilson(accepted, reached, z=FAMILY_Z)
        assert low <= report["rs_acceptance_per_depth"][d] <= high, (d + 1, report["rs_acceptance_per_depth"], measured)
    steps = metrics.num_drafts
    length = metrics.mean_acceptance_length
    spread = math.sqrt(k * k / 4 / steps)  # an upper bound on the standard error of accepted drafts per step
    assert abs(report["mean_acceptance_length"]["rs"][str(k)] - length) < FAMILY_Z * spread


def test_the_chains_are_not_teacher_forced_past_depth_one(policy):
    """The per-depth numbers differ from the rollout-token (teacher-forced) chain's beyond depth 1 in general;
    here: RS depth-2 acceptance is computed on accepted tokens, so it must not equal TO's at a temperature where
    q is spread (a weak check that the two chains are distinct computations)."""
    sampling = SamplingParams(1.0)
    prompts = ids_of(PROMPTS)
    gens = generate(policy.model, prompts, max_new_tokens=24, sampling=sampling, generator=torch.Generator().manual_seed(0))
    report = diagnose(policy, [RolloutIds(i, p, g.token_ids) for i, (p, g) in enumerate(zip(prompts, gens))], k=3,
                      sampling=sampling, progress=False)
    assert report["rs_acceptance_per_depth"][1] != pytest.approx(report["to_acceptance_per_depth"][1], abs=1e-3)
    ml = report["mean_acceptance_length"]["rs"]
    assert 1.0 <= ml["1"] <= ml["2"] <= ml["8"] <= 9.0
    low, high = report["rs_acceptance_intervals"][0]
    assert low < report["rs_acceptance_per_depth"][0] < high


def _dump(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_other_engines_dumps_are_read_as_given(policy, tmp_path):
    p, r = [3, 4, 5], [6, 7, 8, 9]
    rows = [{"prompt_ids": p, "response_ids": r},  # verl
            {"prompt_token_ids": p, "outputs": [{"token_ids": r}, {"token_ids": r[:2]}]},  # vLLM, two samples
            {"input_ids": p, "output_ids": r},  # SGLang
            {"token_ids": p + r}]  # the whole sequence
    pairs = read_rollouts(_dump(tmp_path / "d.jsonl", rows), policy)
    assert [(x.prompt_ids, x.response_ids) for x in pairs] == [(p, r), (p, r), (p, r[:2]), (p, r), (p[:1], p[1:] + r)]
    text = read_rollouts(_dump(tmp_path / "t.jsonl", [{"prompt": "ab", "completion": "cd"}]), policy)
    assert text[0].prompt_ids == policy.codec.encode("ab") and text[0].response_ids == policy.codec.encode("cd")


@pytest.mark.parametrize("rows, message", [
    ([{"prompt_ids": [1, 2], "response_ids": [3, 10 ** 6]}], "row 1: token id 1000000 is not in the model's vocabulary"),
    ([], "no rollouts"),
    ([{"prompt_ids": [1, 2]}], "row 1: has prompt ids but no response ids"),
    ([{"foo": 1}], "row 1 has no 'prompt'"),
])
def test_bad_rollout_files_name_the_row(policy, tmp_path, rows, message, capsys, headed):
    path = _dump(tmp_path / "bad.jsonl", rows)
    assert main(["mtp", "diagnose", "--model", str(headed), "--rollouts", str(path), "--out", str(tmp_path / "o")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_cli_writes_the_diagnosis(headed, tmp_path, capsys):
    rows = [{"prompt_ids": [3, 4, 5], "response_ids": [6, 7, 8, 9, 10, 11]}, {"token_ids": [5, 6, 7, 8, 9]}]
    path = _dump(tmp_path / "r.jsonl", rows)
    assert main(["mtp", "diagnose", "--model", str(headed), "--rollouts", str(path), "--k", "2"]) == 0
    report = json.loads((tmp_path / "r.jsonl.diagnosis" / "diagnosis.json").read_text())
    assert len(report["rs_acceptance_per_depth"]) == len(report["to_acceptance_per_depth"]) == 2
    assert set(report["mean_acceptance_length"]["rs"]) == {str(k) for k in range(1, 9)}
    assert "| 2 |" in (tmp_path / "r.jsonl.diagnosis" / "diagnosis.md").read_text()
    for png in ("acceptance_per_depth.png", "acceptance_length.png", "acceptance_vs_entropy.png"):
        assert (tmp_path / "r.jsonl.diagnosis" / png).stat().st_size > 1000
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rs_acceptance_per_depth"]


def _rollouts(tmp_path, policy, n=12, seed=0):
    prompts = ids_of(PROMPTS) * (n // len(PROMPTS))
    gens = generate(policy.model, prompts, max_new_tokens=24, sampling=SamplingParams(1.0),
                    generator=torch.Generator().manual_seed(seed))
    rows = [{"prompt_token_ids": p, "outputs": [{"token_ids": g.token_ids}]} for p, g in zip(prompts, gens)]  # vLLM
    return _dump(tmp_path / f"vllm-{seed}.jsonl", rows)


@pytest.mark.parametrize("per_pos, flagged", [([30, 3], True), (None, False)])
def test_engine_counters_below_the_bound_are_flagged(policy, headed, tmp_path, per_pos, flagged):
    path = _rollouts(tmp_path, policy)
    drafts = 1000
    if per_pos is None:  # what the head allows, measured exactly
        report = diagnose(policy, read_rollouts(path, policy), k=2, sampling=SamplingParams(1.0), progress=False)
        a1, a2 = report["rs_acceptance_per_depth"]
        per_pos = [round(drafts * a1), round(drafts * a1 * a2)]
    metrics = tmp_path / "metrics.json"
    metrics.write_text(json.dumps({"vllm:spec_decode_num_drafts": drafts, "vllm:spec_decode_num_draft_tokens": 2 * drafts,
                                   "vllm:spec_decode_num_accepted_tokens": sum(per_pos),
                                   "vllm:spec_decode_num_accepted_tokens_per_pos": per_pos}))
    out = tmp_path / "out"
    assert main(["mtp", "diagnose", "--model", str(headed), "--rollouts", str(path), "--k", "2", "--engine-metrics",
                 str(metrics), "--out", str(out)]) == 0
    engine = json.loads((out / "diagnosis.json").read_text())["engine_metrics"]
    assert engine["flagged"] is flagged and [r["depth"] for r in engine["per_depth"]] == [1, 2]
    assert ("accepts less than the head allows" in (out / "diagnosis.md").read_text()) is flagged


def test_engine_metrics_without_counters_are_refused(headed, policy, tmp_path, capsys):
    metrics = tmp_path / "m.json"
    metrics.write_text(json.dumps({"num_requests": 3}))
    code = main(["mtp", "diagnose", "--model", str(headed), "--rollouts", str(_rollouts(tmp_path, policy)),
                 "--engine-metrics", str(metrics), "--out", str(tmp_path / "o")])
    assert code == 2 and "no speculative-decoding counters" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_baseline_splits_the_change(policy, tmp_path):
    """The same rollouts as their own baseline change nothing (depth 1 is exact); other rollouts split the change
    into an entropy part and a remainder that add up to it."""
    first, second = (read_rollouts(_rollouts(tmp_path, policy, seed=s), policy) for s in (0, 1))
    same = diagnose(policy, first, k=2, sampling=SamplingParams(1.0), baseline=first, progress=False)
    assert same["change_from_baseline"]["rs"]["change"] == pytest.approx(0.0, abs=1e-9)
    split = diagnose(policy, second, k=2, sampling=SamplingParams(1.0), baseline=first, progress=False)
    for mode in ("rs", "to"):
        part = split["change_from_baseline"][mode]
        assert part["entropy_part"] + part["mismatch_part"] == pytest.approx(part["change"])


def _past_the_end_exact(model, prefix, sampling):
    """A start whose sequence ends one token after it (prefix = the start's prefix + that last token x): the
    chain's depth 1 is x, then the head drafts on. P(drafts 1..3 accepted) = m_1(x) * alpha_2 *
    E_{y ~ min(p_2, q_2) / alpha_2}[alpha_3(y)], m_1(x) = min(p_1, q_1)(x) / p_1(x), every y enumerated."""
    vocab = model.config.vocab_size
    ids = torch.tensor([prefix] * vocab)  # (V, W): one row per candidate y; the start is at W-2
    cache, mtp = model.new_cache(vocab, len(prefix) + 2), model.require_mtp()
    mtp_cache = mtp.new_cache(vocab, len(prefix) + 2, dtype=model.dtype, device=model.device)
    hidden = model(ids, cache)  # (V, W, H)
    ones = torch.ones(vocab, dtype=torch.long)
    head = mtp(hidden[:, :-2], model.embed(ids[:, 1:-1]), 1, mtp_cache, torch.full((vocab,), len(prefix) - 2))
    x = prefix[-1]
    p1, q1 = warp_probs(model.logits(hidden[0, -2]), sampling), warp_probs(model.mtp_logits(head[0, -1]), sampling)
    h2 = mtp(head[:, -1:], model.embed(ids[:, -1:]), 2, mtp_cache, ones)  # (V, 1, H): depth 2 after x
    p2, q2 = warp_probs(model.logits(hidden[0, -1]), sampling), warp_probs(model.mtp_logits(h2[0, -1]), sampling)
    y = torch.arange(vocab)
    p3 = warp_probs(model.logits(model(y[:, None], cache, ones)[:, 0]), sampling)  # (V, V)
    q3 = warp_probs(model.mtp_logits(mtp(h2, model.embed(y[:, None]), 3, mtp_cache, ones)[:, 0]), sampling)
    through_one = float(min(p1[x], q1[x]) / p1[x])
    return through_one * float((torch.minimum(p2, q2) * torch.minimum(p3, q3).sum(-1)).sum())


def test_past_the_end_the_chain_follows_the_law_of_an_accepted_draft(policy):
    """Where the sequence ends the engine's step still counts the drafts it accepts after the last token; there
    the inputs are accepted drafts, distributed as min(p, q) / alpha: the chains' estimate of P(drafts 1..3
    accepted) at the last start is unbiased for its enumerated value."""
    import copy

    sharp = copy.deepcopy(policy.model)
    with torch.no_grad():
        sharp.lm_head.weight.mul_(8.0)  # peaked targets: an accepted draft's law differs from q's
    prompt, sampling, n = ids_of(PROMPTS[:1])[0], SamplingParams(1.0), 2000
    response = [40, 41]  # one start (last emitted 40), followed by 41, then the end
    with torch.no_grad():
        exact = _past_the_end_exact(sharp, prompt + response, sampling)
    chains = expected_chains(sharp, [(prompt, response)] * n, depth=3, sampling=sampling,
                             generator=torch.Generator().manual_seed(0), batch_size=500)
    draws = torch.cat([r[:, 2] for r in chains.rs_reach])  # (n,) m_1(x) alpha_2 alpha_3(y) per chain
    assert draws.std() > 0  # the chain is sampled past the end
    assert abs(float(draws.mean()) - exact) < 4 * float(draws.std()) / n ** 0.5, (float(draws.mean()), exact)


def test_the_monitor_reads_counters_as_steps():
    """EngineMonitor turns cumulative vLLM counters into per-step acceptance (the docs/api.md example covers the
    alarm); counters that go down are refused."""
    from bebop.errors import BebopError
    from bebop.monitor import EngineMonitor

    monitor = EngineMonitor()
    first = monitor.observe({"spec_decode_num_drafts": 100, "spec_decode_num_draft_tokens": 200,
                             "spec_decode_num_accepted_tokens_per_pos": [60, 30]})
    second = monitor.observe({"spec_decode_num_drafts": 300, "spec_decode_num_draft_tokens": 600,
                              "spec_decode_num_accepted_tokens_per_pos": [80, 35]})
    assert first["acceptance_rate_per_position"] == [0.6, 0.3] and second["acceptance_rate_per_position"] == [0.1, 0.025]
    assert second["mean_acceptance_length"] == pytest.approx(1 + 25 / 200)
    with pytest.raises(BebopError, match="went down"):
        monitor.observe({"spec_decode_num_drafts": 10, "spec_decode_num_accepted_tokens_per_pos": [1, 0]})


def test_the_shared_prefill_equals_the_ragged_one(policy, monkeypatch):
    """Attention-only trunks copy one prefill per sequence; hybrids prefill each start's prefix. On the same dense
    model both give the same exact quantities (TO's chains, depth 1 under RS)."""
    from bebop.mtp import exact

    prompts = ids_of(PROMPTS[:3])
    gens = generate(policy.model, prompts, max_new_tokens=12, sampling=SamplingParams(1.0),
                    generator=torch.Generator().manual_seed(0))
    seqs = [(p, g.token_ids) for p, g in zip(prompts, gens)]
    shared = expected_chains(policy.model, seqs, depth=3, sampling=SamplingParams(1.0), batch_size=5)
    monkeypatch.setattr(exact, "_open_shared", lambda model, prefixes, depth: exact._open_ragged(model, prefixes, depth, 0))
    ragged = expected_chains(policy.model, seqs, depth=3, sampling=SamplingParams(1.0), batch_size=5)
    for a, b in zip(shared.to_reach, ragged.to_reach):
        assert torch.allclose(a, b, atol=1e-5)
    for a, b in zip(shared.rs_reach, ragged.rs_reach):
        assert torch.allclose(a[:, 0], b[:, 0], atol=1e-5)


def test_a_hybrid_is_diagnosed(tmp_path):
    """A Qwen3.5 (Gated DeltaNet layers: no cache cut-back) with a head: the ragged path, depth 1 exact."""
    from bebop.model import load_model
    from bebop.policy import Policy
    from qwen35_helpers import make_hf_qwen35

    from conftest import CHAR_CODEC

    make_hf_qwen35(seed=2).save_pretrained(tmp_path / "q35")
    model = load_model(tmp_path / "q35")
    model.attach_mtp(1, torch.Generator().manual_seed(0))
    hybrid = Policy(model=model, codec=CHAR_CODEC)
    prompt, response = ids_of(PROMPTS[:1])[0], [5, 9, 12, 7, 30]
    report = diagnose(hybrid, [RolloutIds(1, prompt, response)] * 2, k=2, sampling=SamplingParams(1.0), progress=False)
    assert report["positions"] == 2 * (len(response) - 1)
    # depths no realised token reaches (TO whose argmax missed every next token) have no acceptance: None
    assert all(a is None or 0.0 <= a <= 1.0 for a in report["rs_acceptance_per_depth"] + report["to_acceptance_per_depth"])


def test_the_entropy_law_resamples_whole_sequences(policy, monkeypatch):
    """Each depth-1 record handed to the entropy law names its sequence, so its intervals resample sequences."""
    from bebop.mtp import diagnose as diagnose_module

    seen = []
    real = diagnose_module.per_token_law
    monkeypatch.setattr(diagnose_module, "per_token_law", lambda log, **kw: seen.append(log) or real(log, **kw))
    prompt = ids_of(PROMPTS[:1])[0]
    pairs = [RolloutIds(0, prompt, [5, 9, 12, 7]), RolloutIds(1, prompt, [6, 8, 3])]
    diagnose(policy, pairs, k=2, sampling=SamplingParams(1.0), progress=False)
    assert seen and all([record[3] for record in log] == [0, 0, 0, 1, 1] for log in seen)
