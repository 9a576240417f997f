"""``jupyter vgpu``: run programs in slices, list devices, diagnose a machine."""

from __future__ import annotations

import ctypes
import getpass
import json
import logging
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any, NoReturn

from jupyter_core.application import JupyterApp
from traitlets import Bool, Float, List, TraitError, Unicode, default
from traitlets.config import Application, Configurable
from traitlets.config.loader import KVArgParseConfigLoader

# Only what every command needs is imported here: a command imports the rest of jupyter_vgpu
# (holders, ledger, slice manager) and of Jupyter (jupyter_client, jupyter_server) when it runs,
# so `jupyter vgpu status` answers in a fraction of a second (tests/cli/test_cli_imports.py).
from jupyter_vgpu._version import __version__
from jupyter_vgpu.client import (
    RequestRefused,
    ServerClient,
    ServerUnavailable,
    describe_queue,
    gpu_memory_used,
    in_host_memory,
    resize_changes,
    resize_waiting,
    state_meaning,
)
from jupyter_vgpu.model import (
    FULL_SHARE,
    NOTEBOOK_DEFAULTS,
    SliceLimits,
    SliceValueError,
    decide_limits,
    format_size,
    parse_policy,
    parse_size,
    parse_sm_share,
    select_device,
)
from jupyter_vgpu.model.devices import DeviceError, list_devices, use_simulator
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


class UsageError(Exception):
    """Bad command-line input: printed as one line, exit status 2, nothing started."""


class _StrictLoader(KVArgParseConfigLoader):
    """Command-line options where one the command does not have is refused (one line, exit 2),
    not warned about and ignored: `--prefix DIR` to a command without it must not install
    somewhere else."""

    command = "jupyter vgpu"

    def _handle_unrecognized_alias(self, arg: str) -> None:
        self._refuse(f"unknown option --{arg}")

    def _create_parser(self) -> None:
        super()._create_parser()
        # argparse's own errors (an unknown --flag without a value: "expected one argument")
        # read the same: one line, exit 2.
        self.parser.error = self._refuse  # type: ignore[method-assign]

    def _refuse(self, message: str) -> NoReturn:
        if message.startswith("argument --") and message.endswith("expected one argument"):
            option = message.split()[1].rstrip(":").split("/")[0].removeprefix("--")
            # argparse names an alias by its trait: --RunApp.memory for --memory
            alias = next((name for name, trait in self.aliases.items() if option in (name, trait)), None)
            message = f"--{alias} needs a value" if alias else f"unknown option --{option}"
        print(f"{self.command}: {message}; `{self.command} --help` lists the options it takes", file=sys.stderr)
        sys.exit(2)


class _StrictOptions(JupyterApp):
    """A `jupyter vgpu` command: its unknown options are refused (see _StrictLoader), and its
    help names no private class of this module (the bases below)."""

    # One line for the table of `jupyter vgpu --help`: a whole sentence, never cut.
    summary = ""

    def _create_loader(self, argv, aliases, flags, classes) -> KVArgParseConfigLoader:
        loader = _StrictLoader(argv, aliases, flags, classes=classes, log=self.log, subcommands=self.subcommands)
        loader.command = self.name.replace("-", " ")
        return loader

    @classmethod
    def class_get_help(cls, inst=None) -> str:
        # traitlets heads the section "RunApp(_GPUCommand) options", naming a private base
        first, _, rest = super().class_get_help(inst).partition("\n")
        return f"{cls.__name__} options\n{rest}" if first.endswith(" options") else f"{first}\n{rest}"

    def _classes_inc_parents(self, classes=None):
        # --help-all lists a section for every configurable class; the private bases here are
        # not for users to configure.
        for cls in super()._classes_inc_parents(classes):
            if not cls.__name__.startswith("_"):
                yield cls


# flags, aliases and subcommands are traitlets' class-level tables, which Application annotates
# as instance attributes (a ClassVar here is a mypy error) and only reads: RUF012 does not apply.
def _aliases(app: str, *options: str) -> dict[str, str]:
    """traitlets' aliases of an app's options, in the order given: ``trait`` is the option
    ``--trait`` (``_`` written ``-``), ``alias=trait`` another name for it."""
    aliases = {}
    for option in options:
        alias, _, trait = option.rpartition("=")
        aliases[(alias or trait).replace("_", "-")] = f"{app}.{trait}"
    return aliases


class _VGPUSubcommand(_StrictOptions):
    version = __version__

    def start(self) -> None:
        command = self.name.replace("-", " ")  # jupyter vgpu kernelspec install
        try:
            self.exit(self.run() or 0)
        except UsageError as error:
            print(f"{command}: {error}", file=sys.stderr)
            self.exit(2)
        except RequestRefused as error:
            print(f"{command}: {error.message} (HTTP {error.status})", file=sys.stderr)
            self.exit(1)
        except (DeviceError, NativeLibraryMissing, FileNotFoundError, ServerUnavailable) as error:
            print(f"{command}: {error}", file=sys.stderr)
            self.exit(1)

    def run(self) -> int:
        raise NotImplementedError


class _GPUCommand(_VGPUSubcommand):
    """A subcommand that uses this machine's GPUs, or the simulated ones (--simulate)."""

    simulate = Bool(False, config=True, help="Use the simulated GPU instead of the machine's driver.")

    def devices(self):
        if self.simulate:
            use_simulator()
        return list_devices()


