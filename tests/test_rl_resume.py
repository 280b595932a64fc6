"""Resume after SIGKILL: `bebop rl` killed mid-run after its first checkpoint, resumed with --resume,
finishes with every step counted exactly once, valid files and a loadable final model."""

import json
import os
import signal
import subprocess
import sys
import time

from bebop.model import load_model

from rl_helpers import make_headed

STEPS = 40


def _command(model, run, *extra):
    return [sys.executable, "-m", "bebop", "rl", "--model", str(model), "--task", "math", "--steps", str(STEPS),
            "--out", str(run), "--group-size", "2", "--batch-prompts", "2", "--max-new-tokens", "12",
            "--save-every", "2", "--spec", "rs", "--k", "2", "--mtp-update", "ce", "--device", "cpu",
            "--no-progress", *extra]


def test_resume_after_sigkill_counts_every_step_once(tmp_path):
    model = make_headed(tmp_path / "headed", tmp_path / "base")
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(_command(model, run), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not (run / "LATEST").exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]  # still running: killed mid-run
    time.sleep(0.05)  # into a step past the checkpoint (steps take tens of ms)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["step"]
    saved_at = int((run / "LATEST").read_text().strip().split("-")[1])
    assert 2 <= saved_at <= killed_at < STEPS, (saved_at, killed_at)
    print(f"killed after step {killed_at}, checkpoint at {saved_at}")
    done = subprocess.run(_command(model, run, "--resume"), env=env, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]  # every line valid JSON
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert [r["policy_version"] for r in rows] == list(range(STEPS))  # sync: sampled by the weights before it
    assert (run / "LATEST").read_text().strip() == f"ckpt-{STEPS:06d}"
    assert not list(run.glob(".ckpt-tmp-*")) and len(list(run.glob("ckpt-*"))) == 1
    assert json.loads(done.stdout.decode())["policy_version"] == STEPS
    assert load_model(run / "model").mtp is not None


def test_metrics_are_cut_to_the_checkpoint_on_resume(tmp_path):
    from bebop.metrics_log import MetricsLog
    from bebop.rl.metrics import METRICS_FILE

    lines = [json.dumps({"step": s, "reward": 0.5}) for s in (1, 2, 3, 4)]
    (tmp_path / METRICS_FILE).write_text("\n".join(lines) + '\n{"step": 5, "rew')  # torn by a kill
    log = MetricsLog(tmp_path, METRICS_FILE, resume_step=2)
    assert log.last == {"step": 2, "reward": 0.5}
    log.write({"step": 3, "reward": 0.25})
    log.close()
    assert (tmp_path / METRICS_FILE).read_text().splitlines() == lines[:2] + [json.dumps({"step": 3, "reward": 0.25})]


def test_resume_with_another_config_names_the_fields(tmp_path, capsys):
    from bebop.cli import main

    model = make_headed(tmp_path / "headed", tmp_path / "base")
    run = tmp_path / "run"
    args = _command(model, run)[3:]
    args[args.index("--steps") + 1] = "1"
    assert main(args) == 0
    changed = [a if a != "ce" else "tv" for a in args]
    assert main(changed + ["--resume"]) == 2
    assert "config differs in mtp_update" in capsys.readouterr().err
