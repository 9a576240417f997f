"""The memory cap holds for every allocation family on every way a program reaches the driver
(direct linking, dlopen + dlsym, cuGetProcAddress with and without the per-thread-stream flag),
frees give back exactly what was charged, and a refusal says so in one line on stderr."""

from __future__ import annotations

import pytest
from slice_helpers import CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, GIB, MIB, in_pid_namespace, live_slots
from support import wait_for

PATHS = ["direct", "dlsym", "procaddr", "procaddr_ptsz"]

# family command -> the driver entry point it reaches on each path (named in the OOM line)
FAMILY_CALLS = {
    "alloc": "cuMemAlloc_v2",
    "managed": "cuMemAllocManaged",
    "async": "cuMemAllocAsync",
    "pool": "cuMemAllocFromPoolAsync",
    "vmm": "cuMemCreate",
}
PER_THREAD_STREAM_VARIANTS = {"async", "pool"}


def expected_call(family: str, path: str) -> str:
    call = FAMILY_CALLS[family]
    return f"{call}_ptsz" if path == "procaddr_ptsz" and family in PER_THREAD_STREAM_VARIANTS else call


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("family", list(FAMILY_CALLS))
def test_cap_refuses_over_the_cap_and_frees_give_back_on_every_path(probe, sim_env, make_slice, family, path):
    env, _ = make_slice(sim_env, memory_limit=256 * MIB)
    run = probe(
        env,
        "init",
        f"{family}:192M",  # fits
        f"{family}:128M",  # 320 MiB > 256 MiB: refused
        f"{family}:64M",  # exactly the cap: fits
        "info",
        "free:0",
        f"{family}:128M",  # 192 MiB given back, so it fits now
        "info",
        path=path,
    )
    assert run.returncode == 0, run.stderr
    assert run.rc(0) == CUDA_SUCCESS
    assert [run.rc(1), run.rc(2), run.rc(3)] == [CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS]
    assert run.values(4) == [CUDA_SUCCESS, 0, 256 * MIB]
    assert run.rc(5) == CUDA_SUCCESS
    assert run.rc(6) == CUDA_SUCCESS
    if family in ("async", "pool"):
        # Freed into the pool, which keeps it (no synchronisation yet): the 128 MiB come from its
        # reserve, and the process still holds all 256 MiB on the device.
        assert run.values(7) == [CUDA_SUCCESS, 0, 256 * MIB]
    else:
        assert run.values(7) == [CUDA_SUCCESS, 64 * MIB, 256 * MIB]
    oom_lines = [line for line in run.stderr.splitlines() if "out of GPU memory" in line]
    assert len(oom_lines) == 1, run.stderr
    assert f": {expected_call(family, path)} asked for 128.0 MiB," in oom_lines[0]


@pytest.mark.parametrize("path", PATHS)
def test_per_thread_stream_flag_gets_the_ptsz_hooks_only_when_asked(probe, sim_env, make_slice, path):
    env, _ = make_slice(sim_env, memory_limit=GIB)
    run = probe(env, "init", "ptsz-variant", path=path)
    assert run.returncode == 0, run.stderr
    expected = ["1", "1"] if path == "procaddr_ptsz" else ["0", "0"]
    assert run.line(1)[1:] == expected


@pytest.mark.parametrize("path", PATHS)
def test_pitched_allocation_is_charged_pitch_times_height(probe, sim_env, make_slice, path):
    env, _ = make_slice(sim_env, memory_limit=256 * MIB)
    run = probe(env, "init", "pitch:1000:1000", "info", "pitch:8192:40000", "info", "free:0", "info", path=path)
    assert run.returncode == 0, run.stderr
    rc, _index, pitch = run.values(1)
    assert rc == CUDA_SUCCESS and pitch >= 1000
    free, total = run.values(2)[1:]
    assert total - free == pitch * 1000
    assert run.rc(3) == CUDA_ERROR_OUT_OF_MEMORY  # at least 8192 x 40000 = 312.5 MiB
    assert run.values(4)[1:] == [free, total]
    assert run.values(6) == [CUDA_SUCCESS, 256 * MIB, 256 * MIB]


