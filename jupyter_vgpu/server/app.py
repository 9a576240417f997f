"""The server extension: configuration, the ledger, holders and slice manager, the REST handlers."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from jupyter_core.paths import jupyter_runtime_dir
from jupyter_core.utils import ensure_async
from jupyter_server.extension.application import ExtensionApp
from jupyter_server.serverapp import ServerApp
from tornado.ioloop import PeriodicCallback
from traitlets import Bool, Float, Int, List, TraitError, Unicode, validate

from jupyter_vgpu.holders import LocalHolder, PodHolder
from jupyter_vgpu.holders.device_memory import DeviceMemoryReader
from jupyter_vgpu.holders.local import default_region_dir, private_file, private_folder
from jupyter_vgpu.holders.pod import PodScope
from jupyter_vgpu.ledger import EmbeddedLedger, Ledger, LedgerError
from jupyter_vgpu.ledger.policy import ROOM_HOLD_S
from jupyter_vgpu.ledger.remote import RemoteLedger
from jupyter_vgpu.manager import ADOPTED_KEY, SliceManager, SliceStatus
from jupyter_vgpu.model import (
    NOTEBOOK_DEFAULTS,
    DeviceError,
    SliceLimits,
    SliceValueError,
    format_size,
    list_devices,
    parse_policy,
    parse_size,
    parse_sm_share,
    select_device,
    use_simulator,
)
from jupyter_vgpu.pods.cluster import default_namespace
from jupyter_vgpu.provisioning.base import HUB_TOKEN_VARIABLES, MANAGER_SETTING
from jupyter_vgpu.provisioning.pod import POD_PROVISIONER_NAME, VGPUPodProvisioner, default_owner, new_server_instance
from jupyter_vgpu.provisioning.waiting import WAITING_STARTS_SETTING, WaitingStarts
from jupyter_vgpu.server.adopt import adopt_survivors, start_waiting_starts_again, this_server
from jupyter_vgpu.server.errors import StartRefusalLog, VGPUHTTPError, refusal_for_http
from jupyter_vgpu.server.handlers import HANDLERS
from jupyter_vgpu.server.idle import IDLE_SETTING, IdleKernels
from jupyter_vgpu.server.room import RoomForOthers
from jupyter_vgpu.server.suspend import SUSPEND_LOCK_TIMEOUT_SETTING, SUSPEND_SETTING, SuspendedKernels


def _half_the_ram() -> int:
    """The default cap on suspended kernels' host memory: half of this machine's RAM."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


def _size_or_none(value: str) -> int | None:
    return parse_size(value) if value.strip() else None


Parsed = TypeVar("Parsed")


def _parsed(proposal: Any, parse: Callable[[Any], Parsed]) -> Parsed:
    """A traitlets proposal's value read by one of the model's parsers; a value it refuses is a
    TraitError that names the option and says what is accepted."""
    try:
        return parse(proposal["value"])
    except SliceValueError as error:
        raise TraitError(f"VGPUApp.{proposal['trait'].name}: {error}") from None


# What a hub's spawner may set for a single-user server (jupyter_vgpu.hub): each variable,
# JUPYTER_VGPU_<TRAIT>, is the default of the trait of that name, below any config file or
# command line. The one place this extension reads its configuration from the environment.
ENVIRONMENT_TRAITS = (
    "broker_url",
    "broker_limits_dir",
    "simulate",
    "default_memory",
    "default_cores",
    "default_policy",
    "max_cores",
    "server_memory_limit",
    "server_slice_limit",
    "idle_lower_after",
    "idle_floor_cores",
    "idle_cull_after",
    "idle_suspend_after",
    "suspend_host_memory",
    "kernel_survival",
    "room_hold",
)


def environment_variable(trait: str) -> str:
    return f"JUPYTER_VGPU_{trait.upper()}"


