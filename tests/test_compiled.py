"""Compiled decoding steps (`--compile`, bebop.engine.compiled): the compiled path is taken, equals eager
decoding, reuses its graphs across batch sizes and weight updates, and falls back to eager with one line
when compiling fails. The lossless and T=0 tests run on it too (test_speculative's `dtype_model`)."""

import copy
import json
import logging
import os
import subprocess
import sys

import pytest
import torch

from bebop.engine import compiled, generate, step_packages
from bebop.engine.speculative import speculative_generate
from bebop.engine.step_costs import step_costs
from bebop.errors import BebopError
from bebop.sampling import SamplingParams

from spec_helpers import EOS, PROMPTS, ids_of

GREEDY = SamplingParams(0.0)
REAL_FOLDER = step_packages.PackagedGraph.folder  # conftest keeps this process's graphs elsewhere


def unique_graphs() -> int:
    return step_packages.graph_count()


@pytest.fixture
def fresh_store(tmp_path, monkeypatch):
    """An empty package store, and no graphs in memory: what a new process on a new machine starts with."""
    monkeypatch.setenv(step_packages.STORE_ENV, str(tmp_path / "store"))
    monkeypatch.setattr(step_packages, "_SHARED", {})
    monkeypatch.setattr(step_packages.PackagedGraph, "folder", REAL_FOLDER)
    return tmp_path / "store"


@pytest.fixture(scope="module")
def compiled_model(spec_model):
    model = copy.deepcopy(spec_model)
    assert compiled.compile_steps(model, "on")
    return model


def test_compiled_steps_run_and_equal_eager(spec_model, compiled_model):
    prompts = ids_of(PROMPTS)
    ref = generate(spec_model, prompts, max_new_tokens=24, sampling=GREEDY, stop_ids=[EOS])
    plain = generate(compiled_model, prompts, max_new_tokens=24, sampling=GREEDY, stop_ids=[EOS])
    spec, _ = speculative_generate(compiled_model, prompts, k=3, mode="rs", max_new_tokens=24, sampling=GREEDY,
                                   stop_ids=[EOS])
    steps = compiled.compiled_steps(compiled_model)
    assert steps is not None and steps.failed is None  # the compiled path ran, every forward of a decode step
    assert all(steps.calls[name] > 0 for name in ("trunk", "step", "verify")), steps.calls  # a drafting step whole
    assert [g.token_ids for g in plain] == [g.token_ids for g in ref]
    assert [g.token_ids for g in spec] == [g.token_ids for g in ref]


def test_the_recompile_limit_is_the_steps_own(spec_model):
    """Compiling bebop's steps leaves the process's dynamo recompile limit (a user's other compiled code) alone."""
    with torch._dynamo.config.patch(recompile_limit=8):
        compiled.compile_steps(copy.deepcopy(spec_model), "on")
        assert torch._dynamo.config.recompile_limit == 8


def test_graphs_are_reused_across_batch_sizes_and_weight_updates(compiled_model):
    """A run at another live-batch size (2 and up share one graph), with other prompt lengths (every span and rope
    table shares it), plain or speculative with a k met before (a whole step is one graph per k, as --k auto picks
    them; the verify graph of k = 0 serves its plain steps), and after an in-place weight update (as an optimizer
    step makes, every RL step) compiles nothing new, and decodes with the new weights."""
    prompts = ids_of(PROMPTS)

    def decode(batch, n):  # plain and speculative
        generate(compiled_model, batch, max_new_tokens=n, sampling=GREEDY, stop_ids=[EOS])
        speculative_generate(compiled_model, batch, k=3, mode="rs", max_new_tokens=n, sampling=GREEDY, stop_ids=[EOS])

    decode(prompts, 24)  # every shape seen: plain, the refresh, drafting and verify graphs of k = 3
    decode(prompts[:1], 24)  # at batch 1 too (torch specialises size 1)
    speculative_generate(compiled_model, prompts, k=1, mode="rs", max_new_tokens=24, sampling=GREEDY, stop_ids=[EOS])
    before = unique_graphs()
    decode(prompts[:3], 24)
    decode([p * 3 for p in prompts[2:]], 30)
    with torch.no_grad():
        for p in compiled_model.parameters():
            p.add_(torch.randn_like(p), alpha=0.05)
    after_update = generate(compiled_model, prompts, max_new_tokens=24, sampling=GREEDY, stop_ids=[EOS])
    assert unique_graphs() == before
    compiled.compile_steps(compiled_model, "off")  # the same weights, eagerly
    eager = generate(compiled_model, prompts, max_new_tokens=24, sampling=GREEDY, stop_ids=[EOS])
    assert [g.token_ids for g in after_update] == [g.token_ids for g in eager]


