"""How rollouts are decoded, chosen once: DecodeSpec's checks and the engine open_engine gives every caller."""

import re

import pytest
import torch

from bebop.decoding import DecodeSpec, open_engine
from bebop.engine import generate
from bebop.errors import BebopError
from bebop.policy import Policy
from bebop.sampling import SamplingParams
from bebop.tokenizer import build_char_tokenizer, codec_from_tokenizer

from spec_helpers import EOS, PROMPTS, ids_of

GREEDY = SamplingParams(0.0)


@pytest.mark.parametrize("fields,needle", [
    (dict(engine="sglang"), "unknown --engine 'sglang'"),
    (dict(spec="fast"), "unknown --spec 'fast'"),
    (dict(spec="rs", k=9), "K (drafts per step)"),
    (dict(spec="rs", k="auto", max_k=0), "--max-k must be in [1, 8]"),
    (dict(spec="off", k="auto"), "--k auto chooses how many drafts"),
    (dict(compile="always"), "--compile must be one of"),
    (dict(vllm_python="/usr/bin/python3"), "--vllm-python needs --engine vllm"),
    (dict(engine="vllm", spec="rs", k="auto"), "--k auto needs bebop's engine"),
])
def test_a_bad_combination_is_refused_when_made(fields, needle):
    with pytest.raises(BebopError, match=re.escape(needle)):
        DecodeSpec(**fields)


def test_draft_depths():
    assert DecodeSpec(spec="rs", k=4).draft_depths == 4
    assert DecodeSpec(spec="rs", k="auto", max_k=5).draft_depths == 5


@pytest.mark.parametrize("spec", [DecodeSpec(), DecodeSpec(spec="rs", k=3), DecodeSpec(spec="to", k="auto", max_k=3)],
                         ids=["plain", "rs-3", "to-auto"])
def test_the_opened_engine_decodes_as_plain_greedy_and_counts_its_drafts(spec_model, spec):
    """Every engine bebop opens emits plain greedy decoding's tokens at temperature 0; a drafting one keeps its
    acceptance metrics over every call (a plain one has none)."""
    policy = Policy(spec_model, codec_from_tokenizer(build_char_tokenizer()))
    prompts = ids_of(PROMPTS)
    ref = generate(spec_model, prompts, max_new_tokens=16, sampling=GREEDY, stop_ids=[EOS])
    with open_engine(policy, spec, model_dir="unused", rows=2 * len(prompts), batch_size=len(prompts),
                     max_new_tokens=16, sampling=GREEDY) as decoder:
        for _ in range(2):
            gens = decoder(spec_model, prompts, max_new_tokens=16, sampling=GREEDY, stop_ids=[EOS],
                           generator=torch.Generator().manual_seed(0))
            assert [g.token_ids for g in gens] == [g.token_ids for g in ref]
    if spec.drafts:
        assert decoder.metrics is not None and decoder.metrics.num_drafts > 0
        assert len(decoder.sink) == 2  # one entry a call, merged
    else:
        assert decoder.metrics is None
