"""A classroom's kernel starts against the node's broker: 30 users with 3 kernels each asking
within one minute for slices of 2 simulated GPUs (2 x 16 GiB), through the broker's real HTTP
application.

    python benchmarks/classroom_load.py               # about 70 seconds, then the class (about 5 minutes)
    python benchmarks/classroom_load.py --class-only  # only the class
    python benchmarks/classroom_load.py --smoke       # about 10 seconds, as CI runs it

Each run has a simulated GPU and a runtime folder of its own (a fresh folder: the simulated GPU's
state file, the servers' regions, the brokers' files), whatever else runs on the machine.

The broker is jupyter_vgpu.hub.broker.Broker, the one `jupyter vgpu broker` runs: its tornado
application (HubGate, the ledger handlers, an EmbeddedLedger on an SQLite file) served from a
thread of this process. JupyterHub is a stand-in: a small tornado application (another thread)
that answers what the broker asks the hub, `GET /hub/api/user` for a user's token (the user
model with `custom:vgpu:use!user=<name>` in `scopes`, and `groups`) and `GET /hub/api/users/<name>`
(`groups`, and `servers: {"": {"user_options": {"profile": <size>}}}`), as a hub whose users have
started their servers with a size. Each user's kernels ask through a RemoteLedger with the user's
token, as their single-user server does: one thread per kernel start, each arriving at a random
moment within the minute (seeded, so every run asks the same).

The classroom has two sizes: `small` (1 GiB, 20 %, burst; 512 MiB and 10 % a kernel) for two
users in three, `large` (3 GiB, 10 %, hard; 1 GiB and 5 % a kernel) for the others, at most 3
kernels a user, on GPUs whose burst shares may add up to 200 % each (`gpus.burst_oversubscription:
2`; hard shares still 100 % at most). Their wishes together are more than the node has, so some are refused by their budget and
some by the devices. After the minute, every slice is given back and all 90 kernels ask again at
the same moment (the "burst" row: the broker's decisions at full load). After each phase the
ledger's allocations are checked: no device over capacity, no user over budget.

Then a class (issues 18 and 25): a class whose kernels are mostly idle (students read between
cells) on the same node, each student one 4 GiB kernel, played out on a virtual clock (nothing
waits for real minutes) against a fresh broker for each mode. A student opens their notebook (its
kernel starts) in the minute they arrive; after that, each minute, they run a cell with a small
probability (seeded: the same class for every mode). A kernel holds its 4 GiB on the GPU from its
first cell on; before it, it has not used the GPU. A start or a cell that cannot run yet waits:
in cull-only and suspend it is refused and the student asks again the next minute; in the fair
pool it waits in its server's line. The broker's room-making (its suspend requests, which time out
after 60 s) reads the class's clock.

- cull-only: a kernel idle for ``--cull-after`` minutes is stopped (its student's state is lost;
  their next cell starts a kernel again).
- suspend, as before the line: the harness is each student's server, asking the broker through
  the student's RemoteLedger. A kernel idle for ``--suspend-after`` minutes is suspended through
  the broker (POST .../suspend; the node's ``idle.suspend_host_memory`` bounds the host memory),
  and the next cell resumes it; culling after ``--cull-after`` as before. A start or resume that
  does not fit makes room: each owner's server reports its kernel's activity every minute, the
  broker records ``suspend_requested`` on the longest-idle kernels that run no cell, each owner
  (the harness, with that owner's token) suspends its requested kernel, and the start or resume
  is tried again. A kernel that has not used the GPU is never suspended (the servers before the
  line refused: it had nothing to move to host memory).
- the fair pool: each student's server is the server's own code, wired as VGPUApp wires it with a
  broker (StudentServer): a SliceManager over the student's RemoteLedger, whose starts go through
  admit_in_line and its Line; SuspendedKernels as the room maker (lends kernels that have not used
  the GPU, then suspends idle ones) and for resumes in the line; RoomForOthers (activity reports,
  the broker's suspend requests); IdleKernels (suspend after, cull after). Each minute the
  servers' slice watchers make passes (VGPUApp._watch_slices's steps, 0.5 s of the class's clock
  apart, the servers in a seeded random order each pass: whose watcher comes first is a race)
  until a pass changes nothing. Twice: with the suspend mode's idle timer, and "on demand" (no
  idle timer: room is made only when a start or a cell needs it, the server's default).
  Stand-ins: the kernel manager (a kernel's state, busy while its cell runs or waits, and last
  activity), the kernels' processes (LocalHolder with what it reads of them from the region and
  NVML given: 4 GiB once the kernel ran a cell) and the driver's checkpoint (moves those 4 GiB, or
  nothing for a kernel that has not used the GPU, which is then only lent).
- the fair pool with borrowing (issue 25, item 4): the fair pool with the idle timer, where the
  size guarantees its 4 GiB and may borrow 4 GiB more (``borrow: {memory: 4GiB}``), and a quarter
  of the students (drawn from the seed) start 8 GiB kernels: borrowing, so admitted only into room
  nobody within a guarantee needs, and taken back (suspended even mid-cell) when a start or cell
  within its guarantee does not fit. In the other modes they start 4 GiB kernels like everyone.

Time to guarantee: seconds of the class's clock from a start or a cell within its owner's
guarantee that needs room (every request of the other modes; a non-borrower's in the borrowing
mode) until it runs: the minutes and the watcher passes it waited (0.5 s each), and the copies
of the checkpoints on its GPU in the minute it ran, before it ran: the memory of the kernels
suspended to make its room (a borrower's 8 GiB where it was taken back) and, for a cell of a
suspended kernel, its own memory coming back, at the bandwidth an H100 moved a PyTorch kernel's
memory in this project's own check (FIELD-NOTES, 2026-11-27: suspend 1.6-1.8 GiB/s, resume
3.3-4.0 GiB/s; the slower ends, 1.6 and 3.3 GiB/s, are used). Copies on one GPU are counted one
after another; those of earlier minutes are taken to be done within the minute. The same figure
without the copies is shown beside it.

The kernels are slices only, no processes: NVML shows nothing of them, so the broker's check
before lending passes at once. After every minute: no device holds more than its memory
(suspended and lent slices left out, as the ledger counts them), no student more than their size,
and suspended slices hold no more host memory than the cap.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from private_machine import private_machine  # noqa: E402
from tornado import web  # noqa: E402
from tornado.httpserver import HTTPServer  # noqa: E402
from tornado.netutil import bind_sockets  # noqa: E402

from jupyter_vgpu.holders.base import SliceUsage  # noqa: E402
from jupyter_vgpu.holders.checkpoint import Suspendability, SuspendedProcess, Suspension  # noqa: E402
from jupyter_vgpu.holders.local import LocalHolder  # noqa: E402
from jupyter_vgpu.holders.region import ProcessUsage  # noqa: E402
from jupyter_vgpu.holders.suspender import Suspender  # noqa: E402
from jupyter_vgpu.hub.broker import USE_SCOPE, Broker  # noqa: E402
from jupyter_vgpu.hub.classroom import Classroom, load_classroom  # noqa: E402
from jupyter_vgpu.ledger import (  # noqa: E402
    ACTIVITY_KEY,
    SUSPEND_REQUESTED_KEY,
    Allocation,
    CapacityError,
    LedgerError,
    NotSupported,
)
from jupyter_vgpu.ledger.base import ROOM_FOR_KEY  # noqa: E402
from jupyter_vgpu.ledger.remote import RemoteLedger  # noqa: E402
from jupyter_vgpu.manager import SliceManager, SliceRefused  # noqa: E402
from jupyter_vgpu.model import FULL_SHARE, SliceLimits, SliceValueError  # noqa: E402
from jupyter_vgpu.server.idle import IdleKernels  # noqa: E402
from jupyter_vgpu.server.room import RoomForOthers  # noqa: E402
from jupyter_vgpu.server.suspend import SuspendedKernels  # noqa: E402

GIB = 1 << 30
BROKER_TOKEN = "broker-service-token"
PREFIX = "/services/vgpu/"
CLASSROOM = """\
gpus: {count: 2, memory: 16GiB, burst_oversubscription: 2}
simulate: true
broker: {state_dir: broker-state}
sizes:
  - name: small
    memory: 1GiB
    cores: 20
    policy: burst
    default: true
    kernel: {memory: 512MiB, cores: 10}
  - name: large
    memory: 3GiB
    cores: 10
    policy: hard
    kernel: {memory: 1GiB, cores: 5}
