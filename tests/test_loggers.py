"""`--log tensorboard|wandb|mlflow`: every number of metrics.jsonl reaches each tracker at its step, read back
from what the tracker wrote (W&B offline, an MLflow file store, TensorBoard event files); a resumed run
continues the same tracker run; a tracker whose package is missing is one line, exit 2, nothing written."""

import json
import struct
import sys

import pytest

import bebop.rl.loop
from bebop.cli import main
from bebop.metrics_log import flat_scalars

pytest.importorskip("wandb")
pytest.importorskip("mlflow")
pytest.importorskip("tensorboard")


def _rl(model, run, steps, *extra):
    return ["rl", "--model", str(model), "--task", "math", "--steps", str(steps), "--out", str(run),
            "--group-size", "2", "--batch-prompts", "2", "--max-new-tokens", "8", "--spec", "rs", "--k", "2",
            "--save-every", "1", "--device", "cpu", "--no-progress", *extra]


@pytest.fixture()
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)


def _jsonl_scalars(run):
    """{step: {rl/KEY: value}} as the trackers should have them, from metrics.jsonl."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: flat_scalars(row, "rl") for row in rows}


def _wandb_records(path):
    """The records of an offline run file (W&B's LevelDB-style log: 7-byte file header, 32 KiB blocks of
    records with a 7-byte header: crc32, length, type full/first/middle/last)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, chunks, records = path.read_bytes(), 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7]) if left >= 7 else (0, 0, 0)
        if kind == 0:  # block padding
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        chunks = chunk if kind in (1, 2) else chunks + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(chunks)
            records.append(record)
    return records


def _wandb_history(run):
    """{step: {key: value}} over every offline W&B run file of the run directory, and the runs' ids and configs."""
    history, ids, configs = {}, set(), []
    for path in sorted(run.glob("wandb/offline-run-*/run-*.wandb")):
        for record in _wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                ids.add(record.run.run_id)
                configs.append({item.key: json.loads(item.value_json) for item in record.run.config.update})
            elif kind == "history":
                row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
                history[row["rl/step"]] = {k: v for k, v in row.items() if not k.startswith("_") and k != "rl/step"}
    return history, ids, configs


def _mlflow_history(run):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(run.resolve() / "mlruns").as_uri())
    run_id = (run / "mlflow_run_id").read_text().strip()
    history: dict[int, dict[str, float]] = {}
    for key in client.get_run(run_id).data.metrics:
        for m in client.get_metric_history(run_id, key):
            history.setdefault(m.step, {})[key] = m.value
    experiment = client.get_experiment_by_name("bebop")
    runs = client.search_runs([experiment.experiment_id])
    return history, runs, client.get_run(run_id).data.params


def _tensorboard_history(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tb"))
    events.Reload()
    history: dict[int, dict[str, float]] = {}
    for key in events.Tags()["scalars"]:
        for e in events.Scalars(key):
            history.setdefault(e.step, {})[key] = e.value
    return history


def _close(a: dict, b: dict, rel: float):
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    for step in a:
        assert a[step].keys() == b[step].keys(), (step, sorted(set(a[step]) ^ set(b[step])))
        for key in a[step]:
            assert a[step][key] == pytest.approx(b[step][key], rel=rel, abs=1e-6), (step, key)


def test_every_number_reaches_each_tracker_and_a_resume_continues_its_run(headed, tmp_path, offline, monkeypatch):
    run = tmp_path / "run"
    logs = ["--log", "wandb", "--log", "mlflow", "--tensorboard"]
    dump = bebop.rl.loop.dump_rollouts

    def crash_at_step_3(out, step, *args):
        if step == 3:
            raise KeyboardInterrupt  # a run stopped after its step-2 checkpoint
        dump(out, step, *args)

    monkeypatch.setattr(bebop.rl.loop, "dump_rollouts", crash_at_step_3)
    assert main(_rl(headed, run, 3, *logs)) == 130  # Ctrl-C's exit code
    monkeypatch.setattr(bebop.rl.loop, "dump_rollouts", dump)
    assert main(_rl(headed, run, 3, *logs, "--resume")) == 0
    expected = _jsonl_scalars(run)
    assert sorted(expected) == [1, 2, 3] and "rl/acceptance_rate_per_position/2" in expected[1]
    wandb_history, wandb_ids, wandb_configs = _wandb_history(run)
    _close(wandb_history, expected, rel=0)  # W&B keeps the float itself
    assert wandb_ids == {(run / "wandb_run_id").read_text().strip()}  # the resume continued the same W&B run
    assert wandb_configs[0]["k"] == 2 and wandb_configs[0]["spec"] == "rs"
    mlflow_history, mlflow_runs, params = _mlflow_history(run)
    _close(mlflow_history, expected, rel=0)
    assert len(mlflow_runs) == 1 and mlflow_runs[0].info.status == "FINISHED"  # one MLflow run across the resume
    assert params["spec"] == "rs" and params["lr"] == json.dumps(json.loads((run / "config.json").read_text())["lr"])
    _close(_tensorboard_history(run), expected, rel=1e-6)  # TensorBoard stores float32


@pytest.mark.parametrize("name, package", [("wandb", "wandb"), ("mlflow", "mlflow-skinny"),
                                           ("tensorboard", "tensorboard")])
def test_a_missing_tracker_package_is_one_line_and_nothing_written(headed, tmp_path, capsys, monkeypatch, name, package):
    monkeypatch.setitem(sys.modules, name, None)  # import fails as if not installed
    run = tmp_path / "run"
    assert main(_rl(headed, run, 1, "--log", name)) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: --log {name} needs the {package} package (pip install {package}, or pip install " \
                  f"'bebop[{name}]')"
    assert not run.exists()


def test_sft_and_mtp_train_log_under_their_own_tags(headed, tmp_path, offline):
    from mlflow.tracking import MlflowClient

    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "completion": str(i + 1)}) + "\n" for i in range(4)))
    runs = {"sft": ["sft", "--out", str(tmp_path / "sft"), "--model", str(headed), "--data", str(data), "--steps", "2",
                    "--batch-size", "2", "--device", "cpu"],
            "mtp": ["mtp", "train", "--model", str(headed), "--out", str(tmp_path / "mtp"), "--steps", "2", "--depths",
                    "2", "--batch-size", "2", "--num-samples", "4", "--max-new-tokens", "8", "--device", "cpu"]}
    for tag, argv in runs.items():
        assert main(argv + ["--log", "mlflow"]) == 0
        run = tmp_path / tag
        client = MlflowClient(tracking_uri=(run / "mlruns").as_uri())
        run_id = (run / "mlflow_run_id").read_text().strip()
        assert [m.step for m in client.get_metric_history(run_id, f"{tag}/loss")] == [1, 2]
        assert client.get_run(run_id).data.params["steps"] == "2"
