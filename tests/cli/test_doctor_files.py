"""`jupyter vgpu doctor` on the files a vGPU server and batch runs leave: region folders and
files only the user's (0700, 0600), a ledger nobody else can write, one line for each problem;
and whether a batch kernel here finds a server's ledger to take its slice from."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jupyter_vgpu.holders.local import private_folder
from jupyter_vgpu.holders.region import process_start_time
from jupyter_vgpu.ledger import EmbeddedLedger
from jupyter_vgpu.model import Device, SliceLimits

GIB = 1 << 30


@pytest.fixture
def runtime(cli_env) -> Path:
    """The user's Jupyter runtime folder, with the vgpu folder a server makes (0700)."""
    folder = Path(cli_env["JUPYTER_RUNTIME_DIR"])
    private_folder(folder / "vgpu")
    return folder


def make_ledger(path: Path, pid: int = 1, start_time: int = 1) -> None:
    """A ledger as a server leaves it (0600), holding one slice of a batch run started by `pid`
    (by default one that no longer runs: pid 1 started at another time)."""
    device = Device("GPU-00000000-0000-4000-8000-000000000000", 0, "jupyter-vgpu test GPU", 16 * GIB, 100)
    with EmbeddedLedger(path, [device]) as ledger:
        ledger.admit(
            "kernel-a", SliceLimits(2 * GIB, 50), metadata={"batch": {"pid": pid, "pid_start_time": start_time}}
        )


def test_doctor_names_each_region_and_ledger_file_open_to_other_users(vgpu, runtime):
    regions, standalone = runtime / "vgpu" / "regions", runtime / "vgpu" / "regions" / "standalone"
    standalone.mkdir(parents=True)
    regions.chmod(0o755)
    standalone.chmod(0o700)
    (regions / "k1.region").write_bytes(b"")
    (regions / "k1.region").chmod(0o644)
    (standalone / "k2.region").write_bytes(b"")
    (standalone / "k2.region").chmod(0o666)
    (standalone / "k3.region").write_bytes(b"")
    (standalone / "k3.region").chmod(0o600)  # as it should be: not named
    ledger = runtime / "vgpu" / "ledger.sqlite"
    make_ledger(ledger, os.getpid(), process_start_time(os.getpid()))
    ledger.chmod(0o666)
    result = vgpu("doctor", "--simulate")
    assert result.returncode == 1
    failed = [line for line in result.stdout.splitlines() if line.startswith("[FAIL]")]
    assert failed == [
        (
            f"[FAIL] file modes: region folder {regions} is mode 0755 (drwxr-xr-x): other users can list the kernels in "
            f"slices; it should be 700: chmod 700 {regions}"
        ),
        (
            f"[FAIL] file modes: region file {regions / 'k1.region'} is mode 0644 (-rw-r--r--): other users can read the "
            f"slice's limits and usage; it should be 600: chmod 600 {regions / 'k1.region'}"
        ),
        (
            f"[FAIL] file modes: region file {standalone / 'k2.region'} is mode 0666 (-rw-rw-rw-): other users can read "
            f"the slice's limits and usage and replace or rewrite slices' limits; it should be 600: chmod 600 "
            f"{standalone / 'k2.region'}"
        ),
        (
            f"[FAIL] file modes: ledger file {ledger} is mode 0666 (-rw-rw-rw-): group or other users can write it, and "
            f"so admit, resize or release slices; chmod 600 {ledger}"
        ),
    ]
    assert "4 problem(s) found" in result.stdout


def test_doctor_notes_a_ledger_others_can_read_and_a_ledger_folder_they_can_write(vgpu, runtime):
    ledger = runtime / "vgpu" / "ledger.sqlite"
    make_ledger(ledger)
    ledger.chmod(0o644)
    (runtime / "vgpu").chmod(0o777)
    result = vgpu("doctor", "--simulate")
    lines = result.stdout.splitlines()
    assert (
        f"[FAIL] file modes: ledger folder {runtime / 'vgpu'} is mode 0777 (drwxrwxrwx): other users can replace the ledger; chmod 700 {runtime / 'vgpu'}"
        in lines
    )
    assert (
        f"[note] file modes: ledger file {ledger} is mode 0644 (-rw-r--r--): other users can read it (kernel ids, pids); chmod 600 {ledger}"
        in lines
    )
    assert result.returncode == 1


def test_doctor_says_a_batch_kernel_here_takes_its_slice_from_the_servers_ledger(vgpu, runtime):
    ledger = runtime / "vgpu" / "ledger.sqlite"
    make_ledger(ledger, os.getpid(), process_start_time(os.getpid()))  # a run that is still going
    result = vgpu("doctor", "--simulate")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        f"[ok] server ledger: {ledger} holds 1 slice(s) (2GiB; 1 of batch runs). A batch kernel started here "
        in result.stdout
    )
    assert "[ok] file modes: region folders and files private, ledger not writable by others" in result.stdout


