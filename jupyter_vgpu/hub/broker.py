"""The node's broker: the one ledger of a node that many users' servers share, run by JupyterHub
as a managed service (``jupyter vgpu broker --classroom FILE``, added to the hub's services by
:func:`jupyter_vgpu.hub.configure`).

Each user's single-user server decides through it (:class:`~jupyter_vgpu.ledger.RemoteLedger`,
``VGPUApp.broker_url``) with the server's own hub token, so that servers cannot over-commit a GPU
between them. Who asks, and what they may hold, is the hub's word, never the server's:

- a token is the hub's to identify (:class:`~jupyterhub.services.auth.HubAuth`); it must carry
  ``custom:vgpu:use!user=<name>`` (servers get it through ``Spawner.server_token_scopes``) to act
  on its user's own slices, or ``custom:vgpu:admin`` to see and change every slice;
- a user's budget (all their slices together) is the classroom size their server was started
  with, read from the hub's ``user_options`` and the user's groups at each admission and growth.

Every decision is a transaction on the ledger's SQLite file in the classroom's ``state_dir``, so
a broker killed with SIGKILL (the hub starts it again) finds every slice where it was. Every
``reconcile_interval`` seconds it asks the hub which owners still run a server and gives back the
slices of those who do not. While it is down, kernel starts fail at once with a message naming
it; running kernels keep their limits (they live in the kernels' region files, not here).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from collections.abc import Mapping
from dataclasses import asdict
from types import MappingProxyType
from typing import Any
from urllib.parse import quote, urlsplit

from jupyterhub.services.auth import HubAuth, check_scopes
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from tornado import httpclient, httputil, web
from tornado.httpserver import HTTPServer
from tornado.ioloop import IOLoop, PeriodicCallback

from jupyter_vgpu._version import __version__
from jupyter_vgpu.holders.device_memory import DeviceMemoryReader, kernel_pid, still_held
from jupyter_vgpu.holders.pages import PagePublisher
from jupyter_vgpu.hub.classroom import Classroom, ClassroomError, load_classroom
from jupyter_vgpu.ledger import Allocation, DeviceUsage, EmbeddedLedger, Ledger, LedgerError, OwnerBudget
from jupyter_vgpu.ledger.broker_line import BrokerLine
from jupyter_vgpu.ledger.edge import Caller, Gate, Refusal
from jupyter_vgpu.ledger.lending import Lending
from jupyter_vgpu.ledger.metrics import add_device_gauges, add_suspend_gauges
from jupyter_vgpu.ledger.policy import ROOM_HOLD_S
from jupyter_vgpu.ledger.service import LedgerHandler, ledger_handlers
from jupyter_vgpu.model import DeviceError, format_size, list_devices, use_simulator

NO_GROUPS: Mapping[str, tuple[str, ...]] = MappingProxyType({})
USE_SCOPE = "custom:vgpu:use"
ADMIN_SCOPE = "custom:vgpu:admin"
# Long enough that the hub is not asked about every owner all the time, short enough that a
# student's stopped server gives its GPU back within a minute.
DEFAULT_RECONCILE_INTERVAL_S = 30.0
HUB_TIMEOUT_S = 10.0

# The broker's state folder: others pass through it to the limits pages, without listing it.
TRAVERSE_ONLY = 0o711
log = logging.getLogger("jupyter_vgpu.broker")


def half_the_ram() -> int:
    """The node's cap on suspended slices' host memory where the classroom sets none: half its RAM."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


class BrokerError(RuntimeError):
    """A broker that cannot start: missing hub environment, a classroom file or GPUs it cannot use."""


class HubUsers:
    """The hub's REST API as the broker's own service token sees it (``read:users``,
    ``read:servers``: a user's groups and servers with their ``user_options``)."""

    def __init__(self, api_url: str, token: str):
        self.api_url = api_url.rstrip("/")
        self._headers = {"Authorization": f"token {token}", "Accept": "application/json"}
        self._client = httpclient.AsyncHTTPClient()

    async def user(self, name: str) -> dict[str, Any] | None:
        """The user's model (``name``, ``groups``, active ``servers``); None if the hub has no such user."""
        request = httpclient.HTTPRequest(
            f"{self.api_url}/users/{quote(name, safe='')}", headers=self._headers, request_timeout=HUB_TIMEOUT_S
        )
        try:
            reply = await self._client.fetch(request, raise_error=False)
        except OSError as error:
            raise HubUnavailable(f"the hub's API at {self.api_url} cannot be reached ({error})") from None
        if reply.code == 404:
            return None
        if reply.code != 200:
            raise HubUnavailable(
                f"the hub's API at {self.api_url} answered GET /users/{name} with {reply.code} {reply.reason}"
            )
        model = json.loads(reply.body)
        return model if isinstance(model, dict) else None


