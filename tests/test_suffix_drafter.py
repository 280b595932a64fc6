"""Drafts from the rollouts' own text (engine/suffix_index.py, engine/suffix_drafter.py): the index proposes what
siblings, earlier calls and the prompt continued with; the engine verifies them as point masses, losslessly, on a
model with no head at all."""

import pytest
import torch

from bebop.engine import generate
from bebop.engine import speculative as spec
from bebop.engine.suffix_index import SuffixIndex
from bebop.errors import BebopError
from bebop.model import load_model
from bebop.sampling import SamplingParams

from conftest import CHAR_CODEC
from spec_helpers import EOS, PROMPTS, assert_positions_follow, ids_of, on_path


def test_the_index_proposes_a_siblings_continuation_then_history():
    index = SuffixIndex()
    prompt = [5, 6, 7]
    a, b = index.open(prompt), index.open(prompt)
    assert index.propose(b, 3) == ([], 0, 0)  # nothing has followed the prompt yet
    index.extend(a, [1, 2, 3, 4, 1, 2, 9])
    assert index.propose(b, 3)[0] == [1, 2, 3]  # the sibling's start
    index.extend(b, [1, 2])
    assert index.propose(b, 3) == ([3, 4, 1], 4, 1)  # the longest match indexed: "6 7 1 2", the prompt and a's start
    index.extend(b, [7])
    assert index.propose(b, 3) == ([1, 2, 7], 1, 2)  # only "7" matches; its latest occurrence is b's own
    index.close_call()
    c = index.open(prompt)  # a later call: the earlier rows are history
    assert index.propose(c, 2)[0] == [1, 2]
    assert index.propose(index.open([8, 8]), 2) == ([8], 1, 1)  # a new prompt's own text: "8" followed "8"


def test_the_index_keeps_at_most_max_docs_per_prompt_and_rebuilds_its_table():
    index = SuffixIndex(max_docs=3)
    for call in range(5):
        rows = [index.open([1, 2]) for _ in range(4)]
        for r, row in enumerate(rows):
            index.extend(row, [100 + call * 10 + r, 3, 4])
        index.close_call()
    assert len(index) == 3  # the prompt and the two newest responses
    group = next(iter(index._groups.values()))
    assert len(group.table) <= 2 * len(index.lengths) * sum(len(t) for t in group.docs.values())
    fresh = index.open([1, 2])
    assert index.propose(fresh, 1)[0] == [143]  # the newest response's first token, not a dropped one


def sample_after_history(model, *, drafter: str, k: int, temperature: float, max_new_tokens: int,
                         history_tokens: int = 4, max_k: int = spec.DEFAULT_MAX_K, n: int = 4000):
    """n rows of one prompt sampled with RS at `temperature`, top-k 8, drafting with `drafter` from a suffix index
    that already holds 200 rows sampled at that temperature without top-k (so many drafts are tokens the top-k target
    gives no mass) -> (prompt, gens, metrics, params)."""
    prompt = CHAR_CODEC.encode("hello")
    index = SuffixIndex(max_docs=n + 1)
    spec.speculative_generate(model, [prompt] * 200, k=k, mode="rs", max_new_tokens=history_tokens, drafter="suffix",
                              sampling=SamplingParams(temperature), generator=torch.Generator().manual_seed(1),
                              index=index)
    params = SamplingParams(temperature, top_k=8)
    gens, metrics = spec.speculative_generate(model, [prompt] * n, k=k, max_k=max_k, mode="rs",
                                              max_new_tokens=max_new_tokens, sampling=params,
                                              generator=torch.Generator().manual_seed(0), drafter=drafter, index=index)
    return prompt, gens, metrics, params


@pytest.fixture(scope="module")
def headless(hf_model_dir):
    """The transformers-saved tiny model, which has no MTP head."""
    _, path = hf_model_dir
    model = load_model(path)
    assert model.mtp is None
    return model


@pytest.fixture(scope="module", params=["float32", "bfloat16", pytest.param("compiled", marks=pytest.mark.slow)])
def path_model(request, headless):
    """The headless model on each path. Compiled, its graphs are its own model kind's (two to three minutes cold), so
    that variant runs with -m slow; the default suite covers point-mass drafts on compiled steps through
    headed_model's `both` tests."""
    return on_path(headless, request.param)


@pytest.mark.parametrize("mode", ["rs", "to"])
@pytest.mark.parametrize("k", [1, 4, "auto"])
def test_greedy_equals_plain_and_history_drafts_it(path_model, mode, k):
    """T=0: every row equals plain greedy; groups of equal prompts draft from each other, and a second call over the
    same index drafts from the first call's responses (at T=0 the same text: nearly every draft accepted)."""
    prompts = ids_of(PROMPTS) * 3
    ref = generate(path_model, prompts, max_new_tokens=30, sampling=SamplingParams(0.0), stop_ids=[EOS])
    index = SuffixIndex()
    for call in range(2):
        gens, metrics = spec.speculative_generate(path_model, prompts, k=k, mode=mode, max_new_tokens=30,
                                                  sampling=SamplingParams(0.0), stop_ids=[EOS], drafter="suffix",
                                                  index=index, max_k=4)
        for a, b in zip(gens, ref):
            assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert metrics.num_drafts > 0
    # the second call: history drafts the same text (--k auto: drafting chosen, at a depth of its choice)
    assert metrics.mean_acceptance_length > (2.0 if k == "auto" else 1 + 0.9 * k)
    if k == 1:  # matches that the first call's drafts proved strong draft past K, up to max_k
        assert max(depth for steps in metrics.k_histogram.values() for depth in steps) > k


