"""Baseline generation: greedy parity with transformers, ragged batches, stops, log-probs."""

import json

import torch

from bebop.cli import main
from bebop.engine import generate
from bebop.model import load_model
from bebop.sampling import SamplingParams, warp_probs

from conftest import CHAR_CODEC

PROMPTS = ["Q: 12 + 7 = ?", "hello world", "a", "The price of 3 apples is"]


def test_cli_greedy_equals_transformers_generate(hf_model_dir, tmp_path, capsys):
    hf, path = hf_model_dir
    argv = ["generate", "--model", str(path), "--max-new-tokens", "24", "--temperature", "0", "--batch-size", "3"]
    for p in PROMPTS:
        argv += ["--prompt", p]
    assert main(argv) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["prompt"] for r in rows] == PROMPTS
    for row in rows:
        ids = torch.tensor([CHAR_CODEC.encode(row["prompt"])])
        with torch.no_grad():
            out = hf.generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=CHAR_CODEC.eos_id,
                              pad_token_id=CHAR_CODEC.pad_id)
        assert row["token_ids"] == out[0, ids.shape[1]:].tolist()
        assert row["logprobs"] == [0.0] * len(row["token_ids"])
        assert row["finish_reason"] in ("stop", "length")


def test_ragged_batch_equals_one_at_a_time(hf_model_dir):
    _, path = hf_model_dir
    model = load_model(path)
    prompts = [CHAR_CODEC.encode(p) for p in PROMPTS]
    batched = generate(model, prompts, max_new_tokens=30, sampling=SamplingParams(0.0), stop_ids=[CHAR_CODEC.eos_id])
    for prompt, gen in zip(prompts, batched):
        alone = generate(model, [prompt], max_new_tokens=30, sampling=SamplingParams(0.0),
                         stop_ids=[CHAR_CODEC.eos_id])[0]
        assert gen.token_ids == alone.token_ids
        assert gen.finish_reason == alone.finish_reason


def test_stop_token_and_max_new_tokens(hf_model_dir):
    _, path = hf_model_dir
    model = load_model(path)
    prompt = CHAR_CODEC.encode("hello world")
    free = generate(model, [prompt], max_new_tokens=12, sampling=SamplingParams(0.0))[0]
    assert len(free.token_ids) == 12 and free.finish_reason == "length"
    stop = free.token_ids[4]
    cut = generate(model, [prompt], max_new_tokens=12, sampling=SamplingParams(0.0), stop_ids=[stop])[0]
    first = free.token_ids.index(stop)
    assert cut.token_ids == free.token_ids[: first + 1]
    assert cut.finish_reason == "stop"


def test_logprobs_are_the_samplers(hf_model_dir):
    """Each reported log-prob equals log of the warped target probability of that token,
    recomputed from scratch on the full sequence."""
    _, path = hf_model_dir
    model = load_model(path)
    params = SamplingParams(0.8, top_k=10)
    prompt = CHAR_CODEC.encode("Q: 12 + 7 = ?")
    gen = generate(model, [prompt], max_new_tokens=15, sampling=params, generator=torch.Generator().manual_seed(0))[0]
    seq = torch.tensor([prompt + gen.token_ids])
    with torch.no_grad():
        probs = warp_probs(model.logits(model(seq))[0], params)  # (T, V)
    n = len(prompt)
    for i, (tok, lp) in enumerate(zip(gen.token_ids, gen.logprobs)):
        assert abs(torch.log(probs[n - 1 + i, tok]).item() - lp) < 1e-4


def test_seeded_sampling_is_reproducible(hf_model_dir):
    _, path = hf_model_dir
    model = load_model(path)
    prompts = [CHAR_CODEC.encode(p) for p in PROMPTS]
    runs = [[g.token_ids for g in generate(model, prompts, max_new_tokens=10, sampling=SamplingParams(1.0),
                                           generator=torch.Generator().manual_seed(7))] for _ in range(2)]
    assert runs[0] == runs[1]


def test_observation_is_prefilled_and_masked(hf_model_dir):
    """An interrupt token hands control to an observer whose tokens are fed, not sampled."""
    _, path = hf_model_dir
    model = load_model(path)
    prompt = CHAR_CODEC.encode("hello world")
    free = generate(model, [prompt], max_new_tokens=6, sampling=SamplingParams(0.0))[0]
    interrupt = free.token_ids[2]
    obs = CHAR_CODEC.encode("<obs>42</obs>")
    gen = generate(model, [prompt], max_new_tokens=20, sampling=SamplingParams(0.0), interrupt_ids=[interrupt],
                   observer=lambda row, toks: obs)[0]
    i = gen.token_ids.index(interrupt)
    assert gen.token_ids[i + 1:i + 1 + len(obs)] == obs
    assert gen.policy_mask[i + 1:i + 1 + len(obs)] == [False] * len(obs)
    assert all(gen.policy_mask[: i + 1])
    # the continuation is what the model gives after the observation, recomputed from scratch
    seq = prompt + gen.token_ids[: i + 1 + len(obs)]
    with torch.no_grad():
        nxt = model.logits(model(torch.tensor([seq])))[0, -1].argmax().item()
    assert gen.token_ids[i + 1 + len(obs)] == nxt
