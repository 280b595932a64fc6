"""A save replaces a directory's weights as one step (issue 23): interrupted at any file operation, the
directory holds the old model or the new one, complete, for every loader's way of resolving it
(bebop and transformers: the single file first, else the index; vLLM: the index's files when there is
an index, else every *.safetensors file)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil

import pytest
import torch
from safetensors.torch import load_file

from bebop.model import weight_files
from bebop.model.weight_files import INDEX_FILE, SINGLE_FILE, read_state_dict, write_weights


class Interrupted(BaseException):
    pass


def states():
    g = torch.Generator().manual_seed(0)
    old = {f"layer.{i}.weight": torch.randn(64, 64, generator=g) for i in range(4)}
    new = {name: t + 1 for name, t in old.items()} | {"mtp.fc.weight": torch.randn(64, 64, generator=g)}
    return old, new


def vllm_view(model_dir: pathlib.Path) -> dict[str, torch.Tensor]:
    """vLLM's resolution: with an index, the files it names (each must exist); else every *.safetensors."""
    files = sorted(p.name for p in model_dir.glob("*.safetensors"))
    if (model_dir / INDEX_FILE).is_file():
        named = set(json.loads((model_dir / INDEX_FILE).read_text())["weight_map"].values())
        assert named <= set(files), "the index names a missing file"
        files = sorted(named)
    out: dict[str, torch.Tensor] = {}
    for file in files:
        for name, t in load_file(model_dir / file).items():
            assert name not in out or torch.equal(out[name], t), "two files disagree"
            out[name] = t
    return out


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def interrupt_at(n: int, monkeypatch):
    """Make the n-th file operation (rename, unlink, link) raise, before it happens."""
    calls = {"count": 0}

    def counted(real):
        def op(*args, **kwargs):
            calls["count"] += 1
            if calls["count"] == n:
                raise Interrupted
            return real(*args, **kwargs)
        return op

    monkeypatch.setattr(os, "replace", counted(os.replace))
    monkeypatch.setattr(os, "link", counted(os.link))
    monkeypatch.setattr(pathlib.Path, "unlink", counted(pathlib.Path.unlink))
    return calls


# (old layout, new layout): None = one file, else the largest shard in bytes
LAYOUTS = [(20_000, 20_000), (20_000, None), (None, None), (None, 40_000), (40_000, 20_000)]


def interrupted_saves(base, new, shards, tmp_path, monkeypatch, tries):
    """For n = 1, 2, ...: a copy of `base` whose save of `new` is interrupted at its n-th file operation ->
    (n, the copy, whether the save finished before it, the operation counter)."""
    for n in range(1, tries):
        model_dir = tmp_path / f"try{n}"
        shutil.copytree(base, model_dir)
        with monkeypatch.context() as patch:
            calls = interrupt_at(n, patch)
            try:
                write_weights(new, model_dir, shards)
                finished = True
            except Interrupted:
                finished = False
        yield n, model_dir, finished, calls


@pytest.mark.parametrize("old_shards,new_shards", LAYOUTS)
def test_an_interrupted_save_leaves_the_old_model_or_the_new_one(old_shards, new_shards, tmp_path, monkeypatch):
    old, new = states()
    base = tmp_path / "base"
    write_weights(old, base, old_shards)
    seen = set()
    for n, model_dir, finished, calls in interrupted_saves(base, new, new_shards, tmp_path, monkeypatch, 100):
        for view in (read_state_dict(model_dir), vllm_view(model_dir)):
            assert same(view, old) or same(view, new), f"a mix after operation {n}"
            seen.add("new" if same(view, new) else "old")
        if finished:
            assert same(read_state_dict(model_dir), new) and calls["count"] < n
            assert not list(model_dir.glob("*bebop-staged*")) and not list(model_dir.glob(".*tmp"))
            break
    assert seen == {"old", "new"}
    if new_shards is None:
        assert (model_dir / SINGLE_FILE).is_file() and not (model_dir / INDEX_FILE).exists()
    else:
        assert len(list(model_dir.glob("model-*-of-*.safetensors"))) > 1