limits: {kernels: 3}
oversubscribe: true
"""
# What each size's kernels ask for: the size's kernel slice and policy.
KERNEL = {"small": SliceLimits(GIB // 2, 10, "burst"), "large": SliceLimits(GIB, 5, "hard")}


# -- the stand-in hub ----------------------------------------------------------------------------


@dataclass
class HubState:
    """The users the stand-in hub knows: token -> name, name -> chosen size."""

    tokens: dict[str, str]
    sizes: dict[str, str]
    requests: Counter = field(default_factory=Counter)


class _HubHandler(web.RequestHandler):
    def initialize(self, state: HubState) -> None:
        self.state = state

    def token(self) -> str:
        return self.request.headers.get("Authorization", "").partition(" ")[2].strip()


class WhoAmIHandler(_HubHandler):
    """GET /hub/api/user: the model of the token's owner (how HubAuth.user_for_token asks)."""

    def get(self) -> None:
        self.state.requests["GET /hub/api/user"] += 1
        name = self.state.tokens.get(self.token())
        if name is None:
            raise web.HTTPError(403)
        self.finish(
            {
                "kind": "user",
                "name": name,
                "admin": False,
                "groups": ["students"],
                "scopes": [f"{USE_SCOPE}!user={name}", "access:servers!user=" + name],
            }
        )


class UserHandler(_HubHandler):
    """GET /hub/api/users/<name>, for the broker's own token: groups and the running server's options."""

    def get(self, name: str) -> None:
        self.state.requests["GET /hub/api/users/<name>"] += 1
        if self.token() != BROKER_TOKEN:
            raise web.HTTPError(403)
        size = self.state.sizes.get(name)
        if size is None:
            raise web.HTTPError(404)
        self.finish(
            {
                "kind": "user",
                "name": name,
                "groups": ["students"],
                "servers": {"": {"name": "", "ready": True, "user_options": {"profile": size}}},
            }
        )


class LoopThread:
    """An asyncio event loop in a thread of its own (the hub's, the broker's)."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(60)

    def serve(self, make_application: Callable[[], web.Application]) -> tuple[str, HTTPServer]:
        async def start() -> tuple[str, HTTPServer]:
            sockets = bind_sockets(0, "127.0.0.1")
            server = HTTPServer(make_application())
            server.add_sockets(sockets)
            return f"http://127.0.0.1:{sockets[0].getsockname()[1]}", server

        return self.run(start())

    def stop(self, server: HTTPServer) -> None:
        async def stop() -> None:
            server.stop()
            await server.close_all_connections()

        self.run(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()


# -- the classroom -------------------------------------------------------------------------------


@contextlib.contextmanager
def running_broker(classroom: Classroom, state: HubState) -> Iterator[tuple[Broker, str]]:
    """The real broker of `classroom` behind a stand-in hub that knows `state`, each on a loop
    thread of its own: (the broker, its ledger URL), stopped on exit."""
    hub_loop = LoopThread("stand-in-hub")
    hub_url, hub_server = hub_loop.serve(
        lambda: web.Application(
            [
                (r"/hub/api/user", WhoAmIHandler, {"state": state}),
                (r"/hub/api/users/([^/]+)", UserHandler, {"state": state}),
            ]
        )
    )
    broker_loop = LoopThread("broker")

    async def make_broker() -> Broker:
        # On the broker's loop: its hub clients belong to the loop they are made on.
        return Broker(classroom, api_url=f"{hub_url}/hub/api", api_token=BROKER_TOKEN, prefix=PREFIX)

    broker = broker_loop.run(make_broker())
    broker_url, broker_server = broker_loop.serve(broker.application)
    try:
        yield broker, f"{broker_url}{PREFIX}ledger"
    finally:
        broker_loop.stop(broker_server)
        broker.close()
        hub_loop.stop(hub_server)


@dataclass
class Outcome:
    user: str
    kernel_id: str
    result: str  # "admitted" or the reason it was refused
    seconds: float
    number: int = 0  # the user's n-th kernel start (the first one's token is not yet in the broker's cache)


def ask(client: RemoteLedger, user: str, kernel_id: str, limits: SliceLimits) -> Outcome:
    began = time.perf_counter()
    try:
        client.admit(kernel_id, limits)
        result = "admitted"
    except CapacityError as error:
        result = error.resource
    except SliceValueError:
        result = "policy"
    except LedgerError as error:
        result = f"error: {error}"
    return Outcome(user, kernel_id, result, time.perf_counter() - began)


def run_phase(
    clients: dict[str, RemoteLedger], sizes: dict[str, str], kernels: int, arrivals: list[float], tag: str
) -> tuple[list[Outcome], float]:
    """Every user's ``kernels`` kernel starts, the n-th at ``arrivals[n]`` seconds after the start;
    returns the outcomes and the seconds from the first request to the last answer."""
    jobs = [(user, number) for user in sorted(clients) for number in range(kernels)]
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    barrier = threading.Barrier(len(jobs) + 1)
    began = 0.0

    def start(job: int) -> None:
        user, number = jobs[job]
        barrier.wait()
        delay = began + arrivals[job] - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        outcome = ask(clients[user], user, f"{user}-{tag}-kernel-{number}", KERNEL[sizes[user]])
        outcome.number = number
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=start, args=(job,)) for job in range(len(jobs))]
    for thread in threads:
        thread.start()
    began = time.perf_counter()
    barrier.wait()
    for thread in threads:
        thread.join()
    return outcomes, time.perf_counter() - began - min(arrivals)


def check_capacity(broker: Broker, sizes: dict[str, str]) -> list[str]:
    """What the ledger holds beyond a device's capacity or a user's budget (nothing, if it works);
    a suspended slice takes no room on its device (it holds host memory instead)."""
    problems = []
    allocations = broker.ledger.allocations()
    for usage in broker.ledger.devices_usage():
        on_it = [a for a in allocations if a.device_uuid == usage.device.uuid and not a.suspended]
        memory = sum(a.memory_limit for a in on_it)
        hard = sum(a.sm_share for a in on_it if a.policy == "hard")
        total = sum(a.sm_share for a in on_it)
        if memory > usage.memory_capacity or hard > FULL_SHARE or total > usage.share_capacity:
            problems.append(f"GPU {usage.device.index}: {memory} bytes, {hard}% hard, {total}% in all")
    classroom = broker.classroom
    for owner in sorted({a.owner for a in allocations}):
        mine = [a for a in allocations if a.owner == owner]
        budget = classroom.budget_for({"profile": sizes[owner]}, ["students"])
        if (
            sum(a.memory_limit for a in mine) > budget.max_memory
            or sum(a.sm_share for a in mine) > budget.max_cores
            or (budget.kernels is not None and len(mine) > budget.kernels)
            or (budget.policy == "burst" and any(a.policy == "hard" for a in mine))
        ):
            problems.append(f"{owner} holds more than the size {budget.size_name!r}")
    return problems


SIZES_BY_USER: dict[str, str] = {}


def percentile(samples: Sequence[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def row(phase: str, outcomes: list[Outcome], seconds: float, problems: list[str]) -> str:
    counts = Counter(outcome.result for outcome in outcomes)
    refused = {reason: count for reason, count in counts.items() if reason != "admitted"}
    reasons = ", ".join(f"{reason} {count}" for reason, count in sorted(refused.items())) or "-"
    latencies = [outcome.seconds * 1e3 for outcome in outcomes]
    return (
        f"| {phase} | {len(outcomes)} | {counts['admitted']} | {sum(refused.values())} ({reasons}) | "
        f"{'yes: ' + '; '.join(problems) if problems else 'no'} | {statistics.median(latencies):.1f} | "
        f"{percentile(latencies, 0.99):.1f} | {max(latencies):.1f} | {len(outcomes) / seconds:.1f} |"
    )


# -- a mostly idle class: cull-only, suspend, the fair pool (issues 18 and 25) ------------------------

IDLE_CLASSROOM = """\
gpus: {{count: 2, memory: 16GiB, burst_oversubscription: 2}}
simulate: true
broker: {{state_dir: broker-state}}
sizes:
  - {{name: notebook, memory: 4GiB, cores: 10, policy: burst, default: true, kernel: {{memory: 4GiB, cores: 10}}{borrow}}}
