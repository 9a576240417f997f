"""``jupyter vgpu doctor``: what a slice needs on this machine, and what would stop one from working."""

from __future__ import annotations

import ctypes
import json
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from traitlets import Unicode

from jupyter_vgpu.cli.base import UsageError, _aliases, _GPUCommand
from jupyter_vgpu.model import SliceLimits, format_size
from jupyter_vgpu.model.devices import DeviceError
from jupyter_vgpu.native import NativeLibraryMissing, interposer_path, simulator_dir

# What `jupyter vgpu doctor` runs in a probe slice: the memory the driver shows it, and the pids
# NVML lists for the slice's device (argv[1], its UUID) once it holds a context there.
SLICE_PROBE = """
import ctypes, json, os, sys
import pynvml
cuda = ctypes.CDLL("libcuda.so.1")
device, context = ctypes.c_int(), ctypes.c_void_p()
free, total = ctypes.c_size_t(), ctypes.c_size_t()
cuda.cuInit(0)
cuda.cuDeviceGet(ctypes.byref(device), 0)
cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device)
cuda.cuCtxSetCurrent(context)
result = cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
pynvml.nvmlInit()
listed = pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByUUID(sys.argv[1]))
print(json.dumps({"result": result, "total": total.value, "pid": os.getpid(), "nvml_pids": sorted(p.pid for p in listed)}))
"""


def _mode(path: Path) -> str:
    info = path.stat()
    return f"mode {stat.S_IMODE(info.st_mode):04o} ({stat.filemode(info.st_mode)})"


