"""Chat templates (issue 16, part 2): messages rendered as transformers renders the model's own
template; generate --prompts takes messages; generation_config.json's stop tokens; clear errors."""

import json

import pytest

from bebop.chat import load_chat_template, render_chat
from bebop.cli import main
from bebop.errors import BebopError
from bebop.policy import load_policy
from data_helpers import with_chat_template

CHATS = [[{"role": "user", "content": "What is 2 + 2?"}],
         [{"role": "system", "content": "Be brief. é"}, {"role": "user", "content": "hi"},
          {"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}]]


@pytest.fixture()
def chat_model(tiny_model_dir, tmp_path):
    return with_chat_template(tiny_model_dir, tmp_path / "m")


@pytest.mark.parametrize("chat", CHATS)
def test_rendering_equals_transformers(chat_model, chat):
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast.from_pretrained(chat_model)
    expected = hf.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert render_chat(load_chat_template(chat_model), chat) == expected
    assert expected.endswith("<|im_start|>assistant\n")


def test_template_file_and_named_templates(chat_model):
    config = json.loads((chat_model / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (chat_model / "tokenizer_config.json").write_text(json.dumps(config))
    assert load_chat_template(chat_model) is None
    (chat_model / "chat_template.jinja").write_text("{% for m in messages %}[{{ m.content }}]{% endfor %}{{ eos_token }}")
    assert render_chat(load_chat_template(chat_model), CHATS[0]) == "[What is 2 + 2?]<eos>"
    (chat_model / "chat_template.jinja").unlink()
    named = [{"name": "tool_use", "template": "no"}, {"name": "default", "template": "{{ messages | length }}"}]
    (chat_model / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": named}))
    assert render_chat(load_chat_template(chat_model), CHATS[1]) == "4"


def test_generate_renders_message_prompts(chat_model, tmp_path):
    prompts = tmp_path / "p.jsonl"
    short = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]  # a 128-token context
    prompts.write_text(json.dumps({"prompt": CHATS[0]}) + "\n" + json.dumps({"messages": short}) + "\n"
                       + json.dumps({"prompt": "plain text"}) + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["generate", "--model", str(chat_model), "--prompts", str(prompts), "--max-new-tokens", "3",
                 "--temperature", "0", "--out", str(out)]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    policy = load_policy(chat_model, device="cpu")
    assert [r["prompt"] for r in rows] == [policy.prompt_text(CHATS[0]), policy.prompt_text(short), "plain text"]
    assert rows[0]["prompt"].startswith("<|im_start|>system\nYou are helpful.")


def test_generation_config_stop_tokens(chat_model):
    (chat_model / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 9]}))
    assert {7, 9} <= set(load_policy(chat_model, device="cpu").stop_ids)
    (chat_model / "generation_config.json").write_text(json.dumps({"eos_token_id": "x"}))
    with pytest.raises(BebopError, match="eos_token_id must be a token id"):
        load_policy(chat_model, device="cpu")


def test_errors_name_the_problem(chat_model, tiny_model_dir, tmp_path, capsys):
    with pytest.raises(BebopError, match="failed to render prompt: unknown role tool"):
        render_chat(load_chat_template(chat_model), [{"role": "tool", "content": "x"}])
    with pytest.raises(BebopError, match="message 0 needs a 'role' and a 'content' string"):
        render_chat(load_chat_template(chat_model), [{"role": "user"}])
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": CHATS[0]}) + "\n")
    assert main(["generate", "--model", str(tiny_model_dir), "--prompts", str(prompts), "--max-new-tokens", "2"]) == 2
    assert "prompt 0 is a list of chat messages, but the model has no chat template" in capsys.readouterr().err
    prompts.write_text(json.dumps({"text": "x"}) + "\n")
    assert main(["generate", "--model", str(chat_model), "--prompts", str(prompts), "--max-new-tokens", "2"]) == 2
    assert "row 1 has no 'prompt' (or 'messages') key" in capsys.readouterr().err


THINKING = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<assistant>"
            "{% if enable_thinking is defined and enable_thinking is false %}<think></think>{% endif %}{% endif %}")


def test_template_kwargs_reach_the_template_as_transformers_passes_them(tiny_model_dir, tmp_path, capsys):
    """Qwen3's `enable_thinking` switch: --chat-template-kwargs '{"enable_thinking": false}'."""
    from transformers import PreTrainedTokenizerFast

    path = with_chat_template(tiny_model_dir, tmp_path / "m", THINKING)
    off = load_policy(path, device="cpu", template_kwargs='{"enable_thinking": false}')
    hf = PreTrainedTokenizerFast.from_pretrained(path)
    for kwargs, policy in (({}, load_policy(path, device="cpu")), ({"enable_thinking": False}, off)):
        expected = hf.apply_chat_template(CHATS[0], tokenize=False, add_generation_prompt=True, **kwargs)
        assert policy.prompt_text(CHATS[0]) == expected
    assert off.prompt_text(CHATS[0]).endswith("<assistant><think></think>")
    rows = tmp_path / "p.jsonl"
    rows.write_text(json.dumps({"messages": CHATS[0]}) + "\n")
    assert main(["generate", "--model", str(path), "--prompts", str(rows), "--max-new-tokens", "2",
                 "--chat-template-kwargs", '{"enable_thinking": false}']) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["prompt"].endswith("<think></think>")


@pytest.mark.parametrize("text, message", [
    ("{bad", "--chat-template-kwargs is not valid JSON"),
    ("[1]", "--chat-template-kwargs must be a JSON object"),
    ('{"messages": []}', "--chat-template-kwargs cannot set messages"),
])
def test_bad_template_kwargs_are_clear_errors(tiny_model_dir, text, message):
    with pytest.raises(BebopError, match=message):
        load_policy(tiny_model_dir, device="cpu", template_kwargs=text)
    from bebop.rl.config import RLConfig

    with pytest.raises(BebopError, match=message):
        RLConfig(model="m", chat_template_kwargs=text)