class Schedule:
    """A stand-in for AdaptiveK that chooses a fixed cycle of k (0: a plain step)."""

    def __init__(self, ks):
        self.ks, self.at = ks, 0

    def choose(self, rows):
        self.at += 1
        return self.ks[(self.at - 1) % len(self.ks)]

    def observe(self, rows, k, seconds, accepted):
        pass


def test_a_catch_up_over_many_plain_steps_runs_in_the_whole_step(spec_model):
    """Plain steps leave their positions waiting for the head; the next drafting step refreshes all of them in the
    whole step's graph (the refresh's width is dynamic), however many: no verb runs and no graph is compiled for a
    catch-up wider than any before, and the output is plain greedy."""
    prompts = ids_of(PROMPTS)
    ref = generate(spec_model, prompts, max_new_tokens=40, sampling=GREEDY, stop_ids=[EOS])
    model = copy.deepcopy(spec_model)  # compiled_model may have been turned eager by a test before
    assert compiled.compile_steps(model, "on")

    def decode(ks):
        return speculative_generate(model, prompts, k="auto", max_k=3, mode="rs", max_new_tokens=40,
                                    sampling=GREEDY, stop_ids=[EOS], controller=Schedule(ks))[0]

    decode([3])  # the whole step of k = 3 and the plain step compiled
    steps, before = compiled.compiled_steps(model), unique_graphs()
    verbs = steps.calls["refresh"] + steps.calls["draft"]
    gens = decode([3] + [0] * 12)  # catch-ups of 13 positions a row
    assert [g.token_ids for g in gens] == [g.token_ids for g in ref]
    assert unique_graphs() == before and steps.calls["refresh"] + steps.calls["draft"] == verbs


def test_a_failed_compile_says_so_once_and_decodes_eagerly(tiny_model_dir):
    """In a process of its own: inductor keeps what it found of the C++ toolchain for the process's life."""
    no_compiler = ("import sys, torch; torch._inductor.config.cpp.cxx = ('/nonexistent/c++',); "
                   "torch._inductor.config.fx_graph_cache = False; from bebop.cli import main; sys.exit(main())")

    def run(compile_choice: str, *launcher: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *launcher, "generate", "--model", str(tiny_model_dir), "--prompt",
                               "abc", "--max-new-tokens", "6", "--temperature", "0", "--compile", compile_choice],
                              capture_output=True, text=True)

    failed, eager = run("on", "-c", no_compiler), run("off", "-m", "bebop")
    assert failed.returncode == 0 and eager.returncode == 0, failed.stderr[-2000:]
    assert failed.stdout == eager.stdout
    lines = [line for line in failed.stderr.splitlines() if "--compile" in line]
    assert len(lines) == 1 and "decoding runs eager" in lines[0] and "Traceback" not in failed.stderr


def test_auto_compiles_only_runs_long_enough():
    assert not compiled.wants_compile("auto", compiled.PAYS_AFTER_STEPS - 1)
    assert compiled.wants_compile("auto", compiled.PAYS_AFTER_STEPS)
    assert compiled.wants_compile("on", 1) and not compiled.wants_compile("off", 10**9)
    with pytest.raises(BebopError, match="--compile"):
        compiled.wants_compile("fast", 1)


