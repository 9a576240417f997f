"""The simulated driver under an interposer that is not ours (tests/programs/foreign_interposer.c,
standing in for HAMi-core's libvgpu.so or a profiler): a call forwarded into the driver never
comes back into the interposer through another entry point, every entry point such an interposer
resolves is there, and the answers are those the driver gives without it."""

from __future__ import annotations

from sim_helpers import interposer_report, run_program, with_interposer


def test_no_entry_point_reenters_a_foreign_interposer(programs, env, foreign_interposer, tmp_path):
    log = tmp_path / "interposer.log"
    for command in ("versions", "pools"):
        run_program(programs.entry_points, with_interposer(env, foreign_interposer, log), command)
    report = interposer_report(log)
    assert report.nested == []  # fails when a _v2 or _ptsz entry point calls its sibling by symbol
    assert report.missing == []
    never_called = sorted(name for name, count in report.calls.items() if count == 0)
    assert report.calls and never_called == []  # every wrapper was on the path, so the check means something


def test_answers_under_a_foreign_interposer_are_the_drivers_own(programs, env, foreign_interposer, tmp_path):
    alone = run_program(programs.entry_points, env, "versions")
    wrapped = run_program(programs.entry_points, with_interposer(env, foreign_interposer, tmp_path / "log"), "versions")
    assert wrapped.pop("stderr") == alone.pop("stderr") == ""
    assert wrapped == alone
    # cuGetProcAddress hands out the driver's functions, not the interposer's of the same name.
    assert wrapped["proc_address_is_the_drivers"] == wrapped["proc_address_pool_attribute"] == "1"
