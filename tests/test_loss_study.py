"""The converged loss study (bebop.study.loss_study) and what it rests on: the exact held-out measure, the
patience rule that keeps the best head, narrower heads, and the study's cells, pairing and reuse."""

import json

import pytest
import torch

from bebop.cli import main
from bebop.errors import BebopError
from bebop.model import load_model
from bebop.model.checkpoint import save_model
from bebop.mtp.data import Sequence
from bebop.mtp.heldout import expected_acceptance, first_turn
from bebop.mtp.patience import MIN_DELTA, Patience
from bebop.mtp.train import train_mtp
from bebop.mtp.train_config import MTPTrainConfig
from bebop.policy import load_policy
from bebop.study.loss_study import StudySpec, aggregate, equal_compute, head_width, run_loss_study


def _cfg(**kw):
    base = dict(loss="ce", depths=2, steps=12, batch_size=4, num_samples=12, max_new_tokens=16, task="math")
    return MTPTrainConfig(**{**base, **kw})


def test_the_exact_measure_is_the_engine_view_of_the_chains(headed_model):
    """The rate at K is (mean acceptance length - 1) / K of the renewal-weighted chains; a head that equals
    the target (its logits copied from the trunk's next-next position cannot be built, so: the same measure
    on one sequence twice) is measured identically, and an environment token cuts the completion."""
    policy = load_policy(headed_model, device="cpu")
    seqs = [Sequence([1, 2, 3], [4, 5, 6, 7, 8, 9], [False] * 6), Sequence([1, 2], [5, 6, 7, 8], [False] * 4)]
    m = expected_acceptance(policy, seqs, k=2, temperature=1.0, seed=0)
    assert m["positions"] == 5 + 3
    for mode in ("rs", "to"):
        assert m[mode]["rate"] == pytest.approx((m[mode]["mean_acceptance_length"] - 1) / 2)
        assert m[mode]["low"] <= m[mode]["rate"] <= m[mode]["high"]  # TO: no next token is the argmax, [0, 0]
    assert expected_acceptance(policy, seqs, k=2, temperature=1.0, seed=0) == m  # deterministic given the seed
    assert first_turn(Sequence([1], [4, 5, 6, 7], [False, False, True, False])) == ([1], [4, 5])
    with pytest.raises(BebopError, match="no drafting positions"):
        expected_acceptance(policy, [Sequence([1], [4], [False])], k=2, temperature=1.0)


def test_patience_keeps_the_best_head_and_stops_after_p_measures_without_improvement():
    model = torch.nn.Module()
    model.mtp = torch.nn.Linear(2, 2)
    watch = Patience(patience=2)
    assert not watch.update(0.5, 10, model)
    best = model.mtp.weight.detach().clone()
    with torch.no_grad():
        model.mtp.weight.add_(1.0)
    assert not watch.update(0.5 + MIN_DELTA / 2, 20, model)  # within noise: not an improvement
    assert watch.update(0.4, 30, model)  # the second measure without improvement: stop
    watch.restore_best(model)
    assert torch.equal(model.mtp.weight, best) and watch.best_step == 10
    assert Patience.from_state(watch.state()).best == 0.5


def test_training_with_patience_saves_the_best_head_and_resumes_as_finished(headed_model, tmp_path):
    cfg = _cfg(steps=40, held_out=4, eval_every=2, patience=2, lr=5e-2)
    out = tmp_path / "head"
    summary = train_mtp(headed_model, cfg, out=out, progress=False, data_cache=tmp_path / "cache")
    rows = [json.loads(x) for x in (out / "mtp_metrics.jsonl").read_text().splitlines()]
    measured = [(r["step"], r["heldout_rs_acceptance"]) for r in rows if "heldout_rs_acceptance" in r]
    assert [s for s, _ in measured] == list(range(2, rows[-1]["step"] + 1, 2))
    best_step, best = max(measured, key=lambda p: p[1])
    assert summary["heldout_rs_acceptance_best"] == pytest.approx(best) and summary["best_step"] == best_step
    if summary["stopped_early"]:  # stopped exactly `patience` measures after the best
        assert rows[-1]["step"] == measured[-1][0] and sum(1 for s, _ in measured if s > best_step) == 2
    saved = load_policy(out, device="cpu")  # the saved head measures what its best measure said
    held = [json.loads(x) for x in next((tmp_path / "cache").glob("*.jsonl")).read_text().splitlines()][-4:]
    seqs = [Sequence(r["prompt_ids"], r["completion_ids"], r["env_mask"]) for r in held]
    assert expected_acceptance(saved, seqs, k=3, temperature=1.0, seed=0)["rs"]["rate"] == pytest.approx(best, abs=1e-5)
    again = train_mtp(headed_model, cfg, out=out, resume=True, progress=False, data_cache=tmp_path / "cache")
    assert again["steps_trained"] == summary["steps_trained"]  # nothing retrained
    with pytest.raises(BebopError, match="--eval-every and --held-out go together"):
        _cfg(held_out=4)
    with pytest.raises(BebopError, match="fewer than --num-samples"):
        _cfg(held_out=12, eval_every=2)