@pytest.mark.parametrize(
    "command, charged",
    [
        ("array:4096:1024", 4096 * 1024 * 4),
        ("array3d:256:256:64", 256 * 256 * 64 * 4),
        # 11 levels of a 1024 x 1024 float mipmap: 1024^2 + 512^2 + ... + 1 texels of 4 bytes
        ("mipmap:1024:1024:11", 4 * sum((1024 >> level) ** 2 for level in range(11))),
    ],
)
@pytest.mark.parametrize("path", PATHS)
def test_arrays_are_charged_their_texels_and_capped(probe, sim_env, make_slice, command, charged, path):
    env, _ = make_slice(sim_env, memory_limit=charged + MIB)
    kind = command.split(":")[0]
    run = probe(env, "init", command, "info", command, "free:0", "info", path=path)
    assert run.returncode == 0, run.stderr
    assert run.rc(1) == CUDA_SUCCESS
    free, total = run.values(2)[1:]
    assert (total, total - free) == (charged + MIB, charged)
    assert run.line(3)[:2] == [kind, str(CUDA_ERROR_OUT_OF_MEMORY)]
    assert run.rc(4) == CUDA_SUCCESS
    assert run.values(5) == [CUDA_SUCCESS, charged + MIB, charged + MIB]


def test_free_of_a_pointer_nobody_allocated_gets_the_drivers_own_answer(probe, sim_env, make_slice):
    without = probe(sim_env, "init", "free-unknown")
    env, _ = make_slice(sim_env, memory_limit=GIB)
    within = probe(env, "init", "free-unknown", "alloc:1M", "info")
    assert without.returncode == 0 and within.returncode == 0, within.stderr
    assert within.rc(1) == without.rc(1)
    assert within.values(3) == [CUDA_SUCCESS, GIB - MIB, GIB]  # accounting untouched by the stray free


def test_context_creation_and_allocations_count_without_a_cap(probe, sim_env, make_slice, interactive):
    env, region = make_slice(sim_env, memory_limit=0)
    program = interactive([probe.executable, "--path=direct", "init", "ctx", "alloc:300M", "vmm:100M", "wait"], env)
    program.read_until("wait")
    (slot,) = live_slots(region)
    assert slot.pid == program.process.pid
    assert slot.allocated == 400 * MIB
    program.send()
    assert program.finish() == 0


def test_oom_line_names_call_request_usage_cap_and_how_to_resize(probe, sim_env, make_slice, interactive, tmp_path):
    env, region = make_slice(sim_env, memory_limit=4 * GIB)
    stderr_path = tmp_path / "stderr"
    program = interactive(
        [probe.executable, "--path=direct", "init", "alloc:3584M", "alloc:1G", "wait"], env, stderr_path=stderr_path
    )
    lines = program.read_until("wait")
    assert [line[:2] for line in lines[:3]] == [["init", "0"], ["alloc", "0"], ["alloc", str(CUDA_ERROR_OUT_OF_MEMORY)]]
    (slot,) = live_slots(region)
    assert slot.oom_refusals == 1
    assert slot.allocated == 3584 * MIB
    program.send()
    assert program.finish() == 0
    stderr = stderr_path.read_text()
    assert stderr == (
        "jupyter-vgpu: out of GPU memory in this slice: cuMemAlloc_v2 asked for 1.0 GiB, the slice uses "
        "3.5 GiB of its 4.0 GiB cap. Run it in a larger slice, e.g. `jupyter vgpu run --memory 5GiB -- ...`.\n"
    )


def test_memory_freed_into_a_pool_is_charged_while_the_pool_keeps_it(probe, sim_env, make_slice, interactive):
    """The slot counts what the driver's stream-ordered pools reserve for the process: memory freed
    with cuMemFreeAsync stays charged while its pool keeps it, an allocation its reserve serves is
    not refused at the cap, and a synchronisation (threshold 0) or a trim gives it back."""
    env, region = make_slice(sim_env, memory_limit=256 * MIB)
    program = interactive(
        [probe.executable, "init", "async:192M", "free:0", "wait", "async:320M", "async:128M", "free:1", "sync", "wait"]
        + ["keep-pool", "async:64M", "free:2", "sync", "wait", "trim", "wait"],
        env,
    )
    program.read_until("wait")
    (slot,) = live_slots(region)
    assert slot.allocated == 192 * MIB  # freed, but its pool keeps it
    program.send()
    lines = program.read_until("wait")
    assert lines[0][:2] == [
        "async",
        str(CUDA_ERROR_OUT_OF_MEMORY),
    ]  # the reserve serves 192 of it, the other 128 do not fit
    assert lines[1][:2] == ["async", str(CUDA_SUCCESS)]  # served by the pool's reserve
    # Given back at the synchronisation, which libvgpu.so does not hook: its monitor sees it.
    wait_for(lambda: slot.allocated == 0, 5, "the charge after a synchronisation")
    program.send()
    program.read_until("wait")
    assert slot.allocated == 64 * MIB  # the pool keeps it past a synchronisation now
    program.send()
    program.read_until("wait")
    assert slot.allocated == 0  # trimmed: at once (cuMemPoolTrimTo is hooked)
    program.send()
    assert program.finish() == 0


