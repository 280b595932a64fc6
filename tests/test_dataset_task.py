"""A dataset file as a task (issue 16, parts 1-3): prompts rendered with the model's chat template,
rows drawn in shuffled epochs, each row scored by its reward; everything checked at load."""

import pickle

import pytest

from bebop.errors import BebopError
from bebop.policy import load_policy
from bebop.tasks.dataset_task import COMPLETIONS, load_dataset_task
from data_helpers import PREAMBLE, user, verl_row, with_chat_template, write_rows

REWARD_FILE = """
def digits(data_source, solution_str, ground_truth, extra_info):
    if solution_str == "raise":
        raise RuntimeError("bad completion")
    return float(solution_str == str(ground_truth))
"""
EOS_TEMPLATE = ("{% for m in messages %}[{{ m.role }}]{{ m.content }}{% if m.role == 'assistant' %}{{ eos_token }}"
                "{% endif %}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}")


@pytest.fixture(scope="module")
def chat_policy(tiny_model_dir, tmp_path_factory):
    return load_policy(with_chat_template(tiny_model_dir, tmp_path_factory.mktemp("chat") / "m"), device="cpu")


@pytest.fixture()
def reward(tmp_path):
    path = tmp_path / "reward.py"
    path.write_text(REWARD_FILE)
    return f"{path}:digits"


def rows(n):
    return [verl_row(f"{i}+{i}?", str(2 * i), source="mine") for i in range(n)]


def test_prompts_are_rendered_with_the_models_chat_template(chat_policy, tmp_path, reward):
    path = write_rows(tmp_path / "d.jsonl", [verl_row("7*8?", "56", source="mine"), {"prompt": "as is", "answer": 3}])
    task = load_dataset_task(path, chat_policy, reward=reward)
    by_row = {p.row: p for p in task.problems("train", 2, seed=0)}
    chat, text = by_row[1], by_row[2]
    assert chat.prompt == PREAMBLE + "<|im_start|>user\n7*8?<|im_end|>\n<|im_start|>assistant\n"
    assert (chat.ground_truth, chat.row, text.prompt, text.ground_truth, text.row) == ("56", 1, "as is", "3", 2)
    assert task.score(chat, "56") == 1.0 and task.score(text, "56") == 0.0


def test_batches_walk_shuffled_epochs(chat_policy, tmp_path, reward):
    task = load_dataset_task(write_rows(tmp_path / "d.jsonl", rows(5)), chat_policy, reward=reward)
    drawn = [p.row for i in range(5) for p in task.batch(i, 2, seed=3)]  # 10 positions: two epochs
    assert sorted(drawn[:5]) == sorted(drawn[5:]) == [1, 2, 3, 4, 5]
    assert drawn == [p.row for i in range(5) for p in task.batch(i, 2, seed=3)]  # a pure function of (seed, i)
    orders = {tuple(p.row for p in task.batch(0, 5, seed)) for seed in range(6)}
    assert len(orders) > 1  # the seed shuffles
    rows_of = lambda start, seed: [p.row for p in task.stream(start, 5, seed)]  # noqa: E731
    assert any(rows_of(0, seed) != rows_of(5, seed) for seed in range(6))  # and each epoch is shuffled anew


def test_reward_errors_are_reported_with_their_row_and_score_zero(chat_policy, tmp_path, reward, capsys):
    task = load_dataset_task(write_rows(tmp_path / "d.jsonl", rows(2)), chat_policy, reward=reward)
    problem = next(p for p in task.problems("train", 2, 0) if p.row == 2)
    assert [task.score(problem, "raise") for _ in range(12)] == [0.0] * 12
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"bebop: reward error at {tmp_path / 'd.jsonl'} row 2: RuntimeError: bad completion (scored 0)"
    assert len(err) == 10 and err[-1].endswith("later reward errors are not shown")
    assert task.reward_errors == 12


def test_a_task_travels_without_its_imported_reward(chat_policy, tmp_path, reward, monkeypatch):
    monkeypatch.chdir(tmp_path)
    task = load_dataset_task(write_rows(tmp_path / "d.jsonl", rows(3)), chat_policy, reward="reward.py:digits")
    sent = pickle.dumps(task)
    monkeypatch.chdir("/")  # a Ray worker may run elsewhere
    copy = pickle.loads(sent)
    assert copy._rewards is None and copy.reward_spec == f"{tmp_path.resolve() / 'reward.py'}:digits"
    assert [copy.score(p, p.ground_truth) for p in copy.problems("train", 3, 0)] == [1.0] * 3