class RunApp(_GPUCommand):
    name = "jupyter-vgpu-run"
    description = """Run COMMAND inside a fresh GPU slice and return its exit status.

    Every process COMMAND starts counts against the same slice. Over its memory cap a program
    gets CUDA_ERROR_OUT_OF_MEMORY (frameworks raise their own out-of-memory error) and one line
    on stderr naming the cap."""
    examples = """
jupyter vgpu run --memory 4GiB --cores 30 -- python train.py
jupyter vgpu run --simulate --memory 512MiB -- python -c "import pynvml; ..."
"""

    memory = Unicode(
        "",
        config=True,
        help="Memory cap: 512MiB, 4GiB, 4G or a bare number of MiB. Empty: no cap, or in a server's ledger "
        f"a notebook's default ({format_size(NOTEBOOK_DEFAULTS.memory_limit)}).",
    )
    cores = Unicode(
        "",
        config=True,
        help=f"SM share in percent, 1..100. Empty: 100, or in a server's ledger a notebook's default "
        f"({NOTEBOOK_DEFAULTS.sm_share}).",
    )
    policy = Unicode(
        "",
        config=True,
        help="hard: never above the SM share; burst: may use idle SMs. Empty: hard, or in a server's ledger a "
        f"notebook's default ({NOTEBOOK_DEFAULTS.policy}).",
    )
    device = Unicode("0", config=True, help="The GPU: an index or a UUID (GPU-...).")
    ledger = Unicode(
        "auto",
        config=True,
        help="The vGPU ledger the run's slice is admitted to, as a batch kernel's is: auto (a running server's, "
        "<jupyter runtime dir>/vgpu/ledger.sqlite, where that file exists), the path of a server's ledger "
        "(VGPUApp.ledger_path), or none (--no-server: a slice nothing counts, which may over-commit a GPU that "
        "a server's kernels hold).",
    )

    aliases = _aliases("RunApp", "memory", "cores", "policy", "device", "ledger")
    flags = {  # noqa: RUF012 -- traitlets' class-level table
        "simulate": ({"RunApp": {"simulate": True}}, _GPUCommand.simulate.help),
        "no-server": ({"RunApp": {"ledger": "none"}}, "Run in a slice no server's ledger counts (RunApp.ledger=none)."),
    }

    def limits(self, defaults: SliceLimits) -> SliceLimits:
        """The slice asked for, `defaults` where an option was left out (a memory_limit of 0 in
        them: no cap)."""
        try:
            return SliceLimits(
                memory_limit=parse_size(self.memory) if self.memory else defaults.memory_limit,
                sm_share=parse_sm_share(self.cores) if self.cores else defaults.sm_share,
                policy=parse_policy(self.policy) if self.policy else defaults.policy,
            )
        except SliceValueError as error:
            raise UsageError(error) from None

    def run(self) -> int:
        # Alone, a run has the GPU to itself: no cap, every SM. Beside a server, whose kernels
        # take a notebook's default size, it takes the same (a whole GPU would not fit beside one).
        standalone = SliceLimits(0, FULL_SHARE, "hard")
        self.limits(standalone)  # refuse bad values before anything starts
        if not self.extra_args:
            raise UsageError("no command given; usage: jupyter vgpu run [options] -- COMMAND ARGS...")
        try:
            device = select_device(self.devices(), self.device)
        except SliceValueError as error:
            raise UsageError(error) from None
        ledger_path = self.ledger_path()
        limits = self.limits(standalone if ledger_path is None else NOTEBOOK_DEFAULTS)
        if not self.memory and limits.memory_limit > device.memory_total:  # a default larger than a small GPU
            limits = SliceLimits(device.memory_total, limits.sm_share, limits.policy)
        if limits.memory_limit > device.memory_total:
            raise UsageError(
                f"a memory cap of {format_size(limits.memory_limit)} is more than GPU {device.index} has "
                f"({format_size(device.memory_total)}); ask for at most that, or leave --memory out for the whole GPU"
            )
        if ledger_path is None:
            from jupyter_vgpu.holders.local import run_in_slice

            return run_in_slice(self.extra_args, limits, device, simulate=self.simulate)
        if not (self.memory and self.cores and self.policy):
            print(
                f"jupyter vgpu run: beside the vGPU server (ledger {ledger_path}) the slice is {limits.describe()}; "
                "what --memory, --cores and --policy left out is a notebook's default size",
                file=sys.stderr,
            )
        return self.run_in_ledger(ledger_path, limits, device)

    def ledger_path(self) -> Path | None:
        """The server's ledger the run joins, None for none (and a warning where one is there)."""
        from jupyter_vgpu.provisioning.local import default_ledger_path

        value = self.ledger.strip()
        found = default_ledger_path()
        if value == "none":
            if found.exists():
                print(
                    f"jupyter vgpu run: warning: a vGPU server's ledger is at {found}, but this run's slice is not "
                    "counted there (--no-server): it may take GPU memory the server's kernels were promised",
                    file=sys.stderr,
                )
            return None
        if value == "auto":
            return found if found.exists() else None
        if not value:
            raise UsageError("--ledger is empty; give auto, none or the path of a vGPU server's ledger")
        return Path(value)

    def run_in_ledger(self, path: Path, limits: SliceLimits, device) -> int:
        """Run the command in a slice admitted to a server's ledger like a batch kernel's: the
        server lists it (with this command line and the command's pid), counts it against its
        own kernels, can resize it; released when the command ends. Marked with this process, so
        a server restarting meanwhile leaves it alone; if this process is killed, the server
        releases the slice once the command has ended too."""
        import sqlite3

        from jupyter_vgpu.holders.device_memory import DeviceMemoryReader
        from jupyter_vgpu.holders.local import REGION_PATH_KEY, LocalHolder, default_region_dir, run_command
        from jupyter_vgpu.holders.region import process_start_time
        from jupyter_vgpu.ledger import EmbeddedLedger, LedgerError
        from jupyter_vgpu.manager import BATCH_KEY, SliceManager, SliceRefused

        holder = LocalHolder(default_region_dir(standalone=True), simulate=self.simulate)
        try:
            ledger = EmbeddedLedger(path, self.devices(), reader=DeviceMemoryReader(holder.known_processes))
        except (LedgerError, sqlite3.Error, OSError) as error:
            print(
                f"jupyter vgpu run: the vGPU ledger {path} cannot be used: {error}; --no-server runs without it",
                file=sys.stderr,
            )
            return 1
        manager = SliceManager(ledger, [holder], limits)
        name = f"run-{uuid.uuid4().hex}"
        command = shlex.join(self.extra_args)
        metadata = {
            "kernelspec": "jupyter vgpu run",
            BATCH_KEY: {"pid": os.getpid(), "pid_start_time": process_start_time(os.getpid()), "command": command},
            REGION_PATH_KEY: str(holder.path(name)),
        }
        try:
            try:
                allocation = manager.admit(name, limits, owner=getpass.getuser(), device=device.uuid, metadata=metadata)
            except SliceRefused as refusal:
                print(
                    f"jupyter vgpu run: its slice ({limits.describe()}) does not fit beside the slices in the vGPU "
                    f"ledger {path}: {refusal} `jupyter vgpu status` lists them; --no-server runs uncounted",
                    file=sys.stderr,
                )
                return 1

            def started(pid: int) -> None:
                manager.record_kernel(name, {"pid": pid, "pid_start_time": process_start_time(pid)})

            try:
                return run_command(self.extra_args, holder.environment(allocation), started=started)
            finally:
                manager.release(name)
        finally:
            ledger.close()


