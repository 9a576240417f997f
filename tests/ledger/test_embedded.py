"""What only the embedded ledger's SQLite file can show: allocations survive reopening and a
killed server, concurrent processes share one file, devices that vanish or move between
restarts, schema versions and the migration of older files."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from jupyter_vgpu.ledger import CapacityError, EmbeddedLedger, LedgerFileError
from jupyter_vgpu.ledger.embedded import SCHEMA_VERSION, SCHEMA_VERSION_1
from jupyter_vgpu.model import Device, SliceLimits

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30
ROOM_FOR_TEN = [Device("GPU-00000000-0000-4000-8000-000000000000", 0, "test GPU 0", 10 * GIB, 100)]


# -- configuration -----------------------------------------------------------------------------


@pytest.mark.parametrize("options", [{"reserve": -1}, {"burst_oversubscription": 0.5}, {"placement": "random"}])
def test_a_ledger_refuses_bad_configuration(ledger_path, gpu, options):
    with pytest.raises(ValueError):
        EmbeddedLedger(ledger_path, [gpu(0, 8)], **options)


def test_devices_must_be_distinct(ledger_path, gpu):
    with pytest.raises(ValueError, match="distinct"):
        EmbeddedLedger(ledger_path, [gpu(0, 8), gpu(0, 8)])


# -- many processes on one file ----------------------------------------------------------------


def _process_admits(path: Path, barrier, results, number: int) -> None:
    # Each process opens the file itself, as separate servers (or a server and the CLI) do.
    with EmbeddedLedger(path, ROOM_FOR_TEN) as ledger:
        barrier.wait()
        try:
            ledger.admit(f"kernel-{number}", SliceLimits(GIB, 5))
            outcome = "admitted"
        except CapacityError as error:
            outcome = f"refused: {error.resource}"
        except Exception as error:  # noqa: BLE001 -- reported to the parent, which fails the test with it
            outcome = repr(error)
    results.put(outcome)


def test_twenty_concurrent_processes_against_room_for_ten_admit_exactly_ten(tmp_path):
    # A fresh file: the processes also race to create the schema and switch it to WAL.
    path = tmp_path / "ledger.sqlite"
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(20), context.Queue()
    processes = [context.Process(target=_process_admits, args=(path, barrier, results, n)) for n in range(20)]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=60) for _ in processes]
    for process in processes:
        process.join()
    assert Counter(outcomes) == {"admitted": 10, "refused: memory": 10}
    with EmbeddedLedger(path, ROOM_FOR_TEN) as ledger:
        assert len(ledger.allocations()) == 10


# -- persistence and restarts ------------------------------------------------------------------


def test_allocations_survive_reopening_the_file(ledger_path, gpu):
    with EmbeddedLedger(ledger_path, [gpu(0, 16), gpu(1, 16)]) as ledger:
        first = ledger.admit("k1", SliceLimits(4 * GIB, 50, "burst"), owner="ada", metadata={"notebook": "a.ipynb"})
        second = ledger.admit("k2", SliceLimits(2 * GIB), holder="pod")
        ledger.update_metadata("k2", pid=4242, region="/run/k2.region")
    with EmbeddedLedger(ledger_path, [gpu(0, 16), gpu(1, 16)]) as reopened:
        assert reopened.get("k1") == first
        assert reopened.get("k2").metadata == {"pid": 4242, "region": "/run/k2.region"}
        assert reopened.get("k2") == replace(second, metadata={"pid": 4242, "region": "/run/k2.region"})
        assert [usage.memory_allocated for usage in reopened.devices_usage()] == [4 * GIB, 0]


def test_a_pods_slice_is_not_stranded_for_being_on_none_of_this_machines_devices(ledger_path, gpu):
    with EmbeddedLedger(ledger_path, [gpu(0, 16)]) as ledger:
        ledger.admit("k1", SliceLimits(2 * GIB), holder="pod")
        assert ledger.stranded_allocations() == []
        assert ledger.set_devices([gpu(0, 16)]) == []


def test_an_admission_survives_the_server_being_killed(ledger_path):
    code = (
        "import os, signal\n"
        "from jupyter_vgpu.ledger import EmbeddedLedger\n"
        "from jupyter_vgpu.model import Device, SliceLimits\n"
        f"ledger = EmbeddedLedger({str(ledger_path)!r}, [Device('GPU-0', 0, 'test', 16 << 30, 100)])\n"
        "ledger.admit('k1', SliceLimits(3 << 30, 40))\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    killed = subprocess.run(
        [sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True, timeout=60
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    with EmbeddedLedger(ledger_path, [Device("GPU-0", 0, "test", 16 << 30, 100)]) as reopened:
        assert reopened.get("k1").limits == SliceLimits(3 * GIB, 40)


def test_slices_on_a_vanished_device_are_kept_and_reported(ledger_path, gpu, caplog):
    with EmbeddedLedger(ledger_path, [gpu(0, 16), gpu(1, 16)]) as ledger:
        ledger.admit("on-0", SliceLimits(GIB), device=0)
        on_1 = ledger.admit("on-1", SliceLimits(GIB), device=1)
    with EmbeddedLedger(ledger_path, [gpu(0, 16)]) as restarted:
        assert restarted.stranded_allocations() == [on_1]
        assert "kernel on-1 holds a 1GiB slice on GPU 1" in caplog.text
        assert [usage.slices for usage in restarted.devices_usage()] == [1]
        assert restarted.set_devices([gpu(0, 16), gpu(1, 16)]) == []
        assert [usage.slices for usage in restarted.devices_usage()] == [1, 1]


def test_a_device_under_a_new_index_keeps_its_slices(ledger_path, gpu):
    moved = gpu(1, 16)
    with EmbeddedLedger(ledger_path, [gpu(0, 16), moved]) as ledger:
        ledger.admit("k1", SliceLimits(GIB), device=1)
    with EmbeddedLedger(ledger_path, [Device(moved.uuid, 0, moved.name, moved.memory_total, 100)]) as restarted:
        assert restarted.get("k1").device_index == 0
        assert restarted.stranded_allocations() == []
        assert restarted.devices_usage()[0].memory_allocated == GIB


# -- the file and its schema versions ----------------------------------------------------------


def _version_and_columns(path: Path) -> tuple[int, list[str]]:
    with sqlite3.connect(path) as connection:
        version = connection.execute("PRAGMA user_version").fetchone()[0]
        columns = [row[1] for row in connection.execute("PRAGMA table_info(allocations)")]
    return version, columns


def test_a_new_file_is_of_schema_version_2_with_holder_and_node(ledger_path, gpu):
    EmbeddedLedger(ledger_path, [gpu(0, 8)]).close()
    version, columns = _version_and_columns(ledger_path)
    assert (version, SCHEMA_VERSION) == (2, 2)
    assert columns[-2:] == ["holder", "node"]


def test_a_ledger_file_of_an_unknown_schema_version_is_refused(ledger_path, gpu):
    EmbeddedLedger(ledger_path, [gpu(0, 8)]).close()
    with sqlite3.connect(ledger_path) as connection:
        connection.execute("PRAGMA user_version = 99")
    with pytest.raises(LedgerFileError, match="has schema version 99, .* reads version 2; run the jupyter-vgpu"):
        EmbeddedLedger(ledger_path, [gpu(0, 8)])


def test_a_file_that_is_not_a_ledger_is_refused(ledger_path, gpu):
    ledger_path.write_bytes(b"not a database" * 100)
    with pytest.raises(LedgerFileError, match="is not a jupyter-vgpu ledger"):
        EmbeddedLedger(ledger_path, [gpu(0, 8)])


# A file of version 1 as jupyter-vgpu wrote it (before holder and node): the module's frozen schema.
VERSION_1_SCHEMA = (*SCHEMA_VERSION_1, "PRAGMA journal_mode=WAL", "PRAGMA user_version = 1")


@pytest.fixture
def version_1_file(ledger_path, gpu) -> Path:
    """A ledger file of schema version 1 holding one 3GiB burst slice of kernel k1 on GPU 1."""
    with sqlite3.connect(ledger_path) as connection:
        for statement in VERSION_1_SCHEMA:
            connection.execute(statement)
        connection.execute(
            "INSERT INTO allocations VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            ("k1", gpu(1, 16).uuid, 1, 3 * GIB, 40, "burst", "ada", 1700000000.25, json.dumps({"pid": 7})),
        )
    connection.close()
    return ledger_path


def test_a_version_1_file_is_migrated_and_its_slices_held_locally(version_1_file, gpu):
    with EmbeddedLedger(version_1_file, [gpu(0, 16), gpu(1, 16)]) as ledger:
        migrated = ledger.get("k1")
        assert (migrated.holder, migrated.node) == ("local", "")
        assert (migrated.device_uuid, migrated.device_index, migrated.limits) == (
            gpu(1, 16).uuid,
            1,
            SliceLimits(3 * GIB, 40, "burst"),
        )
        assert (migrated.owner, migrated.created_at, migrated.metadata) == ("ada", 1700000000.25, {"pid": 7})
        assert ledger.devices_usage()[1].memory_allocated == 3 * GIB
        ledger.admit("k2", SliceLimits(GIB, 10), holder="pod")
    assert _version_and_columns(version_1_file) == (
        2,
        [
            "kernel_id",
            "device_uuid",
            "device_index",
            "memory_limit",
            "sm_share",
            "policy",
            "owner",
            "created_at",
            "metadata",
            "holder",
            "node",
        ],
    )
    with EmbeddedLedger(version_1_file, [gpu(0, 16), gpu(1, 16)]) as reopened:
        assert [(a.kernel_id, a.holder) for a in reopened.allocations()] == [("k1", "local"), ("k2", "pod")]