class VGPUApp(ExtensionApp):
    name = "jupyter_vgpu"
    _ledger_unavailable = False
    # With a broker and idle suspending on: activity reports and the broker's suspend requests.
    _room_for_others: RoomForOthers | None = None
    # The tasks that learn what adopted kernels running a cell do (server/adopt.py), until the cell ends.
    _learning: set[asyncio.Task[str | None]] | None = None
    _over_cap_since: dict[str, float] = {}  # noqa: RUF012 -- replaced, never mutated: kernel id -> monotonic time first seen over its cap
    description = "GPU slices for Jupyter kernels."

    simulate = Bool(False, config=True, help="Use the simulated GPU (for trying jupyter-vgpu without one).")
    devices = List(Unicode(), config=True, help="GPUs slices may use, by index or UUID. Empty: every GPU NVML reports.")
    reserve = Unicode(
        "0", config=True, help="Memory kept free on each GPU (not given to slices): a size like 1GiB, or 0."
    )
    default_memory = Unicode(
        format_size(NOTEBOOK_DEFAULTS.memory_limit),
        config=True,
        help="Memory cap of a slice when neither the start request nor the kernelspec sets one.",
    )
    default_cores = Int(
        NOTEBOOK_DEFAULTS.sm_share,
        config=True,
        help="SM share (percent) of a slice when neither the start request nor the kernelspec sets one. "
        "With the default burst policy it is what a kernel is guaranteed while others use the GPU; "
        "alone on it, a kernel uses every SM.",
    )
    default_policy = Unicode(
        NOTEBOOK_DEFAULTS.policy,
        config=True,
        help="SM policy of a slice (hard or burst) when neither the start request nor the kernelspec sets one.",
    )
    max_memory = Unicode("", config=True, help="Largest memory cap one slice may have. Empty: a whole GPU.")
    max_cores = Int(100, config=True, help="Largest SM share one slice may have, in percent.")
    server_memory_limit = Unicode(
        "", config=True, help="Memory all slices of this server may hold together. Empty: no limit."
    )
    server_slice_limit = Int(0, config=True, help="Number of slices this server may hold at once. 0: no limit.")
    burst_oversubscription = Float(
        1.0, config=True, help="Burst slices' shares may add up to this many times 100% per GPU (>= 1.0)."
    )
    placement = Unicode(
        "binpack", config=True, help="Where new slices go: binpack (fill a GPU first) or spread (even out)."
    )
    region_dir = Unicode(
        "", config=True, help="Folder of slice region files. Empty: <jupyter runtime dir>/vgpu/regions."
    )
    ledger_path = Unicode(
        "", config=True, help="SQLite file of the GPU ledger. Empty: <jupyter runtime dir>/vgpu/ledger.sqlite."
    )
    local_gpus = Bool(
        True,
        config=True,
        help="Whether this machine's GPUs hold slices. False for a server without GPUs that starts only pod kernels (vgpu-pod-provisioner).",
    )
    watch_interval = Float(
        0.5, config=True, help="Seconds between checks for kernels that died, whose slices are then released."
    )
    over_cap_action = Unicode(
        "flag",
        config=True,
        help="What the server does about a kernel that rewrote its own limits and still holds GPU memory past its "
        "cap after the server put the cap back (memory it allocated meanwhile; the server cannot take it back): "
        "flag (keep the slice flagged; the excess is never promised to another slice) or stop (also stop the "
        "kernel once it has held the excess for over_cap_grace seconds, freeing it).",
    )
    over_cap_grace = Float(
        60.0,
        config=True,
        help="Seconds a kernel may hold memory past its cap (after rewriting its limits) before over_cap_action "
        "stop stops it: time to free it, e.g. torch.cuda.empty_cache().",
    )

    @validate("over_cap_action")
    def _valid_over_cap_action(self, proposal):
        if proposal["value"] not in ("flag", "stop"):
            raise TraitError(f"VGPUApp.over_cap_action must be flag or stop, not {proposal['value']!r}")
        return proposal["value"]

    @validate("over_cap_grace")
    def _valid_over_cap_grace(self, proposal):
        if not 0 <= proposal["value"] < float("inf"):
            raise TraitError(
                f"VGPUApp.over_cap_grace must be a number of seconds, 0 or more, not {proposal['value']!r}"
            )
        return proposal["value"]

    broker_url = Unicode(
        "",
        config=True,
        help="The node's GPU broker (a JupyterHub service, `jupyter vgpu broker`), e.g. "
        "http://127.0.0.1:10101/services/vgpu/: slices are decided there, against every user's slices on the node "
        "and this user's budget. Empty: this server's own ledger (ledger_path). A hub sets it through "
        "$JUPYTER_VGPU_BROKER_URL.",
    )
    broker_token = Unicode(
        "",
        config=True,
        help="Token this server presents to the broker. Empty: $JUPYTERHUB_API_TOKEN, the server's own hub token.",
    )
    broker_limits_dir = Unicode(
        "",
        config=True,
        help="Folder in which the node's broker publishes each slice's limits page, under the broker's own account: "
        "this server's kernels then obey the broker's page, which they can read but not write, and the server "
        "publishes no limits of its own. Empty: the server publishes them beside each region. A hub sets it "
        "through $JUPYTER_VGPU_BROKER_LIMITS_DIR.",
    )

    idle_lower_after = Float(
        0.0,
        config=True,
        help="Seconds a kernel may go without running code before its SM share is lowered to "
        "idle_floor_cores; it gets its share back when it runs again (if that still fits). 0: never. "
        "A hub sets it through $JUPYTER_VGPU_IDLE_LOWER_AFTER.",
    )
    idle_floor_cores = Int(
        5,
        config=True,
        help="SM share (percent) an idle kernel's slice is lowered to after idle_lower_after.",
    )
    idle_cull_after = Float(
        0.0,
        config=True,
        help="Seconds a kernel may go without running code before it is stopped, freeing its GPU "
        "memory; the notebook is told why (GET /api/vgpu/notices). 0: never. A hub sets it through "
        "$JUPYTER_VGPU_IDLE_CULL_AFTER.",
    )

    idle_suspend_after = Float(
        0.0,
        config=True,
        help="Seconds a kernel may go without running code before it is suspended: its GPU memory moves to "
        "host memory (the CUDA driver's checkpoint API, r570+), its slice's room is lent to other kernels, and "
        "its next cell takes it back. Between idle_lower_after and idle_cull_after. A kernel that "
        "cannot be suspended (managed memory, MIG, MPS, several GPUs, an older driver; its notice says why) is "
        "lowered and culled as before. 0: never. A hub sets it through $JUPYTER_VGPU_IDLE_SUSPEND_AFTER.",
    )
    suspend_host_memory = Unicode(
        "",
        config=True,
        help="Host memory all suspended kernels of this server may hold together (a size: 64GiB). Past it an "
        "idle kernel is not suspended (its notice says so) and is culled after idle_cull_after instead. Empty: "
        "half of this machine's RAM. A hub sets it through $JUPYTER_VGPU_SUSPEND_HOST_MEMORY.",
    )

    suspend_lock_timeout = Float(
        5.0,
        config=True,
        help="Seconds each process of a kernel being suspended (to host memory) may take to "
        "finish its GPU work; a kernel whose process does not stop in time is left running and the suspend "
        "refused (409), saying which process.",
    )
    suspend_release_wait = Float(
        2.0,
        config=True,
        help="Seconds a suspend waits for the kernel's processes to give back the device memory they keep "
        "cached but do not use (the driver's stream-ordered pools trimmed by libvgpu.so, PyTorch's and CuPy's "
        "caches emptied where the kernel loaded them) before its memory moves to host memory; what they have "
        "not given back by then moves too. 0: nothing is asked.",
    )
    pending_kernels = Bool(
        True,
        config=True,
        help="Answer kernel starts at once (jupyter_client's pending kernels, "
        "MultiKernelManager.use_pending_kernels) while a start that does not fit waits in the line for its GPU "
        "room: JupyterLab opens the notebook and its kernel shows as starting, with its place in line, until it "
        "has room. False: POST /api/kernels and /api/sessions answer only once the kernel has started.",
    )
    room_hold = Float(
        ROOM_HOLD_S,
        config=True,
        help="Seconds after a kernel got its GPU room (its start was admitted, or it resumed) during which "
        "making room for another start, resume or resize does not suspend or lend it again, so that two kernels "
        "do not take the room from each other back and forth; a request that only such kernels could make room "
        "for waits in line meanwhile. A classroom's borrowed room is taken back regardless. 0: no hold. A hub sets it "
        "through $JUPYTER_VGPU_ROOM_HOLD (the classroom's idle.room_hold).",
    )
    room_wait = Float(
        30.0,
        config=True,
        help="No longer used, kept so that configurations that set it still load: a resize that does not fit "
        "waits in the line now, as a kernel start or a resume does, as long as it takes.",
    )

    kernel_survival = Float(
        600.0,
        config=True,
        help="Seconds a sliced kernel outlives its server (killed, crashed, or restarted for an upgrade), running "
        "or suspended, with its variables and GPU memory, for a restarted server to adopt it: the notebook then "
        "reconnects to it. One nobody adopts in that time ends, and the next server frees its slice. Set when "
        "the kernel starts (a kernel keeps the value of the server that started it). 0: a kernel ends with its "
        "server, as ipykernel's do; always 0 with a node's broker (broker_url), which gives back the slices of a "
        "server that is gone. A hub sets it through $JUPYTER_VGPU_KERNEL_SURVIVAL.",
    )

    @validate(
        "idle_lower_after",
        "idle_cull_after",
        "idle_suspend_after",
        "suspend_lock_timeout",
        "suspend_release_wait",
        "room_wait",
        "kernel_survival",
    )
    def _valid_idle_time(self, proposal):
        value = proposal["value"]
        if not 0 <= value < float("inf"):
            raise TraitError(
                f"VGPUApp.{proposal['trait'].name} must be a number of seconds, 0 (never) or more, not {value!r}"
            )
        return value

    @validate("broker_url")
    def _valid_broker_url(self, proposal):
        value = proposal["value"].strip()
        parts = urlsplit(value)
        if value and (parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment):
            raise TraitError(
                f"VGPUApp.broker_url must be an http:// or https:// URL with a host (the broker's service URL), "
                f"not {value!r}"
            )
        return value

    @validate("reserve", "default_memory", "max_memory", "server_memory_limit", "suspend_host_memory")
    def _valid_size(self, proposal):
        value = proposal["value"]
        if value.strip() in ("", "0") and proposal["trait"].name != "default_memory":
            return value
        _parsed(proposal, parse_size)  # the option stays text: it is read where it is used
        return value

    @validate("default_cores", "max_cores", "idle_floor_cores")
    def _valid_share(self, proposal):
        return _parsed(proposal, parse_sm_share)

    @validate("default_policy")
    def _valid_policy(self, proposal):
        return _parsed(proposal, parse_policy)

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

    def _take_environment(self) -> None:
        configured = self.config.get(type(self).__name__, {})
        for trait in ENVIRONMENT_TRAITS:
            value = os.environ.get(environment_variable(trait))
            if value is None or trait in configured:
                continue
            try:
                setattr(self, trait, self.traits()[trait].from_string(value))
            except (TraitError, ValueError) as error:
                raise SystemExit(f"jupyter_vgpu: ${environment_variable(trait)}={value!r}: {error}") from None

    def _ledger(self, devices, max_slice: SliceLimits | None) -> Ledger:
        if self.broker_url:
            token = self.broker_token or next(filter(None, map(os.environ.get, HUB_TOKEN_VARIABLES)), "")
            if not token:
                raise SystemExit(
                    f"jupyter_vgpu: VGPUApp.broker_url is {self.broker_url} but this server has no token for it: "
                    "set VGPUApp.broker_token, or run it under JupyterHub (which sets $JUPYTERHUB_API_TOKEN)"
                )
            return RemoteLedger(self.broker_url.rstrip("/") + "/ledger", token, name="the node's GPU broker")
        ledger_path = (
            Path(self.ledger_path) if self.ledger_path else Path(jupyter_runtime_dir()) / "vgpu" / "ledger.sqlite"
        )
        private_folder(ledger_path.parent)
        return EmbeddedLedger(
            ledger_path,
            devices,
            reserve=0 if self.reserve.strip() in ("", "0") else parse_size(self.reserve),
            burst_oversubscription=self.burst_oversubscription,
            placement=self.placement,
            max_slice=max_slice,
            server_memory_limit=_size_or_none(self.server_memory_limit),
            server_slice_limit=self.server_slice_limit or None,
        )

    @property
    def largest_slice(self) -> SliceLimits | None:
        """The largest slice one kernel may have here (max_memory and max_cores); None: any."""
        return SliceLimits(parse_size(self.max_memory), self.max_cores) if self.max_memory.strip() else None

    def initialize_settings(self) -> None:
        log = self._server.log
        if not any(isinstance(existing, StartRefusalLog) for existing in log.filters):
            log.addFilter(StartRefusalLog())
        self._take_environment()
        if self.simulate:
            use_simulator()
        try:
            found = list_devices() if self.local_gpus else []
            chosen = [select_device(found, selector) for selector in self.devices] if self.devices else found
        except (DeviceError, SliceValueError) as error:
            raise SystemExit(
                f"jupyter_vgpu: {error}. A server that starts only pod kernels needs no GPU: set VGPUApp.local_gpus = False"
            ) from None
        max_slice = self.largest_slice
        ledger = self._ledger(chosen, max_slice)
        local_holder = LocalHolder(
            Path(self.region_dir) if self.region_dir else default_region_dir(),
            simulate=self.simulate,
            limits_dir=Path(self.broker_limits_dir) if self.broker_limits_dir else None,
        )
        if isinstance(ledger, EmbeddedLedger) and chosen:
            # Decisions count what the GPUs really hold beyond the slices (a broker reads its own).
            ledger.reader = DeviceMemoryReader(local_holder.known_processes)
        manager = SliceManager(
            ledger,
            [local_holder, PodHolder(new_server_instance(), self._pod_scopes(), log=self.log)],
            SliceLimits(parse_size(self.default_memory), self.default_cores, self.default_policy),
            start_error=refusal_for_http,
            parent=self,
        )
        # A node's broker gives back the slices of a user whose server is gone (it asks the hub),
        # so a kernel outliving its server there would hold GPU memory outside any slice.
        manager.kernel_survival = 0.0 if self.broker_url else self.kernel_survival
        if self.broker_url and self.kernel_survival:
            self.log.info("jupyter_vgpu: with a node's broker, kernels end with their server (kernel_survival is 0)")
        self._keep_sessions_in_a_file()
        try:
            for released in manager.reconcile():
                self.log.info(
                    "released the slice of kernel %s, which did not survive the last server", released.kernel_id
                )
        except LedgerError as error:
            self.log.warning("jupyter_vgpu: slices of kernels of the last server not reconciled: %s", error)
        self.settings[MANAGER_SETTING] = manager
        if isinstance(ledger, EmbeddedLedger) and manager.kernel_survival > 0:
            # Starts waiting in line outlive the server as its kernels do (provisioning/waiting.py).
            self.settings[WAITING_STARTS_SETTING] = WaitingStarts(ledger.path.with_name("waiting-starts.json"))
        self.settings[SUSPEND_LOCK_TIMEOUT_SETTING] = self.suspend_lock_timeout
        self._start_idle_policy(manager, self._start_suspending(manager))
        self._adopt_survivors(manager)
        self._watcher = PeriodicCallback(self._watch_slices, self.watch_interval * 1000)
        self._watcher.start()
        self.log.info(
            "jupyter_vgpu: %d GPU(s)%s: %s",
            len(chosen),
            " (simulated)" if self.simulate else "",
            ", ".join(f"{d.index} {d.name}" for d in chosen),
        )

    def _keep_sessions_in_a_file(self) -> None:
        """jupyter_server keeps its sessions (which notebook has which kernel) in memory unless
        ``SessionManager.database_filepath`` names a file: kept in one here, unless the user chose,
        so that a restarted server that adopts its predecessor's kernels has their sessions too
        (a row whose kernel is not back is dropped when read, as always). One file per root
        folder: two servers at once over one folder would drop each other's rows."""
        server = self._server
        sessions = server.session_manager
        if "database_filepath" in server.config.get("SessionManager", {}) or not sessions.has_trait(
            "database_filepath"
        ):
            return
        root = hashlib.sha256(os.path.abspath(server.root_dir).encode()).hexdigest()[:16]
        folder = private_folder(Path(jupyter_runtime_dir()) / "vgpu")
        # Which notebook has which kernel: the user's alone, as everything else there (SQLite
        # would make it with the umask's mode, 0644 for most).
        sessions.database_filepath = str(private_file(folder / f"sessions-{root}.sqlite"))

    def _adopt_survivors(self, manager: SliceManager) -> None:
        """Put the kernels the last server left running into jupyter_server's kernel manager
        (server/adopt.py), before the server answers its first request (it binds its port after
        its extensions load), so that no session row is read before its kernel is back."""
        server = self._server
        learning: set[asyncio.Task[str | None]] = set()
        self._learning = learning
        waiting: WaitingStarts | None = self.settings.get(WAITING_STARTS_SETTING)

        async def adopt() -> None:
            await adopt_survivors(
                manager,
                server.kernel_manager,
                this_server(server.connection_url),
                self.log,
                learning=learning,
            )
            # After the kernels that run: a start waits for the room they hold, not the reverse.
            if waiting is not None:
                # Its provisioner finds the slice manager in the web application's settings,
                # which jupyter_server fills from this extension's only once this method has
                # returned: a start now would find none and run as a kernel without a server.
                server.web_app.settings.update(self.settings)
                await start_waiting_starts_again(waiting, server.kernel_manager, self.log)

        try:
            loop = getattr(server.io_loop, "asyncio_loop", None) or asyncio.get_event_loop()
            if loop.is_running():  # a server started inside a running loop (pytest-jupyter's)
                loop.create_task(adopt())
            else:
                loop.run_until_complete(adopt())
        except LedgerError as error:
            self.log.warning("jupyter_vgpu: kernels of the last server not adopted: %s", error)

    # ExtensionApp's documented hook for work once the server's loop runs (its name is
    # underscored, but jupyter_server's docs say to override it; there is no public one).
    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        """Once the server has its port (it may have taken another than the one asked for), name
        it again beside the kernels it adopted, for their %vgpu."""
        manager: SliceManager | None = self.settings.get(MANAGER_SETTING)
        if manager is None:
            return
        server = this_server(serverapp.connection_url)
        with contextlib.suppress(LedgerError):
            for allocation in manager.ledger.allocations():
                by = allocation.metadata.get(ADOPTED_KEY, {}).get("server", {})
                if isinstance(by, dict) and by.get("pid") == server["pid"] and by != server:
                    manager.adopted(allocation.kernel_id, server)

    @property
    def _server(self) -> ServerApp:
        """The server this extension is loaded into (ExtensionApp's serverapp is None only before
        the server loads it, and everything here runs after)."""
        if self.serverapp is None:
            raise RuntimeError("jupyter_vgpu: VGPUApp is not loaded into a Jupyter server")
        return self.serverapp

    def _start_suspending(self, manager: SliceManager) -> SuspendedKernels:
        """Suspended kernels resumed on demand, idle ones suspended after idle_suspend_after (server/suspend.py)."""
        cap = self.suspend_host_memory.strip()
        suspended = SuspendedKernels(
            manager,
            self._server.kernel_manager,
            suspend_after=self.idle_suspend_after,
            lock_timeout=self.suspend_lock_timeout,
            host_memory_cap=parse_size(cap) if cap not in ("", "0") else _half_the_ram(),
            hold=self.room_hold,
            log=self.log,
            sessions=self._server.session_manager,
        )
        self.settings[SUSPEND_SETTING] = suspended
        manager.release_wait = self.suspend_release_wait
        # A start, resume or resize that does not fit lends the room of idle kernels that have not
        # used the GPU, then suspends idle kernels (losslessly), whatever the idle timers say.
        manager.room_maker = suspended.make_room
        manager.line.published = suspended.show_place
        manager.line.estimate = suspended.estimate
        if self.broker_url:
            # The broker picks whose idle kernels make room across users; this server suspends its own.
            self._room_for_others = RoomForOthers(suspended)
        kernel_manager = self._server.kernel_manager
        if self.pending_kernels:
            # A trait of jupyter_client's AsyncMultiKernelManager, which the server's default
            # (AsyncMappingKernelManager) is; the sync one the server is typed with lacks it.
            setattr(kernel_manager, "use_pending_kernels", True)  # noqa: B010
        _line_aware(kernel_manager, manager)
        return suspended

    def _start_idle_policy(self, manager: SliceManager, suspended: SuspendedKernels) -> None:
        """Idle kernels: lowered to idle_floor_cores, stopped after idle_cull_after (server/idle.py)."""
        idle = IdleKernels(
            manager,
            self._server.kernel_manager,
            lower_after=self.idle_lower_after,
            floor_cores=self.idle_floor_cores,
            cull_after=self.idle_cull_after,
            suspend_after=self.idle_suspend_after,
            suspend=suspended.suspend_idle,
            log=self.log,
        )
        self.settings[IDLE_SETTING] = idle
        suspended.stop_deadline = idle.stop_deadline
        if not idle.enabled:
            return
        if self.idle_lower_after and self.idle_cull_after and self.idle_cull_after <= self.idle_lower_after:
            self.log.warning(
                "jupyter_vgpu: VGPUApp.idle_cull_after (%g s) is not longer than idle_lower_after (%g s): "
                "idle kernels are stopped without being lowered first",
                self.idle_cull_after,
                self.idle_lower_after,
            )
        self.log.info("jupyter_vgpu: %s", idle.describe())

    def _pod_scopes(self) -> list[PodScope]:
        """Where this server's kernel pods go (each pod kernelspec's namespace and owner): where a
        restarted server looks for pods its predecessor left."""
        scopes = set()
        kernel_spec_manager = self._server.kernel_spec_manager
        if kernel_spec_manager is None:
            raise RuntimeError("jupyter_vgpu: the Jupyter server has no kernelspec manager")
        for spec in kernel_spec_manager.get_all_specs().values():
            provisioner = spec.get("spec", {}).get("metadata", {}).get("kernel_provisioner", {})
            if provisioner.get("provisioner_name") != POD_PROVISIONER_NAME:
                continue
            chosen = {
                key: value for key, value in provisioner.get("config", {}).items() if key in ("namespace", "owner")
            }
            settings = VGPUPodProvisioner(config=self.config, **chosen)
            scopes.add(PodScope(settings.namespace or default_namespace(), settings.owner or default_owner()))
        return sorted(scopes, key=lambda scope: (scope.namespace, scope.owner))

    async def _watch_slices(self) -> None:
        """Free the slices of kernels that are gone, put back limits a kernel rewrote, and apply
        the idle policy, all from one read of the ledger (with a broker, one request a tick).

        A kernel is gone when its kernel manager no longer knows it and its process no longer
        runs: a kernel still starting is not known yet but runs (or has not launched, and then
        holds no pid), and one its restarter is bringing back is still known.
        """
        manager: SliceManager = self.settings[MANAGER_SETTING]
        kernel_manager = self._server.kernel_manager
        try:
            statuses = manager.statuses()  # reading the holders re-asserts drifted limits
        except LedgerError as error:
            # The broker is down: kernels keep the limits in their regions; say so once an outage.
            if not self._ledger_unavailable:
                self.log.warning("jupyter_vgpu: %s; running kernels keep their limits", error)
            self._ledger_unavailable = True
            return
        if self._ledger_unavailable:
            self.log.info("jupyter_vgpu: the ledger answers again")
            self._ledger_unavailable = False
        for status in statuses:
            allocation = status.allocation
            launched = "provisioner_info" in allocation.metadata
            if (
                launched
                and allocation.kernel_id not in kernel_manager
                and not manager.holder(allocation).is_alive(allocation)
            ):
                manager.release_gone(allocation)  # kept while a process of it cannot be stopped
        await self._answer_over_cap(manager, statuses)
        allocations = [status.allocation for status in statuses]
        suspended: SuspendedKernels = self.settings[SUSPEND_SETTING]
        await suspended.check(allocations)  # before the idle policy: a kernel that runs again resumes first
        await manager.line.serve()
        if self._room_for_others is not None:
            await self._room_for_others.check(allocations)
        idle: IdleKernels = self.settings[IDLE_SETTING]
        await idle.check(allocations)

    async def _answer_over_cap(self, manager: SliceManager, statuses: list[SliceStatus]) -> None:
        """Stop a kernel that rewrote its limits and has held memory past its (restored) cap for
        over_cap_grace seconds, where over_cap_action says so; else it stays flagged."""
        now = time.monotonic()
        over = {
            status.allocation.kernel_id: status
            for status in statuses
            if status.tamper_warning is not None and status.memory_over_cap > 0
        }
        since = {kernel_id: self._over_cap_since.get(kernel_id, now) for kernel_id in over}
        self._over_cap_since = since
        if self.over_cap_action != "stop":
            return
        kernel_manager = self._server.kernel_manager
        for kernel_id, status in over.items():
            if now - since[kernel_id] < self.over_cap_grace:
                continue
            self.log.warning(
                "jupyter_vgpu: stopping kernel %s (VGPUApp.over_cap_action = stop): %s for %g s",
                kernel_id,
                status.tamper_warning,
                self.over_cap_grace,
            )
            if kernel_id in kernel_manager:
                await kernel_manager.shutdown_kernel(kernel_id, now=True)
            else:  # a batch kernel or a `jupyter vgpu run` command: its processes, then its slice
                manager.release_gone(status.allocation)
            since.pop(kernel_id)

    def initialize_handlers(self) -> None:
        self.handlers.extend(HANDLERS)

    async def stop_extension(self) -> None:
        watcher = getattr(self, "_watcher", None)
        if watcher is not None:
            watcher.stop()
        for learner in list(self._learning or ()):
            learner.cancel()
        _stop_anyio_worker_threads()
        _stop_anyio_worker_threads_at_exit()


