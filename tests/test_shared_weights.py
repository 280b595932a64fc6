"""The shared-memory weights a vLLM worker loads its updates from (bebop/vllm/shared_weights.py): every slot holds
the model's tensor under its file name, in the serving dtype, and an update names exactly the groups that changed
(the trunk after an optimizer step, the head after a head update) and the drafter's share of them."""

from pathlib import Path

import pytest
import torch

from bebop.model import load_model
from bebop.model.checkpoint import file_tensors
from bebop.vllm.shared_weights import SharedWeights


@pytest.fixture()
def model(hf_model_dir):
    _, path = hf_model_dir
    model = load_model(path)
    model.attach_mtp(1, torch.Generator().manual_seed(0))
    return model


def names(entries) -> set[str]:
    return {entry[0] for entry in entries}


def slots_hold(shared: SharedWeights, model, dtype=torch.float32) -> bool:
    return all(torch.equal(shared.view(name), t.to(dtype)) for name, t in file_tensors(model).items())


def test_every_slot_holds_the_tensor_vllm_loads_by_its_file_name(model):
    shared = SharedWeights(model, drafts=True)
    try:
        files = file_tensors(model)
        assert set(shared.slots) == set(files) and any(n.startswith("mtp.") for n in files)
        assert any(n.endswith("q_proj.weight") for n in files)  # the files' names: fused projections split
        # vLLM starts from the model directory: until a sync there is no file, and a new worker needs nothing
        assert not shared.path.exists() and shared.everything()["target"] == shared.everything()["draft"] == []
        assert shared.update(model) == {"path": str(shared.path), "target": [], "draft": []}  # nothing changed
        assert slots_hold(shared, model)  # yet the file, made now, holds every served tensor
        assert all(shared.slots[n].offset % 64 == 0 for n in files)
        everything = shared.everything()
        assert names(everything["target"]) | names(everything["draft"]) == set(files)
        # an entry is what the worker needs to view the file: name, dtype, shape, offset
        name, dtype, shape, offset = everything["target"][0]
        assert (dtype, shape, offset) == ("float32", list(shared.slots[name].shape), shared.slots[name].offset)
    finally:
        shared.close()


def test_an_update_sends_what_changed_and_nothing_else(model):
    shared = SharedWeights(model, drafts=True)
    try:
        files = file_tensors(model)
        head = {n for n in files if n.startswith("mtp.")}
        trunk = set(files) - head
        assert shared.update(model) == {"path": str(shared.path), "target": [], "draft": []}  # nothing changed

        with torch.no_grad():  # an optimizer step on the trunk: every trunk tensor moves
            for name, p in model.named_parameters():
                if not name.startswith("mtp."):
                    p.add_(0.01)
        update = shared.update(model)
        assert names(update["target"]) == trunk
        assert names(update["draft"]) == {"model.embed_tokens.weight", "lm_head.weight"}  # what the drafter shares
        assert slots_hold(shared, model)

        with torch.no_grad():  # an online head update alone
            for p in model.mtp.parameters():
                p.mul_(1.5)
        update = shared.update(model)
        assert update["target"] == [] and names(update["draft"]) == head and slots_hold(shared, model)

        new = {k: v + 1.0 for k, v in model.state_dict().items()}  # load_state_dict copies in place
        model.load_state_dict(new)
        update = shared.update(model)
        assert names(update["target"]) == trunk and head <= names(update["draft"]) and slots_hold(shared, model)
    finally:
        shared.close()


def test_without_drafting_the_head_is_not_served_and_slots_take_the_serving_dtype(model):
    shared = SharedWeights(model, dtype=torch.bfloat16, drafts=False)
    try:
        shared.update(model)
        assert not any(n.startswith("mtp.") for n in shared.slots)
        assert all(shared.slots[n].dtype == torch.bfloat16 for n in shared.slots)
        assert all(torch.equal(shared.view(n), t.to(torch.bfloat16))
                   for n, t in file_tensors(model, with_head=False).items())
        with torch.no_grad():
            for p in model.mtp.parameters():
                p.mul_(2.0)
        assert shared.update(model)["draft"] == [] and shared.update(model)["target"] == []
        assert shared.everything()["draft"] == [] and names(shared.everything()["target"]) == set(shared.slots)
    finally:
        shared.close()


def test_close_removes_the_file(model):
    shared = SharedWeights(model, drafts=True)
    directory = Path(shared.directory)
    shared.update(model)
    assert shared.path.is_file() and shared.path.stat().st_size == shared.nbytes
    shared.close()
    assert not directory.exists()


def test_without_room_in_dev_shm_the_file_goes_to_the_temporary_folder(model, monkeypatch, tmp_path):
    """A container's /dev/shm is often 64 MB: a file that does not fit would fault on its first write there."""
    from bebop.vllm import shared_weights

    monkeypatch.setattr(shared_weights.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(shared_weights.os, "statvfs", lambda path: type("S", (), {"f_bavail": 10, "f_frsize": 4096}))
    shared = SharedWeights(model, drafts=True)
    try:
        assert shared.directory.parent == tmp_path and shared.nbytes > 10 * 4096
        shared.update(model)
        assert slots_hold(shared, model)
    finally:
        shared.close()