def test_auto_runs_the_saved_graphs_of_a_short_run_and_compiles_none(spec_model, fresh_store):
    """`auto` on a run too short to pay for compiling: eager with an empty store; with a store that holds graphs
    for the model's kind, it runs those (loaded, none compiled) and every other step eagerly, decoding the same;
    eager again on a run too short to pay for loading them."""
    prompts = ids_of(PROMPTS)
    short = compiled.PAYS_AFTER_STEPS - 1
    model = copy.deepcopy(spec_model)
    assert not compiled.compile_steps(model, "auto", short)
    want = generate(model, prompts, max_new_tokens=8, sampling=GREEDY, stop_ids=[EOS])
    assert compiled.compile_steps(model, "on")
    generate(model, prompts, max_new_tokens=8, sampling=GREEDY, stop_ids=[EOS])  # saves the plain step's graphs
    step_packages._SHARED.clear()  # as a new process would find the store
    again = copy.deepcopy(spec_model)
    assert compiled.compile_steps(again, "auto", short)
    got = generate(again, prompts, max_new_tokens=8, sampling=GREEDY, stop_ids=[EOS])
    spec, _ = speculative_generate(again, prompts, k=2, mode="rs", max_new_tokens=8, sampling=GREEDY, stop_ids=[EOS])
    steps = compiled.compiled_steps(again)
    assert steps.calls["trunk"] > 0 and steps.calls["verify"] == 0  # saved graphs ran; the rest ran eagerly
    made = sum(g.made for g in steps.graphs.values())
    assert made == 0 and steps.graphs["trunk"].loaded > 0
    assert [g.token_ids for g in got] == [g.token_ids for g in want] == [g.token_ids for g in spec]
    # a run shorter still would spend more loading graphs than they save: eager
    assert not compiled.compile_steps(copy.deepcopy(spec_model), "auto", compiled.LOADS_PAY_AFTER_STEPS - 1)


def test_bad_compile_flag_exits_2(tiny_model_dir):
    proc = subprocess.run([sys.executable, "-m", "bebop", "generate", "--model", str(tiny_model_dir), "--prompt", "a",
                           "--max-new-tokens", "2", "--compile", "fast"], capture_output=True, text=True)
    assert proc.returncode == 2 and "--compile" in proc.stderr and "Traceback" not in proc.stderr


def test_rl_sampler_compiles_its_engine_and_a_resume_may_change_compile(spec_model, tmp_path):
    from bebop.decoding import DecodeSpec
    from bebop.fields import flat_dict, from_flat
    from bebop.policy import Policy
    from bebop.rl.config import RLConfig, run_identity
    from bebop.rl.sampler import RolloutSampler
    from bebop.tasks import get_task

    from conftest import CHAR_CODEC

    model = copy.deepcopy(spec_model)
    cfg = RLConfig(model="m", decode=DecodeSpec(compile="on"))
    sampler = RolloutSampler(get_task("math"), Policy(model, CHAR_CODEC), cfg)
    assert sampler.rollout_model(model) is model and compiled.is_compiled(model)
    saved = flat_dict(cfg)
    assert run_identity({**saved, "compile": "off"}) == run_identity(saved)
    assert run_identity({**saved, "lr": 1.0}) != run_identity(saved)
    with pytest.raises(BebopError, match="--compile"):
        from_flat(RLConfig, {"model": "m", "compile": "fast"})


def test_compile_warmup_is_counted_apart_from_decoding(spec_model, fresh_store):
    """The seconds of the calls that compiled or loaded a graph are the warm-up (`compile_warmup_s` in generate's
    metrics); a later run that compiles nothing adds none."""
    model = copy.deepcopy(spec_model)
    assert compiled.compile_steps(model, "on")
    prompts = ids_of(PROMPTS[:2])
    generate(model, prompts, max_new_tokens=4, sampling=GREEDY)
    first = compiled.compile_seconds(model)
    assert first > 0 and unique_graphs() == 2  # the prompts' prefill chunk (its width dynamic) and the one-token step
    generate(model, prompts, max_new_tokens=4, sampling=GREEDY)
    assert compiled.compile_seconds(model) == first
    assert compiled.compile_seconds(spec_model) == 0.0  # an eager model spends none


