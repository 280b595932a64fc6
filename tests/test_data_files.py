"""Dataset files (issue 16, part 1): verl's and TRL's layouts in JSONL and parquet; errors name the
file and the row."""

import pytest

from bebop.errors import BebopError
from bebop.tasks.data_files import read_data_rows
from data_helpers import user, verl_row, write_rows

SAMPLE = [
    verl_row("What is 7 times 8?", "56", extra="kept"),  # verl
    {"prompt": "Simplify 2/4.", "solution": "\\frac{1}{2}"},  # TRL, text prompt
    {"prompt": user("1+1?"), "answer": 2},  # TRL, chat prompt
    {"prompt": "2+2=", "completion": "4", "ground_truth": "4"},  # SFT prompt-completion
    {"messages": [*user("hi"), {"role": "assistant", "content": "hello"}]},  # TRL conversational
    {"prompt": "x", "response": "y"},  # verl SFT
]


def test_reads_verl_and_trl_layouts(tmp_path):
    rows = read_data_rows(write_rows(tmp_path / "train.jsonl", SAMPLE))
    assert [r.number for r in rows] == [1, 2, 3, 4, 5, 6]
    verl, trl, chat, sft, conversation, response = rows
    assert (verl.prompt, verl.ground_truth, verl.data_source) == (user("What is 7 times 8?"), "56", "openai/gsm8k")
    assert verl.extra_info == {"index": 0, "extra": "kept"}
    assert (trl.prompt, trl.ground_truth, trl.data_source, trl.extra_info) == ("Simplify 2/4.", "\\frac{1}{2}", "", None)
    assert (chat.prompt, chat.ground_truth) == (user("1+1?"), 2)
    assert (sft.completion, sft.ground_truth) == ("4", "4")
    assert (conversation.prompt, conversation.completion) == (user("hi"), [{"role": "assistant", "content": "hello"}])
    assert response.completion == "y"


def test_reads_verl_parquet(tmp_path):
    """A parquet column holds one type: struct fields a row lacks come back as None, meaning absent."""
    pytest.importorskip("pyarrow")
    rows = [verl_row("7*8?", "56"), {**verl_row("1+1?", "2"), "extra_info": None, "data_source": "lighteval/MATH"}]
    first, second = read_data_rows(write_rows(tmp_path / "train.parquet", rows))
    assert (first.prompt, first.ground_truth, first.extra_info) == (user("7*8?"), "56", {"index": 0})
    assert (second.number, second.data_source, second.extra_info) == (2, "lighteval/MATH", None)


def test_jsonl_rows_are_numbered_by_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"prompt": "a"}\n\n{"prompt": "b"}\n')
    assert [r.number for r in read_data_rows(path)] == [1, 3]


@pytest.mark.parametrize("content, message", [
    ('{"prompt": "a"}\n\n{"ground_truth": "2"}\n', r"rows.jsonl: row 3 has no 'prompt' \(nor 'messages'\) key"),
    ('{"prompt": "a"}\nnot json\n', "rows.jsonl: row 2 is not valid JSON"),
    ('{"prompt": ""}\n', "rows.jsonl: row 1 'prompt' is empty"),
    ('{"prompt": [{"role": "user"}]}\n', "rows.jsonl: row 1 'prompt': message 0 needs a 'role' and a 'content'"),
    ('{"prompt": 7}\n', "rows.jsonl: row 1 'prompt': a chat must be a non-empty list of messages"),
    ('{"prompt": "a", "extra_info": [1]}\n', "rows.jsonl: row 1 'extra_info' must be an object, got list"),
    ('{"messages": [{"role": "assistant", "content": "x"}]}\n', "holds only an assistant turn: there is no prompt"),
    ("\n\n", "rows.jsonl: the dataset has no rows"),
])
def test_bad_rows_name_file_and_row(tmp_path, content, message):
    path = tmp_path / "rows.jsonl"
    path.write_text(content)
    with pytest.raises(BebopError, match=message):
        read_data_rows(path)


def test_missing_file_and_unknown_format(tmp_path):
    with pytest.raises(BebopError, match="dataset file not found"):
        read_data_rows(tmp_path / "missing.jsonl")
    (tmp_path / "rows.csv").write_text("prompt\nx\n")
    with pytest.raises(BebopError, match=r"rows.csv: unknown dataset format '.csv'; use .jsonl or .parquet"):
        read_data_rows(tmp_path / "rows.csv")
    (tmp_path / "broken.parquet").write_text("not parquet")
    pytest.importorskip("pyarrow")
    with pytest.raises(BebopError, match="cannot read .*broken.parquet"):
        read_data_rows(tmp_path / "broken.parquet")