@pytest.mark.parametrize("family", ["alloc", "managed", "vmm"])
def test_memory_freed_into_a_pool_makes_room_for_an_allocation_no_pool_serves(probe, sim_env, make_slice, family):
    """Issue 34 item 3: memory the program freed with cuMemFreeAsync stays its pool's reserve, charged
    to the slice, until a synchronisation or a trim; an allocation the pool cannot serve (cuMemAlloc,
    managed, cuMemCreate) that the cap would refuse meanwhile gets it: libvgpu.so trims the
    process's own pools and counts again before it answers. Nothing is in use, so it fits, without an
    out-of-memory line; past what is left then, it is refused once, as any."""
    env, _ = make_slice(sim_env, memory_limit=256 * MIB)
    run = probe(env, "init", "async:192M", "free:0", f"{family}:128M", "info", f"{family}:192M", "info")
    assert run.returncode == 0, run.stderr
    assert [run.rc(1), run.rc(2)] == [CUDA_SUCCESS, CUDA_SUCCESS]
    assert run.rc(3) == CUDA_SUCCESS  # 192 MiB reserved by the pool + 128 MiB > 256 MiB: trimmed first
    assert run.values(4) == [CUDA_SUCCESS, 128 * MIB, 256 * MIB]
    assert run.rc(5) == CUDA_ERROR_OUT_OF_MEMORY  # 128 + 192 MiB: nothing left to trim
    assert run.values(6) == [CUDA_SUCCESS, 128 * MIB, 256 * MIB]
    oom_lines = [line for line in run.stderr.splitlines() if "out of GPU memory" in line]
    assert len(oom_lines) == 1, run.stderr
    assert f": {FAMILY_CALLS[family]} asked for 192.0 MiB, the slice uses 128.0 MiB" in oom_lines[0]


def test_request_larger_than_the_cap_is_refused_without_touching_usage(probe, sim_env, make_slice):
    env, _ = make_slice(sim_env, memory_limit=GIB)
    run = probe(env, "init", "alloc:18446744073709551615", "alloc:2G", "info")
    assert run.returncode == 0, run.stderr
    assert [run.rc(1), run.rc(2)] == [CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_OUT_OF_MEMORY]
    assert run.values(3) == [CUDA_SUCCESS, GIB, GIB]
    assert "cuMemAlloc_v2 asked for 16384.0 PiB, the slice uses 0 bytes of its 1.0 GiB cap" in run.stderr


def test_library_writes_nothing_to_stdout_even_when_logging(probe, sim_env, make_slice):
    env, _ = make_slice(sim_env, memory_limit=64 * MIB)
    env["VGPU_LOG_LEVEL"] = "debug"
    run = probe(env, "init", "alloc:32M", "alloc:64M", "info", path="dlsym")
    assert run.returncode == 0, run.stderr
    assert run.stdout == f"init 0\nalloc 0 0\nalloc 2 -1\ninfo 0 {32 * MIB} {64 * MIB}\n"
    assert "jupyter-vgpu[" in run.stderr  # debug logging went to stderr