def test_a_new_process_loads_the_saved_graphs_and_decodes_the_same(tiny_model_dir, tmp_path):
    """The graphs a run compiles are saved; a second process loads them (no new file) and decodes what eager
    decoding does. In processes of their own: a saved graph must not lean on state its first process made."""
    env = {**os.environ, step_packages.STORE_ENV: str(tmp_path / "store")}

    def run(compile_choice: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "bebop", "generate", "--model", str(tiny_model_dir), "--prompt",
                               "abc", "--prompt", "hello there", "--max-new-tokens", "8", "--temperature", "0",
                               "--compile", compile_choice], capture_output=True, text=True, env=env)
        assert proc.returncode == 0 and "--compile" not in proc.stderr, proc.stderr[-2000:]
        return proc.stdout

    eager = run("off")
    assert run("on") == eager
    saved = sorted(p.name for p in (tmp_path / "store").rglob("*") if p.is_file())
    assert any(name.endswith(step_packages.SUFFIX) for name in saved) and "about.json" in saved
    assert run("on") == eager
    after = sorted(p.name for p in (tmp_path / "store").rglob("*") if p.is_file())
    assert [name for name in after if not name.startswith("isa-builds-")] == saved  # loaded, none compiled
    assert run("on") == eager  # the loading process's record of inductor's instruction-set check, where it made one


@pytest.mark.slow  # compiles its graphs cold into a store of its own
def test_an_unreadable_package_is_compiled_again(spec_model, fresh_store):
    """A truncated or foreign file in the store is removed and its graph compiled anew; decoding is unchanged."""
    model = copy.deepcopy(spec_model)
    assert compiled.compile_steps(model, "on")
    prompts = ids_of(PROMPTS[:2])
    want = generate(model, prompts, max_new_tokens=6, sampling=GREEDY, stop_ids=[EOS])
    saved = list(fresh_store.rglob(f"*{step_packages.SUFFIX}"))  # the prefill's graph and the step's
    for file in saved:
        file.write_bytes(file.read_bytes()[:100])
    step_packages._SHARED.clear()  # as a new process would find the store
    again = copy.deepcopy(spec_model)
    assert compiled.compile_steps(again, "on")
    got = generate(again, prompts, max_new_tokens=6, sampling=GREEDY, stop_ids=[EOS])
    assert [g.token_ids for g in got] == [g.token_ids for g in want]
    assert not any(file.exists() for file in saved)
    assert len(list(fresh_store.rglob(f"*{step_packages.SUFFIX}"))) == len(saved) == 2


@pytest.mark.slow  # compiles its graphs cold into a store of its own
def test_a_store_that_cannot_be_written_says_so_once_and_decodes(spec_model, fresh_store, monkeypatch, capsys):
    (fresh_store.parent / "file").write_text("not a folder")
    monkeypatch.setenv(step_packages.STORE_ENV, str(fresh_store.parent / "file" / "store"))
    model = copy.deepcopy(spec_model)
    assert compiled.compile_steps(model, "on")
    for prompts in (ids_of(PROMPTS[:1]), ids_of(PROMPTS[:2])):  # batch 1 and batch 2: two graphs
        got = generate(model, prompts, max_new_tokens=6, sampling=GREEDY, stop_ids=[EOS])
        want = generate(spec_model, prompts, max_new_tokens=6, sampling=GREEDY, stop_ids=[EOS])
        assert [g.token_ids for g in got] == [g.token_ids for g in want] and compiled.is_compiled(model)
    assert sum(g.made for g in compiled.compiled_steps(model).graphs.values()) > 1  # several graphs failed to save
    lines = [line for line in capsys.readouterr().err.splitlines() if "cannot save compiled steps" in line]
    assert len(lines) == 1  # once, not per graph