def test_doctor_names_a_ledger_batch_kernels_cannot_use(vgpu, runtime):
    (runtime / "vgpu" / "ledger.sqlite").write_text("not a database, but long enough for SQLite to look at it" * 40)
    os.chmod(runtime / "vgpu" / "ledger.sqlite", 0o600)
    result = vgpu("doctor", "--simulate")
    assert result.returncode == 1
    assert (
        f"[FAIL] server ledger: {runtime / 'vgpu' / 'ledger.sqlite'} cannot be used by batch kernels: ledger file "
        in result.stdout
    )


def test_doctor_names_the_slices_a_crashed_server_left_and_what_gives_them_back(vgpu, runtime):
    ledger = runtime / "vgpu" / "ledger.sqlite"
    make_ledger(ledger)  # its batch run is gone
    device = Device("GPU-00000000-0000-4000-8000-000000000000", 0, "jupyter-vgpu test GPU", 16 * GIB, 100)
    with EmbeddedLedger(ledger, [device]) as opened:  # a server's kernel, its process gone
        opened.admit("kernel-b", SliceLimits(GIB, 20), metadata={"provisioner_info": {"pid": 1, "pid_start_time": 1}})
    result = vgpu("doctor", "--simulate")
    assert result.returncode == 1
    assert (
        f"[FAIL] left-over slices: 2 slice(s) in {ledger} are of kernels that no longer run: kernel-a (2GiB, 50% on "
        "GPU 0), kernel-b (1GiB, 20% on GPU 0); 3GiB stays promised to them." in result.stdout
    ), result.stdout
    assert "a vGPU server on this ledger gives them back when it starts" in result.stdout


@pytest.mark.parametrize(
    "flag, message", [("--ledger", "--ledger: no file at"), ("--region-dir", "--region-dir: no folder at")]
)
def test_doctor_refuses_a_path_that_is_not_there(vgpu, tmp_path, flag, message):
    result = vgpu("doctor", "--simulate", flag, str(tmp_path / "nowhere"))
    assert result.returncode == 2
    assert result.stderr.strip().startswith(f"jupyter vgpu doctor: {message} {tmp_path / 'nowhere'}")


def test_doctor_names_live_kernels_and_never_advises_deleting_a_ledger_that_holds_one(vgpu, runtime):
    ledger = runtime / "vgpu" / "ledger.sqlite"
    make_ledger(ledger)  # a left-over slice: its batch run is gone
    device = Device("GPU-00000000-0000-4000-8000-000000000000", 0, "jupyter-vgpu test GPU", 16 * GIB, 100)
    alive = {"pid": os.getpid(), "pid_start_time": process_start_time(os.getpid())}  # stands for a kernel
    gone = {"pid": 1, "pid_start_time": 1}
    with EmbeddedLedger(ledger, [device]) as opened:
        # A kernel that outlived its server (adopted once, by a server that went away in turn) ...
        opened.admit(
            "waiting-kernel",
            SliceLimits(GIB, 20),
            metadata={"provisioner_info": alive, "kernelspec": "GPU slice", "adopted": {"server": gone}},
        )
        # ... and one a running server adopted.
        opened.admit(
            "adopted-kernel",
            SliceLimits(GIB, 20),
            metadata={"provisioner_info": alive, "adopted": {"server": {**alive, "url": "http://127.0.0.1:8888/"}}},
        )
    result = vgpu("doctor", "--simulate")
    assert (
        "[note] live kernel: waiting- (GPU slice, running, 1GiB slice on GPU 0), outlived its server and waits for "
        "a restarted one to adopt it, with its variables" in result.stdout
    ), result.stdout
    assert (
        "[note] live kernel: adopted- (a kernel, running, 1GiB slice on GPU 0), adopted by the server at "
        "http://127.0.0.1:8888/ after the one that started it went away" in result.stdout
    )
    assert "Do not delete the ledger: it records 2 live kernel(s) (above), which a restarted server adopts" in (
        result.stdout
    )
    assert "delete the ledger if no server uses it" not in result.stdout


def test_doctor_calls_a_lent_kernel_lent_and_a_suspended_one_suspended(vgpu, runtime):
    """Issue 34 item 3: a kernel whose room is lent (suspended with nothing moved: it had not used
    the GPU) read "suspended", as every view but doctor says "lent"."""
    ledger = runtime / "vgpu" / "ledger.sqlite"
    device = Device("GPU-00000000-0000-4000-8000-000000000000", 0, "jupyter-vgpu test GPU", 16 * GIB, 100)
    alive = {"pid": os.getpid(), "pid_start_time": process_start_time(os.getpid())}  # stands for a kernel
    with EmbeddedLedger(ledger, [device]) as opened:
        for kernel_id, moved in (("lent-kernel", 0), ("moved-kernel", GIB)):
            opened.admit(kernel_id, SliceLimits(GIB, 20), metadata={"provisioner_info": alive, "adopted": {}})
            opened.suspend(kernel_id, host_memory=moved, details={"lent": not moved})
    result = vgpu("doctor", "--simulate")
    assert "live kernel: lent-ker (a kernel, lent, 1GiB slice on GPU 0)" in result.stdout, result.stdout
    assert "live kernel: moved-ke (a kernel, suspended, 1GiB slice on GPU 0)" in result.stdout, result.stdout