class DevicesApp(_GPUCommand):
    name = "jupyter-vgpu-devices"
    description = "List the GPUs NVML reports (or the simulated ones with --simulate)."
    flags = {"simulate": ({"DevicesApp": {"simulate": True}}, _GPUCommand.simulate.help)}  # noqa: RUF012 -- traitlets' class-level table

    def run(self) -> int:
        devices = self.devices()
        print(f"{'IDX':<4}{'NAME':<34}{'UUID':<42}{'MEMORY':>10}{'USED':>10}{'SMS':>6}")
        for device in devices:
            print(
                f"{device.index:<4}{device.name[:33]:<34}{device.uuid:<42}"
                f"{format_size(device.memory_total):>10}{format_size(device.memory_used):>10}{device.sm_count:>6}"
            )
        return 0


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


class _ServerCommand(_VGPUSubcommand):
    """A subcommand that talks to the running Jupyter server's /api/vgpu as its user (the
    server's GPU, real or simulated, is the server's business: no --simulate)."""

    flags = {}  # noqa: RUF012 -- traitlets' class-level table

    server = Unicode(
        "",
        config=True,
        help="URL of the Jupyter server, with its token in $JUPYTER_TOKEN. Empty: the one found in Jupyter's runtime files.",
    )

    def client(self) -> ServerClient:
        return ServerClient.for_user(self.server)


def short_ids(kernel_ids: list[str]) -> dict[str, str]:
    """Each kernel id cut to 8 characters, or to as many as tell the ids apart."""
    length = 8
    while len({kernel_id[:length] for kernel_id in kernel_ids}) < len(set(kernel_ids)):
        length += 1
    return {kernel_id: kernel_id[:length] for kernel_id in kernel_ids}


# Where JupyterHub serves its API unless configured otherwise (JupyterHub.hub_bind_url).
DEFAULT_HUB_API_URL = "http://127.0.0.1:8081/hub/api"


def _where(item: dict[str, Any]) -> str:
    """What a slice is for, in one line: its notebook, else the command that started it."""
    return item["path"] or " ".join(item.get("command", "").split()) or "-"


def _gpu_column(item: dict[str, Any]) -> str:
    """The slice's GPU index; ``any`` for a start waiting for whichever GPU has room first, ``-``
    for a pod's slice (on no GPU of this machine)."""
    device = item.get("device")
    if device:
        return str(device["index"])
    return "any" if item.get("state") == "queued" else "-"


