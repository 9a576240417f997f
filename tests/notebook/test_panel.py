"""The %vgpu panel's widget models, driven by a scripted client in place of the server
(tests/notebook/conftest.py)."""

from __future__ import annotations

import copy
import queue

import pytest

from jupyter_vgpu.client import RequestRefused
from jupyter_vgpu.notebook.panel import SlicePanel

GIB = 1 << 30


@pytest.fixture
def client(scripted_client, slice_model):
    return scripted_client(
        [
            slice_model("own-kernel", path="work/train.ipynb", device=1, memory=4 * GIB, used=GIB, cores=30, util=12.0),
            slice_model("abcdef012345", memory=2 * GIB, used=3 * GIB // 2, cores=50, util=61.0, policy="burst"),
        ]
    )


@pytest.fixture
def panel(client):
    shown = SlicePanel(client)
    shown.refresh()
    yield shown
    shown.close()


def row_text(row):
    return (row.name.value, row.device.value, row.memory_label.value, row.sm_label.value, row.policy.value)


def test_one_row_per_slice_with_its_bars(panel):
    own, other = (panel.rows[k] for k in ("own-kernel", "abcdef012345"))
    assert row_text(own) == ("train.ipynb (this kernel)", "1 · Sim Large", "1GiB / 4GiB", "12 / 30 %", "hard")
    assert row_text(other) == ("kernel abcdef01", "0 · Sim Small", "1.5GiB / 2GiB", "61 / 50 %", "burst")
    assert (own.memory_bar.value, own.memory_bar.max) == (GIB, 4 * GIB)
    assert (own.sm_bar.value, own.sm_bar.max) == (12.0, 30.0)
    assert other.sm_bar.value == other.sm_bar.max == 50.0  # bursting above its share fills the bar
    assert panel.children == (panel.header, own.widget, other.widget, panel.status)


def test_rows_follow_kernels_as_they_come_and_go(panel, client, slice_model):
    gone = panel.rows["abcdef012345"]
    client.listed = [client.listed[0], slice_model("new-kernel", path="eval.ipynb", memory=GIB, used=0)]
    panel.refresh()
    assert list(panel.rows) == ["own-kernel", "new-kernel"]
    assert panel.rows["new-kernel"].name.value == "eval.ipynb"
    assert gone.widget not in panel.children
    client.listed = []
    panel.refresh()
    assert panel.rows == {} and panel.children == (panel.header, panel.status)
    assert panel.status.value == "no sliced kernels are running"


def test_bars_follow_usage_and_a_full_slice_shows_danger(panel, client):
    client.listed[0]["usage"]["memory_bytes"] = 4 * GIB
    client.listed[0]["usage"]["sm_util"] = 29.4
    panel.refresh()
    own = panel.rows["own-kernel"]
    assert own.memory_bar.value == 4 * GIB and own.memory_bar.bar_style == "danger"
    assert own.sm_bar.value == 29.4 and own.sm_label.value == "29 / 30 %"


def test_apply_sends_what_changed_and_shows_the_new_limits(panel, client):
    own = panel.rows["own-kernel"]
    own.memory_input.value = "6GiB"
    own.policy_input.value = "burst"
    own.apply_button.click()
    assert client.resizes == [("own-kernel", {"memory": "6GiB", "policy": "burst"})]
    assert own.message.value == "resized: memory cap 6GiB, SM share 30%, policy burst"
    assert own.memory_label.value == "1GiB / 6GiB" and own.policy.value == "burst"


def test_a_rows_message_goes_once_the_slice_it_was_about_changes(panel, client):
    own = panel.rows["own-kernel"]
    own.memory_input.value = "6GiB"
    own.apply_button.click()
    said = own.message.value
    panel.refresh()  # the server's answer as the resize left it: still true
    assert own.message.value == said
    client.listed[0]["limits"]["memory_bytes"] = 5 * GIB  # another client resized it
    panel.refresh()
    assert own.message.value == ""
    client.refusal = RequestRefused(409, "device 1 has 1GiB of memory free; the slice asks for 3GiB more")
    own.cores_input.value = 80
    own.apply_button.click()
    assert "refused" in own.message.value
    client.listed[0]["state"] = "suspended"  # what it was refused for no longer stands
    panel.refresh()
    assert own.message.value == ""


def test_a_cap_that_format_size_would_round_is_not_sent_back_changed(client, slice_model):
    client.listed = [slice_model("own-kernel", memory=1400 << 20)]
    shown = SlicePanel(client)
    shown.refresh()
    row = shown.rows["own-kernel"]
    assert row.memory_input.value == "1400MiB" and row.memory_label.value == "1GiB / 1.4GiB"
    row.cores_input.value = 60
    row.apply_button.click()
    assert client.resizes == [("own-kernel", {"cores": "60"})]
    shown.close()


def test_a_refusal_is_shown_in_its_row(panel, client):
    client.refusal = RequestRefused(409, "device 1 has 1GiB of memory free; the slice asks for 3GiB more")
    own = panel.rows["own-kernel"]
    own.cores_input.value = 80
    own.apply_button.click()
    assert client.resizes == [("own-kernel", {"cores": "80"})]
    assert "refused: device 1 has 1GiB of memory free; the slice asks for 3GiB more" in own.message.value
    assert own.sm_label.value == "12 / 30 %"


def test_only_the_rows_the_client_may_resize_have_controls(panel, client, slice_model):
    """A kernel's credential resizes its own slice only; a user's token (kernel_id "") any."""
    own, other = (panel.rows[k] for k in ("own-kernel", "abcdef012345"))
    assert own.resizable and own.apply_button in own.widget.children[2].children
    assert not other.resizable and len(other.widget.children) == 2  # its numbers and notices only
    assert not hasattr(other, "apply_button")
    client.kernel_id = ""
    shown = SlicePanel(client)
    shown.refresh()
    assert all(row.resizable and len(row.widget.children) == 4 for row in shown.rows.values())
    shown.close()


def test_a_bad_size_is_refused_before_anything_is_sent(panel, client):
    own = panel.rows["own-kernel"]
    own.memory_input.value = "lots"
    own.apply_button.click()
    assert client.resizes == []
    assert "refused: memory size 'lots' is not a size like 512MiB" in own.message.value


def test_controls_follow_the_server_unless_the_user_is_editing_them(panel, client):
    own = panel.rows["own-kernel"]
    own.cores_input.value = 45  # being edited
    client.listed[0]["limits"].update(memory_bytes=8 * GIB, cores=20, policy="burst")  # resized elsewhere
    panel.refresh()
    assert (own.memory_input.value, own.cores_input.value, own.policy_input.value) == ("8GiB", 45, "burst")


def test_an_unreachable_server_is_reported_and_the_rows_kept(panel, client):
    client.unreachable = True
    panel.refresh()
    assert panel.status.value.startswith("not refreshed: cannot reach the vGPU server")
    assert list(panel.rows) == ["own-kernel", "abcdef012345"]


def test_the_servers_warnings_show_under_their_row_and_go_when_it_stops_saying_them(panel, client):
    restored = "limits changed from inside the kernel were restored <to 4GiB>"
    client.listed[1]["warnings"] = [restored]
    panel.refresh()
    other = panel.rows["abcdef012345"]
    assert "limits changed from inside the kernel were restored &lt;to 4GiB&gt;" in other.warnings.value
    assert other.warnings in other.widget.children
    assert panel.rows["own-kernel"].warnings.value == ""
    client.listed[1]["warnings"] = []
    panel.refresh()
    assert other.warnings.value == ""


def test_background_refresh_updates_rows_without_blocking_the_caller(client, scripted_client, slice_model):
    """The server answers only when the test says so; each listing the panel asks for after an
    answer proves the answer before it was shown (refresh asks, then shows, then asks again)."""
    answers, asked = queue.Queue(), queue.Queue()
    slow = scripted_client(client.listed)

    def slices():
        asked.put(True)
        return copy.deepcopy(answers.get(timeout=30))

    slow.slices = slices
    shown = SlicePanel(slow, interval=0)
    try:
        shown.start()  # returns at once although the first refresh is waiting for the server
        asked.get(timeout=30)
        assert shown.rows == {}
        answers.put(client.listed)
        asked.get(timeout=30)
        assert list(shown.rows) == ["own-kernel", "abcdef012345"]
        answers.put([slice_model("late-kernel", path="late.ipynb")])
        asked.get(timeout=30)
        assert list(shown.rows) == ["late-kernel"]
    finally:
        answers.put([])  # the refresh under way gets its answer, then sees the panel closed
        shown.close()
    assert not shown._thread.is_alive()


def test_a_start_waiting_in_line_shows_where_it_stands_in_its_row(panel, client, slice_model):
    queued = slice_model("queued-kernel", path="big.ipynb", memory=10 * GIB, cores=20, policy="burst", used=0, util=0.0)
    queued.update(
        state="queued",
        device=None,  # it takes whichever GPU has room first
        queue={"position": 2, "eta_seconds": None, "waiting_for": "6GiB more GPU memory (4GiB free)"},
    )
    client.listed = [*client.listed, queued]
    panel.refresh()
    row = panel.rows["queued-kernel"]
    assert row_text(row) == ("big.ipynb", "any GPU", "none yet (queued) / 10GiB", "0 / 20 %", "burst")
    assert row.memory_bar.value == 0
    assert "2nd in line for any GPU · waiting for 6GiB more GPU memory (4GiB free)" in row.warnings.value
