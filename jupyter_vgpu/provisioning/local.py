"""The local kernel provisioner: every kernel started through a vGPU kernelspec runs in its own
slice on this machine.

A kernelspec selects it with::

    "metadata": {"kernel_provisioner": {"provisioner_name": "vgpu-provisioner"}}

and may set a size (``"config": {"memory": "8GiB", "cores": 30, "policy": "hard"}``). Inside a
Jupyter server with the jupyter_vgpu extension, slices come from the server's ledger (placement,
capacity, live resize over REST), sized by what the start asked for, else the kernelspec, else
the server's ``VGPUApp.default_*``.

Started by plain jupyter_client (a batch run: ``jupyter nbconvert --execute``, papermill,
nbclient, ``jupyter execute``), a kernel still gets a slice: of the size given to the run
(``--VGPUProvisioner.memory=3GiB`` on its command line or in its config), else the kernelspec's,
else 4GiB with the whole SM share. Where a vGPU server's ledger is on the machine (see
``VGPUProvisioner.ledger``) the slice is admitted to it as a server's kernel's would be, so a
batch kernel never over-commits a GPU that the server's kernels hold; without one, nothing
arbitrates between batch runs. docs/batch.md tells the whole story.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from jupyter_client.provisioning.local_provisioner import LocalProvisioner
from jupyter_core.paths import jupyter_runtime_dir
from traitlets import Bool, Int, Unicode, Union
from traitlets.config import Application

from jupyter_vgpu.client import KERNEL_ID_VARIABLE, KERNEL_VARIABLES, kernel_environment
from jupyter_vgpu.holders.device_memory import process_running
from jupyter_vgpu.holders.local import (
    REGION_PATH_KEY,
    SURVIVAL_VARIABLE,
    LocalHolder,
    default_region_dir,
    slice_environment,
)
from jupyter_vgpu.holders.region import Region, process_start_time
from jupyter_vgpu.ledger import CapacityError, EmbeddedLedger, LedgerError
from jupyter_vgpu.manager import BATCH_KEY, SliceManager, SliceRefused
from jupyter_vgpu.model import (
    DEFAULT_LIMITS,
    NOTEBOOK_DEFAULTS,
    DeviceError,
    SliceLimits,
    SliceValueError,
    decide_limits,
    format_size,
    list_devices,
    parse_device,
    parse_policy,
    parse_size,
    parse_sm_share,
    select_device,
    use_simulator,
)
from jupyter_vgpu.model.sizes import SIZE_HELP, SM_SHARE_HELP, exact_size
from jupyter_vgpu.provisioning.base import (
    ADOPT_ARGUMENT,
    HUB_TOKEN_VARIABLES,
    ServerLinked,
    forget_refused_start,
    slice_owner,
)
from jupyter_vgpu.provisioning.batch_refusal import say_refusals_in_one_line
from jupyter_vgpu.provisioning.waiting import SINCE_ARGUMENT, WAITING_STARTS_SETTING

PROVISIONER_NAME = "vgpu-provisioner"
# Loads the %vgpu magic in IPython kernels. extra_extensions, not extensions, so that the
# extensions a user configured still load.
LOAD_MAGIC_ARGUMENT = "--IPKernelApp.extra_extensions=jupyter_vgpu"
# The options that size a slice; a kernelspec sets them in its provisioner config.
SLICE_OPTIONS = ("memory", "cores", "policy", "device")
# Set in a batch kernel whose slice is in a vGPU server's ledger: that ledger's path (for %vgpu).
LEDGER_VARIABLE = "JUPYTER_VGPU_LEDGER"
LEDGER_AUTO, LEDGER_NONE = "auto", "none"
# The start argument (of MappingKernelManager.start_kernel, reaching pre_launch as the slice size
# does) by which a restarted server adopts a kernel its predecessor left running: what
# SliceManager.adoption() says of it (server/adopt.py).


def default_ledger_path() -> Path:
    """Where a vGPU server keeps its ledger when ``VGPUApp.ledger_path`` is not set."""
    return Path(jupyter_runtime_dir()) / "vgpu" / "ledger.sqlite"


def with_vgpu_magic(cmd: list[str]) -> list[str]:
    """The kernel command with the %vgpu magic loaded, if it starts ipykernel (other kernels
    would refuse the unknown argument)."""
    if any("ipykernel" in part for part in cmd) and LOAD_MAGIC_ARGUMENT not in cmd:
        return [*cmd, LOAD_MAGIC_ARGUMENT]
    return cmd


def checked_layer(values: dict[str, Any], source: str) -> dict[str, Any]:
    """The size options ``values`` sets (an empty one is unset), each checked with the model's
    parsers; a bad one is refused naming ``source`` (who set it: ``{name}`` is the option) and
    what is accepted."""
    layer = {}
    for name in SLICE_OPTIONS:
        value = values.get(name)
        if value is None or value == "":
            continue
        try:
            if name == "memory":
                parse_size(value)
            elif name == "cores":
                parse_sm_share(value)
            elif name == "policy":
                parse_policy(value)
            else:
                parse_device(value)
        except SliceValueError as error:
            raise SliceRefused(
                f"{source.format(name=name)}: {error}".replace("%", " percent"), kind="invalid"
            ) from None
        layer[name] = value
    return layer


class VGPUProvisioner(ServerLinked, LocalProvisioner):
    """Starts a kernel with libvgpu.so preloaded, in a slice admitted before launch."""

    memory = Unicode(
        "",
        config=True,
        help=f"Memory cap of the kernel's slice: {SIZE_HELP}. Empty: the kernelspec's, else the server's default "
        "(4GiB in a batch run). In a server a kernelspec's own value wins over this one; in a batch run "
        "(nbconvert, papermill, nbclient: no server) this one wins over the kernelspec's.",
    )
    cores = Union(
        [Unicode(), Int()],
        default_value="",
        config=True,
        help=f"SM share of the kernel's slice, {SM_SHARE_HELP}. Empty and precedence: as for memory (in a batch run 100, or 20 beside a vGPU server's ledger).",
    )
    policy = Unicode(
        "",
        config=True,
        help="hard: never above the SM share; burst: may use idle SMs. Empty and precedence: as for memory (in a batch run hard, or burst beside a vGPU server's ledger).",
    )
    device = Unicode(
        "",
        config=True,
        help="GPU index or UUID; empty lets the ledger place the slice (GPU 0 in a batch run without one).",
    )
    simulate = Bool(False, config=True, help="Outside a vGPU server: use the simulated GPU.")
    ledger = Unicode(
        LEDGER_AUTO,
        config=True,
        help="Outside a vGPU server (a batch run): the vGPU ledger the kernel's slice is admitted to, so that it "
        "does not over-commit a GPU that a vGPU server's kernels hold. auto: the ledger a vGPU server keeps by "
        "default (<jupyter runtime dir>/vgpu/ledger.sqlite) if that file exists, else none; a path: that ledger "
        "file (a server's VGPUApp.ledger_path); none: no ledger, nothing counts the slice against others.",
    )

    _batch: BatchSlice | None = None
    # A kernel this provisioner adopted (a process it did not start, so no Popen: watched by pid
    # and start time) and whether an adoption was done (a restart then launches a new kernel).
    _adopted_start_time: int | None = None
    _adoption_done = False

    def __init__(self, **kwargs: Any):
        # jupyter_client passes the kernelspec's provisioner config as keyword arguments, which
        # traitlets would set over the configured values; the size options are kept aside
        # instead, so that each start decides which wins (see pre_launch).
        self.kernelspec_size = {name: kwargs.pop(name) for name in SLICE_OPTIONS if name in kwargs}
        super().__init__(**kwargs)

    def _size_layers(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(what this provisioner's config sets, what the kernelspec sets), each checked."""
        spec_name = getattr(self.kernel_spec, "display_name", "") or "of this kernel"
        configured = checked_layer({name: getattr(self, name) for name in SLICE_OPTIONS}, "VGPUProvisioner.{name}")
        from_spec = checked_layer(
            self.kernelspec_size, f"the kernelspec {spec_name!r} sets {{name}} in its provisioner config"
        )
        return configured, from_spec

    def _take_run_config(self) -> None:
        """In a batch run, also the config of the Jupyter application running it: ``jupyter
        execute`` (nbclient's) makes its kernel manager without its config, so its
        ``--VGPUProvisioner.memory=...`` would not reach here (nbconvert's does)."""
        if not Application.initialized():
            return
        section = Application.instance().config.get(type(self).__name__)
        if section:
            self.update_config(Application.instance().config)

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        adoption = kwargs.pop(ADOPT_ARGUMENT, None)
        if adoption and not self._adoption_done:
            return await self._adopt(adoption, kwargs)
        requested = kwargs.pop("vgpu_slice", None) or {}
        since = kwargs.pop(SINCE_ARGUMENT, None)
        size = {key: requested.get(key) for key in ("memory", "cores", "policy")}
        manager = self.slice_manager()
        try:
            if manager is None:
                self._take_run_config()
            configured, from_spec = self._size_layers()
            if manager is None:
                return await self._batch_launch(configured, from_spec, size, requested.get("device"), kwargs)
            # A restart reuses the provisioner and keeps the kernel's slice.
            if manager.held(self.kernel_id) is None:
                chosen = {**configured, **from_spec}  # in a server the kernelspec wins over config
                limits = manager.decide_limits(size, _size_of(chosen))
                device = requested.get("device") or chosen.get("device") or None
                metadata = {"kernelspec": getattr(self.kernel_spec, "display_name", "")}
                # A start that does not fit waits in the line, where room is made for it; written
                # down while it waits, for a restarted server to start it again in its place.
                with self._written_down_while_waiting(limits, device, kwargs) as queued:
                    await manager.admit_in_line(
                        self.kernel_id,
                        limits,
                        owner=slice_owner(),
                        device=device,
                        metadata=metadata,
                        since=since,
                        queued=queued,
                    )
        except SliceRefused as refusal:
            forget_refused_start(self)
            if manager is None:  # a batch run: one line on its terminal, not two tracebacks
                say_refusals_in_one_line(getattr(self.parent, "log", self.log))
            raise (manager.start_error(refusal) if manager else refusal) from None
        try:
            kwargs = await super().pre_launch(**kwargs)
            allocation = manager.get(self.kernel_id)
            holder = manager.holder(allocation)
            if not isinstance(holder, LocalHolder):
                raise TypeError(
                    f"kernel {self.kernel_id}'s slice is held by a {holder.kind} holder, not this machine's"
                )
            kwargs["env"] = holder.environment(allocation, kwargs["env"])
        except BaseException:
            manager.release(self.kernel_id)
            raise
        server_url = self._server_app().connection_url
        credential = manager.issue_kernel_credential(self.kernel_id)
        for name in HUB_TOKEN_VARIABLES:
            kwargs["env"].pop(name, None)
        kwargs["env"].update(kernel_environment(server_url, self.kernel_id, credential))
        kwargs["env"].pop(SURVIVAL_VARIABLE, None)
        if manager.kernel_survival > 0:
            kwargs["env"][SURVIVAL_VARIABLE] = f"{manager.kernel_survival:g}"
        kwargs["cmd"] = with_vgpu_magic(kwargs["cmd"])
        return kwargs

    @contextlib.contextmanager
    def _written_down_while_waiting(
        self, limits: SliceLimits, device: Any, kwargs: dict[str, Any]
    ) -> Iterator[Callable[[float], None] | None]:
        """The ``queued`` callback that writes this start down among the server's waiting starts
        (provisioning/waiting.py; None where the server keeps none), crossed out again when the
        start leaves the line, however it does."""
        store = self._server_setting(WAITING_STARTS_SETTING)
        server = self._server_app()
        if store is None or server is None:
            yield None
            return
        # Where the kernel starts, as the API path jupyter_server would be given again.
        cwd = kwargs.get("cwd") or server.root_dir
        relative = os.path.relpath(cwd, server.root_dir)
        path = "" if relative == "." or relative.startswith("..") else relative
        size = {"memory": exact_size(limits.memory_limit), "cores": limits.sm_share, "policy": limits.policy}
        if device not in (None, ""):
            size["device"] = device
        kernel_name = getattr(self.parent, "kernel_name", "")
        written = False

        def queued(since: float) -> None:
            nonlocal written
            store.add(self.kernel_id, kernel_name=kernel_name, path=path, size=size, since=since)
            written = True

        try:
            yield queued
        finally:
            if written:
                store.remove(self.kernel_id)

    async def _adopt(self, adoption: dict[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        """Take over a kernel that a previous server started and that outlived it: nothing is
        launched; the kernel manager reads the kernel's connection file (its ports and key) and
        this provisioner its process (pid, process group, start time), which ``poll``,
        ``send_signal``, ``kill`` and ``wait`` then act on by pid. Its slice stays as the ledger
        holds it. A later restart of the kernel launches a new one, as for any kernel."""
        self._adoption_done = True
        connection_file = adoption["connection_file"]
        # The kernel manager's public reader of a connection file: ports, transport, ip, key and
        # signature scheme, so that its clients (the websocket's included) reach this kernel.
        self.parent.load_connection_file(connection_file)
        connection_info = self.parent.get_connection_info()
        await self.load_provisioner_info(
            {**adoption["provisioner_info"], "kernel_id": self.kernel_id, "connection_info": connection_info}
        )
        return {**kwargs, "cmd": []}

    async def _batch_launch(
        self,
        configured: dict[str, Any],
        from_spec: dict[str, Any],
        requested: dict[str, Any],
        device: Any,
        kwargs: dict[str, Any],
    ) -> dict[str, Any]:
        """A kernel of a batch run (no server): a slice of the run's size, admitted to a vGPU
        server's ledger where there is one. A restart keeps the slice."""
        if self._batch is None:
            ledger_path = self._ledger_path()
            # Alone, the run has the GPU to itself (DEFAULT_LIMITS: all the SMs, hard); beside a
            # vGPU server, what it leaves out is a notebook's default size, as for `jupyter vgpu
            # run` (a whole hard share would not fit beside any server kernel).
            defaults = DEFAULT_LIMITS if ledger_path is None else NOTEBOOK_DEFAULTS
            try:
                # The run's own config (its command line) wins over the kernelspec: it is where a
                # batch run chooses its size.
                limits = decide_limits(defaults, _size_of(from_spec), _size_of(configured), requested)
            except ValueError as error:
                raise SliceRefused(str(error).replace("%", " percent"), kind="invalid") from None
            if self.simulate:
                use_simulator()
            device = device or configured.get("device") or from_spec.get("device")
            self._batch = BatchSlice.admit(self, limits, device, ledger_path)
        else:
            self._batch.readmit_if_released()
        try:
            kwargs = await super().pre_launch(**kwargs)
        except BaseException:
            self._batch.release()
            self._batch = None
            raise
        env = slice_environment(self._batch.region_view(), simulate=self.simulate, base_env=kwargs["env"])
        # No server holds this slice: a kernel must not inherit the server link of the sliced
        # kernel that started this one, or it would resize that kernel's slice. Its own id tells
        # libvgpu.so's out-of-memory line, and %vgpu, that it is a kernel without a server.
        for name in (*KERNEL_VARIABLES, LEDGER_VARIABLE, SURVIVAL_VARIABLE):
            env.pop(name, None)
        env[KERNEL_ID_VARIABLE] = self.kernel_id
        if self._batch.ledger_path is not None:
            env[LEDGER_VARIABLE] = str(self._batch.ledger_path)
        kwargs["env"] = env
        kwargs["cmd"] = with_vgpu_magic(kwargs["cmd"])
        return kwargs

    def _ledger_path(self) -> Path | None:
        """The ledger a batch kernel's slice goes to (the ``ledger`` option), None for none."""
        value = self.ledger.strip()
        if value.lower() == LEDGER_NONE:
            return None
        if value.lower() == LEDGER_AUTO:
            path = default_ledger_path()
            return path if path.exists() else None
        if not value:
            raise SliceRefused(
                "VGPUProvisioner.ledger is empty; give auto, none or the path of a vGPU server's ledger", kind="invalid"
            )
        path = Path(value).expanduser()
        if not path.is_file():
            raise SliceRefused(
                f"VGPUProvisioner.ledger: no ledger file at {path}. A vGPU server makes its ledger when it starts "
                "(its VGPUApp.ledger_path says where); give that file, or auto, or none",
                kind="invalid",
            )
        return path

    async def launch_kernel(self, cmd: list[str], **kwargs: Any):
        if self._adopted_start_time is not None:
            return self.connection_info  # adopted: it runs already (see _adopt)
        connection_info = await super().launch_kernel(cmd, **kwargs)
        if self._batch is not None and self.pid:
            self._batch.holder.mark_owners(self.kernel_id, self.pid)  # ... and while its kernel does
        manager = self.slice_manager() or (self._batch.manager if self._batch else None)
        if manager is not None:
            connection_file = getattr(self.parent, "connection_file", "")
            where = os.path.abspath(connection_file) if connection_file else ""
            kernel_name = getattr(self.parent, "kernel_name", "")
            manager.record_kernel(self.kernel_id, await self._process_identity(), where, kernel_name)
        return connection_info

    async def send_signal(self, signum: int) -> None:
        """An interrupt (SIGINT, Kernel > Interrupt) of a kernel waiting in the line for its room
        takes it out of the line first: the CUDA call its cell waits in fails at once, and the
        signal then interrupts the cell as usual; the kernel stays suspended, nothing lost."""
        manager = self.slice_manager()
        if signum == signal.SIGINT and manager is not None:
            with contextlib.suppress(LedgerError):
                manager.leave_line(self.kernel_id)
        if self._adopted_start_time is None:
            await super().send_signal(signum)
        elif self.pid and self._adopted_running():
            # As LocalProvisioner's: the process group first (the kernel leads its own), else the process.
            try:
                os.killpg(self.pgid or self.pid, signum)
            except OSError:
                os.kill(self.pid, signum)

    # -- an adopted kernel: a process this provisioner did not start (no Popen) ------------------

    async def load_provisioner_info(self, provisioner_info: dict[str, Any]) -> None:
        """What ``get_provisioner_info`` kept (pid, process group, ip, the pid's start time), for
        a kernel this provisioner adopts: from then on it is watched by pid, and the start time
        tells it apart from a later process that got the same pid."""
        await super().load_provisioner_info(provisioner_info)
        self._adopted_start_time = int(provisioner_info.get("pid_start_time") or 0)

    def _adopted_running(self) -> bool:
        return bool(self.pid and self._adopted_start_time and process_running(self.pid, self._adopted_start_time))

    @property
    def has_process(self) -> bool:
        return self.process is not None or self._adopted_start_time is not None

    async def poll(self) -> int | None:
        if self._adopted_start_time is None:
            return await super().poll()
        # Not its parent, the exit status is not known here: 1, as the poller that ends it says.
        return None if self._adopted_running() else 1

    async def wait(self) -> int | None:
        if self._adopted_start_time is None:
            return await super().wait()
        while await self.poll() is None:
            await asyncio.sleep(0.1)  # no child to wait on: polled, as LocalProvisioner polls its own
        self._adopted_start_time = None  # has_process is False from now on
        return 1

    async def kill(self, restart: bool = False) -> None:
        await self._stop(super().kill, signal.SIGKILL, restart)

    async def terminate(self, restart: bool = False) -> None:
        await self._stop(super().terminate, signal.SIGTERM, restart)

    async def _stop(self, own: Callable[..., Awaitable[None]], signum: int, restart: bool) -> None:
        """``own``, LocalProvisioner's way to stop its child; an adopted kernel is no child of this
        server: it gets ``signum`` (it may have ended already)."""
        if self._adopted_start_time is None:
            await own(restart=restart)
        else:
            with contextlib.suppress(ProcessLookupError):
                await self.send_signal(signum)

    async def get_provisioner_info(self) -> dict[str, Any]:
        """jupyter_client's record of this kernel (its pid, ...) plus what tells the process apart
        from a later one that got the same pid; kept in the ledger so a restarted server finds
        the kernel again (see :meth:`load_provisioner_info`)."""
        info = await super().get_provisioner_info()
        if self.pid:
            info["pid_start_time"] = process_start_time(self.pid)
        return info

    async def _process_identity(self) -> dict[str, Any]:
        """The JSON part of the provisioner info that identifies the kernel's process."""
        info = await self.get_provisioner_info()
        return {key: info[key] for key in ("pid", "pgid", "ip", "pid_start_time") if key in info}

    async def cleanup(self, restart: bool = False) -> None:
        await super().cleanup(restart=restart)
        if restart:
            return
        connection_file = str(getattr(self.parent, "connection_file", None) or "")
        if self._adoption_done and connection_file:
            # The kernel manager removes only a connection file it wrote; an adopted kernel's was
            # written by the server that started it.
            Path(connection_file).unlink(missing_ok=True)
        manager = self.slice_manager()
        if manager is not None:
            manager.release(self.kernel_id)
        if self._batch is not None:
            self._batch.release()
            self._batch = None


def _size_of(layer: dict[str, Any]) -> dict[str, Any]:
    """A layer's memory, cores and policy (what decide_limits takes; the device is placement)."""
    return {name: value for name, value in layer.items() if name != "device"}


def _command_line() -> str:
    """The command that started this process, for people reading the ledger (short)."""
    return " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]])[:200] if sys.argv else ""


class BatchSlice:
    """The slice of a kernel that no server started: its region in the standalone folder and,
    where a vGPU server's ledger is on the machine, its allocation there.

    In a ledger the slice is a row like a server kernel's (the server lists it, can resize it and
    re-asserts its limits), marked with the process that started it (``BATCH_KEY``) so that a
    restarted server leaves it alone while that process runs, and naming its region
    (``REGION_PATH_KEY``), which lives in the standalone folder that no server sweeps.
    """

    def __init__(self, provisioner: VGPUProvisioner, limits: SliceLimits, device, holder: LocalHolder):
        self.kernel_id = provisioner.kernel_id
        self.limits, self.device, self.holder = limits, device, holder
        self.manager: SliceManager | None = None
        self.ledger_path: Path | None = None
        self.region: Region | None = None  # without a ledger the slice's region is held here
        self.metadata = {
            "kernelspec": getattr(provisioner.kernel_spec, "display_name", ""),
            BATCH_KEY: {
                "pid": os.getpid(),
                "pid_start_time": process_start_time(os.getpid()),
                "command": _command_line(),
            },
            REGION_PATH_KEY: str(holder.path(self.kernel_id)),
        }

    @classmethod
    def admit(cls, provisioner: VGPUProvisioner, limits: SliceLimits, device, ledger_path: Path | None) -> BatchSlice:
        try:
            devices = list_devices()
        except DeviceError as error:
            raise SliceRefused(
                f"{error.reason} To run the notebook on the simulated GPU, give --VGPUProvisioner.simulate=True "
                "(papermill: -k a kernelspec made with `jupyter vgpu kernelspec install --simulate`).",
                kind="invalid",
            ) from None
        holder = LocalHolder(default_region_dir(standalone=True), simulate=provisioner.simulate)
        holder.sweep_stale()  # what earlier batch kernels, never shut down, left there
        batch = cls(provisioner, limits, device, holder)
        if ledger_path is None:
            batch._make_region(devices)
        else:
            batch._admit_to_ledger(ledger_path, devices, parent=provisioner)
        holder.mark_owners(batch.kernel_id, os.getpid())  # in use while this program runs ...
        return batch

    def _make_region(self, devices) -> None:
        try:
            chosen = select_device(devices, self.device if self.device not in (None, "") else 0)
        except SliceValueError as error:
            raise SliceRefused(str(error), kind="invalid") from None
        if self.limits.memory_limit > chosen.memory_total:
            raise SliceRefused(
                f"a memory cap of {format_size(self.limits.memory_limit)} is more than GPU {chosen.index} has "
                f"({format_size(chosen.memory_total)}); ask for at most that",
                kind="invalid",
            )
        self.region = self.holder.new_region(self.kernel_id, self.limits, chosen)

    def _admit_to_ledger(self, path: Path, devices, *, parent) -> None:
        try:
            ledger = EmbeddedLedger(path, devices)
        except (LedgerError, sqlite3.Error, OSError) as error:
            raise SliceRefused(
                f"the vGPU ledger {path} cannot be used: {error}. Run the batch with --VGPUProvisioner.ledger=none "
                "to start without it (nothing then keeps this kernel from over-committing a GPU that a vGPU "
                "server's kernels hold)",
                kind="invalid",
            ) from None
        manager = SliceManager(ledger, [self.holder], self.limits, parent=parent)
        self.manager, self.ledger_path = manager, path
        try:
            self._admit(manager)
        except BaseException:
            ledger.close()
            self.manager = None
            raise

    def _admit(self, manager: SliceManager) -> None:
        try:
            manager.admit(
                self.kernel_id, self.limits, owner=slice_owner(), device=self.device or None, metadata=self.metadata
            )
        except SliceRefused as refusal:
            if not isinstance(refusal.__cause__, CapacityError):
                raise
            message = (
                f"this kernel's GPU slice ({self.limits.describe()}) does not fit beside the slices held in the vGPU "
                f"ledger {self.ledger_path} (the kernels of a vGPU server on this machine, and other batch runs): "
                f"{refusal.__cause__}. Start the run with a smaller slice (--VGPUProvisioner.memory=SIZE or "
                "--VGPUProvisioner.cores=PCT, or a kernelspec made with `jupyter vgpu kernelspec install`), or "
                "stop a kernel that holds one (`jupyter vgpu status` lists the server's)"
            )
            raise SliceRefused(message.replace("%", " percent"), kind="capacity") from None

    def readmit_if_released(self) -> None:
        """After a restart: admit the slice again if it left the ledger meanwhile (a server
        releases the slice of a batch kernel whose process it saw gone)."""
        if self.manager is not None and self.manager.ledger.get(self.kernel_id) is None:
            self.holder.release(self.kernel_id)
            self._admit(self.manager)

    def region_view(self) -> Region:
        return self.region if self.region is not None else self.holder.region(self.kernel_id)

    def release(self) -> None:
        if self.manager is not None:
            self.manager.release(self.kernel_id)
            self.manager.ledger.close()
            self.manager = None
        if self.region is not None:
            self.region.close()
            self.region = None
            self.holder.release(self.kernel_id)