def test_bad_rows_are_errors_at_load_naming_file_and_row(chat_policy, tiny_model_dir, tmp_path, reward):
    path = write_rows(tmp_path / "d.jsonl", [verl_row("1?", "1", source="mine"), {"prompt": "x" * 200, "answer": 1}])
    with pytest.raises(BebopError, match="d.jsonl: row 2: the prompt is 200 tokens; the model's context is 128"):
        load_dataset_task(path, chat_policy, reward=reward)
    plain = load_policy(tiny_model_dir, device="cpu")
    with pytest.raises(BebopError, match="d.jsonl: row 1 prompt is a list of chat messages, but the model has no chat "
                                         "template"):
        load_dataset_task(path, plain, reward=reward)
    path = write_rows(tmp_path / "d.jsonl", [{"prompt": [{"role": "tool", "content": "x"}], "answer": 1}])
    with pytest.raises(BebopError, match="failed to render .*d.jsonl: row 1 prompt: unknown role tool"):
        load_dataset_task(path, chat_policy, reward=reward)
    path = write_rows(tmp_path / "d.jsonl", [{"prompt": "1+1=", "answer": 1}, {"prompt": "日本", "answer": 2}])
    with pytest.raises(BebopError, match="d.jsonl: row 2: the policy's tokenizer cannot express the prompt '日本'"):
        load_dataset_task(path, chat_policy, reward=reward)
    path = write_rows(tmp_path / "d.jsonl", [{"prompt": "1+1=", "answer": 2, "data_source": "nobody"}])
    with pytest.raises(BebopError, match="d.jsonl: row 1 has 'nobody', which no built-in scorer knows"):
        load_dataset_task(path, chat_policy)


def test_sft_completions_from_text_and_from_assistant_messages(tiny_model_dir, tmp_path):
    policy = load_policy(with_chat_template(tiny_model_dir, tmp_path / "m", EOS_TEMPLATE), device="cpu")
    data = [{"prompt": "2+2=", "completion": "4"},
            {"messages": [*user("hi"), {"role": "assistant", "content": "hello"}]},
            {"prompt": user("yo"), "completion": [{"role": "assistant", "content": "hey"}]}]
    task = load_dataset_task(write_rows(tmp_path / "sft.jsonl", data), policy, need=COMPLETIONS)
    by_row = {p.row: p for p in task.problems("train", 3, 0)}
    assert [task.demonstration(by_row[r], None) for r in (1, 2, 3)] == ["4", "hello", "hey"]  # eos: training adds it
    assert by_row[2].prompt == "[user]hi[assistant]"
    qwen = load_dataset_task(write_rows(tmp_path / "q.jsonl", data[1:]), load_policy(
        with_chat_template(tiny_model_dir, tmp_path / "q"), device="cpu"), need=COMPLETIONS)
    # a turn ending that is not the eos token stays as the template writes it (training appends <eos>)
    assert {qwen.demonstration(p, None) for p in qwen.problems("train", 2, 0)} == {"hello<|im_end|>\n",
                                                                                 "hey<|im_end|>\n"}
    with pytest.raises(BebopError, match=r"sft.jsonl: row 1 has no completion \('completion', 'response', or a final "
                                         "assistant message\\)"):
        load_dataset_task(write_rows(tmp_path / "sft.jsonl", [{"prompt": "a"}]), policy, need=COMPLETIONS)


def test_two_files_of_one_name_never_share_a_self_distillation_cache(chat_policy, tmp_path):
    from bebop.mtp.data import _cache_path
    from bebop.tasks.dataset_task import PROMPTS

    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    a = load_dataset_task(write_rows(tmp_path / "a" / "train.jsonl", rows(2)), chat_policy, need=PROMPTS)
    b = load_dataset_task(write_rows(tmp_path / "b" / "train.jsonl", rows(3)), chat_policy, need=PROMPTS)
    paths = {_cache_path(tmp_path, task, 4, 1.0, 0, 8) for task in (a, b, a)}
    assert len(paths) == 2 and all(p.name.startswith("train.jsonl-") for p in paths)
    # loaded for its prompts, a file needs no scorer for its data_source ('mine' has none): nothing is scored
    assert [a.score(p, "2") for p in a.problems("train", 2, 0)] == [0.0, 0.0] and a.reward_errors == 0