class StatusApp(_ServerCommand):
    name = "jupyter-vgpu-status"
    description = "Show every GPU slice of the running Jupyter server, like nvidia-smi for slices."
    show_all = Bool(
        False,
        config=True,
        help="Every user's slices on the node, from its broker, by GPU (a JupyterHub with jupyter_vgpu.hub). "
        "Needs a hub token with custom:vgpu:admin (the vgpu-admin role) in $JUPYTERHUB_API_TOKEN.",
    )
    broker = Unicode(
        "",
        config=True,
        help="The broker's URL for --all. Empty: $JUPYTER_VGPU_BROKER_URL, else the URL of the hub's service "
        "--service, asked of the hub's API at $JUPYTERHUB_API_URL (else JupyterHub's default, "
        f"{DEFAULT_HUB_API_URL}).",
    )
    service = Unicode(
        "vgpu", config=True, help="For --all: the broker's service name in the hub (the classroom file's broker.name)."
    )
    aliases = _aliases("StatusApp", "server", "broker", "service")
    flags = {"all": ({"StatusApp": {"show_all": True}}, show_all.help)}  # noqa: RUF012 -- traitlets' class-level table

    def run(self) -> int:
        if self.show_all:
            return self.run_all()
        client = self.client()
        slices = client.slices()
        print(
            f"{'KERNEL':<10}{'NOTEBOOK':<28}{'GPU':>4}{'MEMORY USED / CAP':>22}{'SM % / SHARE':>15}{'POLICY':>8}  STATE"
        )
        for item in slices:
            limits, usage = item["limits"], item["usage"]
            used = gpu_memory_used(item)  # none on the GPU while suspended: the state says where it is
            memory = f"{format_size(used) if used else '0'} / {format_size(limits['memory_bytes'])}"
            sm = f"{usage['sm_util']:.0f} / {limits['cores']}"
            print(
                f"{item['kernel_id'][:8]:<10}{_where(item)[-27:]:<28}{_gpu_column(item):>4}"
                f"{memory:>22}{sm:>15}{limits['policy']:>8}  {in_host_memory(item) or item['state']}"
            )
            # A start waiting in line, or a suspended or lent kernel's cell waiting for its room.
            place = describe_queue(item)
            if place:
                print(f"{'':<10}{place}")
            for warning in item.get("warnings", ()):
                print(f"{'':<10}warning: {warning}")
        if not slices:
            print("(no slices)")
        for state in dict.fromkeys(item["state"] for item in slices):
            if meaning := state_meaning(state):
                print(meaning)
        for device in client.devices():
            # Memory the GPU holds beyond the slices: not free, whatever the caps leave.
            outside, over_cap = device.get("memory_outside_bytes", 0), device.get("memory_over_cap_bytes", 0)
            if outside or over_cap:
                print(
                    f"GPU {device['index']}: {format_size(outside) if outside else '0'} in use outside any slice, "
                    f"{format_size(over_cap) if over_cap else '0'} over its slice's cap; "
                    f"{format_size(device['memory_free_bytes']) if device['memory_free_bytes'] else '0'} free for slices"
                )
        return 0

    def run_all(self) -> int:
        from jupyter_vgpu.ledger import LedgerError
        from jupyter_vgpu.ledger.remote import RemoteLedger

        token = os.environ.get("JUPYTERHUB_API_TOKEN", "")
        if not token:
            raise UsageError(
                "--all needs a hub token with custom:vgpu:admin (the vgpu-admin role) in $JUPYTERHUB_API_TOKEN"
            )
        url = self.broker or os.environ.get("JUPYTER_VGPU_BROKER_URL", "") or self.broker_from_hub(token)
        try:
            with RemoteLedger(url.rstrip("/") + "/ledger", token, name="the node's GPU broker") as ledger:
                usages, allocations = ledger.devices_usage(), ledger.allocations()
        except (LedgerError, ValueError) as error:
            print(f"jupyter vgpu status: {error}", file=sys.stderr)
            return 1
        owners = {allocation.owner for allocation in allocations}
        print(f"{len(allocations)} slice(s) of {len(owners)} user(s) on {len(usages)} GPU(s)")
        for usage in usages:
            device = usage.device
            print(
                f"\nGPU {device.index} {device.name}: {format_size(usage.memory_allocated)} of "
                f"{format_size(usage.memory_capacity)} promised, {usage.total_share}% of the SMs "
                f"({usage.hard_share}% hard), {usage.slices} slice(s)"
            )
            held = [allocation for allocation in allocations if allocation.device_uuid == device.uuid]
            if held:
                print(f"  {'USER':<16}{'KERNEL':<10}{'MEMORY':>10}{'SHARE':>7}{'POLICY':>8}")
            for allocation in sorted(held, key=lambda allocation: (allocation.owner, allocation.created_at)):
                print(
                    f"  {allocation.owner or '-':<16}{allocation.kernel_id[:8]:<10}"
                    f"{format_size(allocation.memory_limit):>10}{allocation.sm_share:>6}%{allocation.policy:>8}"
                )
        return 0

    def broker_from_hub(self, token: str) -> str:
        """The broker's URL as the hub knows its service (its url and prefix); a UsageError that
        says what to pass where the hub cannot say."""
        import urllib.error
        import urllib.request

        hub = os.environ.get("JUPYTERHUB_API_URL", "") or DEFAULT_HUB_API_URL
        where = f"{hub.rstrip('/')}/services/{self.service}"
        pass_instead = (
            "give --broker URL (the broker's own address and prefix: http://127.0.0.1:<broker.port>/services/"
            f"{self.service}/ with the classroom file's broker.port), or set $JUPYTERHUB_API_URL to the hub's API "
            "(e.g. http://127.0.0.1:8081/hub/api)"
        )
        request = urllib.request.Request(where, headers={"Authorization": f"token {token}"})
        try:
            with urllib.request.urlopen(request, timeout=30) as reply:
                model = json.loads(reply.read())
        except urllib.error.HTTPError as error:
            why = (
                f"the hub has no service {self.service!r} (see --service) or this token may not read it "
                "(the vgpu-admin role may)"
                if error.code in (403, 404)
                else f"the hub answered {error.code} {error.reason}"
            )
            raise UsageError(f"--all: {why} ({where}); {pass_instead}") from None
        except (OSError, ValueError) as error:
            raise UsageError(f"--all: cannot ask the hub at {hub} for the broker ({error}); {pass_instead}") from None
        url, prefix = (model.get("url") or "", model.get("prefix") or "") if isinstance(model, dict) else ("", "")
        if not url:
            raise UsageError(f"--all: the hub's service {self.service!r} has no URL ({where}); {pass_instead}")
        return url.rstrip("/") + "/" + prefix.lstrip("/")