def test_sampled_output_is_lossless_with_point_mass_drafts(path_model):
    """RS with suffix drafts through the engine: the first two emitted tokens follow the warped target exactly
    (chi-square at alpha = 1e-6). The history comes from sampling without top-k, so many drafts are tokens the
    top-k target gives zero probability: they must never be emitted."""
    n = 4000
    prompt, gens, metrics, params = sample_after_history(path_model, drafter="suffix", k=2, temperature=1.5,
                                                         max_new_tokens=3, n=n)
    assert metrics.num_drafts > n / 2 and 200 < metrics.num_accepted_tokens < 0.9 * metrics.num_draft_tokens  # both
    assert_positions_follow(path_model, prompt, gens, params, positions=(0, 1))


def test_strong_matches_drafting_past_k_stay_lossless(headless, monkeypatch):
    """Every match taken as strong: K = 1 steps deepen to max_k = 4 wherever the history's continuation is that long,
    and the tokens those steps emit (positions 1-3) still follow the warped target (chi-square at alpha = 1e-6),
    drafts the top-k target gives no mass included."""
    from bebop.engine.suffix_drafter import SourceChooser

    monkeypatch.setattr(SourceChooser, "strong", lambda self, match: True)
    n = 4000
    prompt, gens, metrics, params = sample_after_history(headless, drafter="suffix", k=1, temperature=0.6,
                                                         max_new_tokens=4, history_tokens=8, max_k=4, n=n)
    deep = sum(count for steps in metrics.k_histogram.values() for depth, count in steps.items() if depth > 1)
    assert deep > 0 and metrics.accepted_per_position[2] > n / 4, metrics  # many rows accept past depth 2
    assert_positions_follow(headless, prompt, gens, params, positions=(1, 2, 3))


def test_a_strong_match_deepens_only_where_it_pays():
    from bebop.engine.suffix_drafter import SourceChooser

    chooser = SourceChooser()
    found = [([5, 6, 7, 8, 9, 10], 8), ([5], 2)]
    always = lambda deep, gain, rows: True  # noqa: E731
    for _ in range(SourceChooser.STRONG_AFTER - 1):
        chooser.observe(8, 3, 3)
    assert not chooser.strong(8) and chooser.deepen(3, found, 6, always) == 3  # too few to judge yet
    chooser.observe(8, 3, 3)
    chooser.observe(2, 0, 3)
    assert chooser.strong(8) and not chooser.strong(2)
    asked = []
    assert chooser.deepen(3, found, 5, lambda deep, gain, rows: asked.append((deep, gain, rows)) or True) == 5
    assert asked == [(5, 2.0, 1)]  # to max_k; the strong row's share (1.0) x its 2 extra drafts
    assert chooser.deepen(3, found, 6, lambda deep, gain, rows: False) == 3
    assert chooser.deepen(0, found, 6, always) == 0  # a plain step stays plain
    for _ in range(30):  # the continuations stop paying: no longer strong
        chooser.observe(8, 0, 6)
    assert not chooser.strong(8)


def test_an_unknown_drafter_is_named(headless):
    with pytest.raises(BebopError, match="unknown --drafter 'ngram'"):
        spec.speculative_generate(headless, [[1, 2]], k=2, mode="rs", max_new_tokens=2, drafter="ngram")


def test_generate_and_rl_draft_from_their_own_text_on_a_model_without_a_head(hf_model_dir, tmp_path):
    """`--spec rs --drafter suffix` on a model with no head: generate's output is plain greedy's at T=0, and an RL
    run's rollouts draft (the group's siblings, then the earlier steps' responses)."""
    from bebop.cli import main
    from bebop.rl.loop import train_rl

    from rl_helpers import read_metrics, rl_cfg

    _, path = hf_model_dir
    outs = []
    for flags in ([], ["--spec", "rs", "--drafter", "suffix", "--k", "3"]):
        out = tmp_path / f"out{len(outs)}.jsonl"
        assert main(["generate", "--model", str(path), "--max-new-tokens", "20", "--temperature", "0", "--out",
                     str(out), "--prompt", "hello", "--prompt", "hello", "--no-progress", *flags]) == 0
        outs.append(out.read_text())
    assert outs[0] == outs[1]
    train_rl(tmp_path / "run", rl_cfg(path, steps=2, spec="rs", drafter="suffix", k=3), progress=False, device="cpu")
    rows = read_metrics(tmp_path / "run")
    assert all(r["acceptance_rate"] is not None for r in rows) and rows[-1]["mean_acceptance_length"] > 1
    assert set(rows[-1]["drafts_by_source"]) == {"suffix"} and rows[-1]["drafts_by_source"]["suffix"]["num_drafts"] > 0
    import json

    dumped = [json.loads(line) for line in (tmp_path / "run" / "rollouts" / "step-000002.jsonl").read_text().splitlines()]
    per_row = [d["drafts_by_source"].get("suffix", {"drafts": 0})["drafts"] for d in dumped]
    assert sum(per_row) == rows[-1]["drafts_by_source"]["suffix"]["num_drafts"]  # the step's drafts, row by row