class HubUnavailable(RuntimeError):
    """The hub did not answer a question the broker had to ask it."""


def chosen_options(user: Mapping[str, Any]) -> dict[str, Any]:
    """The ``user_options`` the user's default server was started with ({} when none runs)."""
    servers = user.get("servers") or {}
    default = servers.get("") or {}
    options = default.get("user_options") or {}
    return options if isinstance(options, dict) else {}


class HubGate:
    """Callers and budgets as the hub says (the :class:`~jupyter_vgpu.ledger.edge.Gate` of the broker)."""

    def __init__(self, classroom: Classroom, auth: HubAuth, users: HubUsers):
        self.classroom = classroom
        self.auth = auth
        self.users = users
        # Groups of the owners the broker has looked up, for the metrics' labels.
        self.groups: dict[str, tuple[str, ...]] = {}

    async def caller(self, request: httputil.HTTPServerRequest, credential: str) -> Caller:
        try:
            model = await self.auth.user_for_token(credential, sync=False)
        except (web.HTTPError, OSError) as error:
            raise Refusal(
                503, f"the hub could not be asked who this token belongs to ({error})", "HubUnavailable"
            ) from None
        if not model:
            raise Refusal(403, "the hub does not accept this token", "Forbidden")
        scopes = set(model.get("scopes") or ())
        name = model.get("name") or ""
        user = model.get("kind", "user") == "user"
        if check_scopes(ADMIN_SCOPE, scopes):
            return Caller(name if user else "", admin=True)
        if user and check_scopes(f"{USE_SCOPE}!user={name}", scopes):
            self.groups[name] = tuple(sorted(model.get("groups") or ()))
            return Caller(name)
        raise Refusal(
            403,
            f"this token ({name or 'unnamed'}) lacks the scope {USE_SCOPE}!user={name or '<name>'}: single-user "
            "servers get it through Spawner.server_token_scopes (jupyter_vgpu.hub.configure sets that); "
            f"{ADMIN_SCOPE} (the vgpu-admin role) may act on every slice",
            "Forbidden",
        )

    async def budget(self, caller: Caller) -> OwnerBudget | None:
        if not caller.name:
            return None
        try:
            user = await self.users.user(caller.name)
        except HubUnavailable as error:
            raise Refusal(503, f"{error}; the broker reads your GPU size from the hub", "HubUnavailable") from None
        if user is None:
            raise Refusal(403, f"the hub has no user {caller.name!r}", "Forbidden")
        groups = [group for group in user.get("groups") or () if isinstance(group, str)]
        self.groups[caller.name] = tuple(sorted(groups))
        try:
            budget = self.classroom.budget_for(chosen_options(user), groups)
        except ClassroomError as error:
            raise Refusal(403, f"{caller.name}: {error}", "Forbidden") from None
        # Every size guarantees its memory and cores: borrowers give that room back when its
        # student asks for it (Lending.take_back), whether or not the size may borrow itself. A
        # size that may borrow allows its maximum; the broker lends what is above the guarantee
        # only from room nobody within a guarantee needs.
        return OwnerBudget(
            memory=budget.max_memory,
            sm_share=budget.max_cores,
            slices=budget.kernels,
            policy=budget.policy,
            label=f"{caller.name}'s GPU size {budget.size_name!r}",
            guaranteed_memory=budget.memory,
            guaranteed_sm_share=budget.cores,
        )


class HealthHandler(web.RequestHandler):
    """``GET <prefix>``: whether the broker runs, and on which devices (nothing about anyone's slices)."""

    def initialize(self, ledger: EmbeddedLedger) -> None:
        self.ledger = ledger

    def get(self) -> None:
        self.set_header("Content-Type", "application/json; charset=UTF-8")
        devices = [asdict(device) for device in self.ledger.devices]
        self.finish(json.dumps({"service": "jupyter-vgpu broker", "version": __version__, "devices": devices}))


class MetricsHandler(LedgerHandler):
    """``GET <prefix>metrics``: every slice of the node with its owner and the owner's groups, in
    Prometheus' text format, for a token with ``custom:vgpu:admin`` (authenticated, refused and
    read as every ledger route is)."""

    def initialize(
        self,
        ledger: Ledger,
        gate: Gate,
        lending: Lending | None = None,
        groups: Mapping[str, tuple[str, ...]] = NO_GROUPS,
        *,
        line: BrokerLine | None = None,
    ) -> None:
        super().initialize(ledger, gate, lending, line=line)
        self.groups = groups  # the owners' groups, as the gate last read them from the hub

    async def get(self) -> None:
        if not self.caller.admin:
            raise Refusal(403, f"the broker's metrics show every user's slices: they need {ADMIN_SCOPE}", "Forbidden")
        allocations = await self.decide(self.ledger.allocations)
        usages = await self.decide(self.ledger.devices_usage)
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(broker_metrics(allocations, usages, self.groups))


