"""Inductor's instruction-set check remembered across processes (engine/isa_check.py): recorded once every set the
CPU reports has passed it, answered from the record afterwards, never recorded when a set failed."""

import platform

import pytest
import torch

from bebop.engine import isa_check

pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="inductor checks x86 only")


def test_a_check_that_passed_is_recorded_then_answers_the_next(tmp_path, monkeypatch):
    from torch._inductor import config

    monkeypatch.setattr(isa_check, "_all_reported_pass", lambda: True)
    with isa_check.isa_checked(tmp_path):
        assert config.cpp.vec_isa_ok is None  # no record yet: inductor checks
    (record,) = tmp_path.glob("isa-check-*.json")
    monkeypatch.setattr(isa_check, "_all_reported_pass", lambda: pytest.fail("checked again"))
    with isa_check.isa_checked(tmp_path):
        assert config.cpp.vec_isa_ok is True
    assert config.cpp.vec_isa_ok is None


def test_a_failed_set_is_never_recorded(tmp_path, monkeypatch):
    for outcome in (False, None):  # a set failed; no check ran in this process
        monkeypatch.setattr(isa_check, "_all_reported_pass", lambda: outcome)
        with isa_check.isa_checked(tmp_path):
            pass
    assert not list(tmp_path.iterdir())


def test_the_record_is_this_machines(tmp_path, monkeypatch):
    with isa_check.isa_checked(tmp_path):
        pass
    machine = isa_check._machine()
    assert machine is not None and machine["torch"] == torch.__version__
    assert isa_check._record(tmp_path, {**machine, "isa": machine["isa"] + ["a new set"]}) != isa_check._record(
        tmp_path, machine)


def test_a_process_that_ran_inductors_check_reads_its_outcome():
    from torch._inductor import cpu_vec_isa

    cpu_vec_isa.pick_vec_isa()  # inductor's own check, as loading a kernel makes it
    assert isa_check._all_reported_pass() is not None and cpu_vec_isa.valid_vec_isa_list()
