"""A classroom on a real JupyterHub: the hub (PyPI jupyterhub) behind configurable-http-proxy,
the broker as its managed service, users' servers started by SimpleLocalProcessSpawner with the
size they chose, their kernels sliced on the simulated GPU (2 x 16 GiB) through the broker.

All users run under this one Unix account (as in CI): these tests prove what the hub's scopes and
the broker decide, not what separate accounts would add (docs/classroom.md).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from hub_process import Hub, kernel_connection_file, kernel_process, run_in_hub_kernel
from support import CUDA_PRELUDE, JUPYTER, dashboard_misreads, running, wait_for

pytestmark = pytest.mark.timeout(600)

CLASSROOM = """
gpus: {count: 2, memory: 16GiB}
groups:
  students: [alice, bob, carol, dave, erin, frank, gina, hana]
  staff: [teacher]
admins: [teacher]
sizes:
  - {name: small, memory: 2GiB, cores: 20, policy: burst, default: true, kernel: {memory: 1GiB, cores: 10}}
  - {name: large, memory: 6GiB, cores: 40, policy: burst, kernel: {memory: 2GiB, cores: 10}}
limits: {kernels: 3}
oversubscribe: true
"""
# The broker asks the hub every second which users still run a server (default: 30 s).
FAST_RECONCILE = """
for service in c.JupyterHub.services:
    if service["name"] == "vgpu":
        service["command"] = [*service["command"], "--reconcile-interval", "1"]
"""
GiB = 1 << 30
CHECK_SLICE = (
    CUDA_PRELUDE
    + """
import os
free, total = memory()
over = allocate(total + 1)
print(total, over, os.environ.get("JUPYTERHUB_API_TOKEN"), os.environ.get("JPY_API_TOKEN"), os.environ["VGPU_LIMITS"])
"""
)
CUDA_ERROR_OUT_OF_MEMORY = 2


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    running = Hub(tmp_path_factory.mktemp("hub"), CLASSROOM, extra_config=FAST_RECONCILE)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def teacher(hub):
    return hub.user_token("teacher")


def started_kernel(hub: Hub, user: str, token: str) -> str:
    status, reply = hub.start_kernel(user, token)
    assert status == 201, reply
    return reply["id"]


def slice_in_kernel(hub: Hub, user: str, kernel_id: str) -> tuple[int, int, str, str, str]:
    total, over, hub_token, jpy_token, limits_page = run_in_hub_kernel(hub, user, kernel_id, CHECK_SLICE).split()
    return int(total), int(over), hub_token, jpy_token, limits_page


def allocations(hub: Hub, token: str) -> dict[str, dict]:
    status, reply = hub.broker("GET", "ledger/allocations", token)
    assert status == 200, reply
    return {allocation["kernel_id"]: allocation for allocation in reply["allocations"]}


def test_two_users_get_slices_within_the_sizes_they_chose_and_a_kernel_over_the_budget_is_refused(hub):
    alice, bob = hub.user_token("alice"), hub.user_token("bob")
    hub.start_server("alice", {"profile": "small"})
    hub.start_server("bob", {"profile": "large"})

    alice_kernels = [started_kernel(hub, "alice", alice) for _ in range(2)]
    status, refusal = hub.start_kernel("alice", alice)
    bob_kernels = [started_kernel(hub, "bob", bob) for _ in range(2)]

    # small: 2 GiB for all of alice's kernels, 1 GiB each; her third does not fit.
    assert status == 409, refusal
    assert "alice's GPU size 'small'" in refusal["message"] and "2GiB" in refusal["message"], refusal
    # large: 2 GiB each, so bob holds twice what alice's whole size allows.
    for user, token, kernels, cap in (("alice", alice, alice_kernels, GiB), ("bob", bob, bob_kernels, 2 * GiB)):
        status, slices = hub.server(user, token, "GET", "api/vgpu/slices")
        assert status == 200, slices
        assert sorted(item["kernel_id"] for item in slices) == sorted(kernels)
        assert {item["limits"]["memory_bytes"] for item in slices} == {cap}
        assert {item["owner"] for item in slices} == {user}
        # The cap holds in the kernel itself, and the server's hub token never reached it.
        total, over, hub_token, jpy_token, limits_page = slice_in_kernel(hub, user, kernels[0])
        assert (total, over) == (cap, CUDA_ERROR_OUT_OF_MEMORY)
        assert (hub_token, jpy_token) == ("None", "None")
        # The cap the kernel obeys is on the broker's page, not one its server wrote.
        assert limits_page == str(hub.folder / "broker-state" / "limits" / f"{kernels[0]}.limits")


def test_a_students_server_offers_only_the_sliced_kernel_and_starts_no_unsliced_one(hub):
    """The launcher lists /api/kernelspecs: no "Python 3 (ipykernel)" card, whose kernels would use
    the GPU outside the broker's accounting, and no start of it through the REST API either."""
    hana = hub.user_token("hana")
    hub.start_server("hana", {"profile": "small"})
    status, specs = hub.server("hana", hana, "GET", "api/kernelspecs")
    assert status == 200, specs
    assert (specs["default"], sorted(specs["kernelspecs"])) == ("python3-vgpu", ["python3-vgpu"])
    status, refusal = hub.start_kernel("hana", hana, kernelspec="python3")
    assert (status, refusal["message"]) == (404, "no kernelspec named 'python3' on this server; it offers python3-vgpu")
    status, kernels = hub.server("hana", hana, "GET", "api/kernels")
    assert (status, kernels) == (200, [])