def test_without_hard_links_the_staged_names_stay_and_load(tmp_path, monkeypatch):
    old, new = states()
    write_weights(old, tmp_path, 20_000)

    def no_links(*args):
        raise OSError("operation not permitted")

    monkeypatch.setattr(weight_files.os, "link", no_links)
    write_weights(new, tmp_path, 20_000)
    assert same(read_state_dict(tmp_path), new) and same(vllm_view(tmp_path), new)
    monkeypatch.undo()
    write_weights(old, tmp_path, 20_000)  # the next save cleans them up
    assert same(read_state_dict(tmp_path), old) and not list(tmp_path.glob("*bebop-staged*"))


def test_a_stale_staged_twin_goes_before_the_single_file_is_written(tmp_path, monkeypatch):
    """A crash while a sharded directory became one file leaves model.safetensors beside its staged twin
    (same tensors, no index). The next one-file save must remove the twin first: the new file beside the
    old twin would be a mix for vLLM, which reads every *.safetensors file when there is no index."""
    old, new = states()
    base = tmp_path / "base"
    write_weights(old, base, None)
    os.link(base / SINGLE_FILE, base / "model.bebop-staged.safetensors")
    for n, model_dir, finished, calls in interrupted_saves(base, new, None, tmp_path, monkeypatch, 10):
        view = vllm_view(model_dir)
        assert same(view, old) or same(view, new), f"a mix after operation {n}"
        if finished:
            assert calls["count"] < n and same(view, new) and not list(model_dir.glob("*bebop-staged*"))
            return
    raise AssertionError("the save never finished")


def spy_on_the_folder(model_dir: pathlib.Path, monkeypatch) -> list[str]:
    """The save's file operations in order: 'replace', 'link', 'unlink', 'unlink index', and 'fsync' for
    an fsync of the model folder itself (a file's fsync is not listed)."""
    events: list[str] = []
    folder = os.stat(model_dir).st_ino

    def logged(real, kind):
        def op(*args, **kwargs):
            name = kind + (" index" if kind == "unlink" and args[0].name == INDEX_FILE else "")
            events.append(name)
            return real(*args, **kwargs)
        return op

    def fsync(fd):
        if os.fstat(fd).st_ino == folder:
            events.append("fsync")
        return real_fsync(fd)

    real_fsync = os.fsync
    monkeypatch.setattr(os, "replace", logged(os.replace, "replace"))
    monkeypatch.setattr(os, "link", logged(os.link, "link"))
    monkeypatch.setattr(pathlib.Path, "unlink", logged(pathlib.Path.unlink, "unlink"))
    monkeypatch.setattr(os, "fsync", fsync)
    return events


@pytest.mark.parametrize("old_shards,new_shards", LAYOUTS)
def test_the_folder_is_fsynced_at_each_switch_point(old_shards, new_shards, tmp_path, monkeypatch):
    """Every rename is on disk before the next operation; every link and unlink before the next rename
    and before the save returns; an unlinked index before anything else (the staged files it named go
    next). Without these, a power loss may keep a later step and lose the one it relied on."""
    old, new = states()
    write_weights(old, tmp_path, old_shards)
    (tmp_path / "model.bebop-staged.safetensors").write_bytes(b"")  # a crash's leftover, to be removed
    events = spy_on_the_folder(tmp_path, monkeypatch)
    write_weights(new, tmp_path, new_shards)
    monkeypatch.undo()
    assert same(read_state_dict(tmp_path), new)
    unsynced = []  # operations since the last fsync of the folder
    for event in events:
        if event == "fsync":
            unsynced = []
            continue
        assert not {"replace", "unlink index"} & set(unsynced), f"{event} before the folder was fsynced: {events}"
        if event == "replace":
            assert not unsynced, f"a rename relies on operations not yet on disk: {events}"
        unsynced.append(event)
    assert not unsynced, f"the save returned with operations not on disk: {events}"
    if old_shards is None and new_shards is None:  # one file over one file: the leftover goes first
        assert events[:3] == ["unlink", "fsync", "replace"], events


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600)])
def test_a_saved_model_gets_the_umask_permissions(umask, mode, tmp_path):
    """Every file of a saved model, the safetensors weights included (safetensors renames its own 0600
    temporary file), is readable by whom the umask allows: a vLLM server under another account."""
    from bebop.embedded import init_model_dir

    before = os.umask(umask)
    try:
        init_model_dir(tmp_path / "model", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64)
        write_weights(states()[0], tmp_path / "sharded", 20_000)
    finally:
        os.umask(before)
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {SINGLE_FILE, INDEX_FILE, "config.json", "model-00001-of-00004.safetensors"}
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in files} == {p.name: oct(mode) for p in files}