async def started_or_queued(kernel_manager, slices: SliceManager, kernel_id: str) -> None:
    """With pending kernels a start goes on after ``start_kernel`` returns: wait until the kernel
    is ready or its start waits in the line; where it was refused (it can never fit), forget the
    kernel and raise the refusal, so every start path answers it at once as before."""
    ready = kernel_manager.get_kernel(kernel_id).ready
    ready = ready if isinstance(ready, asyncio.Future) else asyncio.wrap_future(ready)
    joined = slices.line.joined(kernel_id)
    try:
        await asyncio.wait([ready, joined], return_when=asyncio.FIRST_COMPLETED)
    finally:
        joined.cancel()
    if ready.done() and ready.exception() is not None:
        if kernel_id in kernel_manager:
            kernel_manager.remove_kernel(kernel_id)
        raise ready.exception()  # type: ignore[misc]


def _line_aware(kernel_manager, slices: SliceManager) -> None:
    """This server's kernel manager, on its instance only, made aware of the line.

    - A start answers once the kernel is ready, waits in line, or is refused (started_or_queued):
      with pending kernels jupyter_client would answer at once and let a refusal reach the client
      only when its websocket connects (a 500, no message JupyterLab shows).
    - Shutting down a kernel whose start waits in the line takes it out of the line first:
      jupyter_client's shutdown of a pending kernel awaits its start, which would keep the client
      waiting until the kernel had room; no hook runs before that wait.
    - A kernelspec that ``KernelSpecManager.allowed_kernelspecs`` leaves out is refused (404):
      jupyter_client only hides it from the listings and starts it by name all the same, so a
      classroom's hidden unsliced "Python 3 (ipykernel)" would still start from the REST API."""
    start = kernel_manager.start_kernel

    async def start_kernel(*args: Any, **kwargs: Any) -> str:
        name = kwargs.get("kernel_name") or kernel_manager.default_kernel_name
        allowed = kernel_manager.kernel_spec_manager.allowed_kernelspecs
        if allowed and name not in allowed:
            raise VGPUHTTPError(
                404, f"no kernelspec named {name!r} on this server; it offers {', '.join(sorted(allowed))}"
            )
        kernel_id: str = await ensure_async(start(*args, **kwargs))
        await started_or_queued(kernel_manager, slices, kernel_id)
        return kernel_id

    kernel_manager.start_kernel = start_kernel
    shutdown = kernel_manager.shutdown_kernel

    async def shutdown_kernel(kernel_id: str, *args: Any, **kwargs: Any) -> Any:
        slices.line.leave(kernel_id, "its kernel was shut down while it waited")
        result = await ensure_async(shutdown(kernel_id, *args, **kwargs))
        # With pending kernels jupyter_client finishes a shutdown in a task of its own (the same
        # private map forget_refused_start uses); waiting for it keeps DELETE /api/kernels/{id}
        # answering once the kernel is gone and its slice released, as without pending kernels.
        stopping = getattr(kernel_manager, "_pending_kernels", {}).get(kernel_id)
        if stopping is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await stopping
        return result

    kernel_manager.shutdown_kernel = shutdown_kernel


