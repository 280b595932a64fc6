"""A (prompt, completion) pair -> token ids and training labels: what the policy is trained on.

    ids, labels = encode_example(codec, prompt, completion)   # labels: the ids, or IGNORE

Used by SFT (the policy) and by the MTP head's demonstration data: both train on the completion
only, never on the prompt, padding or what the environment wrote (`<obs> ... </obs>`).
"""

from __future__ import annotations

from collections.abc import Sequence

from bebop.errors import BebopError
from bebop.tokenizer import TextCodec

IGNORE = -100  # the label of a position that is not trained on (torch's cross-entropy ignore_index)


def env_token_mask(ids: Sequence[int], codec: TextCodec) -> list[bool]:
    """True for tokens the environment wrote: each `<obs>` through its `</obs>`."""
    open_id, close_id = codec.token_id("<obs>"), codec.token_id("</obs>")
    inside, out = False, []
    for tok in ids:
        if tok == open_id:
            inside = True
        out.append(inside)
        if tok == close_id:
            inside = False
    return out


def encode_example(codec: TextCodec, prompt: str, completion: str,
                   context: int | None = None) -> tuple[list[int], list[int]]:
    """-> (ids, labels): labels are the ids where the policy is trained, IGNORE elsewhere.

    With `context`, both are cut to its first `context` tokens: a long-tail demonstration on a
    model with a small context (the embedded default's 512 holds every task's examples whole)."""
    if codec.eos_id is None:
        raise BebopError("the tokenizer has no end-of-sequence token: a completion cannot be ended")
    p_ids = codec.encode(prompt)
    c_ids = codec.encode(completion) + [codec.eos_id]
    env = env_token_mask(c_ids, codec)
    labels = [IGNORE] * len(p_ids) + [IGNORE if e else t for t, e in zip(c_ids, env)]
    return (p_ids + c_ids)[:context], labels[:context]
