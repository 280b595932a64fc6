"""A policy = model + tokenizer (+ chat template, + generation config's stop tokens) from one model
directory, checked against each other."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bebop.chat import ChatTemplate, load_chat_template, parse_template_kwargs, render_chat
from bebop.errors import BebopError
from bebop.model.checkpoint import load_model
from bebop.model.qwen3 import CausalLM
from bebop.precision import DTYPES
from bebop.tokenizer import TextCodec, load_tokenizer


@dataclass
class Policy:
    model: CausalLM
    codec: TextCodec
    chat: ChatTemplate | None = None  # the tokenizer's chat template, if the model ships one
    generation_stop_ids: tuple[int, ...] = ()  # generation_config.json's eos_token_id(s)
    template_kwargs: dict = field(default_factory=dict)  # extra chat-template variables (--chat-template-kwargs)

    @property
    def stop_ids(self) -> tuple[int, ...]:
        ids = set(self.model.config.stop_token_ids) | set(self.generation_stop_ids)
        if self.codec.eos_id is not None:
            ids.add(self.codec.eos_id)
        return tuple(sorted(ids))

    def prompt_text(self, prompt: str | list[dict], what: str = "prompt") -> str:
        """A prompt as the model reads it: text as given, a list of chat messages rendered with the
        model's chat template (generation prompt added)."""
        if isinstance(prompt, str):
            return prompt
        return self.render(prompt, what=what)

    def render(self, messages: list[dict], *, add_generation_prompt: bool = True, what: str = "prompt") -> str:
        """Chat messages rendered with the model's template and the run's template_kwargs."""
        if self.chat is None:
            raise BebopError(f"{what} is a list of chat messages, but the model has no chat template "
                             f"(`chat_template` in tokenizer_config.json, or chat_template.jinja)")
        return render_chat(self.chat, messages, add_generation_prompt=add_generation_prompt, what=what,
                           extra=self.template_kwargs)

    @property
    def pad_id(self) -> int:
        return self.codec.pad_id if self.codec.pad_id is not None else 0


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise BebopError(f"device {name!r} requested but CUDA is not available")
    return torch.device(name)


def load_policy(model_dir: str | os.PathLike, *, dtype: str = "float32", device: str = "auto",
                template_kwargs: str = "", state_dtype: str = "float32") -> Policy:
    """The model, tokenizer, chat template and stop tokens of a model directory; `template_kwargs`: extra
    chat-template variables as JSON text (--chat-template-kwargs, bebop.chat.parse_template_kwargs); `state_dtype`:
    what a hybrid's caches keep its recurrent states in (CausalLM.state_dtype)."""
    for name, value in (("dtype", dtype), ("state dtype", state_dtype)):
        if value not in DTYPES:
            raise BebopError(f"unknown {name} {value!r} (choose from {', '.join(DTYPES)})")
    model = load_model(model_dir, dtype=DTYPES[dtype], device=resolve_device(device))
    model.state_dtype = DTYPES[state_dtype]
    codec = load_tokenizer(model_dir, eos_id=(model.config.stop_token_ids or (None,))[0])
    if codec.vocab_size > model.config.vocab_size:
        raise BebopError(f"tokenizer has {codec.vocab_size} tokens but the model's vocab_size is "
                         f"{model.config.vocab_size} (vocab mismatch)")
    return Policy(model=model, codec=codec, chat=load_chat_template(model_dir),
                  generation_stop_ids=generation_stop_ids(model_dir),
                  template_kwargs=parse_template_kwargs(template_kwargs))


def generation_stop_ids(model_dir: str | os.PathLike) -> tuple[int, ...]:
    """generation_config.json's `eos_token_id` (one id or a list): where the model's chat turns end."""
    path = Path(model_dir) / "generation_config.json"
    if not path.is_file():
        return ()
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as exc:
        raise BebopError(f"{path} is not a valid generation config: {exc}") from None
    ids = value if isinstance(value, list) else [] if value is None else [value]
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise BebopError(f"{path}: eos_token_id must be a token id or a list of them, got {value!r}")
    return tuple(ids)


def encode_prompt(policy: Policy, text: str, what: str) -> list[int]:
    """A prompt's token ids, or a BebopError naming `what` when the tokenizer cannot express it."""
    ids = policy.codec.encode(text)
    unk = policy.codec.token_id("<unk>")
    if not ids or (unk is not None and unk in ids):
        raise BebopError(f"{what}: the policy's tokenizer cannot express the prompt {text[:60]!r}")
    return ids