def test_a_loaded_graphs_first_run_is_warm_up(monkeypatch):
    """A graph read from the store loads its kernels when it first runs: that run is counted with the warm-up
    (`--k auto` does not measure it as a step), later runs are not."""
    import time

    class Loaded:
        runs = 0

        def guard_check(self, *args):
            return True

        def fn(self, *args):
            Loaded.runs += 1
            time.sleep(0.05 if Loaded.runs == 1 else 0.0)
            return "out"

    graph = step_packages.PackagedGraph(lambda x: x, "digest", {"inductor": {}})
    monkeypatch.setattr(graph, "_load", lambda name: [Loaded()])
    first, second = graph(("k",), list, False, 1), graph(("k",), list, False, 1)
    assert first[0] == second[0] == "out" and first[1] >= 0.05 and second[1] == 0.0


class Checked:
    """A stand-in for a graph: counts its guard checks, passes them while `passes`."""

    def __init__(self):
        self.checks, self.passes = 0, True

    def guard_check(self, *args):
        self.checks += 1
        return self.passes

    def fn(self, *args):
        return "out"


def test_a_call_trusted_to_pass_the_guards_skips_their_check(monkeypatch):
    """A call whose trust (its signature) is the last call's of its key runs that call's graph unchecked; another
    trust, a call without one or another key checks the guards. With CHECK_TRUSTED (the suite's setting) a trusted
    call whose guards do not pass fails."""
    entry = Checked()
    graph = step_packages.PackagedGraph(lambda x: x, "digest", {"inductor": {}})
    monkeypatch.setattr(graph, "_load", lambda name: [entry])
    monkeypatch.setattr(step_packages, "CHECK_TRUSTED", False)
    for trust, checks in (("a", 1), ("a", 1), ("a", 1), ("b", 2), ("b", 2), ("a", 3), (None, 4), (None, 5)):
        assert graph(("k",), list, False, 1, trust=trust)[0] == "out"
        assert entry.checks == checks, trust
    graph(("other",), list, False, 1, trust="b")
    assert entry.checks == 6  # a key's trust is its own
    monkeypatch.setattr(step_packages, "CHECK_TRUSTED", True)
    graph(("k",), list, False, 1, trust="c")
    entry.passes = False
    with pytest.raises(AssertionError, match="trusted"):
        graph(("k",), list, False, 1, trust="c")


@pytest.mark.slow  # compiles its graphs cold into a store of its own
def test_each_engine_call_checks_the_guards_again(spec_model, fresh_store):
    """Within an engine call a graph's guards are checked for the first call of each signature only; the model may
    change between calls (here a norm's epsilon, a module attribute the graph bakes in), so the next call
    checks them again and runs a graph that fits: it decodes as the changed model does eagerly. The suite's
    CHECK_TRUSTED holds every call that skipped the check to the guards."""
    model = copy.deepcopy(spec_model)
    assert compiled.compile_steps(model, "on")
    prompts = ids_of(PROMPTS)
    before = generate(model, prompts, max_new_tokens=12, sampling=GREEDY)  # no stop: every row to the end, so
    made = unique_graphs()  # the next call's first step has the signature of this one's last
    model.model.layers[0].input_layernorm.eps = 10.0
    got = generate(model, prompts, max_new_tokens=12, sampling=GREEDY)
    assert unique_graphs() > made and compiled.compiled_steps(model).failed is None  # another graph ran
    compiled.compile_steps(model, "off")
    want = generate(model, prompts, max_new_tokens=12, sampling=GREEDY)
    assert [g.token_ids for g in got] == [g.token_ids for g in want] != [g.token_ids for g in before]