def private_path_problems(path: Path, *, folder: bool) -> list[str]:
    """What is wrong with the modes of a region folder or region file: nobody but its owner, the
    user, may read or write it (a region's limits are what the interposer enforces; the folder
    names every running kernel). An empty list where all is well or the path does not exist."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return []
    kind = "region folder" if folder else "region file"
    problems = []
    if info.st_uid != os.getuid():
        problems.append(
            f"{kind} {path} belongs to uid {info.st_uid}, not to you (uid {os.getuid()}); remove it or chown it"
        )
    if stat.S_IMODE(info.st_mode) & 0o077:
        writable = stat.S_IMODE(info.st_mode) & 0o022
        harm = (
            "other users can list the kernels in slices"
            if folder
            else "other users can read the slice's limits and usage"
        ) + (" and replace or rewrite slices' limits" if writable else "")
        expected = "700" if folder else "600"
        problems.append(f"{kind} {path} is {_mode(path)}: {harm}; it should be {expected}: chmod {expected} {path}")
    return problems


def ledger_problems(path: Path) -> tuple[list[str], list[str]]:
    """(problems, notes) of a ledger file's modes: the server makes it 0600 in a 0700 folder.
    Writable by group or others is a problem (anyone could admit, resize or release slices);
    readable only is a note (kernel ids and pids show)."""
    problems, notes = [], []
    folder = path.parent
    if folder.exists() and stat.S_IMODE(folder.stat().st_mode) & 0o022:
        problems.append(
            f"ledger folder {folder} is {_mode(folder)}: other users can replace the ledger; chmod 700 {folder}"
        )
    for part in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        if not part.exists():
            continue
        mode = stat.S_IMODE(part.stat().st_mode)
        if part.stat().st_uid != os.getuid():
            problems.append(f"ledger file {part} belongs to uid {part.stat().st_uid}, not to you (uid {os.getuid()})")
        if mode & 0o022:
            problems.append(
                f"ledger file {part} is {_mode(part)}: group or other users can write it, and so admit, resize or "
                f"release slices; chmod 600 {part}"
            )
        elif mode & 0o044:
            notes.append(
                f"ledger file {part} is {_mode(part)}: other users can read it (kernel ids, pids); chmod 600 {part}"
            )
    return problems, notes


class DoctorApp(_GPUCommand):
    name = "jupyter-vgpu-doctor"
    description = "Check what a slice needs on this machine and say what would stop one from working."
    ledger_path = Unicode(
        "",
        config=True,
        help="The vGPU server's ledger file to check. Empty: where a server keeps it by default (<jupyter runtime dir>/vgpu/ledger.sqlite).",
    )
    region_dir = Unicode(
        "", config=True, help="The server's folder of region files to check. Empty: <jupyter runtime dir>/vgpu/regions."
    )
    aliases = _aliases("DoctorApp", "ledger=ledger_path", "region_dir")
    flags = {"simulate": ({"DoctorApp": {"simulate": True}}, _GPUCommand.simulate.help)}  # noqa: RUF012 -- traitlets' class-level table

    def _paths(self) -> tuple[Path, list[Path]]:
        """(the ledger file, the region folders) to check; a path given that is not there is a
        usage error, a default one may not exist yet."""
        from jupyter_vgpu.holders.local import default_region_dir
        from jupyter_vgpu.provisioning.local import default_ledger_path

        ledger = Path(self.ledger_path).expanduser() if self.ledger_path else default_ledger_path()
        if self.ledger_path and not ledger.is_file():
            raise UsageError(f"--ledger: no file at {ledger}; give the server's VGPUApp.ledger_path")
        regions = Path(self.region_dir).expanduser() if self.region_dir else default_region_dir()
        if self.region_dir and not regions.is_dir():
            raise UsageError(f"--region-dir: no folder at {regions}; give the server's VGPUApp.region_dir")
        return ledger, list(dict.fromkeys([regions, default_region_dir(), default_region_dir(standalone=True)]))

    def run(self) -> int:
        from jupyter_vgpu.holders.local import LocalHolder, default_region_dir, slice_environment

        problems = 0

        def report(ok: bool, what: str, detail: str) -> None:
            nonlocal problems
            problems += not ok
            print(f"[{'ok' if ok else 'FAIL'}] {what}: {detail}")

        ledger, region_folders = self._paths()
        # Before anything here makes or fixes a folder: what the server and earlier runs left.
        self.check_file_modes(report, ledger, region_folders)
        try:
            library = interposer_path()
            report(True, "interposer", str(library))
        except NativeLibraryMissing as error:
            report(False, "interposer", str(error))
            return 1
        try:
            report(True, "simulated GPU", str(simulator_dir()))
        except NativeLibraryMissing as error:
            report(not self.simulate, "simulated GPU", str(error))

        holder = LocalHolder(default_region_dir(standalone=True), simulate=self.simulate)
        try:
            directory = holder.region_dir
            with tempfile.NamedTemporaryFile(dir=directory):
                pass  # made and removed: the folder takes files
            report(True, "region directory", f"{directory} is writable")
        except OSError as error:
            report(False, "region directory", f"cannot write slice regions: {error}")
            return 1

        if not self.simulate:
            try:
                ctypes.CDLL("libcuda.so.1")
                report(True, "CUDA driver", "libcuda.so.1 loads")
            except OSError as error:
                report(False, "CUDA driver", f"libcuda.so.1 does not load ({error}); try --simulate")
        try:
            devices = self.devices()
        except DeviceError as error:
            report(False, "devices", str(error))
            return 1
        report(
            bool(devices),
            "devices",
            ", ".join(f"{d.index}: {d.name} {format_size(d.memory_total)}" for d in devices) or "none",
        )
        if not devices:
            return 1
        self.check_ledger(report, ledger, devices)

        # A real process under the interposer, in a real slice: must start, print nothing extra,
        # see the cap, and be listed by NVML under the pid it has (the slice attributes context
        # memory and SM utilisation by pid).
        probe_limit = 256 << 20
        probe_name = f"doctor-{os.getpid()}"
        region = holder.new_region(probe_name, SliceLimits(probe_limit), devices[0])
        try:
            env = slice_environment(region, simulate=self.simulate)
            result = subprocess.run(
                [sys.executable, "-c", SLICE_PROBE, region.device_uuid],
                check=False,  # the probe's exit status is reported below
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            try:
                seen = json.loads(result.stdout)
            except json.JSONDecodeError:
                seen = None
            sees_cap = (
                result.returncode == 0 and seen is not None and seen["result"] == 0 and seen["total"] == probe_limit
            )
            report(
                sees_cap,
                "slice",
                "a process in a 256MiB slice sees a 256MiB GPU"
                if sees_cap
                else f"a process in a 256MiB slice saw {result.stdout.strip() or 'nothing'} {result.stderr.strip()}",
            )
            if sees_cap and seen["pid"] in seen["nvml_pids"]:
                report(True, "process ids", "NVML lists a process of the slice under its own pid")
            elif sees_cap:
                print(
                    f"[note] process ids: NVML lists the GPU's processes as {seen['nvml_pids'] or 'none'}, not under "
                    f"the probe's pid {seen['pid']}: a PID namespace (a container) hides the host's pids. A slice "
                    "finds each process's NVML pid by its allocations, so its context memory and SM share count "
                    "from the first allocation of 4MiB or more on; in the host's PID namespace (docker run "
                    "--pid=host; Kubernetes hostPID: true) they count from the start."
                )
        finally:
            region.close()
            holder.release(probe_name)

        if os.environ.get("LD_PRELOAD"):
            print(
                f"[note] LD_PRELOAD is already set here ({os.environ['LD_PRELOAD']}); slices add libvgpu.so in front of it"
            )
        print(
            "[note] LD_PRELOAD enforcement holds for cooperative code in this Unix account; see README "
            "'Honest limits' for the modes that hold against a hostile user."
        )
        print("no problems found" if problems == 0 else f"{problems} problem(s) found")
        return 0 if problems == 0 else 1

    @staticmethod
    def check_file_modes(report, ledger: Path, region_folders: list[Path]) -> None:
        """Region folders 0700 and region files 0600, the user's own; the ledger not writable by
        others. One line for each problem, one ok line when there is none."""
        from jupyter_vgpu.holders.local import REGION_SUFFIX

        found, checked = [], []
        for folder in region_folders:
            if not folder.is_dir():
                continue
            checked.append(str(folder))
            found += private_path_problems(folder, folder=True)
            for region in sorted(folder.glob(f"*{REGION_SUFFIX}")):
                found += private_path_problems(region, folder=False)
        ledger_found, notes = ledger_problems(ledger)
        found += ledger_found
        for problem in found:
            report(False, "file modes", problem)
        for note in notes:
            print(f"[note] file modes: {note}")
        if not found:
            where = ", ".join([*checked, *([str(ledger)] if ledger.exists() else [])]) or "nothing made yet"
            report(True, "file modes", f"region folders and files private, ledger not writable by others ({where})")

    @staticmethod
    def check_ledger(report, path: Path, devices) -> None:
        """Whether a batch kernel here (nbconvert, papermill, nbclient) finds the server's ledger
        and can take its slice from it."""
        import sqlite3

        from jupyter_vgpu.holders.local import LocalHolder, default_region_dir
        from jupyter_vgpu.ledger import EmbeddedLedger, LedgerError
        from jupyter_vgpu.manager import BATCH_KEY, held_by_batch_run

        if not path.exists():
            print(
                f"[note] server ledger: none at {path}. A batch kernel (nbconvert, papermill, nbclient) then gets "
                "the slice it asks for and nothing counts it against other slices; a vGPU server makes its ledger "
                "when it starts (--VGPUProvisioner.ledger=PATH names one elsewhere)"
            )
            return
        try:
            with EmbeddedLedger(path, devices) as ledger:
                allocations = ledger.allocations()
        except (LedgerError, OSError, sqlite3.Error) as error:
            report(False, "server ledger", f"{path} cannot be used by batch kernels: {error}")
            return
        batch = sum(1 for allocation in allocations if BATCH_KEY in allocation.metadata)
        held = format_size(sum(allocation.memory_limit for allocation in allocations)) if allocations else "nothing"
        report(
            True,
            "server ledger",
            f"{path} holds {len(allocations)} slice(s) ({held}; {batch} of batch runs). A batch kernel started "
            "here (nbconvert, papermill, nbclient) is admitted to it, so it does not over-commit what the "
            "server's kernels hold",
        )
        holder = LocalHolder(default_region_dir(standalone=True))
        live = [
            allocation
            for allocation in allocations
            if allocation.holder == "local" and not held_by_batch_run(allocation) and holder.is_alive(allocation)
        ]
        for allocation in live:
            print(f"[note] live kernel: {live_kernel(allocation)}")
        # A kernel whose process is gone (a server or batch run that crashed) still has its room
        # promised: nothing gives it back until a server on this ledger starts again.
        left = [
            allocation
            for allocation in allocations
            if allocation.holder == "local" and not held_by_batch_run(allocation) and not holder.is_alive(allocation)
        ]
        if left:
            shown = ", ".join(
                f"{allocation.kernel_id[:8]} ({format_size(allocation.memory_limit)}, {allocation.sm_share}% "
                f"on GPU {allocation.device_index})"
                for allocation in left[:5]
            )
            report(
                False,
                "left-over slices",
                f"{len(left)} slice(s) in {path} are of kernels that no longer run: {shown}"
                f"{' and more' if len(left) > 5 else ''}; {format_size(sum(a.memory_limit for a in left))} stays "
                "promised to them. A server or batch run that crashed left them; a vGPU server on this ledger gives "
                "them back when it starts (jupyter server, then stop it)"
                + (
                    f". Do not delete the ledger: it records {len(live)} live kernel(s) (above), which a restarted "
                    "server adopts"
                    if live
                    else ", or delete the ledger if no server uses it"
                ),
            )


def live_kernel(allocation) -> str:
    """What a live kernel of the ledger is to its user: its slice, and which server has it (the
    one that started it, one that adopted it after that one went away, or none yet)."""
    from jupyter_vgpu.holders.device_memory import process_running
    from jupyter_vgpu.manager import ADOPTED_KEY, CONNECTION_FILE_KEY, ORPHANED_KEY, served_elsewhere

    metadata = allocation.metadata
    # Lent: suspended with nothing moved (it had not used the GPU), as every view says it.
    state = "lent" if allocation.lent else "suspended" if allocation.suspended else "running"
    what = (
        f"{allocation.kernel_id[:8]} ({metadata.get('kernelspec') or 'a kernel'}, {state}, "
        f"{format_size(allocation.memory_limit)} slice on GPU {allocation.device_index})"
    )
    adopted = metadata.get(ADOPTED_KEY)
    server = adopted.get("server") if isinstance(adopted, dict) else None
    if isinstance(server, dict) and process_running(server.get("pid", 0), server.get("pid_start_time", 0)):
        return f"{what}, adopted by the server at {server.get('url')} after the one that started it went away"
    if isinstance(metadata.get(ORPHANED_KEY), dict):
        return (
            f"{what}, outlived its server; kept by a restarted server that could not adopt it: reach it with "
            f"`jupyter console --existing {metadata.get(CONNECTION_FILE_KEY, '')}`"
        )
    serving = served_elsewhere(allocation)
    if serving:
        return f"{what}, with the server that started it (pid {serving})"
    return (
        f"{what}, outlived its server and waits for a restarted one to adopt it, with its variables: start "
        "the server again (same user and Jupyter runtime dir) before its survival time (VGPUApp.kernel_survival) "
        "runs out"
    )