limits: {{kernels: 1}}
oversubscribe: true
idle: {{suspend_after: {suspend_after}m, suspend_host_memory: {host_memory}, cull_after: {cull_after}m}}
"""
NOTEBOOK = SliceLimits(4 * GIB, 10, "burst")
# A borrower's kernel in the borrowing mode: its 4 GiB guarantee and 4 GiB borrowed.
BORROWING_NOTEBOOK = SliceLimits(8 * GIB, 10, "burst")
BORROW = ", borrow: {memory: 4GiB}"
BORROWING_MODE = "fair pool, borrowing"
# The modes compared: (name, idle minutes before a kernel is suspended: None, the --suspend-after
# option; 0 never). The fair pool three times: with the suspend mode's idle timer, with room made
# only when a start or a cell needs it (the server's default: no idle option set), and with the
# idle timer and borrowing.
MODES = (
    ("cull-only", 0),
    ("suspend", None),
    ("fair pool", None),
    ("fair pool, on demand", 0),
    (BORROWING_MODE, None),
)
# The fair pool's servers: seconds between two passes of a server's slice watcher (VGPUApp's
# watch_interval default), and the most passes played out in one minute (they stop earlier, once a
# pass changes nothing).
WATCH_INTERVAL_S = 0.5
MAX_PASSES_A_MINUTE = 24
# The stand-in checkpoint: what a suspend and a resume move a second, as an H100 moved a 3.51 GiB
# PyTorch kernel in this project's check (FIELD-NOTES "Suspending a CUDA process", 2026-11-27:
# 1.6-1.8 GiB/s to host memory, 3.3-4.0 GiB/s back; the slower ends). The seconds the server
# records, and the copies counted in the time to guarantee.
SUSPEND_BYTES_A_SECOND = 1.6 * GIB
RESUME_BYTES_A_SECOND = 3.3 * GIB


class VirtualClock:
    """The class's clock, in epoch seconds: minute ``minute`` of the class plus ``second``. The
    broker's room-making (its suspend requests and their 60 s timeout), the servers' idle policy
    and activity reports all read it, so a 180-minute class plays out in seconds."""

    def __init__(self) -> None:
        self.epoch = float(int(time.time()))
        self.seconds = 0.0

    def __call__(self) -> float:
        return self.epoch + self.seconds

    def set(self, minute: int, second: float = 0.0) -> None:
        self.seconds = minute * 60.0 + second

    def at(self, minute: float) -> float:
        return self.epoch + minute * 60.0


class CountingLedger(RemoteLedger):
    """A student's server's RemoteLedger, counting its requests to the broker and their seconds."""

    requests = 0
    seconds = 0.0

    def _call(self, *arguments, **keywords):
        began = time.perf_counter()
        try:
            return super()._call(*arguments, **keywords)
        finally:
            CountingLedger.requests += 1
            CountingLedger.seconds += time.perf_counter() - began


@dataclass(frozen=True)
class ClassPlan:
    """Who arrives when and who runs a cell in which minute: drawn once from the seed, the same
    class for every mode."""

    names: list[str]
    arrivals: list[int]
    cells: list[list[bool]]
    borrowers: frozenset[str] = frozenset()  # who starts 8 GiB kernels in the borrowing mode

    @classmethod
    def draw(cls, seed: int, students: int, minutes: int, arrival_minutes: int, activity: float) -> ClassPlan:
        generator = random.Random(seed)
        names = [f"student-{number:02d}" for number in range(students)]
        arrivals = sorted(generator.randrange(arrival_minutes) for _ in names)
        cells = [[generator.random() < activity for _ in range(minutes)] for _ in names]
        # A generator of its own, so that the class the other modes play is the one drawn before.
        borrowers = frozenset(random.Random(seed + 1).sample(names, max(1, students // 4)))
        return cls(names, arrivals, cells, borrowers)

    def cell(self, number: int, minute: int) -> bool:
        """Whether student ``number`` runs a cell in ``minute`` (never in the minute they arrive:
        opening the notebook starts its kernel, the first cell comes later)."""
        return minute > self.arrivals[number] and self.cells[number][minute]


@dataclass
class Waiting:
    """A start or a cell that has not run yet: ``since`` the minute it was asked."""

    kind: str  # "start" (the notebook opened) or "cell"
    since: int
    needs_room: bool = True  # a start, or a cell of a suspended (lent) kernel or of one that was stopped
    refused: bool = False


@dataclass
class Student:
    name: str
    number: int
    arrives: int  # minute
    client: RemoteLedger
    kernel: str | None = None  # kernel id while it has one
    suspended: bool = False  # (cull-only and suspend: the harness is the server)
    used_gpu: bool = False  # its kernel ran a cell, so it holds its 4 GiB on the GPU
    last_active: float = 0.0  # virtual epoch seconds of its kernel's last activity
    starts: int = 0
    reported: tuple[str, bool, float] | None = None  # (kernel, busy, last activity) its server last reported
    waiting: Waiting | None = None
    ran_this_minute: bool = False
    limits: SliceLimits = NOTEBOOK  # what its kernels ask for


@dataclass
class ModeResult:
    mode: str
    minutes: int = 0
    held_peak: int = 0  # kernels alive at once (running, suspended, lent)
    running_peak: int = 0
    students_refused: set[str] = field(default_factory=set)
    refusals: int = 0  # answers "does not fit" to a start, a cell or a resume
    waits: list[int] = field(default_factory=list)  # minutes from a start or cell until it ran
    # Seconds of the class's clock from a start or cell within its owner's guarantee that needed
    # room until it ran (still waiting at the end: its wait so far).
    guarantee_waits: list[float] = field(default_factory=list)
    # The same, with the copies of the checkpoints on its GPU in the minute it ran, before it ran.
    guarantee_copied: list[float] = field(default_factory=list)
    taken_back: int = 0  # borrowing kernels asked to give their room back
    start_waits: list[int] = field(default_factory=list)
    still_waiting: list[int] = field(default_factory=list)  # minutes waited so far, at the end
    culled: int = 0  # kernels stopped idle
    culled_with_state: int = 0  # of them, kernels that had run a cell
    suspends: int = 0  # kernels whose GPU memory moved to host memory
    lent: int = 0  # kernels that had not used the GPU, whose room was lent
    resumes: int = 0
    # Starts and cells that did not run at once (the fair pool: not in the watcher pass they were
    # asked in), and the most watcher passes one that ran within its minute took.
    waited: Counter = field(default_factory=Counter)
    most_passes: int = 0
    overtook: int = 0  # starts and cells that ran while one asked earlier still waited (see overtakes)
    busy_minutes: int = 0  # minutes whose passes were still changing things at the last one
    asked: Counter = field(default_factory=Counter)  # starts and cells asked
    errors: list[str] = field(default_factory=list)
    reserved: float = 0.0  # sum over minutes of GiB reserved by running (not suspended or lent) slices
    in_use: float = 0.0  # ... by running slices whose kernels have used the GPU
    host_peak: int = 0
    host_over_cap_peak: int = 0  # how far past the cap host memory went (the swap), at most
    paired_suspends: int = 0  # suspends made for a named suspended kernel's resume
    capacity: int = 0
    problems: list[str] = field(default_factory=list)
    requests: int = 0
    request_seconds: float = 0.0
    wall_seconds: float = 0.0


class ClassRun:
    """One class on a fresh broker under one mode; ``run()`` plays it minute by minute."""

    def __init__(
        self, mode: str, suspend_after: int, args: argparse.Namespace, plan: ClassPlan, minutes: int, folder: Path
    ):
        self.mode, self.args, self.plan, self.minutes, self.folder = mode, args, plan, minutes, folder
        self.suspend_after = suspend_after  # minutes, 0: never
        self.result = ModeResult(mode, minutes=minutes)
        self.clock = VirtualClock()
        self.state = HubState(
            tokens={f"token-{name}": name for name in plan.names}, sizes=dict.fromkeys(plan.names, "notebook")
        )
        self.borrowing = mode == BORROWING_MODE
        path = folder / "classroom.yaml"
        path.write_text(
            IDLE_CLASSROOM.format(
                suspend_after=args.suspend_after,
                cull_after=args.cull_after,
                host_memory=args.host_memory,
                borrow=BORROW if self.borrowing else "",
            )
        )
        self.classroom = load_classroom(path, hub_groups=None)
        self.cap = self.classroom.idle.suspend_host_memory or 0
        self.people: list[Student] = []
        self.by_kernel: dict[str, Student] = {}
        self.pass_number = 0  # the fair pool's watcher pass within the minute
        self.minute = 0  # the class's minute being played
        # Seconds of checkpoint copies on each GPU in a minute: (minute, device uuid) -> seconds.
        self.copying: Counter = Counter()
        # Suspended kernels whose resume a suspend was paired with (the swap at the host cap): while
        # one is suspended, host memory may exceed the cap by as much as it holds.
        self.paired: set[str] = set()

    def run(self) -> ModeResult:
        began = time.perf_counter()
        CountingLedger.requests, CountingLedger.seconds = 0, 0.0
        with running_broker(self.classroom, self.state) as (broker, ledger_url):
            self.broker = broker
            # The broker's room-making reads the class's clock (its suspend requests time out after
            # 60 s of it); everything else of the broker is as `jupyter vgpu broker` runs it.
            broker.lending.clock = self.clock
            broker.lending.hold = 0.0  # admissions are stamped with the wall's clock, not the class's
            publish = broker.lending.on_take_back

            def taken_back(allocation: Allocation, asked: bool) -> None:
                self.result.taken_back += asked
                if publish is not None:
                    publish(allocation, asked)

            broker.lending.on_take_back = taken_back
            self.result.capacity = sum(usage.memory_capacity for usage in broker.ledger.devices_usage())
            self.people = [
                Student(
                    name,
                    number,
                    arrives,
                    CountingLedger(ledger_url, f"token-{name}", timeout=60),
                    limits=BORROWING_NOTEBOOK if self.borrowing and name in self.plan.borrowers else NOTEBOOK,
                )
                for number, (name, arrives) in enumerate(zip(self.plan.names, self.plan.arrivals, strict=True))
            ]
            try:
                self.play()
            finally:
                for student in self.people:
                    student.client.close()
        for student in self.people:
            if student.waiting is not None:
                self.result.still_waiting.append(self.minutes - student.waiting.since)
                if student.waiting.needs_room and self.within_guarantee(student):
                    self.result.guarantee_waits.append((self.minutes - student.waiting.since) * 60.0)
                    self.result.guarantee_copied.append((self.minutes - student.waiting.since) * 60.0)
        self.result.requests, self.result.request_seconds = CountingLedger.requests, CountingLedger.seconds
        self.result.wall_seconds = time.perf_counter() - began
        return self.result

    def play(self) -> None:
        raise NotImplementedError

    # -- what every mode shares ------------------------------------------------------------------

    def new_requests(self, student: Student, now: int) -> None:
        """The student's start (the minute they arrive) or cell this minute, unless one waits already."""
        if now == student.arrives:
            student.waiting = Waiting("start", now)
            self.result.asked["start"] += 1
        elif self.plan.cell(student.number, now) and student.waiting is None:
            kernel = student.kernel and self.broker.ledger.get(student.kernel)
            student.waiting = Waiting("cell", now, needs_room=not kernel or kernel.suspended)
            self.result.asked["cell"] += 1

    def ran(self, student: Student, now: int) -> None:
        """The student's waiting start or cell runs now."""
        waiting = student.waiting
        assert waiting is not None
        self.result.waits.append(now - waiting.since)
        if waiting.needs_room and self.within_guarantee(student):
            waited = (now - waiting.since) * 60.0 + self.pass_number * WATCH_INTERVAL_S
            self.result.guarantee_waits.append(waited)
            device = self.device_of(student.kernel) if student.kernel else ""
            self.result.guarantee_copied.append(waited + self.copying[(now, device)])
        if now > waiting.since or self.pass_number:
            self.result.waited[waiting.kind] += 1
        if now == waiting.since:
            self.result.most_passes = max(self.result.most_passes, self.pass_number)
        if waiting.needs_room and self.overtakes(student, waiting):
            self.result.overtook += 1
        if waiting.kind == "start":
            self.result.start_waits.append(now - waiting.since)
        else:
            student.used_gpu = True
            student.ran_this_minute = True
        student.last_active = self.clock()
        student.waiting = None

    def copied(self, device: str, seconds: float) -> None:
        """A checkpoint's copy on ``device`` this minute (a suspend's or a resume's)."""
        self.copying[(self.minute, device)] += seconds

    def device_of(self, kernel_id: str) -> str:
        allocation = self.broker.ledger.get(kernel_id)
        return allocation.device_uuid or "" if allocation is not None else ""

    def within_guarantee(self, student: Student) -> bool:
        """Whether the student's requests are within their guarantee (a borrower's are not)."""
        return student.limits.memory_limit <= NOTEBOOK.memory_limit

    def overtakes(self, student: Student, waiting: Waiting) -> bool:
        """Whether the student's start or cell runs while another student's, asked in an earlier
        minute, still waits for room it could have had: a start (any GPU), or a cell of a suspended
        kernel on the GPU this one runs on."""
        earlier = [
            s
            for s in self.people
            if s is not student and s.waiting and s.waiting.needs_room and s.waiting.since < waiting.since
        ]
        if not earlier:
            return False
        devices = {a.kernel_id: a.device_uuid for a in self.broker.ledger.allocations()}
        here = devices.get(student.kernel or "")
        return any(other.kernel is None or devices.get(other.kernel) == here for other in earlier)

    def refused(self, student: Student) -> None:
        self.result.refusals += 1
        self.result.students_refused.add(student.name)
        if student.waiting is not None:
            student.waiting.refused = True

    def stopped(self, student: Student) -> None:
        self.result.culled += 1
        self.result.culled_with_state += student.used_gpu
        if student.kernel is not None:
            self.by_kernel.pop(student.kernel, None)
        student.kernel, student.suspended, student.used_gpu, student.reported = None, False, False, None

    def measure(self, now: int) -> None:
        """The minute's figures and checks, read from the broker's ledger."""
        allocations = self.broker.ledger.allocations()
        running = [a for a in allocations if not a.suspended]
        result = self.result
        result.held_peak = max(result.held_peak, len(allocations))
        result.running_peak = max(result.running_peak, len(running))
        result.reserved += sum(a.memory_limit for a in running) / GIB
        result.in_use += (
            sum(
                a.memory_limit
                for a in running
                if a.kernel_id in self.by_kernel and self.by_kernel[a.kernel_id].used_gpu
            )
            / GIB
        )
        in_host = sum(a.host_memory for a in allocations)
        problems = check_capacity(self.broker, self.state.sizes) + self.check_host(allocations)
        result.problems.extend(f"minute {now}: {problem}" for problem in problems)
        if self.args.trace and now % self.args.trace == self.args.trace - 1:
            self.trace(now, allocations, in_host)

    def suspended_one(self, was: Allocation) -> None:
        """After a suspend (``was``: the slice before it, with the broker's request): the pairing
        it carried out, and host memory checked where it peaks."""
        request = was.metadata.get(SUSPEND_REQUESTED_KEY)
        if isinstance(request, dict) and isinstance(request.get(ROOM_FOR_KEY), str):
            self.paired.add(request[ROOM_FOR_KEY])
            self.result.paired_suspends += 1
        problems = self.check_host(self.broker.ledger.allocations())
        self.result.problems.extend(f"after suspending {was.kernel_id}: {problem}" for problem in problems)

    def check_host(self, allocations: list[Allocation]) -> list[str]:
        """Host memory against the cap plus what a paired resume gives back (the swap), read at
        each minute and after each suspend, when it is highest; records the peaks."""
        in_host = sum(a.host_memory for a in allocations)
        self.result.host_peak = max(self.result.host_peak, in_host)
        if not self.cap:
            return []
        self.result.host_over_cap_peak = max(self.result.host_over_cap_peak, in_host - self.cap)
        swap = max((a.host_memory for a in allocations if a.suspended and a.kernel_id in self.paired), default=0)
        if in_host <= self.cap + swap:
            return []
        return [f"host memory {in_host} over the cap {self.cap} plus the paired resume's {swap}"]

    def trace(self, now: int, allocations: list[Allocation], in_host: int) -> None:
        """One line of what the GPUs and the host memory hold at the end of minute ``now`` (--trace)."""
        waiting = {s.kernel for s in self.people if s.waiting is not None and s.kernel is not None}
        running = [a for a in allocations if not a.suspended]
        idle = sum(
            1
            for a in running
            if a.kernel_id not in waiting and not getattr(self.by_kernel.get(a.kernel_id), "ran_this_minute", True)
        )
        suspended = [a for a in allocations if a.suspended and not a.lent]
        print(
            f"{self.mode}, minute {now}: running {len(running)} (idle {idle}); suspended {len(suspended)} (a cell "
            f"waits in {sum(1 for a in suspended if a.kernel_id in waiting)}); lent "
            f"{sum(1 for a in allocations if a.lent)}; starts waiting "
            f"{sum(1 for s in self.people if s.waiting is not None and s.kernel is None)}; host memory "
            f"{in_host / GIB:.0f} GiB; stopped so far {self.result.culled}",
            file=sys.stderr,
        )