def test_allocations_stop_counting_when_their_context_goes(probe, sim_env, make_slice, interactive):
    env, region = make_slice(sim_env, memory_limit=GIB)
    program = interactive(
        [
            probe.executable,
            "init",
            "alloc:64M",
            "ctx",
            "alloc:100M",
            "array:1024:1024",
            "async:8M",
            "vmm:32M",
            "ctx-destroy",
            "info",
            "wait",
            "primary-reset",
            "info",
            "wait",
        ],
        env,
    )
    lines = program.read_until("wait")
    assert [line[:2] for line in lines[:8]] == [
        [command, "0"] for command in ("init", "alloc", "ctx", "alloc", "array", "async", "vmm", "ctx-destroy")
    ]
    # the created context took its 100 MiB, its 4 MiB array and its 8 MiB with it; VMM memory
    # belongs to no context and stays
    assert lines[8] == ["info", "0", str(GIB - 96 * MIB), str(GIB)]
    (slot,) = live_slots(region)
    assert slot.allocated == 96 * MIB
    program.send()
    lines = program.read_until("wait")
    assert lines[0] == ["primary-reset", "0"]
    assert lines[1] == ["info", "0", str(GIB - 32 * MIB), str(GIB)]
    assert slot.allocated == 32 * MIB
    program.send()
    assert program.finish() == 0


def test_pitch_wider_than_expected_is_charged_as_the_driver_chose_it(
    probe, build_shared, sim_env, make_slice, interactive, tmp_path
):
    fake = build_shared("driver_without_vmm", "libcuda.so.1")  # pitch aligned to 4 KiB
    env, region = make_slice(sim_env, memory_limit=2 * MIB)
    env["LD_LIBRARY_PATH"] = f"{fake.parent}:{env['LD_LIBRARY_PATH']}"
    # 1000 x 1000 is 1000 KiB at a 1 KiB pitch, but 4000 KiB at the driver's 4 KiB one: over
    # the cap, so refused (and given back to the driver); 1000 x 400 at 4 KiB fits.
    program = interactive(
        [probe.executable, "pitch:1000:1000", "pitch:1000:400", "wait"], env, stderr_path=tmp_path / "stderr"
    )
    lines = program.read_until("wait")
    assert lines[0][:2] == ["pitch", str(CUDA_ERROR_OUT_OF_MEMORY)]
    assert lines[1] == ["pitch", "0", "0", "4096"]
    (slot,) = live_slots(region)
    assert slot.allocated == 4096 * 400
    program.send()
    assert program.finish() == 0
    assert (
        "cuMemAllocPitch_v2 asked for 3.9 MiB, the slice uses 0 bytes of its 2.0 MiB cap"
        in (tmp_path / "stderr").read_text()
    )


def test_driver_memory_of_contexts_counts_against_the_cap(probe, sim_env, make_slice, interactive):
    sim_env["VGPU_SIM_DEVICES"] = "name=context GPU,memory=16GiB,sms=100,context_memory=300MiB"
    env, region = make_slice(sim_env, memory_limit=GIB)
    program = interactive([probe.executable, "init", "info", "alloc:700M", "alloc:100M", "ctx", "info", "wait"], env)
    lines = program.read_until("wait")
    assert lines[1] == ["info", "0", str(GIB - 300 * MIB), str(GIB)]  # counted as soon as the context exists
    assert lines[2][:2] == ["alloc", "0"]  # 300 + 700 MiB fit in 1 GiB
    assert lines[3][:2] == ["alloc", str(CUDA_ERROR_OUT_OF_MEMORY)]
    assert lines[4] == ["ctx", "0"]  # a second context: 300 MiB more, over the cap (the driver decides)
    assert lines[5] == ["info", "0", "0", str(GIB)]
    (slot,) = live_slots(region)
    assert (slot.allocated, slot.driver_reserved) == (700 * MIB, 600 * MIB)
    program.send()
    assert program.finish() == 0


CONTEXT_DEVICE = "name=context GPU,memory=16GiB,sms=100,context_memory=300MiB"


def without_nvml(env: dict[str, str], native_libs, tmp_path) -> dict[str, str]:
    """`env` with the simulated driver but no NVML to be found."""
    directory = tmp_path / "driver-only"
    directory.mkdir(exist_ok=True)
    if not (directory / "libcuda.so.1").exists():
        (directory / "libcuda.so.1").symlink_to(native_libs.sim_dir / "libcuda.so.1")
    return dict(env, LD_LIBRARY_PATH=str(directory))


