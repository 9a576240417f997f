"""``jupyter vgpu``: run programs in slices, list devices, diagnose a machine."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import tempfile

from jupyter_core.application import JupyterApp
from traitlets import Bool, Unicode

from ._version import __version__
from .devices import DeviceError, list_devices, select_device, use_simulator
from .native import NativeLibraryMissing, interposer_path, simulator_dir
from .sandbox import SliceSpec, create_region, region_directory, run_in_slice, slice_environment
from .sizes import SliceValueError, format_size, parse_policy, parse_size, parse_sm_share


class UsageError(Exception):
    """Bad command-line input: printed as one line, exit status 2, nothing started."""


class _VGPUSubcommand(JupyterApp):
    version = __version__
    simulate = Bool(False, config=True, help="Use the simulated GPU instead of the machine's driver.")
    flags = {"simulate": ({"_VGPUSubcommand": {"simulate": True}}, simulate.help)}

    def start(self) -> None:
        try:
            self.exit(self.run() or 0)
        except UsageError as error:
            print(f"jupyter vgpu {self.name.split('-')[-1]}: {error}", file=sys.stderr)
            self.exit(2)
        except (DeviceError, NativeLibraryMissing, FileNotFoundError) as error:
            print(f"jupyter vgpu {self.name.split('-')[-1]}: {error}", file=sys.stderr)
            self.exit(1)

    def run(self) -> int:
        raise NotImplementedError

    def devices(self):
        if self.simulate:
            use_simulator()
        return list_devices()


class RunApp(_VGPUSubcommand):
    name = "jupyter-vgpu-run"
    description = """Run COMMAND inside a fresh GPU slice and return its exit status.

    Every process COMMAND starts counts against the same slice. Over its memory cap a program
    gets CUDA_ERROR_OUT_OF_MEMORY (frameworks raise their own out-of-memory error) and one line
    on stderr naming the cap."""
    examples = """
    jupyter vgpu run --memory 4GiB --cores 30 -- python train.py
    jupyter vgpu run --simulate --memory 512MiB -- python -c "import pynvml; ..."
    """

    memory = Unicode("", config=True, help="Memory cap: 512MiB, 4GiB, 4G or a bare number of MiB. Empty: no cap.")
    cores = Unicode("100", config=True, help="SM share in percent, 1..100.")
    policy = Unicode("hard", config=True, help="hard: never above the SM share; burst: may use idle SMs.")
    device = Unicode("0", config=True, help="The GPU: an index or a UUID (GPU-...).")

    aliases = {
        "memory": "RunApp.memory",
        "cores": "RunApp.cores",
        "policy": "RunApp.policy",
        "device": "RunApp.device",
    }
    flags = {"simulate": ({"RunApp": {"simulate": True}}, _VGPUSubcommand.simulate.help)}

    def spec(self) -> SliceSpec:
        try:
            return SliceSpec(
                memory_limit=parse_size(self.memory) if self.memory else 0,
                sm_share=parse_sm_share(self.cores),
                policy=parse_policy(self.policy),
            )
        except SliceValueError as error:
            raise UsageError(error) from None

    def run(self) -> int:
        spec = self.spec()  # refuse bad values before anything starts
        if not self.extra_args:
            raise UsageError("no command given; usage: jupyter vgpu run [options] -- COMMAND ARGS...")
        device = select_device(self.devices(), self.device)
        return run_in_slice(self.extra_args, spec, device, simulate=self.simulate)


class DevicesApp(_VGPUSubcommand):
    name = "jupyter-vgpu-devices"
    description = "List the GPUs NVML reports (or the simulated ones with --simulate)."
    flags = {"simulate": ({"DevicesApp": {"simulate": True}}, _VGPUSubcommand.simulate.help)}

    def run(self) -> int:
        devices = self.devices()
        print(f"{'IDX':<4}{'NAME':<34}{'UUID':<42}{'MEMORY':>10}{'USED':>10}{'SMS':>6}")
        for device in devices:
            print(
                f"{device.index:<4}{device.name[:33]:<34}{device.uuid:<42}"
                f"{format_size(device.memory_total):>10}{format_size(device.memory_used):>10}{device.sm_count:>6}"
            )
        return 0


class DoctorApp(_VGPUSubcommand):
    name = "jupyter-vgpu-doctor"
    description = "Check what a slice needs on this machine and say what would stop one from working."
    flags = {"simulate": ({"DoctorApp": {"simulate": True}}, _VGPUSubcommand.simulate.help)}

    def run(self) -> int:
        problems = 0

        def report(ok: bool, what: str, detail: str) -> None:
            nonlocal problems
            problems += not ok
            print(f"[{'ok' if ok else 'FAIL'}] {what}: {detail}")

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

        try:
            directory = region_directory()
            probe = tempfile.NamedTemporaryFile(dir=directory)
            probe.close()
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
        report(bool(devices), "devices", ", ".join(f"{d.index}: {d.name} {format_size(d.memory_total)}" for d in devices) or "none")
        if not devices:
            return 1

        # A real process under the interposer, in a real slice: must start, print nothing extra, and see the cap.
        probe_limit = 256 << 20
        region = create_region(SliceSpec(memory_limit=probe_limit), devices[0])
        try:
            env = slice_environment(region, simulate=self.simulate)
            code = (
                "import ctypes; cuda = ctypes.CDLL('libcuda.so.1'); cuda.cuInit(0); "
                "d = ctypes.c_int(); cuda.cuDeviceGet(ctypes.byref(d), 0); c = ctypes.c_void_p(); "
                "cuda.cuDevicePrimaryCtxRetain(ctypes.byref(c), d); cuda.cuCtxSetCurrent(c); "
                "f, t = ctypes.c_size_t(), ctypes.c_size_t(); "
                "r = cuda.cuMemGetInfo_v2(ctypes.byref(f), ctypes.byref(t)); print(r, t.value)"
            )
            result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
            seen = result.stdout.split()
            sees_cap = result.returncode == 0 and seen == ["0", str(probe_limit)]
            report(
                sees_cap,
                "slice",
                "a process in a 256MiB slice sees a 256MiB GPU"
                if sees_cap
                else f"a process in a 256MiB slice saw {result.stdout.strip() or 'nothing'} {result.stderr.strip()}",
            )
        finally:
            region.close()
            region.path.unlink(missing_ok=True)

        if os.environ.get("LD_PRELOAD"):
            print(f"[note] LD_PRELOAD is already set here ({os.environ['LD_PRELOAD']}); slices add libvgpu.so in front of it")
        print(
            "[note] LD_PRELOAD enforcement holds for cooperative code in this Unix account; see README "
            "'Honest limits' for the modes that hold against a hostile user."
        )
        print("no problems found" if problems == 0 else f"{problems} problem(s) found")
        return 0 if problems == 0 else 1


class VGPUCommand(JupyterApp):
    name = "jupyter-vgpu"
    version = __version__
    description = "GPU slices for Jupyter kernels and any program."
    subcommands = {
        "run": (RunApp, RunApp.description.splitlines()[0]),
        "devices": (DevicesApp, DevicesApp.description),
        "doctor": (DoctorApp, DoctorApp.description),
    }

    def start(self) -> None:
        if self.subapp is None:
            print("usage: jupyter vgpu {" + ",".join(self.subcommands) + "} ...  (jupyter vgpu COMMAND --help)", file=sys.stderr)
            self.exit(2)
        super().start()


main = VGPUCommand.launch_instance
