"""The server extension: configuration, the ledger and slice manager, the REST handlers."""

from __future__ import annotations

from pathlib import Path

from jupyter_core.paths import jupyter_runtime_dir
from jupyter_server.extension.application import ExtensionApp
from tornado.ioloop import PeriodicCallback
from traitlets import Bool, Float, Int, List, TraitError, Unicode, validate

from jupyter_vgpu.model.devices import DeviceError, list_devices, use_simulator
from jupyter_vgpu.server.handlers import HANDLERS
from jupyter_vgpu.ledger.embedded import DeviceCapacity, Ledger, SliceRequest
from jupyter_vgpu.model.sizes import SliceValueError, parse_policy, parse_size, parse_sm_share, select_device
from jupyter_vgpu.manager import SliceManager


def _size_or_none(value: str) -> int | None:
    return parse_size(value) if value.strip() else None


class VGPUApp(ExtensionApp):
    name = "jupyter_vgpu"
    description = "GPU slices for Jupyter kernels."

    simulate = Bool(False, config=True, help="Use the simulated GPU (for trying jupyter-vgpu without one).")
    devices = List(Unicode(), config=True, help="GPUs slices may use, by index or UUID. Empty: every GPU NVML reports.")
    reserve = Unicode("0", config=True, help="Memory kept free on each GPU (not given to slices): a size like 1GiB, or 0.")
    default_memory = Unicode("4GiB", config=True, help="Memory cap of a slice when a kernel asks for none.")
    default_cores = Int(100, config=True, help="SM share (percent) of a slice when a kernel asks for none.")
    default_policy = Unicode("hard", config=True, help="SM policy of a slice when a kernel asks for none: hard or burst.")
    max_memory = Unicode("", config=True, help="Largest memory cap one slice may have. Empty: a whole GPU.")
    max_cores = Int(100, config=True, help="Largest SM share one slice may have, in percent.")
    server_memory_limit = Unicode("", config=True, help="Memory all slices of this server may hold together. Empty: no limit.")
    server_slice_limit = Int(0, config=True, help="Number of slices this server may hold at once. 0: no limit.")
    burst_oversubscription = Float(1.0, config=True, help="Burst slices' shares may add up to this many times 100% per GPU (>= 1.0).")
    placement = Unicode("binpack", config=True, help="Where new slices go: binpack (fill a GPU first) or spread (even out).")
    region_dir = Unicode("", config=True, help="Folder of slice region files. Empty: <jupyter runtime dir>/vgpu.")
    ledger_path = Unicode("", config=True, help="SQLite file of the GPU ledger. Empty: <jupyter runtime dir>/vgpu/ledger.sqlite.")
    watch_interval = Float(0.5, config=True, help="Seconds between checks for kernels that died, whose slices are then released.")

    @validate("reserve", "default_memory", "max_memory", "server_memory_limit")
    def _valid_size(self, proposal):
        value = proposal["value"]
        if value.strip() in ("", "0") and proposal["trait"].name != "default_memory":
            return value
        try:
            parse_size(value)
        except SliceValueError as error:
            raise TraitError(f"VGPUApp.{proposal['trait'].name}: {error}") from None
        return value

    @validate("default_cores", "max_cores")
    def _valid_share(self, proposal):
        try:
            return parse_sm_share(proposal["value"])
        except SliceValueError as error:
            raise TraitError(f"VGPUApp.{proposal['trait'].name}: {error}") from None

    @validate("default_policy")
    def _valid_policy(self, proposal):
        try:
            return parse_policy(proposal["value"])
        except SliceValueError as error:
            raise TraitError(f"VGPUApp.default_policy: {error}") from None

    @validate("placement")
    def _valid_placement(self, proposal):
        if proposal["value"] not in ("binpack", "spread"):
            raise TraitError(f"VGPUApp.placement {proposal['value']!r} is not binpack or spread")
        return proposal["value"]

    @validate("burst_oversubscription")
    def _valid_oversubscription(self, proposal):
        if proposal["value"] < 1.0:
            raise TraitError("VGPUApp.burst_oversubscription must be 1.0 or more")
        return proposal["value"]

    def _runtime_path(self, configured: str, default: str) -> Path:
        return Path(configured) if configured else Path(jupyter_runtime_dir()) / "vgpu" / default

    def initialize_settings(self) -> None:
        if self.simulate:
            use_simulator()
        try:
            found = list_devices()
            chosen = [select_device(found, selector) for selector in self.devices] if self.devices else found
        except (DeviceError, SliceValueError) as error:
            raise SystemExit(f"jupyter_vgpu: {error}") from None
        max_slice = None
        if self.max_memory.strip():
            max_slice = SliceRequest(parse_size(self.max_memory), self.max_cores)
        ledger = Ledger(
            self._runtime_path(self.ledger_path, "ledger.sqlite"),
            [DeviceCapacity(d.uuid, d.index, d.name, d.memory_total, d.sm_count) for d in chosen],
            reserve=0 if self.reserve.strip() in ("", "0") else parse_size(self.reserve),
            burst_oversubscription=self.burst_oversubscription,
            placement=self.placement,
            max_slice=max_slice,
            server_memory_limit=_size_or_none(self.server_memory_limit),
            server_slice_limit=self.server_slice_limit or None,
        )
        manager = SliceManager(
            ledger, chosen, self._runtime_path(self.region_dir, "regions"), self.simulate, parent=self
        )
        for released in manager.reconcile():
            self.log.info("released the slice of kernel %s, which did not survive the last server", released.kernel_id)
        manager.make_current()
        self.settings["vgpu_slice_manager"] = manager
        self._watcher = PeriodicCallback(self._release_dead_kernels, self.watch_interval * 1000)
        self._watcher.start()
        self.log.info(
            "jupyter_vgpu: %d GPU(s)%s: %s",
            len(chosen),
            " (simulated)" if self.simulate else "",
            ", ".join(f"{d.index} {d.name}" for d in chosen),
        )

    def _release_dead_kernels(self) -> None:
        """A kernel whose process died and that its kernel manager will not restart frees its slice."""
        manager: SliceManager = self.settings["vgpu_slice_manager"]
        kernel_manager = self.serverapp.kernel_manager
        starting = getattr(kernel_manager, "_pending_kernels", {})
        for allocation in manager.ledger.allocations():
            if allocation.kernel_id not in kernel_manager and allocation.kernel_id not in starting:
                manager.release(allocation.kernel_id)

    def initialize_handlers(self) -> None:
        self.handlers.extend(HANDLERS)

    async def stop_extension(self) -> None:
        watcher = getattr(self, "_watcher", None)
        if watcher is not None:
            watcher.stop()
