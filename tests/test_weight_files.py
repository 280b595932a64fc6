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


@pytest.mark.parametrize("old_shards,new_shards", LAYOUTS)
def test_an_interrupted_save_leaves_the_old_model_or_the_new_one(old_shards, new_shards, tmp_path, monkeypatch):
    old, new = states()
    base = tmp_path / "base"
    write_weights(old, base, old_shards)
    seen = set()
    for n in range(1, 100):
        model_dir = tmp_path / f"try{n}"
        shutil.copytree(base, model_dir)
        with monkeypatch.context() as patch:
            calls = interrupt_at(n, patch)
            try:
                write_weights(new, model_dir, new_shards)
                finished = True
            except Interrupted:
                finished = False
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