@pytest.mark.slow  # compiles its graphs cold into a store of its own
def test_a_saved_graph_whose_guards_cannot_be_made_is_compiled_again_quietly(spec_model, fresh_store):
    """A graph saved while the model's forward was wrapped (a profiler's timer) guards on the wrapper; a process
    without it cannot rebuild those guards: the file is removed and the graph compiled anew, with no traceback
    logged, and decoding is unchanged."""
    model = copy.deepcopy(spec_model)
    assert compiled.compile_steps(model, "on")
    prompts = ids_of(PROMPTS[:2])
    real = type(model).forward
    timer, records = Checked(), []

    def timed(*args, **kwargs):  # a closure over an object the graph guards on
        return real(*args, **kwargs) if timer.passes else None

    type(model).forward = timed
    try:
        want = generate(model, prompts, max_new_tokens=6, sampling=GREEDY, stop_ids=[EOS])
    finally:
        type(model).forward = real
    saved = list(fresh_store.rglob(f"*{step_packages.SUFFIX}"))  # the prefill's graph and the step's
    step_packages._SHARED.clear()  # as a new process would find the store
    again = copy.deepcopy(spec_model)
    assert compiled.compile_steps(again, "on")
    logged = logging.Handler()
    logged.emit = records.append  # type: ignore[method-assign]
    guards_log = logging.getLogger("torch._guards")  # where torch logs a guard it cannot make, with its traceback
    guards_log.addHandler(logged)
    try:
        got = generate(again, prompts, max_new_tokens=6, sampling=GREEDY, stop_ids=[EOS])
    finally:
        guards_log.removeHandler(logged)
    assert [g.token_ids for g in got] == [g.token_ids for g in want]
    assert not any(file.exists() for file in saved)
    assert len(list(fresh_store.rglob(f"*{step_packages.SUFFIX}"))) == len(saved) == 2
    assert not [r.getMessage() for r in records if r.levelno >= logging.WARNING]


def test_auto_profiles_through_the_compiled_steps_and_decodes_without_compiling(spec_model):
    """`--k auto` on the compiled path: its cost profile runs the graphs the engine will run (the verify at every k,
    the refresh and the drafting forward, the whole drafting step at every k, at batch 1 and above), so no decoding
    step compiles or loads one and every step the controller measures is a compiled step."""
    model = copy.deepcopy(spec_model)
    assert compiled.compile_steps(model, "on")  # T = 1 below: graphs no other test of this module compiles
    prompts = ids_of(PROMPTS)
    costs = step_costs(model, max_rows=len(prompts), max_k=2)
    assert costs.compiled and compiled.compile_seconds(model) > 0 and set(costs.step) == {(1, 1), (1, 2), (4, 1),
                                                                                          (4, 2), (6, 1), (6, 2)}
    assert set(costs.trunk) == {(1, 1), (4, 1), (6, 1)}  # no verify with drafts: this run's drafts are the head's
    costs.step = {key: costs.trunk[(key[0], 1)] for key in costs.step}  # drafting priced as a plain step: on this
    # tiny model a whole step may be dear enough that drafting is never chosen, and both kinds must run
    assert costs.table is not None and costs.table.parent.parent == step_packages.store_root()  # kept for later
    before = unique_graphs(), compiled.compile_seconds(model)
    steps = compiled.compiled_steps(model)
    profiled = steps.calls["verify"] + steps.calls["step"]
    _, metrics = speculative_generate(model, prompts, k="auto", max_k=2, mode="rs", max_new_tokens=24,
                                      sampling=SamplingParams(1.0), stop_ids=[EOS],
                                      generator=torch.Generator().manual_seed(0))
    assert (unique_graphs(), compiled.compile_seconds(model)) == before
    ks = {k for by_k in metrics.k_histogram.values() for k in by_k}
    assert 0 in ks and len(ks) > 1, metrics.k_histogram  # plain and drafting steps both ran, compiled
    ran = steps.calls["verify"] + steps.calls["step"] - profiled  # a step: a verify graph, or a whole step's
    assert ran == sum(sum(c.values()) for c in metrics.k_histogram.values())
    assert costs.to_dict()["log_ratio"] == json.loads(costs.table.read_text())["log_ratio"]


