"""``jupyter vgpu run`` and ``jupyter vgpu devices``: programs in slices of this machine's GPUs."""

from __future__ import annotations

import getpass
import os
import shlex
import sys
import uuid
from pathlib import Path

from traitlets import Unicode

from jupyter_vgpu.cli.base import UsageError, _aliases, _GPUCommand
from jupyter_vgpu.model import (
    FULL_SHARE,
    NOTEBOOK_DEFAULTS,
    SliceLimits,
    SliceValueError,
    format_size,
    parse_policy,
    parse_size,
    parse_sm_share,
    select_device,
)


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