class ResizeApp(_ServerCommand):
    name = "jupyter-vgpu-resize"
    description = "Resize a running kernel's slice: jupyter vgpu resize KERNEL_ID [--memory] [--cores] [--policy]."
    memory = Unicode("", config=True, help="New memory cap: 512MiB, 4GiB, 4G or MiB.")
    cores = Unicode("", config=True, help="New SM share in percent, 1..100.")
    policy = Unicode("", config=True, help="New policy: hard or burst.")
    aliases = _aliases("ResizeApp", "memory", "cores", "policy", "server")

    def run(self) -> int:
        if len(self.extra_args) != 1:
            raise UsageError("usage: jupyter vgpu resize KERNEL_ID [--memory SIZE] [--cores PCT] [--policy hard|burst]")
        try:
            # An empty option is one not given.
            change = resize_changes(self.memory or None, self.cores or None, self.policy or None)
        except SliceValueError as error:
            raise UsageError(error) from None
        if not change:
            raise UsageError("nothing to change; give --memory, --cores and/or --policy")
        client = self.client()
        kernel_id = self.find_kernel(self.extra_args[0], client.slices())
        model = client.resize(kernel_id, **change)
        waiting = resize_waiting(model)
        if waiting is not None:
            print(f"{kernel_id[:8]}: {waiting}")
            return 0
        limits = model["limits"]
        print(
            f"resized {kernel_id[:8]}: memory {format_size(limits['memory_bytes'])}, cores {limits['cores']} %, policy {limits['policy']}"
        )
        return 0

    @staticmethod
    def find_kernel(wanted: str, slices: list[dict[str, Any]]) -> str:
        """The one sliced kernel whose id starts with ``wanted``; else say which ones there are,
        so the next try can be typed from the message."""
        matches = [item for item in slices if item["kernel_id"].startswith(wanted)]
        if len(matches) == 1:
            kernel_id: str = matches[0]["kernel_id"]  # a str: startswith(str) just took it
            return kernel_id
        if not slices:
            raise UsageError(f"no kernel id starts with {wanted!r}: this server has no sliced kernels")
        shown = matches or slices
        ids = short_ids([item["kernel_id"] for item in shown])
        listed = ", ".join(f"{ids[item['kernel_id']]} ({item['path'] or 'no notebook'})" for item in shown)
        if matches:
            raise UsageError(f"{wanted!r} matches {len(matches)} sliced kernels: {listed}; give more of the kernel id")
        raise UsageError(f"no sliced kernel's id starts with {wanted!r}; the sliced kernels are {listed}")


class SuspendApp(_ServerCommand):
    name = "jupyter-vgpu-suspend"
    description = "Suspend a kernel: its GPU memory moves to host memory and its slice's room is lent: jupyter vgpu suspend KERNEL_ID."
    aliases = _aliases("SuspendApp", "server")
    verb = "suspend"

    def run(self) -> int:
        if len(self.extra_args) != 1:
            raise UsageError(f"usage: jupyter vgpu {self.verb} KERNEL_ID")
        client = self.client()
        slices = client.slices()
        kernel_id = ResizeApp.find_kernel(self.extra_args[0], slices)
        # The server answers a kernel already in the state asked for as it is (200): what this
        # says comes from the state the kernel was in before.
        before = next(item for item in slices if item["kernel_id"] == kernel_id)["state"]
        was_suspended = before == "suspended"
        model = client.resume(kernel_id) if self.verb == "resume" else client.suspend(kernel_id)
        short = kernel_id[:8]
        if self.verb == "resume" and before not in ("suspended", "lent"):  # lent: its room, without memory
            print(f"{short} was not suspended (it is {model['state']}): nothing to resume")
        elif self.verb == "resume":
            print(f"resumed {short}: its {format_size(model['limits']['memory_bytes'])} slice runs again")
        elif was_suspended:
            print(
                f"{short} was already suspended: its {format_size(model['host_memory_bytes'] or 0)} is in host "
                f"memory; `jupyter vgpu resume {short}` resumes it"
            )
        else:
            print(
                f"suspended {short}: {format_size(model['host_memory_bytes'])} moved to host memory; it resumes on "
                f"its next cell, or with `jupyter vgpu resume {short}`"
            )
        return 0


class ResumeApp(SuspendApp):
    name = "jupyter-vgpu-resume"
    description = (
        "Resume a suspended kernel (its room on the GPU first, then its memory): jupyter vgpu resume KERNEL_ID."
    )
    aliases = _aliases("ResumeApp", "server")
    verb = "resume"


SHIPPED_KERNELSPEC = "python3-vgpu"  # kernels/python3-vgpu, installed with the package


def shipped_kernel_logos(kernelspecs: Any) -> list[Path]:
    """The logo files of the kernelspec installed with the package (none where it is missing)."""
    from jupyter_client.kernelspec import NoSuchKernel

    try:
        folder = Path(kernelspecs.get_kernel_spec(SHIPPED_KERNELSPEC).resource_dir)
    except NoSuchKernel:
        return []
    return sorted(folder.glob("logo-*"))