class RefusingClass(ClassRun):
    """cull-only and suspend, as before the line: the harness is each student's server, asking the
    broker through the student's RemoteLedger; a start, cell or resume that does not fit is refused,
    and the student tries again the next minute. In ``suspend`` a kernel whose processes have not
    used the GPU cannot be suspended (the servers before the line refused: "no process of it has
    used the GPU yet, so it holds nothing to move to host memory"); it runs until it is stopped."""

    def suspend(self, student: Student) -> bool:
        assert student.kernel is not None
        if not student.used_gpu:
            return False
        try:
            student.client.suspend(student.kernel, host_memory=NOTEBOOK.memory_limit)
        except NotSupported:
            return False  # the host memory cap: it keeps running, stopped later
        student.suspended = True
        self.result.suspends += 1
        self.copied(self.device_of(student.kernel), student.limits.memory_limit / SUSPEND_BYTES_A_SECOND)
        return True

    def report(self) -> None:
        """Each running kernel's server reports its activity, where it changed (server/room.py)."""
        for student in self.people:
            if student.kernel and not student.suspended:
                busy = student.waiting is not None and student.waiting.kind == "cell"
                now_reported = (student.kernel, busy, student.last_active)
                if now_reported != student.reported:
                    activity = {"busy": busy, "last_activity": student.last_active}
                    student.client.update_metadata(student.kernel, **{ACTIVITY_KEY: activity})
                    student.reported = now_reported

    def make_room(self, refused: CapacityError) -> bool:
        """The owners' servers suspend the kernels the broker asked them to; whether one was."""
        if not self.suspend_after or not refused.making_room:
            return False
        made = False
        for student in self.people:
            if (
                not student.kernel
                or student.suspended
                or student.reported != (student.kernel, False, student.last_active)
            ):
                continue
            before = student.client.get(student.kernel)
            if before.metadata.get(SUSPEND_REQUESTED_KEY) and self.suspend(student):
                self.suspended_one(before)
                made = True
        return made

    def play(self) -> None:
        args = self.args
        for now in range(self.minutes):
            self.clock.set(now)
            self.minute = now
            for student in self.people:
                student.ran_this_minute = False
                if student.arrives <= now:
                    self.new_requests(student, now)
            self.report()
            for student in self.people:
                if student.arrives > now:
                    continue
                if student.waiting is not None:
                    self.try_to_run(student, now)
                    continue
                if student.kernel is None or student.ran_this_minute:
                    continue
                idle_for = (self.clock() - student.last_active) / 60
                if idle_for >= args.cull_after:
                    student.client.release(student.kernel)
                    self.stopped(student)
                elif self.suspend_after and not student.suspended and idle_for >= self.suspend_after:
                    self.suspend(student)
            self.measure(now)

    def try_to_run(self, student: Student, now: int) -> None:
        while True:
            try:
                if student.kernel is None:
                    kernel_id = f"{student.name}-kernel-{student.starts}"
                    student.client.admit(kernel_id, NOTEBOOK)
                    student.kernel, student.starts = kernel_id, student.starts + 1
                    self.by_kernel[kernel_id] = student
                elif student.suspended:
                    student.client.resume(student.kernel)
                    student.suspended = False
                    self.result.resumes += 1
                    self.copied(self.device_of(student.kernel), student.limits.memory_limit / RESUME_BYTES_A_SECOND)
                self.ran(student, now)
                return
            except CapacityError as refused:
                if not self.make_room(refused):
                    self.refused(student)
                    return