@functools.cache
def _stop_anyio_worker_threads_at_exit() -> None:
    """The server goes on after its extensions stop (it shuts kernels down, ends requests in
    flight), and an AnyIO worker started then hangs the exit the same way (seen once in CI under
    two CPU hogs): stop those too, just before the interpreter joins its threads, as
    concurrent.futures stops its own. Once per process."""
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        with contextlib.suppress(RuntimeError):  # the interpreter is already shutting down
            register(_stop_anyio_worker_threads)


def _stop_anyio_worker_threads() -> None:
    """Let the server's process exit after SIGTERM.

    jupyter_server runs some handlers (nbconvert's exporter list, which JupyterLab asks for at
    every page load; the async contents manager) on AnyIO worker threads. Those are not daemon
    threads, and AnyIO stops them only when the task it took for the root task ends; under
    tornado's loop that task may never end, and the process then hangs at exit joining them
    (jupyterlab/jupyterlab#10442; seen here as `jupyter lab` not exiting after SIGTERM under CPU
    load, a fault-handler dump showing the main thread in threading._shutdown and one AnyIO
    worker waiting for work). The server stops its extensions on its loop before it stops the
    loop, so here the workers are told to stop as AnyIO itself would; one still running a task
    finishes it first. AnyIO has no public call for this, hence the guarded import.
    """
    try:
        from anyio._backends._asyncio import WorkerThread
    except ImportError:  # another AnyIO layout: nothing to do
        return
    for thread in threading.enumerate():
        if isinstance(thread, WorkerThread) and thread.is_alive():
            with contextlib.suppress(queue.Full, ValueError, AttributeError):
                thread.stop()
