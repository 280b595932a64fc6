"""The GPU path (issue 17): `pytest -m cuda`, skipped where torch sees no CUDA device.

CPU against CUDA float32 logits; bfloat16 within a stated tolerance; T=0 speculative decoding equal
to greedy on CUDA in float32, and in bfloat16 every divergence at a near-tie (measured and
printed); the lossless statistical test of the acceptance rules with CUDA tensors and generator;
two GRPO steps with `--spec rs` on CUDA. Set BEBOP_CUDA_REPORT=FILE to keep the measured rates.
"""

import json
import os

import pytest
import torch

from bebop.engine import generate
from bebop.engine.speculative import speculative_generate
from bebop.model import load_model
from bebop.rl import train_rl
from bebop.sampling import SamplingParams, rejection_sample, sample, target_only_sample
from test_acceptance import K, N, V, _case, chain_pvalues

from rl_helpers import read_metrics, rl_cfg
from spec_helpers import EOS, PROMPTS, ids_of
from stats_helpers import ALPHA

DEVICE = os.environ.get("BEBOP_CUDA_TEST_DEVICE", "cuda")  # "cpu": a dry run of these tests' own code here
pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(DEVICE.startswith("cuda") and not torch.cuda.is_available(), reason="needs a CUDA device")]

BF16_REL_TOL = 0.05  # max |bf16 - fp32| logit over max |fp32 logit| (0.028 measured on this CPU; bf16 keeps 8 bits)
NEAR_TIE = 0.5  # logits: a bf16 greedy choice may differ from fp32's only where the top two are this close


def _report(key: str, value) -> None:
    path = os.environ.get("BEBOP_CUDA_REPORT")
    print(f"{key}: {value}")
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps({key: value}) + "\n")


def _headed(path, dtype=torch.float32):
    model = load_model(path)
    model.attach_mtp(1, torch.Generator().manual_seed(0))
    return model.to(device=DEVICE, dtype=dtype)


def test_cuda_float32_logits_equal_cpu(hf_model_dir):
    _, path = hf_model_dir
    ids = torch.randint(0, 100, (3, 40), generator=torch.Generator().manual_seed(0))
    cpu, gpu = load_model(path), load_model(path, device=DEVICE)
    with torch.no_grad():
        ref = cpu.logits(cpu(ids))
        got = gpu.logits(gpu(ids.to(DEVICE))).cpu()
    diff = (ref - got).abs().max().item()
    _report("cuda_fp32_max_abs_logit_diff", diff)
    assert diff <= 1e-3


def test_cuda_bfloat16_within_tolerance(hf_model_dir):
    _, path = hf_model_dir
    ids = torch.randint(0, 100, (3, 40), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    ref, m16 = load_model(path, device=DEVICE), load_model(path, device=DEVICE, dtype=torch.bfloat16)
    with torch.no_grad():
        a, b = ref.logits(ref(ids)), m16.logits(m16(ids))
    rel = ((a - b).abs().max() / a.abs().max()).item()
    agree = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
    _report("cuda_bf16_max_logit_diff_over_max_logit", rel)
    _report("cuda_bf16_argmax_agreement", agree)
    assert rel <= BF16_REL_TOL and agree > 0.9


@pytest.mark.parametrize("mode", ["rs", "to"])
def test_cuda_float32_greedy_speculation_equals_plain(hf_model_dir, mode):
    _, path = hf_model_dir
    model, prompts = _headed(path), ids_of(PROMPTS)
    ref = generate(model, prompts, max_new_tokens=40, sampling=SamplingParams(0.0), stop_ids=[EOS])
    gens, metrics = speculative_generate(model, prompts, k=3, mode=mode, max_new_tokens=40,
                                         sampling=SamplingParams(0.0), stop_ids=[EOS])
    assert [g.token_ids for g in gens] == [g.token_ids for g in ref]
    assert metrics.num_drafts > 0


def test_cuda_bfloat16_greedy_speculation_diverges_only_at_near_ties(hf_model_dir):
    """A verify over K+1 positions and a one-token decode may round differently in bf16: count how
    often the outputs differ, and check that each first divergence sits at a near-tie."""
    _, path = hf_model_dir
    model = _headed(path, torch.bfloat16)
    prompts = ids_of(PROMPTS * 8)
    ref = generate(model, prompts, max_new_tokens=48, sampling=SamplingParams(0.0))
    gens, _ = speculative_generate(model, prompts, k=3, mode="rs", max_new_tokens=48, sampling=SamplingParams(0.0))
    diverged = 0
    for prompt, a, b in zip(prompts, gens, ref):
        j = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y), None)
        if j is None:
            continue
        diverged += 1
        with torch.no_grad():
            ids = torch.tensor([prompt + b.token_ids[:j]], device=DEVICE)
            top2 = model.logits(model(ids))[0, -1].topk(2).values
        assert (top2[0] - top2[1]).item() <= NEAR_TIE, (j, top2.tolist())
    _report("cuda_bf16_greedy_rows_diverged", f"{diverged}/{len(prompts)}")


@pytest.mark.parametrize("name", ["t0.7", "target_topk", "both_topp"])
def test_cuda_acceptance_rules_are_lossless(name):
    """test_acceptance's chi-square check with CUDA tensors and a CUDA generator (false failure <= 8e-6)."""
    target_rows, draft_rows, _ = _case(name, seed=1)
    target, draft = target_rows.to(DEVICE), draft_rows.to(DEVICE)
    g = torch.Generator(device=DEVICE).manual_seed(2)
    draft_probs = draft.expand(N, K, V)
    tokens, num = rejection_sample(sample(draft_probs, generator=g), draft_probs, target.expand(N, K + 1, V),
                                   generator=g)
    assert min(chain_pvalues(tokens.cpu(), num.cpu(), target_rows)) > ALPHA
    tokens, num = target_only_sample(draft.argmax(-1).expand(N, K), target.expand(N, K + 1, V), generator=g)
    assert min(chain_pvalues(tokens.cpu(), num.cpu(), target_rows)) > ALPHA


def test_cuda_two_grpo_steps_with_rs(headed, digit_reward, tmp_path):
    train_rl(tmp_path / "run", rl_cfg(headed, spec="rs", k=2), progress=False, device=DEVICE)
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["acceptance_rate"] is not None for r in rows) and all(r["grad_norm"] > 0 for r in rows)