# -- the fair pool: each student's server as the server runs it ----------------------------------


class StandInKernel:
    """What the server's code reads of a kernel (jupyter_server's kernel object)."""

    def __init__(self, last_activity: float):
        self.execution_state = "idle"
        self.last_activity = datetime.fromtimestamp(last_activity, tz=timezone.utc)


class StandInKernels:
    """jupyter_server's kernel manager, as much of it as the slice manager, the idle policy, the
    suspender and the room-maker read: which kernels run, their state and last activity, and a
    shutdown (which, as the provisioner's cleanup does, gives the slice back)."""

    def __init__(self, on_shutdown: Callable[[str], None]):
        self.kernels: dict[str, StandInKernel] = {}
        self.on_shutdown = on_shutdown

    def __contains__(self, kernel_id: object) -> bool:
        return kernel_id in self.kernels

    def list_kernel_ids(self) -> list[str]:
        return list(self.kernels)

    def get_kernel(self, kernel_id: str) -> StandInKernel:
        return self.kernels[kernel_id]

    async def shutdown_kernel(self, kernel_id: str, now: bool = False) -> None:
        self.kernels.pop(kernel_id, None)
        self.on_shutdown(kernel_id)


class StandInProcesses(LocalHolder):
    """The local holder (regions made beside the broker's limits pages, as in a classroom), except
    that a kernel's processes are stand-ins: no process runs, and what the holder would read of
    them from the region and NVML is the student's: 4 GiB on the GPU once its kernel ran a cell,
    nothing before."""

    def __init__(self, student: Student, pid: int, **keywords):
        super().__init__(**keywords)
        self.student, self.pid = student, pid

    def _held(self) -> int:
        return self.student.limits.memory_limit if self.student.used_gpu else 0

    def usage(self, allocation: Allocation) -> SliceUsage:
        if not self._held():
            return SliceUsage("unused")
        return SliceUsage("running", [ProcessUsage(self.pid, self._held(), 0, 1, 0, 0, 0)])

    def known_processes(self, allocation: Allocation) -> dict[int, int]:
        return {self.pid: self._held()}

    def slice_processes(self, allocation: Allocation) -> dict[int, int]:
        return {self.pid: 1}

    def is_alive(self, allocation: Allocation) -> bool:
        return True

    def stop(self, allocation: Allocation) -> list[str]:
        return []

    def resume_requests(self, allocation: Allocation) -> int:
        return 0  # a cell that waits marks its kernel busy, which resumes it

    def uses_managed_memory(self, allocation: Allocation) -> bool:
        return False