def broker_metrics(
    allocations: list[Allocation], usages: list[DeviceUsage], groups: Mapping[str, tuple[str, ...]]
) -> bytes:
    registry = CollectorRegistry()
    add_device_gauges(registry, usages)
    add_suspend_gauges(registry, allocations)
    slice_labels = ["kernel_id", "device", "policy", "user", "groups"]
    limit = Gauge("vgpu_slice_memory_limit_bytes", "Memory cap of a slice", slice_labels, registry=registry)
    share = Gauge("vgpu_slice_sm_share_percent", "SM share of a slice", slice_labels, registry=registry)
    for allocation in allocations:
        owner_groups = ",".join(groups.get(allocation.owner, ()))
        labels = (allocation.kernel_id, str(allocation.device_index), allocation.policy, allocation.owner, owner_groups)
        limit.labels(*labels).set(allocation.memory_limit)
        share.labels(*labels).set(allocation.sm_share)
    return generate_latest(registry)


class Broker:
    """The ledger of one node served to the hub's users, and its reconciliation with the hub."""

    def __init__(
        self,
        classroom: Classroom,
        *,
        api_url: str,
        api_token: str,
        prefix: str,
        reconcile_interval: float = DEFAULT_RECONCILE_INTERVAL_S,
    ):
        self.classroom = classroom
        self.prefix = "/" + prefix.strip("/") + "/" if prefix.strip("/") else "/"
        self.reconcile_interval = reconcile_interval
        if classroom.simulate:
            os.environ["VGPU_SIM_DEVICES"] = classroom.simulated_devices
            use_simulator()
        try:
            devices = list_devices()
        except DeviceError as error:
            raise BrokerError(f"the broker finds no GPU to share: {error}") from None
        if len(devices) < classroom.gpus.count:
            raise BrokerError(
                f"{classroom.path}: gpus.count is {classroom.gpus.count} but this node has {len(devices)} GPU(s): "
                + ", ".join(f"{device.index} {device.name} ({format_size(device.memory_total)})" for device in devices)
            )
        # Others may pass through the state folder to the limits pages, not list it (the ledger
        # file in it is the broker's alone).
        classroom.state_dir.mkdir(parents=True, exist_ok=True)
        classroom.state_dir.chmod(TRAVERSE_ONLY)
        self.pages = PagePublisher(classroom.limits_dir)
        self.ledger = EmbeddedLedger(
            classroom.state_dir / "ledger.sqlite",
            devices[: classroom.gpus.count],
            reserve=classroom.gpus.reserve,
            burst_oversubscription=classroom.gpus.burst_oversubscription,
            placement=classroom.gpus.placement,
            observers=[self.pages],
            # What the GPUs hold beyond the slices, attributed by process ancestry: the users'
            # regions are theirs, but the kernels' pids (and /proc) are not secret.
            reader=DeviceMemoryReader(kernel_pid),
        )
        # Pages survive a crash of the broker; make them the ledger's again, drop released ones.
        self.pages.sync(self.ledger.allocations())
        # A suspended slice's room is lent only once NVML lists none of its processes (the user's
        # server checkpoints them; its word is not enough), and within the node's host memory cap.
        self.lending = Lending(
            still_held=lambda allocation: still_held(allocation, kernel_pid),
            host_memory_cap=classroom.idle.suspend_host_memory or half_the_ram(),
            # The pages are the broker's (a user's server cannot write them under its own account).
            on_change=self.pages.set_suspended,
            # A start or resume that does not fit asks the servers of idle kernels (any user's) to
            # suspend them; each server suspends only its own (server/room.py).
            make_room=True,
            # Borrowed room taken back: the kernel's calls wait in libvgpu.so from now on, and say why.
            on_take_back=self.pages.set_taken_back,
            # A kernel that just got its room is not asked to give it up again for a while.
            hold=ROOM_HOLD_S if classroom.idle.room_hold is None else classroom.idle.room_hold,
        )
        # One fair line across the users' servers, kept beside the ledger (a restart keeps it).
        self.line = BrokerLine(classroom.state_dir / "line.json")
        auth = HubAuth(api_url=api_url, api_token=api_token, cache_max_age=60)
        self.users = HubUsers(api_url, api_token)
        self.gate = HubGate(classroom, auth, self.users)

    def application(self) -> web.Application:
        handlers: list[Any] = [
            (rf"{self.prefix}?", HealthHandler, {"ledger": self.ledger}),
            (
                rf"{self.prefix}metrics",
                MetricsHandler,
                {"ledger": self.ledger, "gate": self.gate, "groups": self.gate.groups},
            ),
            *ledger_handlers(f"{self.prefix}ledger", self.ledger, self.gate, lending=self.lending, line=self.line),
        ]
        return web.Application(handlers)

    async def reconcile_with_hub(self) -> list[Allocation]:
        """Give back the slices of owners who run no server any more (or whom the hub no longer has)."""
        owners = {
            allocation.owner for allocation in await IOLoop.current().run_in_executor(None, self.ledger.allocations)
        }
        gone = set()
        for owner in sorted(owners):
            try:
                user = await self.users.user(owner) if owner else {"servers": {"": {}}}
            except HubUnavailable as error:
                log.warning("not reconciling with the hub this time: %s", error)
                return []
            if user is None or not user.get("servers"):
                gone.add(owner)
        if not gone:
            return []
        released = await IOLoop.current().run_in_executor(
            None, self.ledger.reconcile, lambda allocation: allocation.owner not in gone
        )
        for allocation in released:
            log.info(
                "gave back the slice of kernel %s (%s, %d%%): its owner %r runs no server",
                allocation.kernel_id,
                format_size(allocation.memory_limit),
                allocation.sm_share,
                allocation.owner,
            )
        return released

    async def _reconcile_safely(self) -> None:
        try:
            await self.reconcile_with_hub()
            # A kernel whose server did not give its borrowed room back in time runs on.
            for lapsed in await IOLoop.current().run_in_executor(None, self.lending.lapse_take_backs, self.ledger):
                log.warning("kernel %s was not paused to give borrowed room back; it runs on", lapsed.kernel_id)
        except LedgerError:
            log.exception("reconciling with the hub failed")

    def close(self) -> None:
        self.ledger.close()


