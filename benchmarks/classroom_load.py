"""A classroom's kernel starts against the node's broker: 30 users with 3 kernels each asking
within one minute for slices of 2 simulated GPUs (2 x 16 GiB), through the broker's real HTTP
application.

    python benchmarks/classroom_load.py            # about 70 seconds, then the suspend comparison
    python benchmarks/classroom_load.py --smoke    # a few seconds, as CI runs it

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

Then suspend against cull-only (issue 18): a class whose kernels are mostly idle (students read
between cells) on the same node, each student one 4 GiB kernel, played out on a virtual clock
of one-minute ticks (nothing waits for real minutes) against a fresh broker for each policy. Every
tick each student who has arrived runs a cell with a small probability (seeded, the same for both
policies). Cull-only: a kernel idle for ``--cull-after`` minutes is stopped (its student's state
is lost; their next cell starts a kernel again). Suspend: a kernel idle for ``--suspend-after``
minutes is suspended through the broker (POST .../suspend; the node's ``idle.suspend_host_memory``
bounds the host memory), and the next cell resumes it; culling after ``--cull-after`` as before.
A start or resume that does not fit makes room as in a real classroom: each owner's server
reports its kernel's activity every tick (``activity`` in the slice's metadata), the broker picks
the longest-idle kernels that run no cell and records ``suspend_requested`` on them, and each
owner's server (here the harness, with that owner's token) suspends its requested kernel; then
the start or resume is tried again. The kernels are slices only, no processes: NVML
shows nothing of them, so the broker's check before lending passes at once. After every tick:
no device holds more than its memory (suspended slices left out, as the ledger counts them), and
suspended slices hold no more host memory than the cap.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tornado import web  # noqa: E402
from tornado.httpserver import HTTPServer  # noqa: E402
from tornado.netutil import bind_sockets  # noqa: E402

from jupyter_vgpu.hub.broker import USE_SCOPE, Broker  # noqa: E402
from jupyter_vgpu.hub.classroom import Classroom, load_classroom  # noqa: E402
from jupyter_vgpu.ledger import (  # noqa: E402
    ACTIVITY_KEY,
    SUSPEND_REQUESTED_KEY,
    CapacityError,
    LedgerError,
    NotSupported,
)
from jupyter_vgpu.ledger.remote import RemoteLedger  # noqa: E402
from jupyter_vgpu.model import FULL_SHARE, SliceLimits, SliceValueError  # noqa: E402

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
            sum(a.memory_limit for a in mine) > budget.memory
            or sum(a.sm_share for a in mine) > budget.cores
            or (budget.kernels is not None and len(mine) > budget.kernels)
            or (budget.policy == "burst" and any(a.policy == "hard" for a in mine))
        ):
            problems.append(f"{owner} holds more than the size {budget.size_name!r}")
    return problems


SIZES_BY_USER: dict[str, str] = {}


def percentile(samples: list[float], fraction: float) -> float:
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


# -- suspend against cull-only (issue 18) ----------------------------------------------------------

IDLE_CLASSROOM = """\
gpus: {{count: 2, memory: 16GiB, burst_oversubscription: 2}}
simulate: true
broker: {{state_dir: broker-state}}
sizes:
  - {{name: notebook, memory: 4GiB, cores: 10, policy: burst, default: true, kernel: {{memory: 4GiB, cores: 10}}}}