class KernelspecInstallApp(_GPUCommand):
    name = "jupyter-vgpu-kernelspec-install"
    description = "Install a kernelspec whose kernels start in GPU slices of a given size."
    memory = Unicode("4GiB", config=True, help="Memory cap of each kernel's slice.")
    cores = Unicode("100", config=True, help="SM share of each kernel's slice in percent.")
    policy = Unicode("hard", config=True, help="hard or burst.")
    kernel_name = Unicode(
        "",
        config=True,
        help="Kernelspec name (letters, digits, '-', '_', '.'). Default: python3-vgpu-<memory>-<cores>.",
    )
    display_name = Unicode(
        "", config=True, help="Name shown in the launcher. Default: Python 3 (GPU <memory>, <cores>% SM)."
    )
    device = Unicode(
        "",
        config=True,
        help="GPU index or UUID of every kernel's slice. Empty: the ledger places it (GPU 0 in a batch run without one).",
    )
    user = Bool(False, config=True, help="Install for this user only (in ~/.local/share/jupyter/kernels).")
    prefix = Unicode(
        "",
        config=True,
        help="Install in PREFIX/share/jupyter/kernels, e.g. a virtual or conda environment's folder, as "
        "`jupyter kernelspec install --prefix` does. Empty: system-wide, or this user's with --user.",
    )
    aliases = _aliases(
        "KernelspecInstallApp", "prefix", "memory", "cores", "policy", "device", "name=kernel_name", "display_name"
    )
    flags = {  # noqa: RUF012 -- traitlets' class-level table
        "user": ({"KernelspecInstallApp": {"user": True}}, user.help),
        "sys-prefix": (
            {"KernelspecInstallApp": {"prefix": sys.prefix}},
            f"Install in this Python's environment ({sys.prefix}/share/jupyter/kernels): --prefix sys.prefix.",
        ),
        "simulate": (
            {"KernelspecInstallApp": {"simulate": True}},
            "Kernels started without a vGPU server (papermill, nbconvert) use the simulated GPU.",
        ),
    }

    def run(self) -> int:
        from ipykernel.kernelspec import get_kernel_dict
        from jupyter_client.kernelspec import KernelSpecManager

        from jupyter_vgpu.manager import SliceRefused
        from jupyter_vgpu.provisioning.local import checked_layer

        try:
            memory, cores, policy = (
                format_size(parse_size(self.memory)),
                parse_sm_share(self.cores),
                parse_policy(self.policy),
            )
            device = checked_layer({"device": self.device}, "--{name}").get("device", "").strip()
        except (SliceValueError, SliceRefused) as error:
            raise UsageError(error) from None
        config: dict[str, str | bool] = {"memory": memory, "cores": str(cores), "policy": policy}
        if device:
            config["device"] = device
        if self.simulate:
            config["simulate"] = True
        name = self.kernel_name or f"python3-vgpu-{memory.lower()}-{cores}"
        if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
            raise UsageError(f"kernelspec name {name!r} may hold only letters, digits, '-', '_' and '.'")
        if self.user and self.prefix:
            raise UsageError("--user and --prefix (or --sys-prefix) name two places; give one of them")
        self.warn_where_it_cannot_start(parse_size(memory), device)
        # What the installed ipykernel declares of itself (debugger, supported_encryption: a server
        # with transport_encryption="required" starts only kernels that say "curve"; the
        # protocol version), as its own `python -m ipykernel install` writes it.
        ipykernel_spec = get_kernel_dict()
        spec = {
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": self.display_name or f"Python 3 (GPU {memory}, {cores}% SM)",
            "language": "python",
            "metadata": {
                **ipykernel_spec.get("metadata", {}),
                "kernel_provisioner": {
                    "provisioner_name": "vgpu-provisioner",
                    "config": config,
                },
            },
        }
        if "kernel_protocol_version" in ipykernel_spec:
            spec["kernel_protocol_version"] = ipykernel_spec["kernel_protocol_version"]
        # Its own logger, which shows warnings only: the manager's "Installed kernelspec" line
        # would repeat the one below.
        kernelspecs = KernelSpecManager(log=logging.getLogger("jupyter_vgpu.kernelspec"))
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "kernel.json"), "w") as file:
                json.dump(spec, file, indent=2)
            for logo in shipped_kernel_logos(kernelspecs):  # the launcher shows them, not a letter
                shutil.copy(logo, folder)
            path = kernelspecs.install_kernel_spec(folder, name, user=self.user, prefix=self.prefix or None)
        print(f"installed kernelspec {Path(path).name} in {path}")  # Jupyter lower-cases the name
        return 0

    def warn_where_it_cannot_start(self, memory: int, device: str) -> None:
        """A warning on stderr where no GPU here (the one --device names) has the slice's memory:
        its kernels would be refused on this machine. The GPUs are this machine's, or with
        --simulate, or where it has no NVIDIA driver, the simulated ones."""
        try:
            devices, kind = self.devices(), "simulated GPU" if self.simulate else "GPU"
        except (DeviceError, NativeLibraryMissing):
            if self.simulate:
                return
            try:  # no driver: the GPU of a server started with --VGPUApp.simulate=True
                use_simulator()
                devices, kind = list_devices(), "simulated GPU"
            except (DeviceError, NativeLibraryMissing, OSError):
                return
        if device:
            try:
                devices = [select_device(devices, device)]
            except SliceValueError as error:
                print(f"jupyter vgpu kernelspec install: warning: --device: {error}", file=sys.stderr)
                return
        if not devices:
            return
        largest = max(devices, key=lambda each: each.memory_total)
        if memory > largest.memory_total:
            has = format_size(largest.memory_total)
            which = (
                f"{kind} {largest.index} has ({has})"
                if device
                else f"any {kind} here has (the largest, {kind} {largest.index}, has {has})"
            )
            print(
                f"jupyter vgpu kernelspec install: warning: a {format_size(memory)} slice is more than {which}; its "
                "kernels will be refused on this machine (installed anyway, for a machine with a larger GPU)",
                file=sys.stderr,
            )


class _CommandGroup(_StrictOptions):
    """A command of subcommands (``jupyter vgpu``, ``jupyter vgpu kernelspec``, ...): without one
    it prints its usage and exits 2."""

    version = __version__

    @default("subcommand_description")
    def _subcommand_description_default(self) -> str:
        # traitlets' own names the command by its name here (jupyter-vgpu-kernelspec), which is
        # no program; its text is then format()ted, so braces are doubled.
        command = self.name.replace("-", " ")
        return f"Run a command as `{command} COMMAND [options]`; `{command} COMMAND --help` lists its options."

    def usage(self) -> str:
        raise NotImplementedError

    def start(self) -> None:
        if self.subapp is None:
            print(f"usage: {self.usage()}", file=sys.stderr)
            self.exit(2)
        super().start()