def hub_environment(environ: Mapping[str, str]) -> tuple[str, str, str, str]:
    """What the hub hands a managed service: (API URL, token, the service's URL, its prefix)."""
    names = ("JUPYTERHUB_API_URL", "JUPYTERHUB_API_TOKEN", "JUPYTERHUB_SERVICE_URL", "JUPYTERHUB_SERVICE_PREFIX")
    missing = [name for name in names if not environ.get(name)]
    if missing:
        raise BrokerError(
            f"the broker runs as a JupyterHub managed service and needs {', '.join(missing)} from the hub; "
            "add it to the hub with jupyter_vgpu.hub.configure(c, 'classroom.yaml') in jupyterhub_config.py"
        )
    return tuple(environ[name] for name in names)  # type: ignore[return-value]


async def serve(classroom: Classroom, environ: Mapping[str, str], *, reconcile_interval: float) -> None:
    api_url, token, service_url, prefix = hub_environment(environ)
    address = urlsplit(service_url)
    if not address.hostname or not address.port:
        raise BrokerError(f"JUPYTERHUB_SERVICE_URL {service_url!r} needs a host and a port to listen on")
    broker = Broker(classroom, api_url=api_url, api_token=token, prefix=prefix, reconcile_interval=reconcile_interval)
    server = HTTPServer(broker.application(), xheaders=True)
    server.listen(address.port, address.hostname)
    reconciler = PeriodicCallback(broker._reconcile_safely, reconcile_interval * 1000)
    reconciler.start()
    await broker._reconcile_safely()
    log.info(
        "jupyter-vgpu broker %s on %s%s: %d GPU(s), %d slice(s) held, classroom %s",
        __version__,
        service_url.rstrip("/"),
        broker.prefix,
        len(broker.ledger.devices),
        len(broker.ledger.allocations()),
        classroom.path,
    )
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopped.set)
    await stopped.wait()
    reconciler.stop()
    server.stop()
    broker.close()
    log.info("jupyter-vgpu broker stopped")


def run(
    classroom_path: str,
    *,
    reconcile_interval: float = DEFAULT_RECONCILE_INTERVAL_S,
    environ: Mapping[str, str] = os.environ,
) -> int:
    """Serve until SIGTERM or SIGINT (``jupyter vgpu broker``); 1 where the broker cannot start."""
    if not reconcile_interval > 0:
        log.error("the reconcile interval must be more than 0 seconds, not %s", reconcile_interval)
        return 1
    try:
        # The hub checked the file against its groups at start; its load_groups are not known here.
        classroom = load_classroom(classroom_path, hub_groups=None)
        asyncio.run(serve(classroom, environ, reconcile_interval=reconcile_interval))
    except (BrokerError, ClassroomError, LedgerError, OSError) as error:
        log.error("the broker cannot run: %s", error)
        return 1
    return 0
