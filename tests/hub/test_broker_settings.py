"""The broker opens its node's ledger with the classroom file's sharing settings (gpus.reserve,
gpus.burst_oversubscription, gpus.placement), and with the ledger's defaults when the file has none.

The GPUs are a stand-in list (no simulator, no hub): the Broker's constructor lists the node's
devices and opens its ledger, and contacts the hub only later."""

from __future__ import annotations

from pathlib import Path

import pytest

from jupyter_vgpu.hub import broker as broker_module
from jupyter_vgpu.hub.broker import Broker
from jupyter_vgpu.hub.classroom import load_classroom
from jupyter_vgpu.model import Device, SliceLimits

GIB = 1 << 30
DEVICES = [
    Device(uuid=f"GPU-test-{index}", index=index, name="test GPU", memory_total=16 * GIB, sm_count=100)
    for index in range(2)
]


@pytest.fixture(autouse=True)
def node(monkeypatch):
    monkeypatch.setattr(broker_module, "list_devices", lambda: list(DEVICES))


def make_broker(tmp_path: Path, gpus: str) -> Broker:
    path = tmp_path / "classroom.yaml"
    path.write_text(
        f"gpus: {gpus}\nbroker: {{state_dir: state}}\nsizes:\n  - {{name: small, memory: 1GiB, cores: 10, policy: burst}}\n"
    )
    return Broker(
        load_classroom(path), api_url="http://127.0.0.1:1/hub/api", api_token="token", prefix="/services/vgpu/"
    )


def test_the_ledger_gets_the_file_s_settings(tmp_path):
    broker = make_broker(
        tmp_path, "{count: 2, memory: 16GiB, reserve: 1GiB, burst_oversubscription: 2.5, placement: spread}"
    )
    try:
        ledger = broker.ledger
        assert (ledger.reserve, ledger.share_capacity, ledger.placement) == (GIB, 250, "spread")
        usage = ledger.devices_usage()
        assert [(u.memory_capacity, u.share_capacity) for u in usage] == [(15 * GIB, 250)] * 2
        # Burst shares past 100 % of a GPU are admitted; spread puts the second slice on the other GPU.
        first = ledger.admit("k1", SliceLimits(GIB, 90, "burst"), owner="alice")
        second = ledger.admit("k2", SliceLimits(GIB, 90, "burst"), owner="alice")
        assert first.device_uuid != second.device_uuid
        third = ledger.admit("k3", SliceLimits(GIB, 90, "burst"), owner="alice")
        on_its_gpu = [a for a in ledger.allocations() if a.device_uuid == third.device_uuid]
        assert sum(a.sm_share for a in on_its_gpu) == 180
    finally:
        broker.close()


def test_without_settings_the_ledger_has_its_defaults(tmp_path):
    broker = make_broker(tmp_path, "{count: 2, memory: 16GiB}")
    try:
        assert (broker.ledger.reserve, broker.ledger.share_capacity, broker.ledger.placement) == (0, 100, "binpack")
    finally:
        broker.close()