limits: {{kernels: 1}}
oversubscribe: true
idle: {{suspend_after: {suspend_after}m, suspend_host_memory: {host_memory}, cull_after: {cull_after}m}}
"""
NOTEBOOK = SliceLimits(4 * GIB, 10, "burst")


@dataclass
class Student:
    name: str
    arrives: int  # tick
    client: RemoteLedger
    kernel: str | None = None  # kernel id while it has one
    suspended: bool = False
    last_cell: int = 0
    starts: int = 0
    reported: tuple[str, bool, int] | None = None  # (kernel, busy, last cell) its server last reported


@dataclass
class PolicyResult:
    policy: str
    held_peak: int = 0  # kernels alive at once (running + suspended)
    running_peak: int = 0
    held_at_arrival_end: int = 0
    culled: int = 0  # kernels stopped idle: their students' state lost
    suspends: int = 0
    resumes: int = 0
    made_room: int = 0  # kernels suspended to make room for a start or resume
    refused_cells: int = 0  # cells that could not run that minute (no room)
    students_refused: set[str] = field(default_factory=set)
    host_peak: int = 0
    decisions: int = 0
    decision_seconds: float = 0.0
    problems: list[str] = field(default_factory=list)


def play_classroom(
    policy: str, args: argparse.Namespace, students: int, ticks: int, arrival_ticks: int
) -> PolicyResult:
    """One class on a fresh broker under ``policy`` (``suspend`` or ``cull-only``)."""
    result = PolicyResult(policy)
    names = [f"student-{number:02d}" for number in range(students)]
    state = HubState(tokens={f"token-{name}": name for name in names}, sizes=dict.fromkeys(names, "notebook"))
    generator = random.Random(args.seed)
    arrivals = sorted(generator.randrange(arrival_ticks) for _ in names)
    cells = [[generator.random() < args.activity for _ in range(ticks)] for _ in names]
    with tempfile.TemporaryDirectory(prefix="vgpu-classroom-suspend-") as tmp:
        path = Path(tmp) / "classroom.yaml"
        path.write_text(
            IDLE_CLASSROOM.format(
                suspend_after=args.suspend_after, cull_after=args.cull_after, host_memory=args.host_memory
            )
        )
        classroom = load_classroom(path, hub_groups=None)
        cap = classroom.idle.suspend_host_memory or 0
        with running_broker(classroom, state) as (broker, ledger_url):
            people = [
                Student(name, arrives, RemoteLedger(ledger_url, f"token-{name}", timeout=60))
                for name, arrives in zip(names, arrivals, strict=True)
            ]

            def decide(call: Callable, *arguments, **keywords):
                began = time.perf_counter()
                try:
                    return call(*arguments, **keywords)
                finally:
                    result.decisions += 1
                    result.decision_seconds += time.perf_counter() - began

            def suspend(student: Student) -> bool:
                try:
                    decide(student.client.suspend, student.kernel, host_memory=NOTEBOOK.memory_limit)
                except NotSupported:
                    return False  # the host memory cap: it keeps running, culled later
                student.suspended = True
                result.suspends += 1
                return True

            def report(busy: set[str]) -> None:
                """Each running kernel's server reports its activity, where it changed (server/room.py)."""
                for student in people:
                    if student.kernel and not student.suspended:
                        now_reported = (student.kernel, student.name in busy, student.last_cell)
                        if now_reported != student.reported:
                            activity = {"busy": now_reported[1], "last_activity": float(student.last_cell)}
                            decide(student.client.update_metadata, student.kernel, **{ACTIVITY_KEY: activity})
                            student.reported = now_reported

            def make_room(refused: CapacityError) -> bool:
                """The owners' servers suspend the kernels the broker asked them to; whether one was."""
                if policy != "suspend" or not refused.making_room:
                    return False
                made = False
                for student in people:
                    if (
                        not student.kernel
                        or student.suspended
                        or student.reported != (student.kernel, False, student.last_cell)
                    ):
                        continue
                    if decide(student.client.get, student.kernel).metadata.get(SUSPEND_REQUESTED_KEY) and suspend(
                        student
                    ):
                        result.made_room += 1
                        made = True
                return made

            try:
                for now in range(ticks):
                    busy = {
                        s.name
                        for s in people
                        if s.arrives <= now and (now == s.arrives or cells[names.index(s.name)][now])
                    }
                    report(busy)
                    for student in people:
                        if student.arrives > now:
                            continue
                        if student.name in busy:
                            ran = False
                            while True:
                                try:
                                    if student.kernel is None:
                                        kernel_id = f"{student.name}-kernel-{student.starts}"
                                        decide(student.client.admit, kernel_id, NOTEBOOK)
                                        student.kernel, student.starts = kernel_id, student.starts + 1
                                    elif student.suspended:
                                        decide(student.client.resume, student.kernel)
                                        student.suspended = False
                                        result.resumes += 1
                                    ran = True
                                    break
                                except CapacityError as refused:
                                    if not make_room(refused):
                                        break
                            if ran:
                                student.last_cell = now
                            else:
                                result.refused_cells += 1
                                result.students_refused.add(student.name)
                            continue
                        if student.kernel is None:
                            continue
                        idle_for = now - student.last_cell
                        if idle_for >= args.cull_after:
                            decide(student.client.release, student.kernel)
                            student.kernel, student.suspended = None, False
                            result.culled += 1
                        elif policy == "suspend" and not student.suspended and idle_for >= args.suspend_after:
                            suspend(student)
                    held = [s for s in people if s.kernel]
                    result.held_peak = max(result.held_peak, len(held))
                    result.running_peak = max(result.running_peak, sum(1 for s in held if not s.suspended))
                    if now == arrival_ticks - 1:
                        result.held_at_arrival_end = len(held)
                    in_host = sum(a.host_memory for a in broker.ledger.allocations())
                    result.host_peak = max(result.host_peak, in_host)
                    problems = check_capacity(broker, state.sizes) + (
                        [f"host memory {in_host} over the cap {cap}"] if cap and in_host > cap else []
                    )
                    result.problems.extend(f"minute {now}: {problem}" for problem in problems)
            finally:
                for student in people:
                    student.client.close()
    return result