class KernelspecApp(_CommandGroup):
    name = "jupyter-vgpu-kernelspec"
    description = "Install kernelspecs whose kernels start in GPU slices of a given size."
    subcommands = {"install": (KernelspecInstallApp, KernelspecInstallApp.description)}  # noqa: RUF012 -- traitlets' class-level table

    def usage(self) -> str:
        return "jupyter vgpu kernelspec install [options]  (jupyter vgpu kernelspec install --help)"


def own_options_help(cls: type[Configurable]) -> str:
    """``--Class.name=<Type>`` and the help of every option ``cls`` itself defines, as
    ``--help-all`` shows them: jupyter_server's own help lists no extension's options, and the
    options an extension app inherits (``open_browser``, ``default_url``, ...) are not ours."""
    traits = cls.class_own_traits(config=True)
    return "\n".join(cls.class_get_trait_help(traits[name]) for name in sorted(traits))


class ConfigApp(_StrictOptions):
    name = "jupyter-vgpu-config"
    version = __version__
    description = "Print the options of the server extension (VGPUApp) and of the kernel provisioner, with their help."

    def start(self) -> None:
        # Imported here: the server extension pulls in jupyter_server, which `run` never needs.
        from jupyter_vgpu.provisioning.local import VGPUProvisioner
        from jupyter_vgpu.provisioning.pod import VGPUPodProvisioner
        from jupyter_vgpu.server.app import VGPUApp

        print("VGPUApp: the server extension. Set on the command line (jupyter lab --VGPUApp.simulate=True)")
        print("or in jupyter_server_config.py (c.VGPUApp.simulate = True).\n")
        print(own_options_help(VGPUApp))
        print("\nVGPUProvisioner: the slice of each kernel a vGPU kernelspec starts. Set in the kernelspec's")
        print(
            'metadata, {"kernel_provisioner": {"provisioner_name": "vgpu-provisioner", "config": {"memory": "8GiB"}}},'
        )
        print("which wins over the server's config (c.VGPUProvisioner.memory = '8GiB'). In a batch run without a")
        print("server (jupyter nbconvert --execute --VGPUProvisioner.memory=3GiB ...) the run's own value wins.\n")
        print(own_options_help(VGPUProvisioner))
        print(
            "\nVGPUPodProvisioner: kernels as Kubernetes pods (provisioner_name vgpu-pod-provisioner; docs/kubernetes.md)."
        )
        print("Set like VGPUProvisioner: in the kernelspec's config, or c.VGPUPodProvisioner.* for the server.\n")
        print(own_options_help(VGPUPodProvisioner))


class PodManifestApp(_StrictOptions):
    name = "jupyter-vgpu-pod-manifest"
    version = __version__
    description = (
        "Print, as YAML, the Pod and Secret (key and credential redacted) that a pod kernel start would "
        "create with the current configuration (jupyter_server_config, the kernelspec), without a cluster. "
        "The kernel image: --image IMAGE here, or VGPUPodProvisioner.image in the kernelspec's config or "
        "jupyter_server_config.py. Any other pod option is set on the command line by its full name, "
        "--VGPUPodProvisioner.NAME=VALUE (`jupyter vgpu config` lists them)."
    )
    # traitlets strips, then dedents: every line starts at the margin
    examples = """
jupyter vgpu pod-manifest --image registry.example.org/kernels/torch:2.5 --memory 8GiB --cores 30
jupyter vgpu pod-manifest --kernel python3-vgpu-pod
jupyter vgpu pod-manifest --image IMAGE --VGPUPodProvisioner.namespace=students
"""
    image = Unicode(
        "",
        config=True,
        help="The kernel image (VGPUPodProvisioner.image): Python with ipykernel, and jupyter-vgpu for in-pod "
        "slices. Empty: the kernelspec's, else the server's config.",
    )
    kernel = Unicode(
        "",
        config=True,
        help="A pod kernelspec (vgpu-pod-provisioner) whose config to use. Empty: the server's config only.",
    )
    memory = Unicode(
        "",
        config=True,
        help="Memory cap of the slice, as the start would ask for it. Empty: the kernelspec's, else the server's default.",
    )
    cores = Unicode("", config=True, help="SM share in percent. Empty: the kernelspec's, else the server's default.")
    policy = Unicode("", config=True, help="hard or burst. Empty: the kernelspec's, else the server's default.")
    aliases = _aliases("PodManifestApp", "kernel", "image", "memory", "cores", "policy")

    def start(self) -> None:
        import uuid

        import yaml
        from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
        from jupyter_core.paths import jupyter_config_path

        from jupyter_vgpu.pods.manifest import ManifestError
        from jupyter_vgpu.provisioning.pod import POD_PROVISIONER_NAME, VGPUPodProvisioner
        from jupyter_vgpu.server.app import VGPUApp

        # The options a server would start pod kernels with: its config files, then the kernelspec.
        Application.load_config_file(self, "jupyter_server_config", path=jupyter_config_path())
        self.update_config(self.cli_config)  # this command's own options win over the files
        configured: dict[str, Any] = {}
        if self.kernel:
            try:
                spec = KernelSpecManager().get_kernel_spec(self.kernel)
            except NoSuchKernel:
                self._fail(f"no kernelspec named {self.kernel!r}")
            provisioner = spec.metadata.get("kernel_provisioner", {})
            if provisioner.get("provisioner_name") != POD_PROVISIONER_NAME:
                self._fail(
                    f"kernelspec {self.kernel!r} does not start pod kernels (its provisioner is {provisioner.get('provisioner_name') or 'the default'})"
                )
            configured = dict(provisioner.get("config", {}))
        if self.image.strip():  # the command line wins over the kernelspec and the files
            configured["image"] = self.image.strip()
        try:
            provisioner = VGPUPodProvisioner(config=self.config, kernel_id=str(uuid.uuid4()), **configured)
            server = VGPUApp(config=self.config)
            defaults = SliceLimits(parse_size(server.default_memory), server.default_cores, server.default_policy)
            size = {"memory": self.memory, "cores": self.cores, "policy": self.policy}
            limits = decide_limits(defaults, {k: configured.get(k, "") for k in size}, size)
            limits.check_within(server.largest_slice)  # as the server's ledger would refuse the start
            manifests = provisioner.planned_manifests(limits, kernel_name=self.kernel)
        except (ManifestError, SliceValueError, TraitError) as error:
            self._fail(str(error))
        print(
            f"# What a start of kernel {provisioner.kernel_id} would create ({limits.describe()}); no cluster was contacted."
        )
        print(yaml.safe_dump_all(manifests, sort_keys=False), end="")

    def _fail(self, message: str) -> None:
        print(f"jupyter vgpu pod-manifest: {message}", file=sys.stderr)
        self.exit(2)


