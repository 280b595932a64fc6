"""Chat templates: a list of messages rendered as the model's own template renders it.

    template = load_chat_template(model_dir)                  # None when the model ships none
    text = render_chat(template, messages)                    # ends with the generation prompt

The template is `chat_template` in tokenizer_config.json (a string, or a list of named templates,
of which the one named "default") or a `chat_template.jinja` file beside it. It is rendered with
jinja2 in a sandbox with the settings transformers renders chat templates with (trim_blocks,
lstrip_blocks, the loopcontrols extension, a `raise_exception` function, a `tojson` filter that
keeps non-ASCII text) and the tokenizer's special tokens (`bos_token`, `eos_token`, ...) as
variables (and `tools`, `documents` defined as None), so the text is the one the model was trained on.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bebop.errors import BebopError

TEMPLATE_FILE = "chat_template.jinja"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS = ("bos_token", "eos_token", "pad_token", "unk_token")
TEMPLATE_KWARGS_HELP = ("extra chat-template variables, a JSON object: '{\"enable_thinking\": false}' turns Qwen3's "
                        "thinking off")  # --chat-template-kwargs, in every command that renders prompts


@dataclass(frozen=True)
class ChatTemplate:
    source: str  # the jinja text
    where: Path  # the file it came from (errors name it)
    variables: dict = field(default_factory=dict)  # the tokenizer's special tokens, by name


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: text, or {"content": text, ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_config(model_dir: Path) -> dict:
    path = model_dir / CONFIG_FILE
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BebopError(f"{path} is not valid JSON: {exc}") from None
    return config if isinstance(config, dict) else {}


def load_chat_template(model_dir: str | os.PathLike) -> ChatTemplate | None:
    model_dir = Path(model_dir)
    config = _read_config(model_dir)
    variables = {name: text for name in SPECIAL_TOKENS if (text := _token_text(config.get(name))) is not None}
    source = config.get("chat_template")
    where = model_dir / CONFIG_FILE
    if isinstance(source, list):  # named templates: [{"name": ..., "template": ...}]
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    if not isinstance(source, str) and (model_dir / TEMPLATE_FILE).is_file():
        source, where = (model_dir / TEMPLATE_FILE).read_text(encoding="utf-8"), model_dir / TEMPLATE_FILE
    return ChatTemplate(source, where, variables) if isinstance(source, str) else None


def check_messages(value: Any, what: str) -> list[dict]:
    """A chat: a non-empty list of {"role": str, "content": str} (other keys kept), or a BebopError naming `what`."""
    if not isinstance(value, list) or not value:
        raise BebopError(f"{what}: a chat must be a non-empty list of messages")
    for i, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) \
                or not isinstance(message.get("content"), str):
            raise BebopError(f"{what}: message {i} needs a 'role' and a 'content' string")
    return value


def _environment() -> Any:
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals["raise_exception"] = raise_exception
    return env


RESERVED = frozenset({"messages", "add_generation_prompt", "raise_exception"})


def parse_template_kwargs(text: str) -> dict:
    """--chat-template-kwargs: a JSON object of extra template variables, e.g. {"enable_thinking": false}
    (Qwen3's switch), passed as transformers passes apply_chat_template's extra keyword arguments."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BebopError(f"--chat-template-kwargs is not valid JSON ({exc.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise BebopError(f"--chat-template-kwargs must be a JSON object, got {text!r}")
    clash = sorted(RESERVED & set(value))
    if clash:
        raise BebopError(f"--chat-template-kwargs cannot set {', '.join(clash)}")
    return value


def render_chat(template: ChatTemplate, messages: list[dict], *, add_generation_prompt: bool = True,
                what: str = "prompt", extra: dict | None = None) -> str:
    """The chat as text, ending with the assistant's generation prompt; a template that fails to
    render is a BebopError naming its file and `what` (the prompt or the row). `extra`: more template
    variables (parse_template_kwargs); they override the special tokens of the same name."""
    from jinja2.exceptions import TemplateError

    check_messages(messages, what)
    try:
        compiled = _environment().from_string(template.source)
        # tools, documents: defined (None), as transformers does
        variables = {"tools": None, "documents": None, **template.variables, **(extra or {})}
        return compiled.render(messages=messages, add_generation_prompt=add_generation_prompt, **variables)
    except TemplateError as exc:
        raise BebopError(f"the chat template in {template.where} failed to render {what}: {exc}") from None
