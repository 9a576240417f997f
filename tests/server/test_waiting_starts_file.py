"""The file in which a server writes down the starts that wait in its line (provisioning/waiting.py):
what a restarted server starts again, and what it leaves alone. A real second process stands for
a server that still runs, a process that has ended for one that was killed."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

from jupyter_vgpu.provisioning.waiting import WaitingStarts

SIZE = {"memory": "8GiB", "cores": 20, "policy": "burst"}


def ended_process() -> dict[str, int]:
    """The identity (pid and start time) of a server that has ended."""
    from jupyter_vgpu.holders.region import process_start_time

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    identity = {"pid": child.pid, "pid_start_time": process_start_time(child.pid)}
    child.kill()
    child.wait()
    return identity


def written_by(path, server: dict[str, int], **starts: float) -> None:
    """The file as a server ``server`` left it, with a start per kernel id waiting since its time."""
    path.write_text(
        json.dumps(
            {
                kernel_id: {"kernel_name": "vgpu", "path": "", "size": SIZE, "since": since, "server": server}
                for kernel_id, since in starts.items()
            }
        )
    )


def test_a_gone_servers_starts_come_back_oldest_first_once(tmp_path):
    store = WaitingStarts(tmp_path / "waiting-starts.json")
    written_by(store.path, ended_process(), later=200.0, earlier=100.0)

    left = store.left_by_a_gone_server()

    assert list(left) == ["earlier", "later"]
    assert (left["earlier"]["kernel_name"], left["earlier"]["size"], left["earlier"]["since"]) == ("vgpu", SIZE, 100.0)
    # Taken: the next server does not start them again (a start that failed now stays failed).
    assert store.left_by_a_gone_server() == {}


def test_the_starts_of_a_server_that_still_runs_stay_its_own(tmp_path):
    from jupyter_vgpu.holders.region import process_start_time

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        store = WaitingStarts(tmp_path / "waiting-starts.json")
        written_by(store.path, {"pid": other.pid, "pid_start_time": process_start_time(other.pid)}, theirs=1.0)
        store.add("mine", kernel_name="vgpu", path="work", size=SIZE, since=2.0)

        assert store.left_by_a_gone_server() == {}
        assert sorted(json.loads(store.path.read_text())) == ["mine", "theirs"]
    finally:
        other.kill()
        other.wait()


def test_a_start_that_left_the_line_is_crossed_out_and_the_file_is_the_users_alone(tmp_path):
    store = WaitingStarts(tmp_path / "vgpu" / "waiting-starts.json")
    store.add("a", kernel_name="vgpu", path="", size=SIZE, since=1.0)
    store.add("b", kernel_name="vgpu", path="", size=SIZE, since=2.0)
    store.remove("a")
    store.remove("never-there")

    assert list(json.loads(store.path.read_text())) == ["b"]
    assert store.path.stat().st_mode & 0o777 == 0o600


def test_a_file_nobody_can_read_names_no_start_and_says_so(tmp_path, caplog):
    store = WaitingStarts(tmp_path / "waiting-starts.json")
    store.path.write_text("{not json")

    with caplog.at_level(logging.WARNING):
        assert store.left_by_a_gone_server() == {}
    assert "waiting starts in" in caplog.text and "none is started again" in caplog.text
    # Written afresh: the next start is written down as before.
    store.add("c", kernel_name="vgpu", path="", size=SIZE, since=3.0)
    assert list(json.loads(store.path.read_text())) == ["c"]


def test_an_entry_missing_what_a_start_needs_is_not_started(tmp_path):
    store = WaitingStarts(tmp_path / "waiting-starts.json")
    written_by(store.path, ended_process(), whole=1.0)
    data = json.loads(store.path.read_text())
    data["broken"] = {"kernel_name": "vgpu", "since": 2.0, "server": data["whole"]["server"]}
    data["not-an-entry"] = ["vgpu"]
    store.path.write_text(json.dumps(data))

    assert list(store.left_by_a_gone_server()) == ["whole"]
    assert json.loads(store.path.read_text()) == {}