class BrokerApp(_StrictOptions):
    name = "jupyter-vgpu-broker"
    version = __version__
    description = (
        "The node's GPU ledger for a JupyterHub's users, run by the hub as a managed service "
        "(jupyter_vgpu.hub.configure(c, 'classroom.yaml') in jupyterhub_config.py adds it)."
    )
    classroom = Unicode("", config=True, help="The classroom file (YAML) the hub was configured with.")
    reconcile_interval = Float(
        30.0,
        config=True,
        help="Seconds between asking the hub which users still run a server (others' slices are given back).",
    )
    aliases = _aliases("BrokerApp", "classroom", "reconcile_interval")

    def start(self) -> None:
        if not self.classroom:
            print("jupyter vgpu broker: --classroom FILE is required (the hub's classroom file)", file=sys.stderr)
            self.exit(2)
        import logging

        from jupyter_vgpu.hub.broker import run

        level = self.log_level  # traitlets' Enum of level numbers and names
        assert isinstance(level, (int, str)), level
        logging.basicConfig(level=level, format="[%(levelname)1.1s %(asctime)s %(name)s] %(message)s")
        self.exit(run(self.classroom, reconcile_interval=self.reconcile_interval))


class HubProfilesApp(_StrictOptions):
    name = "jupyter-vgpu-hub-profiles"
    version = __version__
    description = "Print, as JSON, the KubeSpawner profile_list a classroom file makes (all sizes, or a group's)."
    config_file_name = Unicode("", config=True, help="The classroom file (YAML).")
    groups = List(Unicode(), config=True, help="Only the sizes these JupyterHub groups may pick. Empty: every size.")
    aliases = _aliases("HubProfilesApp", "config=config_file_name", "group=groups")

    def start(self) -> None:
        from jupyter_vgpu.hub.classroom import ClassroomError, load_classroom
        from jupyter_vgpu.hub.profiles import profile_list

        if not self.config_file_name:
            print("jupyter vgpu hub profiles: --config FILE is required (the classroom file)", file=sys.stderr)
            self.exit(2)
        try:
            classroom = load_classroom(self.config_file_name, hub_groups=None)
        except (ClassroomError, OSError) as error:
            print(f"jupyter vgpu hub profiles: {error}", file=sys.stderr)
            self.exit(2)
        print(json.dumps(profile_list(classroom, self.groups or None), indent=2))


class HubApp(_CommandGroup):
    name = "jupyter-vgpu-hub"
    description = "JupyterHub integration: what a classroom file makes."
    subcommands = {"profiles": (HubProfilesApp, HubProfilesApp.description)}  # noqa: RUF012 -- traitlets' class-level table

    def usage(self) -> str:
        return "jupyter vgpu hub profiles --config FILE  (jupyter vgpu hub profiles --help)"


class VGPUCommand(_CommandGroup):
    name = "jupyter-vgpu"
    description = "GPU slices for Jupyter kernels and any program."
    # Each command in one whole sentence (its --help has the rest).
    subcommands = {  # noqa: RUF012 -- traitlets' class-level table
        "run": (RunApp, "Run a command in a fresh GPU slice and return its exit status."),
        "devices": (DevicesApp, DevicesApp.description),
        "doctor": (DoctorApp, DoctorApp.description),
        "status": (StatusApp, StatusApp.description),
        "resize": (ResizeApp, "Resize a running kernel's slice: its memory cap, SM share or policy."),
        "suspend": (SuspendApp, "Suspend a kernel: its GPU memory moves to host memory and its room is lent."),
        "resume": (ResumeApp, "Resume a suspended kernel: its room on the GPU first, then its memory."),
        "kernelspec": (KernelspecApp, "Install kernelspecs whose kernels start in GPU slices of a given size."),
        "config": (ConfigApp, ConfigApp.description),
        "pod-manifest": (
            PodManifestApp,
            "Print the Pod and Secret a pod kernel's start would create, without a cluster.",
        ),
        "broker": (BrokerApp, "The node's GPU ledger for a JupyterHub's users, which the hub runs as a service."),
        "hub": (HubApp, HubApp.description),
    }

    def usage(self) -> str:
        return "jupyter vgpu {" + ",".join(self.subcommands) + "} ...  (jupyter vgpu COMMAND --help)"


main = VGPUCommand.launch_instance