def test_a_narrower_head_saves_and_loads_and_no_engine_takes_it(headed_model, tmp_path):
    policy = load_policy(headed_model, device="cpu")
    width = head_width("half", policy.model.config.intermediate_size)
    policy.model.attach_mtp(1, torch.Generator().manual_seed(0), intermediate_size=width)
    save_model(policy.model, tmp_path / "narrow")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "narrow" / name).write_bytes((headed_model / name).read_bytes())
    loaded = load_model(tmp_path / "narrow")
    assert loaded.mtp.layers[0].mlp.down_proj.in_features == width == policy.model.config.intermediate_size // 2
    assert json.loads((tmp_path / "narrow" / "config.json").read_text())["mtp_intermediate_size"] == width
    assert "mtp_intermediate_size" not in json.loads((headed_model / "config.json").read_text())
    assert main(["mtp", "export", "--model", str(tmp_path / "narrow"), "--engine", "vllm",
                 "--out", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()


def test_the_study_pairs_losses_per_seed_in_each_cell_and_reuses_its_heads(headed_model, tmp_path, monkeypatch):
    spec = StudySpec(task="math", losses=("ce", "e2e_tv"), temperatures=(1.0, 0.7), head_sizes=("full", "half"),
                     seeds=(0, 1), steps=6, depths=2, k=2, num_samples=10, held_out=3, eval_every=2, patience=0,
                     n_eval=3, sampled=False)
    results = run_loss_study(headed_model, tmp_path / "study", spec, progress=False)
    assert [(c["temperature"], c["head_size"]) for c in results["cells"]] == \
        [(1.0, "full"), (1.0, "half"), (0.7, "full"), (0.7, "half")]
    for cell in results["cells"]:
        runs = [r for r in results["runs"] if (r["temperature"], r["head_size"]) == (cell["temperature"], cell["head_size"])]
        assert sorted((r["loss"], r["seed"]) for r in runs) == [("ce", 0), ("ce", 1), ("e2e_tv", 0), ("e2e_tv", 1)]
        tv = {r["seed"]: r["exact_rs_rate"] for r in runs if r["loss"] == "e2e_tv"}
        ce = {r["seed"]: r["exact_rs_rate"] for r in runs if r["loss"] == "ce"}
        (row,) = [r for r in cell["rows"] if r["loss"] == "e2e_tv"]
        assert row["exact_rs_rate_vs_ce"][0] == pytest.approx((tv[0] - ce[0] + tv[1] - ce[1]) / 2)
        assert cell["equal_compute"]["step"] == 6
    text = (tmp_path / "study" / "loss_table.md").read_text()
    assert "## T = 0.7, head half" in text and "Equal compute" in text
    assert (tmp_path / "study" / "loss_table-T0.7-half-curves.png").read_bytes()[:4] == b"\x89PNG"

    def forbidden(*a, **k):
        raise AssertionError("a finished head was trained or measured again")

    monkeypatch.setattr("bebop.study.loss_study.train_mtp", forbidden)
    monkeypatch.setattr("bebop.study.loss_study.expected_acceptance", forbidden)
    assert run_loss_study(headed_model, tmp_path / "study", spec, progress=False)["cells"] == results["cells"]
    assert main(["report", str(tmp_path / "study" / "loss_table.json")]) == 0
    # a measure cached under another estimator is measured again; the heads are not retrained
    measured = []
    monkeypatch.setattr("bebop.study.loss_study.ESTIMATOR", "another")
    monkeypatch.setattr("bebop.study.loss_study.expected_acceptance", lambda *a, **k: measured.append(1) or
                        {"positions": 1, **{m: {"rate": 0.5, "low": 0.4, "high": 0.6, "mean_acceptance_length": 2.0,
                                                "per_depth": [0.5, 0.5]} for m in ("rs", "to")}})
    run_loss_study(headed_model, tmp_path / "study", spec, progress=False)
    assert len(measured) == len(results["runs"])


def test_aggregate_and_equal_compute_on_a_worked_case():
    runs = [{"loss": loss, "seed": s, "exact_rs_rate": v, "exact_to_rate": 0.5, "exact_rs_mean_acceptance_length": 2.0,
             "sampled_rs_rate": None, "sampled_to_rate": None, "best_step": 10, "curve": curve}
            for loss, s, v, curve in [("ce", 0, 0.60, [[5, 0.5], [10, 0.6]]), ("ce", 1, 0.62, [[5, 0.52], [10, 0.62]]),
                                      ("tv", 0, 0.64, [[5, 0.55]]), ("tv", 1, 0.70, [[5, 0.58], [10, 0.7]])]]
    rows = {r["loss"]: r for r in aggregate(runs, ("ce", "tv"))}
    assert rows["tv"]["exact_rs_rate_vs_ce"][0] == pytest.approx(0.06)  # (0.04 + 0.08) / 2
    half = 12.706205 * (0.08 - 0.04) / 2  # t(0.975, 1) * sd / sqrt(2), sd = |a - b| / sqrt(2)
    assert rows["tv"]["exact_rs_rate_vs_ce"][2] - 0.06 == pytest.approx(half)
    assert "sampled_rs_rate" not in rows["tv"]  # not measured: left out, not made up
    eq = equal_compute(runs, ("ce", "tv"))
    assert eq["step"] == 5 and eq["losses"]["tv"]["vs_ce"][0] == pytest.approx((0.05 + 0.06) / 2)


@pytest.mark.parametrize("argv, message", [
    (["--losses", "tv,e2e_tv"], "must include ce"),
    (["--temperatures", "0,1"], "--temperatures must be > 0"),
    (["--head-sizes", "huge"], "unknown head size 'huge'"),
    (["--seeds", "1,1"], "distinct seeds"),
    (["--seeds", "a"], "--seeds must be a comma-separated list"),
    (["--task", "nope"], "unknown task 'nope'"),
])
def test_bad_study_flags_are_refused_before_anything_is_written(headed_model, tmp_path, capsys, argv, message):
    out = tmp_path / "study"
    assert main(["mtp", "study", "--model", str(headed_model), "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not out.exists()