def test_an_engine_call_takes_its_step_functions_once(spec_model, monkeypatch):
    """The engine holds the model's step functions (compiled or eager) for a call and passes them on: one look-up
    per generate call, however many steps it decodes."""
    import importlib

    from bebop.engine import speculative

    plain_module = importlib.import_module("bebop.engine.generate")  # the module (the package exports the function)
    looked_up = []

    def counting(model):
        looked_up.append(model)
        return compiled.prepared_steps(model)

    monkeypatch.setattr(plain_module, "prepared_steps", counting)
    monkeypatch.setattr(speculative, "prepared_steps", counting)
    prompts = ids_of(PROMPTS)
    generate(spec_model, prompts, max_new_tokens=12, sampling=SamplingParams(0.0), stop_ids=[EOS])
    speculative_generate(spec_model, prompts, k=2, mode="rs", max_new_tokens=12, sampling=SamplingParams(0.0))
    assert looked_up == [spec_model, spec_model]


@pytest.mark.skipif(not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="oneDNN runs no bfloat16 on this CPU")
def test_compiled_graphs_take_packed_weights_and_their_updates_without_recompiling(spec_model, fresh_store,
                                                                                    monkeypatch):
    """In bfloat16 a compiled graph multiplies by oneDNN's packed copies (model/packed_linear.py: an input of the
    graph, remade when its weight changes, and saved with the graph though the copies cannot be): an in-place
    update reaches the next call with no new graph, and decodes as a model compiled afresh with the updated weights
    does. A model whose layers take no copies is another graph, not the saved one."""
    from bebop.model import packed_linear

    model = copy.deepcopy(spec_model).to(torch.bfloat16)
    assert compiled.compile_steps(model, "on")
    prompts = ids_of(PROMPTS)
    generate(model, prompts, max_new_tokens=12, sampling=GREEDY, stop_ids=[EOS])
    layers = [m for m in model.modules() if getattr(m, "graph_weight", None) is not None]
    assert layers  # the graphs took packed weights
    before = unique_graphs()
    assert before and compiled.steps_of(model).failed is None  # compiled and saved, not decoded eagerly
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p), alpha=0.05)
    updated = generate(model, prompts, max_new_tokens=12, sampling=GREEDY, stop_ids=[EOS])
    assert unique_graphs() == before
    fresh = copy.deepcopy(model)
    assert compiled.compile_steps(fresh, "on")
    again = generate(fresh, prompts, max_new_tokens=12, sampling=GREEDY, stop_ids=[EOS])
    assert [g.token_ids for g in updated] == [g.token_ids for g in again]
    monkeypatch.setattr(packed_linear, "PACKED", False)  # the same model's graphs without the copies
    unpacked = generate(fresh, prompts, max_new_tokens=12, sampling=GREEDY, stop_ids=[EOS])
    assert unique_graphs() > before and compiled.steps_of(fresh).failed is None
    assert all(getattr(m, "graph_weight", None) is None for m in fresh.modules())
    assert len(unpacked) == len(updated)


def test_a_saved_graph_keeps_no_guards_dynamo_does_not_check():
    """The guards that a module's hook dictionaries are empty: dynamo builds none while it skips hook guards (its
    default), so a saved graph keeps none either (each would be rebuilt at load); tensors and constants stay."""
    from torch._dynamo import config
    from torch._dynamo.types import GuardFilterEntry

    def entry(kind, name):
        return GuardFilterEntry(name=name, has_value=False, value=None, guard_type=kind, derived_guard_types=(),
                                is_global=False, orig_guard=None)

    layer = "model._modules['model']._modules['layers']._modules['0']"
    guards = [entry("EMPTY_NN_MODULE_HOOKS_DICT", f"{layer}._forward_hooks"),
              entry("TENSOR_MATCH", f"{layer}._modules['mlp']._modules['down_proj']._parameters['weight']"),
              entry("CONSTANT_MATCH", f"{layer}._modules['input_layernorm'].eps"),
              entry("TYPE_MATCH", layer)]
    assert config.skip_nnmodule_hook_guards
    assert step_packages.saved_guards(guards) == [False, True, True, True]
    with config.patch(skip_nnmodule_hook_guards=False):  # not monkeypatch: its undo deletes a config's entry
        assert step_packages.saved_guards(guards) == [True, True, True, True]
    assert config.skip_nnmodule_hook_guards
