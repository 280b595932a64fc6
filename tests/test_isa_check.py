"""Inductor's instruction-set checks remembered across processes (engine/isa_check.py): each build check a process
ran is recorded, failures too, and answered from the record in the next; a check the record lacks runs."""

import platform

import pytest
import torch

from bebop.engine import isa_check

pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="inductor checks x86 only")


@pytest.fixture
def builds(monkeypatch):
    """inductor's build check replaced by a stub that passes every code but "fails", and counts its calls."""
    from torch._inductor.cpu_vec_isa import VecISA

    calls = []

    def check_build(isa, code):
        calls.append((type(isa).__name__, code))
        return code != "fails"

    monkeypatch.setattr(VecISA, "check_build", check_build)
    return calls


def test_a_check_that_ran_is_recorded_then_answers_the_next(tmp_path, builds):
    from torch._inductor.cpu_vec_isa import VecAVX2, VecAVX512

    with isa_check.isa_checked(tmp_path):
        assert VecAVX2().check_build("builds") and not VecAVX512().check_build("fails")
    assert len(builds) == 2
    (record,) = tmp_path.glob("isa-builds-*.json")
    with isa_check.isa_checked(tmp_path):  # a later process: both answered, the failure as a failure
        assert VecAVX2().check_build("builds") and not VecAVX512().check_build("fails")
        assert VecAVX512().check_build("builds")  # another set: not in the record, so it runs
    assert len(builds) == 3
    with isa_check.isa_checked(tmp_path):
        assert VecAVX512().check_build("builds")
    assert len(builds) == 3


def test_a_check_is_named_by_its_set_its_flags_and_its_code():
    from torch._inductor.cpu_vec_isa import VecAVX512

    isa = VecAVX512()
    name = isa_check.build_check(isa, "code")
    assert name != isa_check.build_check(isa, "other code")
    isa._arch_flags += " -mavx512bf16"  # a sub-check for an extension, as inductor makes them
    try:
        assert isa_check.build_check(isa, "code") != name
    finally:
        isa._arch_flags = VecAVX512._arch_flags


def test_an_unreadable_record_checks_again_and_is_rewritten(tmp_path, builds):
    from torch._inductor.cpu_vec_isa import VecAVX2

    record = isa_check._record(tmp_path, isa_check._machine())
    record.write_text("{not json")
    with isa_check.isa_checked(tmp_path):
        assert VecAVX2().check_build("builds")
    with isa_check.isa_checked(tmp_path):
        assert VecAVX2().check_build("builds")
    assert len(builds) == 1


def test_inductor_is_itself_again_after_the_block(tmp_path, builds):
    from torch._inductor.cpu_vec_isa import VecAVX2

    with isa_check.isa_checked(tmp_path):
        VecAVX2().check_build("builds")
    VecAVX2().check_build("builds")
    assert len(builds) == 2  # outside, every call runs
    assert not list(isa_check._read(isa_check._record(tmp_path / "none", isa_check._machine())))


def test_the_record_is_this_machines(tmp_path):
    machine = isa_check._machine()
    assert machine is not None and machine["torch"] == torch.__version__
    assert isa_check._record(tmp_path, {**machine, "isa": machine["isa"] + ["a new set"]}) != isa_check._record(
        tmp_path, machine)


def test_inductors_own_check_runs_through_the_record(tmp_path):
    """The real checks (a build and a child process each): what loading a kernel makes inductor run, recorded."""
    from torch._inductor import cpu_vec_isa

    isa = cpu_vec_isa.VecAVX2()
    with isa_check.isa_checked(tmp_path):
        outcome = isa.check_build(cpu_vec_isa.VecISA._avx_code)
    assert list(isa_check._read(isa_check._record(tmp_path, isa_check._machine())).values()) == [outcome]