class StandInCheckpoints:
    """The driver's checkpoint, for stand-in processes: a kernel that has used the GPU moves its
    4 GiB to host memory (at the simulated driver's 7 GB/s, for the seconds the server records);
    one that has not moves nothing, so its room is only lent."""

    def __init__(self, processes: StandInProcesses, device_of: Callable[[str], str]):
        self.processes = processes
        self.device_of = device_of  # the device a kernel's slice is on, as the driver knows it

    def probe(self, pids: Iterable[int], *, managed_memory: bool = False) -> Suspendability:
        return Suspendability()

    def suspend(self, pids: Iterable[int], *, lock_timeout: float) -> Suspension:
        held = self.processes._held()
        if not held:
            return Suspension(())
        kernel = self.processes.student.kernel
        device = self.device_of(kernel) if kernel else ""
        return Suspension((SuspendedProcess(self.processes.pid, device, held),), held / SUSPEND_BYTES_A_SECOND)

    def resume(self, suspension: Suspension) -> float:
        return suspension.memory / RESUME_BYTES_A_SECOND


class CountingSuspender(Suspender):
    """The server's Suspender, counting what it suspended, lent and resumed (from worker threads)."""

    lock = threading.Lock()

    def __init__(
        self,
        result: ModeResult,
        *arguments,
        suspended_one: Callable[[Allocation], None],
        copied: Callable[[str, float], None],
        **keywords,
    ):
        super().__init__(*arguments, **keywords)
        self.result = result
        self.suspended_one = suspended_one
        self.copied = copied  # (device, seconds of copy)

    def suspend(self, allocation: Allocation, *, lock_timeout: float, release_wait: float = 0.0) -> Allocation:
        suspended = super().suspend(allocation, lock_timeout=lock_timeout, release_wait=release_wait)
        if not allocation.suspended:
            with self.lock:
                if suspended.lent:
                    self.result.lent += 1
                else:
                    self.result.suspends += 1
                    self.copied(allocation.device_uuid or "", suspended.host_memory / SUSPEND_BYTES_A_SECOND)
                self.suspended_one(allocation)
        return suspended

    def resume(self, allocation: Allocation) -> Allocation:
        resumed = super().resume(allocation)
        if allocation.suspended:
            with self.lock:
                self.result.resumes += 1
                self.copied(resumed.device_uuid or "", allocation.host_memory / RESUME_BYTES_A_SECOND)
        return resumed


class StudentServer:
    """One student's Jupyter server as far as GPU room goes, made of the server's own parts wired
    as VGPUApp wires them with a broker: a SliceManager over the student's RemoteLedger (its line,
    admit_in_line), SuspendedKernels as its room maker (lends kernels that have not used the GPU
    first, then suspends idle ones), RoomForOthers (activity reports, the broker's suspend requests),
    IdleKernels (suspend after, cull after), on the class's clock."""

    def __init__(self, run: FairPoolClass, student: Student, log: logging.Logger):
        self.run, self.student = run, student
        args, classroom = run.args, run.classroom
        self.kernels = StandInKernels(self.shut_down)
        self.holder = StandInProcesses(
            student,
            4_000_000 + student.number,
            region_dir=run.folder / "servers" / student.name / "regions",
            simulate=True,
            limits_dir=classroom.limits_dir,
        )
        self.slices = SliceManager(student.client, [self.holder], NOTEBOOK, log=log)
        # SliceManager.suspender (a cached property) with the stand-in checkpoint.
        self.slices.__dict__["suspender"] = CountingSuspender(
            run.result,
            student.client,
            self.holder,
            controller=StandInCheckpoints(self.holder, run.device_of),
            suspended_one=run.suspended_one,
            copied=run.copied,
        )
        # Waiting starts are served by the watcher's passes, as on a server whose retry timer
        # has not fired: one pass a WATCH_INTERVAL_S of the class's clock, not of the wall's.
        self.slices.line.retry_interval = 1e9
        suspend_after = run.suspend_after * 60
        self.suspended = SuspendedKernels(
            self.slices,
            self.kernels,
            suspend_after=suspend_after,
            host_memory_cap=classroom.idle.suspend_host_memory,
            # No hold: the class runs on a virtual clock, while the ledger stamps admissions with
            # the wall's (a hold would read every kernel as just started).
            hold=0.0,
            log=log,
        )
        self.slices.room_maker = self.suspended.make_room
        self.slices.line.published = self.suspended.show_place
        self.room = RoomForOthers(self.suspended, clock=run.clock)
        self.idle = IdleKernels(
            self.slices,
            self.kernels,
            cull_after=args.cull_after * 60,
            suspend_after=suspend_after,
            suspend=self.suspended.suspend_idle,
            log=log,
            clock=run.clock,
        )
        self.start: asyncio.Task | None = None

    async def watch(self) -> None:
        """One pass of the slice watcher (VGPUApp._watch_slices, in its order)."""
        allocations = [status.allocation for status in self.slices.statuses()]
        await self.suspended.check(allocations)
        await self.slices.line.serve()
        await self.room.check(allocations)
        await self.idle.check(allocations)

    def begin_start(self) -> None:
        """A kernel start through admit_in_line, as the provisioner makes it (a pending kernel)."""
        student = self.student
        kernel_id = f"{student.name}-kernel-{student.starts}"
        student.starts += 1

        async def start() -> None:
            try:
                await self.slices.admit_in_line(kernel_id, student.limits, owner=student.name)
            except SliceRefused:
                self.run.refused(student)
                return
            self.kernels.kernels[kernel_id] = StandInKernel(self.run.clock())
            student.kernel = kernel_id
            self.run.by_kernel[kernel_id] = student

        self.start = asyncio.get_running_loop().create_task(start(), name=f"start {kernel_id}")

    def starting(self) -> bool:
        """Whether a start is under way and not yet waiting in the line (or done)."""
        if self.start is None or self.start.done():
            return False
        kernel_id = f"{self.student.name}-kernel-{self.student.starts - 1}"
        return kernel_id not in self.slices.line

    def shut_down(self, kernel_id: str) -> None:
        """What the provisioner's cleanup and the server do when a kernel is shut down (culled)."""
        self.slices.line.leave(kernel_id, "its kernel was shut down while it waited")
        self.slices.release(kernel_id)
        if self.student.kernel == kernel_id:
            self.run.stopped(self.student)