def suspend_comparison(args: argparse.Namespace) -> bool:
    """Print the suspend against cull-only table; False where something went over capacity."""
    students, ticks, arrival_ticks = (12, 40, 10) if args.smoke else (args.students, args.minutes, args.arrival_minutes)
    results = [play_classroom(policy, args, students, ticks, arrival_ticks) for policy in ("cull-only", "suspend")]
    print()
    print(
        f"Suspend against cull-only: {students} students, one 4GiB kernel each (8 fit in the node's 2 x 16 GiB at "
        f"once), arriving within {arrival_ticks} min, {ticks} min in all; a student runs a cell in a given minute "
        f"with probability {args.activity:g}; suspend after {args.suspend_after} min idle, stop after "
        f"{args.cull_after} min idle; host memory cap {args.host_memory}."
    )
    print()
    print(
        "| policy | kernels held, peak | running, peak | held when all have arrived | students ever refused | "
        "cells refused | kernels stopped (state lost) | suspends (to make room) | resumes | host memory peak | "
        "over capacity? | broker decisions (mean ms) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|---|")
    for r in results:
        mean = r.decision_seconds / r.decisions * 1e3 if r.decisions else 0.0
        print(
            f"| {r.policy} | {r.held_peak} | {r.running_peak} | {r.held_at_arrival_end} | {len(r.students_refused)} | "
            f"{r.refused_cells} | {r.culled} | {r.suspends} ({r.made_room}) | {r.resumes} | "
            f"{r.host_peak / GIB:.0f} GiB | {'yes: ' + '; '.join(r.problems[:3]) if r.problems else 'no'} | "
            f"{r.decisions} ({mean:.1f}) |"
        )
    return not any(r.problems for r in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="4 users over 2 seconds: proves the benchmark runs")
    parser.add_argument("--users", type=int, default=30)
    parser.add_argument("--kernels", type=int, default=3, help="kernel starts per user")
    parser.add_argument("--seconds", type=float, default=60.0, help="the window the starts arrive in")
    parser.add_argument("--seed", type=int, default=10)
    comparison = parser.add_argument_group("suspend against cull-only")
    comparison.add_argument("--students", type=int, default=40, help="students, one kernel each")
    comparison.add_argument("--minutes", type=int, default=180, help="the class's length, in one-minute ticks")
    comparison.add_argument("--arrival-minutes", type=int, default=30, help="the window students arrive in")
    comparison.add_argument("--activity", type=float, default=0.05, help="chance a student runs a cell in a minute")
    comparison.add_argument("--suspend-after", type=int, default=10, help="minutes idle before a kernel is suspended")
    comparison.add_argument("--cull-after", type=int, default=45, help="minutes idle before a kernel is stopped")
    comparison.add_argument("--host-memory", default="96GiB", help="idle.suspend_host_memory of the node")
    args = parser.parse_args()
    # Refusals are answers: tornado logs each 409 as a warning, which would bury the table.
    logging.getLogger("tornado.access").setLevel(logging.ERROR)
    users, kernels, window = (4, 3, 2.0) if args.smoke else (args.users, args.kernels, args.seconds)

    names = [f"student-{number:02d}" for number in range(users)]
    SIZES_BY_USER.update({name: "large" if number % 3 == 0 else "small" for number, name in enumerate(names)})
    state = HubState(tokens={f"token-{name}": name for name in names}, sizes=dict(SIZES_BY_USER))

    with tempfile.TemporaryDirectory(prefix="vgpu-classroom-bench-") as tmp:
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
    within_capacity = suspend_comparison(args)
    if errors or spread_problems or burst_problems or not within_capacity:
        for error in sorted(set(errors)):
            print(error, file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