def test_a_user_cannot_see_or_change_another_users_slices_and_a_vgpu_admin_can(hub, teacher):
    carol, dave = hub.user_token("carol"), hub.user_token("dave")
    hub.start_server("carol", {})  # no choice: the default size
    hub.start_server("dave", {"profile": "small"})
    carols = started_kernel(hub, "carol", carol)
    daves = started_kernel(hub, "dave", dave)

    assert set(allocations(hub, dave)) == {daves}
    for method, body in (("GET", None), ("PATCH", {"sm_share": 20}), ("DELETE", None)):
        status, reply = hub.broker(method, f"ledger/allocations/{carols}", dave, body)
        assert status == 403, (method, reply)
        assert "not yours" in reply["message"]
    status, reply = hub.broker("PATCH", f"ledger/allocations/{carols}/metadata", dave, {"note": "x"})
    assert status == 403, reply
    # Asked of dave's own server, carol's slice is refused as hers (403), not as an outage (503).
    for method, body in (("GET", None), ("PATCH", {"cores": 20})):
        status, reply = hub.server("dave", dave, method, f"api/vgpu/slices/{carols}", body)
        assert status == 403, (method, reply)
        assert f"the slice of kernel {carols!r} is not yours ('dave')" in reply["message"], reply
    status, reply = hub.server("dave", dave, "GET", "api/vgpu/slices/no-such-kernel")
    assert status == 404 and "no slice is held for kernel 'no-such-kernel'" in reply["message"], reply
    status, reply = hub.broker("GET", "metrics", dave)
    assert status == 403 and "custom:vgpu:admin" in reply["message"], reply

    everything = allocations(hub, teacher)
    assert {carols, daves} <= set(everything)
    assert (everything[carols]["owner"], everything[daves]["owner"]) == ("carol", "dave")
    status, resized = hub.broker("PATCH", f"ledger/allocations/{carols}", teacher, {"sm_share": 5})
    assert status == 200 and resized["sm_share"] == 5, resized
    status, metrics = hub.broker("GET", "metrics", teacher)
    assert status == 200
    assert 'vgpu_slice_sm_share_percent{device="' in metrics
    line = next(line for line in metrics.splitlines() if carols in line and line.startswith("vgpu_slice_sm_share"))
    assert 'user="carol"' in line and 'groups="students"' in line and line.endswith(" 5.0"), line

    # `jupyter vgpu status --all`, as the teacher runs it with a token of the hub's: who holds
    # what on each GPU. No --broker: the hub says where its vgpu service is.
    shown = subprocess.run(
        [JUPYTER, "vgpu", "status", "--all"],
        env={**without_broker_url(), "JUPYTERHUB_API_TOKEN": teacher, "JUPYTERHUB_API_URL": hub.api},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    rows = {
        line.split()[1]: line.split() for line in shown.stdout.splitlines() if line.startswith("  ") and "%" in line
    }
    assert rows[carols[:8]][0] == "carol" and rows[carols[:8]][3] == "5%", shown.stdout
    assert rows[daves[:8]][0] == "dave", shown.stdout


def without_broker_url() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if name != "JUPYTER_VGPU_BROKER_URL"}


