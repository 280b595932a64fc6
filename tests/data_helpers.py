"""Your own model and data in the tests: a chat template in Qwen's shape, a model directory that ships
it, dataset files in verl's and TRL's layouts."""

import json
import shutil

from bebop.jsonl import write_jsonl

# the shape of Qwen's template: system default, roles in im_start/im_end, tools as JSON, generation prompt
TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' %}{{- '<|im_start|>system\\nYou are helpful.<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + message['role']) }}{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    "{%- if tools %}{{- tools | tojson }}{%- endif %}")
PREAMBLE = "<|im_start|>system\nYou are helpful.<|im_end|>\n"


def with_chat_template(model_dir, path, template=TEMPLATE):
    """A copy of `model_dir` at `path` whose tokenizer_config.json carries `template`."""
    path = shutil.copytree(model_dir, path)
    config = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    return path


def user(text):
    return [{"role": "user", "content": text}]


def verl_row(question, answer, source="openai/gsm8k", **extra):
    return {"data_source": source, "prompt": user(question), "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": answer}, "extra_info": {"index": 0, **extra}}


def write_parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_rows(path, rows):
    """JSONL or parquet by the path's suffix."""
    if str(path).endswith(".parquet"):
        return write_parquet(path, rows)
    write_jsonl(path, rows)
    return path