@pytest.fixture(scope="module", params=["float32", "compiled"])
def headed_model(request, spec_model):
    """spec_model (a random head) eager and with compiled steps."""
    return on_path(spec_model, request.param)


# compiled: slow (its graphs compile cold); test_speculative keeps compiled T=0 equal to greedy in the default suite
@pytest.mark.parametrize("headed_model,k", [("float32", 2), ("float32", "auto"),
                                            pytest.param("compiled", 2, marks=pytest.mark.slow),
                                            pytest.param("compiled", "auto", marks=pytest.mark.slow)],
                         indirect=["headed_model"])
def test_both_drafters_keep_greedy_output(headed_model, k):
    """--drafter both, T=0: equal to plain greedy; with a fixed k the second call's long history matches replace most
    of the random head's drafts, so far more are accepted than with the head alone."""
    prompts = ids_of(PROMPTS) * 2
    ref = generate(headed_model, prompts, max_new_tokens=30, sampling=SamplingParams(0.0), stop_ids=[EOS])
    lengths = {}
    for drafter in ("mtp", "both"):
        index = SuffixIndex()
        for _ in range(2):
            gens, metrics = spec.speculative_generate(headed_model, prompts, k=k, max_k=3, mode="rs", max_new_tokens=30,
                                                      sampling=SamplingParams(0.0), stop_ids=[EOS], drafter=drafter,
                                                      index=index)
            assert [g.token_ids for g in gens] == [g.token_ids for g in ref]
        lengths[drafter] = metrics.mean_acceptance_length
    if k != "auto":  # (--k auto soon stops drafting with a random head, and verifies what it chooses)
        assert lengths["both"] > lengths["mtp"] + 0.5, lengths


@pytest.mark.parametrize("headed_model", ["float32", pytest.param("compiled", marks=pytest.mark.slow)],
                         indirect=True)  # compiled: slow, as above
def test_sampled_output_is_lossless_with_both_drafters(headed_model):
    """RS over a mixture: rows whose text matches the history draft point masses, the others the head's samples;
    the first two tokens follow the warped target (chi-square at alpha = 1e-6)."""
    n = 4000
    prompt, gens, metrics, params = sample_after_history(headed_model, drafter="both", k=2, temperature=1.5,
                                                         max_new_tokens=4, n=n)
    assert metrics.num_drafts > n / 2 and 200 < metrics.num_accepted_tokens < 0.9 * metrics.num_draft_tokens
    assert_positions_follow(headed_model, prompt, gens, params, positions=(1, 2))  # the drafted steps' tokens


def test_the_source_chooser_tries_a_match_length_then_follows_what_it_paid():
    from bebop.engine.suffix_drafter import SourceChooser

    chooser = SourceChooser()
    assert chooser.prefer_suffix(3)  # nothing measured yet
    chooser.observe(0, 3)  # a head draft: 3 tokens accepted
    assert chooser.prefer_suffix(3)  # a match length not yet tried is tried
    chooser.observe(3, 1)
    chooser.observe(6, 3)
    assert not chooser.prefer_suffix(3) and chooser.prefer_suffix(6)
    for _ in range(60):  # the head gets worse (a policy under RL): the estimates follow
        chooser.observe(0, 0)
    assert chooser.prefer_suffix(3)


def test_metrics_count_drafts_by_source():
    from bebop.engine.metrics import SpecMetrics

    a, b = SpecMetrics(3), SpecMetrics(3)
    a.record_draft(2, source="mtp")
    b.record_draft(1, source="suffix")
    b.record_draft(3, source="suffix")
    merged = a.merge(b).to_dict()["by_source"]
    assert merged == {"mtp": {"num_drafts": 1, "mean_acceptance_length": 3.0},
                      "suffix": {"num_drafts": 2, "mean_acceptance_length": 3.0}}


def test_the_progress_bar_shows_each_sources_accept_length_when_there_are_two():
    from bebop.rl.loop import _by_source_postfix

    both = {"mtp": {"num_drafts": 9, "mean_acceptance_length": 4.5}, "suffix": {"num_drafts": 3, "mean_acceptance_length": 2.137}}
    assert _by_source_postfix(both) == {"mtp": "4.50", "suffix": "2.14"}
    assert _by_source_postfix({"mtp": both["mtp"]}) == {}  # one source: the bar's accept_len says it