def test_the_teachers_status_all_says_what_to_pass_where_the_hub_cannot_say(hub, teacher):
    for extra, said in (
        (["--service", "gpus"], "the hub has no service 'gpus' (see --service) or this token may not read it"),
        ([], "cannot ask the hub at http://127.0.0.1:9/hub/api for the broker"),
    ):
        api = hub.api if extra else "http://127.0.0.1:9/hub/api"  # nothing listens on port 9
        shown = subprocess.run(
            [JUPYTER, "vgpu", "status", "--all", *extra],
            env={**without_broker_url(), "JUPYTERHUB_API_TOKEN": teacher, "JUPYTERHUB_API_URL": api},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert shown.returncode == 2, shown
        assert said in shown.stderr and "give --broker URL" in shown.stderr, shown.stderr


def test_the_broker_killed_with_sigkill_comes_back_with_every_slice_and_grants_nothing_twice(hub, teacher):
    erin = hub.user_token("erin")
    hub.start_server("erin", {"profile": "small"})
    first = started_kernel(hub, "erin", erin)
    before = allocations(hub, teacher)

    os.kill(hub.broker_pid(), signal.SIGKILL)
    wait_for(lambda: not hub.broker_answers(), 30, "the broker to be gone")
    started = time.monotonic()
    status, refusal = hub.start_kernel("erin", erin)
    refused_after = time.monotonic() - started
    # Refused at once (no wait for a timeout), naming the broker; the running kernel keeps its cap.
    assert status == 503, refusal
    assert "the node's GPU broker" in refusal["message"], refusal
    assert refused_after < 30, refused_after
    assert slice_in_kernel(hub, "erin", first)[:2] == (GiB, CUDA_ERROR_OUT_OF_MEMORY)

    wait_for(hub.broker_answers, 120, "the hub to start the broker again", interval=0.2)
    after = allocations(hub, teacher)
    # Every slice, with its device, size, owner and creation time; the activity its server reports
    # at its ticks (server/room.py) is not the broker's to keep the same, so it is left out.
    assert without_activity(after) == without_activity(before)
    second = started_kernel(hub, "erin", erin)
    status, refusal = hub.start_kernel("erin", erin)  # her 2 GiB are held: 1 GiB before, 1 GiB now
    assert status == 409 and "erin's GPU size 'small'" in refusal["message"], refusal
    assert {first, second} <= set(allocations(hub, erin))


def without_activity(allocations_by_kernel: dict[str, dict]) -> dict[str, dict]:
    return {
        kernel_id: {**allocation, "metadata": {k: v for k, v in allocation["metadata"].items() if k != "activity"}}
        for kernel_id, allocation in allocations_by_kernel.items()
    }


def test_slices_of_a_user_whose_server_is_gone_are_given_back_by_the_broker(hub, teacher):
    frank = hub.user_token("frank")
    hub.start_server("frank", {"profile": "small"})
    kernel = started_kernel(hub, "frank", frank)
    connection_file = kernel_connection_file(hub, "frank", kernel)
    assert kernel in allocations(hub, teacher)

    # The server dies without shutting its kernels down (nothing of it releases a slice).
    os.kill(hub.server_pid("frank"), signal.SIGKILL)
    wait_for(lambda: hub.server_gone("frank"), 60, "the hub to see frank's server gone", interval=0.2)
    wait_for(lambda: kernel not in allocations(hub, teacher), 60, "the broker to give frank's slice back", 0.2)
    _kill_kernels_of(connection_file)


def _kill_kernels_of(connection_file: Path) -> None:
    """The orphaned kernel of a killed server (its command line names its connection file)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if str(connection_file).encode() in argv:
                os.kill(int(entry.name), signal.SIGKILL)


def test_the_grafana_dashboard_asks_only_for_metrics_and_labels_the_broker_exports(hub, teacher):
    dashboard = json.loads((Path(__file__).parents[2] / "docs" / "grafana" / "jupyter-vgpu-classroom.json").read_text())
    gina = hub.user_token("gina")
    hub.start_server("gina", {})
    started_kernel(hub, "gina", gina)  # a slice, so its labels are exported
    status, metrics = hub.broker("GET", "metrics", teacher)
    assert status == 200
    assert not dashboard_misreads(dashboard, metrics)


IDLE_CLASSROOM = """
gpus: {count: 1, memory: 16GiB}
groups:
  students: [ida]
sizes:
  - {name: small, memory: 2GiB, cores: 20, policy: burst, default: true, kernel: {memory: 1GiB, cores: 10}}
limits: {kernels: 2}
oversubscribe: true
idle: {lower_after: 2s, floor_cores: 5, cull_after: 10s}
"""


def test_an_idle_kernel_is_lowered_restored_when_it_runs_and_stopped_later_with_a_notice(tmp_path):
    """The classroom's idle policy reaches the student's server through the hub, and the share it
    restores is decided by the broker."""
    from jupyter_client import BlockingKernelClient

    hub = Hub(tmp_path, IDLE_CLASSROOM, extra_config=FAST_RECONCILE)
    try:
        ida = hub.user_token("ida")
        hub.start_server("ida", {})
        kernel = started_kernel(hub, "ida", ida)

        def slice_now() -> dict:
            status, slices = hub.server("ida", ida, "GET", "api/vgpu/slices")
            assert status == 200, slices
            return next(item for item in slices if item["kernel_id"] == kernel)

        lowered = wait_for(
            lambda: (item := slice_now())["limits"]["cores"] == 5 and item, 60, "the idle kernel lowered"
        )
        assert "lowered to 5% of the SMs after 2 s idle" in lowered["notice"], lowered
        assert allocations(hub, ida)[kernel]["sm_share"] == 5  # the broker holds the lowered share

        client = BlockingKernelClient(connection_file=str(kernel_connection_file(hub, "ida", kernel)))
        client.load_connection_file()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=60)
            # Long enough that a loaded machine's watcher, broker and proxy still see it busy (4 s
            # was missed once in a fresh-clone CI run beside other work: lowered again after it).
            running = client.execute("import time; time.sleep(20)")
            restored = wait_for(lambda: (item := slice_now())["limits"]["cores"] == 10 and item, 30, "the share back")
            assert restored["notice"] is None, restored
            assert allocations(hub, ida)[kernel]["sm_share"] == 10
            reply = client.get_shell_msg(timeout=60)
            assert reply["parent_header"]["msg_id"] == running and reply["content"]["status"] == "ok"
        finally:
            client.stop_channels()

        wait_for(lambda: kernel not in allocations(hub, ida), 60, "the idle kernel stopped", interval=0.2)

        def listed() -> list[str]:
            status, kernels = hub.server("ida", ida, "GET", "api/kernels")
            assert status == 200, kernels
            return [item["id"] for item in kernels]

        # Its slice is given back while the kernel shuts down, before its server stops listing it
        # (a loaded machine showed the kernel still listed right after).
        wait_for(lambda: kernel not in listed(), 60, "the stopped kernel gone from its server's list", interval=0.2)
        status, notices = hub.server("ida", ida, "GET", "api/vgpu/notices")
        assert status == 200 and "stopped after 10 s idle to free its 1GiB of GPU memory" in notices[kernel], notices
    finally:
        hub.stop()


# One 4 GiB GPU, a 3 GiB kernel each: two students' kernels do not fit on it together. Servers
# suspend a kernel after an hour idle (so that they report activity and carry out the broker's
# requests), which this test never reaches.
ROOM_CLASSROOM = """
gpus: {count: 1, memory: 4GiB}
groups:
  students: [jo, kim]
sizes:
  - {name: small, memory: 3GiB, cores: 40, policy: burst, default: true, kernel: {memory: 3GiB, cores: 40}}
limits: {kernels: 1}
oversubscribe: true
# room_hold 0: kernels started a moment ago make room at once (the hold has its own tests)
idle: {suspend_after: 1h, suspend_host_memory: 8GiB, room_hold: 0}
"""
HOLD_512_MIB = CUDA_PRELUDE + "\nheld = allocate(512 << 20)\nprint(held)\n"


def test_a_start_that_does_not_fit_waits_while_another_students_idle_kernel_is_suspended_by_her_server(tmp_path):
    """Kim's start asks the broker for room that jo's idle kernel holds: the broker asks jo's
    server (from its activity reports), her server suspends it, and kim's start, which waited
    meanwhile in his server's line, is admitted: one request, no refusal."""
    hub = Hub(tmp_path, ROOM_CLASSROOM, extra_config=FAST_RECONCILE)
    try:
        jo, kim = hub.user_token("jo"), hub.user_token("kim")
        hub.start_server("jo", {})
        hub.start_server("kim", {})
        kernel = started_kernel(hub, "jo", jo)
        assert run_in_hub_kernel(hub, "jo", kernel, HOLD_512_MIB).strip() == "0"  # CUDA_SUCCESS

        def her_slice() -> dict:
            return allocations(hub, jo)[kernel]

        wait_for(lambda: her_slice()["metadata"].get("activity", {}).get("busy") is False, 60, "jo's server's report")
        # Answered at once (its start waits in kim's server's line), then admitted once jo's server
        # has suspended her idle kernel: never refused.
        kims = started_kernel(hub, "kim", kim)
        wait_for(lambda: kims in allocations(hub, kim), 60, "kim's kernel admitted")

        # Her server writes the notice just after the suspension that let kim's kernel in.
        suspended = wait_for(
            lambda: (item := her_slice())["metadata"].get("suspend_notice") and item, 30, "jo's suspend notice"
        )
        assert suspended["metadata"].get("suspended"), suspended
        assert suspended["metadata"]["suspend_notice"].startswith("suspended to make room for another user's kernel")
        assert suspended["metadata"].get("suspend_requested") is None
        hers = kernel_process(hub, "jo", kernel)
    finally:
        hub.stop()
    # A suspended kernel outlives its server (a restarted one adopts it); the test that started
    # it ends it, so that no run leaves it behind.
    assert not running(hers)