def test_later_processes_count_the_slices_context_size_at_once_without_nvml(
    probe, sim_env, make_slice, interactive, native_libs, tmp_path
):
    """The first process of a slice measures its context and records the size in the region; a
    later one counts that size for its own first context at once, without starting NVML (here
    it cannot: NVML is not there), so a subprocess's start-up does not pay for NVML."""
    sim_env["VGPU_SIM_DEVICES"] = CONTEXT_DEVICE
    env, region = make_slice(sim_env, memory_limit=GIB)
    first = interactive([probe.executable, "init", "wait"], env)
    first.read_until("wait")
    assert (region.raw.context_memory_known, region.raw.context_memory) == (1, 300 * MIB)
    later = interactive([probe.executable, "init", "info", "wait"], without_nvml(env, native_libs, tmp_path))
    lines = later.read_until("wait")
    assert lines[1] == ["info", "0", str(GIB - 600 * MIB), str(GIB)]  # both contexts count
    assert sorted(slot.driver_reserved for slot in live_slots(region)) == [300 * MIB, 300 * MIB]
    for program in (later, first):
        program.send()
        assert program.finish() == 0


def test_a_cap_decision_the_recorded_context_size_could_change_is_measured_first(
    probe, sim_env, make_slice, interactive
):
    """A recorded size smaller than the real context: far from the cap it stands until the
    monitor measures; a request it could decide is measured first, and refused on the real
    figure (300 + 600 + 200 MiB is over 1 GiB, though 200 + 600 + 200 MiB would not be)."""
    sim_env["VGPU_SIM_DEVICES"] = CONTEXT_DEVICE
    env, region = make_slice(sim_env, memory_limit=GIB)
    region.raw.context_memory = 200 * MIB
    region.raw.context_memory_known = 1
    program = interactive([probe.executable, "init", "alloc:600M", "wait", "alloc:200M", "wait"], env)
    lines = program.read_until("wait")
    assert lines[1][:2] == ["alloc", "0"]  # 200 + 600 (+ 200 more at worst) is within the cap: not measured
    program.send()
    lines = program.read_until("wait")
    assert lines[0][:2] == ["alloc", str(CUDA_ERROR_OUT_OF_MEMORY)]
    (slot,) = live_slots(region)
    assert (slot.allocated, slot.driver_reserved) == (600 * MIB, 300 * MIB)
    program.send()
    assert program.finish() == 0


def test_the_monitor_replaces_the_recorded_context_size_by_a_measurement(probe, sim_env, make_slice, interactive):
    sim_env["VGPU_SIM_DEVICES"] = CONTEXT_DEVICE
    env, region = make_slice(sim_env, memory_limit=GIB)
    region.raw.context_memory = 200 * MIB
    region.raw.context_memory_known = 1
    program = interactive([probe.executable, "init", "wait"], env)
    program.read_until("wait")
    (slot,) = live_slots(region)
    assert wait_for(lambda: slot.driver_reserved == 300 * MIB, timeout=5, message="the monitor measured the context")
    program.send()
    assert program.finish() == 0


def test_context_memory_counts_in_a_pid_namespace_where_nvml_shows_host_pids(
    probe, sim_env, make_slice, interactive, tmp_path
):
    """In a container with its own PID namespace NVML lists the program under the host's pid, not
    the one getpid() returns. The interposer finds that pid by its allocations, so the context's
    memory counts. The program runs in a PID namespace with a /proc of its own; the simulated
    driver is given the host's /proc (VGPU_SIM_PROC) and reports host pids, as a real driver does."""
    host_proc = tmp_path / "host-proc"
    host_proc.mkdir()
    sim_env["VGPU_SIM_DEVICES"] = "name=context GPU,memory=16GiB,sms=100,context_memory=300MiB"
    sim_env["VGPU_SIM_PROC"] = str(host_proc)
    env, region = make_slice(sim_env, memory_limit=GIB)
    program = interactive(
        [*in_pid_namespace(host_proc), probe.executable, "init", "alloc:64M", "wait", "info", "wait"], env
    )
    assert program.read_until("wait")[:2] == [["init", "0"], ["alloc", "0", "0"]]

    (slot,) = live_slots(region)
    found = wait_for(lambda: slot.nvml_pid, timeout=5, message="the interposer finding its NVML pid")
    counted = wait_for(lambda: slot.driver_reserved, timeout=5, message="the context's memory counted")
    pid, allocated = slot.pid, slot.allocated
    program.send()
    info = program.read_until("wait")[0]
    program.send()
    assert program.finish() == 0

    assert pid == 1 and found > 1  # the probe is the namespace's first process; NVML knows it otherwise
    assert (allocated, counted) == (64 * MIB, 300 * MIB)
    assert info == ["info", "0", str(GIB - 364 * MIB), str(GIB)]