class FairPoolClass(ClassRun):
    """The fair pool: each student's server is a :class:`StudentServer`; a start or a cell that
    does not fit waits in its server's line and goes ahead when room is made."""

    def play(self) -> None:
        asyncio.run(self.play_async())

    async def play_async(self) -> None:
        log = logging.getLogger("classroom-bench")
        self.servers = [StudentServer(self, student, log) for student in self.people]
        order = random.Random(self.args.seed)
        for now in range(self.minutes):
            self.clock.set(now)
            self.minute = now
            for server in self.servers:
                student = server.student
                student.ran_this_minute = False
                if student.arrives > now:
                    continue
                self.new_requests(student, now)
                if student.waiting is None:
                    continue
                if student.kernel is None and not self.start_pending(server):
                    # Opening the notebook, a cell after its kernel was stopped, or (never here) a
                    # start refused the minute before, tried again.
                    server.begin_start()
                elif student.kernel is not None and server.kernels.kernels[student.kernel].execution_state != "busy":
                    self.mark_busy(server)
            for number in range(MAX_PASSES_A_MINUTE):
                self.clock.set(now, number * WATCH_INTERVAL_S)
                self.pass_number = number
                before = self.snapshot()
                servers = [s for s in self.servers if s.student.arrives <= now]
                order.shuffle(servers)  # which server's watcher comes first in a moment: a race
                for server in servers:
                    if server.student.kernel is not None or len(server.slices.line):
                        await server.watch()
                    await self.settle()
                    self.resolve(server, now)
                if number and self.snapshot() == before:
                    break
            else:
                self.result.busy_minutes += 1
            self.pass_number = 0
            for server in self.servers:
                student = server.student
                kernel = server.kernels.kernels.get(student.kernel or "")
                if kernel is not None and student.ran_this_minute:
                    kernel.execution_state = "idle"  # the cell is done
                    kernel.last_activity = datetime.fromtimestamp(student.last_active, tz=timezone.utc)
            self.measure(now)
        for server in self.servers:
            if server.start is not None and not server.start.done():
                server.start.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await server.start
            if server.start is not None and server.start.done() and not server.start.cancelled():
                error = server.start.exception()
                if error is not None:
                    self.result.errors.append(f"{server.student.name}'s start: {error!r}")

    def start_pending(self, server: StudentServer) -> bool:
        return server.start is not None and not server.start.done()

    def mark_busy(self, server: StudentServer) -> None:
        """A cell was sent to the kernel: busy (a cell that waits for room keeps it busy)."""
        student = server.student
        kernel = server.kernels.kernels[student.kernel or ""]
        kernel.execution_state = "busy"
        kernel.last_activity = datetime.fromtimestamp(self.clock(), tz=timezone.utc)

    async def settle(self) -> None:
        """Let what the pass set going finish: the line's passes it kicked, starts until they run
        or wait in line."""
        for _ in range(10_000):
            current = asyncio.current_task()
            starts = {server.start for server in self.servers if server.start is not None}
            others = [task for task in asyncio.all_tasks() if task is not current and task not in starts]
            if not others and not any(server.starting() for server in self.servers):
                return
            if others:
                await asyncio.wait(others)
            else:
                await asyncio.sleep(0.001)
        raise RuntimeError("the servers' tasks did not settle")

    def resolve(self, server: StudentServer, now: int) -> None:
        """Whether the student's waiting start or cell runs now."""
        student = server.student
        waiting = student.waiting
        if waiting is None or student.kernel is None:
            return
        if waiting.kind == "start":
            self.ran(student, now)
            return
        kernel = server.kernels.kernels.get(student.kernel)
        if kernel is not None and kernel.execution_state != "busy":
            self.mark_busy(server)  # its kernel just started again: the cell is sent
        allocation = self.broker.ledger.get(student.kernel)
        if allocation is not None and not allocation.suspended:
            self.ran(student, now)

    def snapshot(self) -> tuple:
        """What the servers' next pass reads of the class, to tell whether a pass changed it. The
        activity reports are in it: a pass whose only trace is a report (the broker withdrew the
        suspend request it had made on the reporting kernel's stale report, within the same pass)
        changed what the broker asks next, and a server's watcher ticks again as on a real server."""
        allocations = self.broker.ledger.allocations()
        return (
            tuple(
                (
                    a.kernel_id,
                    a.suspended,
                    a.metadata.get(SUSPEND_REQUESTED_KEY) is not None,
                    repr(a.metadata.get(ACTIVITY_KEY)),
                )
                for a in allocations
            ),
            tuple(s.waiting is not None for s in self.people),
            tuple(len(server.slices.line) for server in self.servers),
        )


def play_class(mode: str, suspend_after: int, args: argparse.Namespace, plan: ClassPlan, minutes: int) -> ModeResult:
    with tempfile.TemporaryDirectory(prefix="vgpu-classroom-class-", dir=os.environ.get("TMPDIR")) as tmp:
        kind = FairPoolClass if mode.startswith("fair pool") else RefusingClass
        return kind(mode, suspend_after, args, plan, minutes, Path(tmp)).run()


def _figure(samples: Sequence[float], fraction: float | None = None) -> str:
    """A percentile (None: the largest) of minutes or seconds, as the table shows it."""
    if not samples:
        return "-"
    value = percentile(samples, fraction) if fraction is not None else max(samples)
    return f"{round(value, 1):g}"


def class_comparison(args: argparse.Namespace) -> bool:
    """Print the class table; False where something went over capacity or the fair pool refused."""
    students, minutes, arrival = (12, 40, 10) if args.smoke else (args.students, args.minutes, args.arrival_minutes)
    plan = ClassPlan.draw(args.seed, students, minutes, arrival, args.activity)
    chosen = args.mode or [mode for mode, _ in MODES]
    unknown = set(chosen) - {mode for mode, _ in MODES}
    if unknown:
        sys.exit(f"--mode: no mode {', '.join(sorted(unknown))}; the modes: {'; '.join(mode for mode, _ in MODES)}")
    results = [
        play_class(mode, args.suspend_after if after is None else after, args, plan, minutes)
        for mode, after in MODES
        if mode in chosen
    ]
    print()
    print(
        f"A class: {students} students, one 4GiB kernel each (8 fit in the node's 2 x 16 GiB at once), opening "
        f"their notebook (the kernel starts) within {arrival} min, {minutes} min in all; after that a student "
        f"runs a cell in a given minute with probability {args.activity:g}; seed {args.seed}. Suspend after "
        f"{args.suspend_after} min idle (suspend, fair pool; fair pool, on demand: never), stop after {args.cull_after} "
        f"min idle; host memory cap {args.host_memory}. {BORROWING_MODE}: the size guarantees 4GiB and may borrow "
        f"4GiB more, and {len(plan.borrowers)} students (drawn from the seed) start 8GiB kernels. Waits in minutes of the class's clock (0: within the "
        "minute it was asked); a start or cell still waiting at the end counts with its wait so far. GPU memory: "
        "memory-minutes reserved by running (not suspended or lent) kernels over the node's."
    )
    print()
    rows: list[tuple[str, Callable[[ModeResult], str]]] = [
        ("starts + cells asked", lambda r: f"{r.asked['start']} + {r.asked['cell']}"),
        ("students ever refused (refusals)", lambda r: f"{len(r.students_refused)} ({r.refusals})"),
        ("waited: starts + cells", lambda r: f"{r.waited['start']} + {r.waited['cell']}"),
        ("&nbsp;&nbsp;of them ran while one asked earlier still waited", lambda r: f"{r.overtook}"),
        (
            "wait p50 / p95 / max, min",
            lambda r: " / ".join(_figure(r.waits + r.still_waiting, f) for f in (0.5, 0.95, None)),
        ),
        (
            "&nbsp;&nbsp;starts: p95 / max, min",
            lambda r: f"{_figure(r.start_waits, 0.95)} / {_figure(r.start_waits)}",
        ),
        ("still waiting at the end", lambda r: f"{len(r.still_waiting)}"),
        (
            "time to guarantee p50 / p95 / max, s (copies at 1.6 / 3.3 GiB/s)",
            lambda r: " / ".join(_figure(r.guarantee_copied, f) for f in (0.5, 0.95, None)),
        ),
        (
            "&nbsp;&nbsp;the same without the copies",
            lambda r: " / ".join(_figure(r.guarantee_waits, f) for f in (0.5, 0.95, None)),
        ),
        ("borrowing kernels taken back", lambda r: f"{r.taken_back}"),
        (
            "GPU memory reserved by running kernels",
            lambda r: f"{100 * r.reserved / (r.capacity / GIB * r.minutes):.0f} %",
        ),
        (
            "&nbsp;&nbsp;by kernels that had used the GPU",
            lambda r: f"{100 * r.in_use / (r.capacity / GIB * r.minutes):.0f} %",
        ),
        ("kernels stopped (of them had run a cell)", lambda r: f"{r.culled} ({r.culled_with_state})"),
        ("suspended / lent / resumed", lambda r: f"{r.suspends} / {r.lent} / {r.resumes}"),
        ("host memory peak", lambda r: f"{r.host_peak / GIB:.0f} GiB"),
        ("host memory past the cap, peak", lambda r: f"{max(0, r.host_over_cap_peak) / GIB:.0f} GiB"),
        ("suspends paired with a resume (the swap)", lambda r: f"{r.paired_suspends}"),
        ("kernels held, peak", lambda r: f"{r.held_peak}"),
        (
            "over capacity in any minute?",
            lambda r: "yes: " + "; ".join(r.problems[:3]) if r.problems else "no",
        ),
        (
            "broker requests (mean ms)",
            lambda r: f"{r.requests} ({r.request_seconds / r.requests * 1e3 if r.requests else 0.0:.1f})",
        ),
        ("wall seconds", lambda r: f"{r.wall_seconds:.0f}"),
    ]
    print("| | " + " | ".join(r.mode for r in results) + " |")
    print("|---|" + "---:|" * len(results))
    for name, cell in rows:
        print(f"| {name} | " + " | ".join(cell(r) for r in results) + " |")
    fair = [r for r in results if r.mode.startswith("fair pool")]
    print()
    for r in results:
        if r.mode.startswith("fair pool"):
            print(
                f"{r.mode}: a start or cell that ran within the minute it was asked took at most {r.most_passes} "
                f"watcher passes after the first ({r.most_passes * WATCH_INTERVAL_S:g} s of the servers' clock, the "
                f"checkpoints' copies not counted); minutes still changing after {MAX_PASSES_A_MINUTE} passes: "
                f"{r.busy_minutes}."
            )
        for error in r.errors:
            print(f"{r.mode}: {error}", file=sys.stderr)
    return not any(r.problems for r in results) and not any(r.students_refused or r.errors for r in fair)


def admission(args: argparse.Namespace) -> bool:
    """Print the admission table (the first part); False where something went wrong."""
    users, kernels, window = (4, 3, 2.0) if args.smoke else (args.users, args.kernels, args.seconds)

    names = [f"student-{number:02d}" for number in range(users)]
    SIZES_BY_USER.update({name: "large" if number % 3 == 0 else "small" for number, name in enumerate(names)})
    state = HubState(tokens={f"token-{name}": name for name in names}, sizes=dict(SIZES_BY_USER))

    with tempfile.TemporaryDirectory(prefix="vgpu-classroom-bench-", dir=os.environ.get("TMPDIR")) as tmp:
        path = Path(tmp) / "classroom.yaml"
        path.write_text(CLASSROOM)
        classroom = load_classroom(path, hub_groups=None)

        with running_broker(classroom, state) as (broker, ledger_url):
            clients = {name: RemoteLedger(ledger_url, f"token-{name}", timeout=60) for name in names}
            try:
                random.seed(args.seed)
                arrivals = sorted(random.uniform(0, window) for _ in range(users * kernels))
                random.shuffle(arrivals)
                spread, spread_s = run_phase(clients, SIZES_BY_USER, kernels, arrivals, "minute")
                spread_problems = check_capacity(broker, SIZES_BY_USER)
                held = len(broker.ledger.allocations())
                for name, client in clients.items():
                    for allocation in client.allocations():
                        assert allocation.owner == name
                        client.release(allocation.kernel_id)
                burst, burst_s = run_phase(clients, SIZES_BY_USER, kernels, [0.0] * (users * kernels), "burst")
                burst_problems = check_capacity(broker, SIZES_BY_USER)
            finally:
                for client in clients.values():
                    client.close()

    errors = [outcome.result for outcome in spread + burst if outcome.result.startswith("error")]
    sizes = Counter(SIZES_BY_USER.values())
    print(
        f"{users} users x {kernels} kernels, arriving within {window:g} s, on 2 simulated GPUs (2 x 16 GiB, "
        f"burst_oversubscription {broker.ledger.share_capacity / FULL_SHARE:g}); "
        f"sizes: small {sizes['small']} users (512MiB 10% burst a kernel, budget 1GiB 20%), large "
        f"{sizes['large']} users (1GiB 5% hard a kernel, budget 3GiB 10%), at most {kernels} kernels a user."
    )
    print("The broker (jupyter_vgpu.hub.broker.Broker) is real; JupyterHub is a stand-in in this process.")
    print()
    print(
        "| phase | asked | admitted | refused (by reason) | over capacity? | p50 ms | p99 ms | max ms | decisions/s |"
    )
    print("|---|---:|---:|---|---|---:|---:|---:|---:|")
    print(row(f"spread over {window:g} s", spread, spread_s, spread_problems))
    print(row("burst: all at once", burst, burst_s, burst_problems))
    print()
    print(
        f"Slices held after the spread phase: {held}. Stand-in hub requests: "
        + ", ".join(f"{path} {count}" for path, count in sorted(state.requests.items()))
        + ". decisions/s: answers over the seconds from the first request to the last answer (paced by "
        "the arrivals in the spread phase)."
    )
    first = [outcome.seconds * 1e3 for outcome in spread if outcome.number == 0]
    later = [outcome.seconds * 1e3 for outcome in spread if outcome.number > 0]
    if first and later:
        print(
            f"Spread phase, a user's first start (the broker asks the hub who the token is) p50 "
            f"{statistics.median(first):.1f} ms, max {max(first):.1f} ms; later starts (token cached, the "
            f"user's size still asked at each) p50 {statistics.median(later):.1f} ms, max {max(later):.1f} ms."
        )
    for error in sorted(set(errors)):
        print(error, file=sys.stderr)
    return not (errors or spread_problems or burst_problems)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--smoke", action="store_true", help="4 users over 2 seconds, a class of 12 over 40 minutes: proves it runs"
    )
    parser.add_argument("--class-only", action="store_true", help="only the class (the second table)")
    parser.add_argument("--users", type=int, default=30)
    parser.add_argument("--kernels", type=int, default=3, help="kernel starts per user")
    parser.add_argument("--seconds", type=float, default=60.0, help="the window the starts arrive in")
    parser.add_argument("--seed", type=int, default=10)
    comparison = parser.add_argument_group("the class: cull-only, suspend, the fair pool")
    comparison.add_argument("--students", type=int, default=40, help="students, one kernel each")
    comparison.add_argument("--minutes", type=int, default=180, help="the class's length, in one-minute ticks")
    comparison.add_argument("--arrival-minutes", type=int, default=30, help="the window students arrive in")
    comparison.add_argument("--activity", type=float, default=0.05, help="chance a student runs a cell in a minute")
    comparison.add_argument("--suspend-after", type=int, default=10, help="minutes idle before a kernel is suspended")
    comparison.add_argument("--cull-after", type=int, default=45, help="minutes idle before a kernel is stopped")
    comparison.add_argument("--host-memory", default="96GiB", help="idle.suspend_host_memory of the node")
    comparison.add_argument(
        "--mode",
        action="append",
        help="play only this mode (again for more): " + "; ".join(mode for mode, _ in MODES) + " (default: all)",
    )
    comparison.add_argument(
        "--trace", type=int, default=0, metavar="N", help="every N minutes, what the GPUs and host memory hold (stderr)"
    )
    args = parser.parse_args()
    # Refusals are answers: tornado logs each 409 as a warning, which would bury the table.
    logging.getLogger("tornado.access").setLevel(logging.ERROR)
    with private_machine("vgpu-classroom-bench-"):
        admitted = args.class_only or admission(args)
        within_capacity = class_comparison(args)
    if not admitted or not within_capacity:
        sys.exit(1)


if __name__ == "__main__":
    main()
