"""The ipywidgets panel of every sliced kernel of the server (``%vgpu panel``).

A background thread asks the server for the slices about once a second and updates the widgets'
traits, so the panel stays live while cells run. Clicks (Apply) arrive on the kernel's shell
channel like any widget message: while a cell runs they wait for it to finish, which is why the
JupyterLab sidebar, not this panel, is the place to resize a kernel that is busy.
"""

from __future__ import annotations

import threading
from typing import Any

import ipywidgets as widgets

from jupyter_vgpu.client import (
    RequestRefused,
    ServerClient,
    ServerUnavailable,
    describe_limits,
    describe_queue,
    device_label,
    gpu_memory_used,
    in_host_memory,
    slice_name,
    slice_notice,
)
from jupyter_vgpu.model.sizes import POLICIES, SliceValueError, exact_size, format_size, parse_size

REFRESH_SECONDS = 1.0
_COLUMN_WIDTHS = ("14em", "16em", "16em", "14em", "5em")
_INDENT = "0 0 0 14em"  # controls and messages sit under the row's name
_LABELLED = {"description_width": "initial"}


def _row(*children: widgets.Widget) -> widgets.HBox:
    for child, width in zip(children, _COLUMN_WIDTHS, strict=True):
        child.layout.width = width
    return widgets.HBox(list(children), layout=widgets.Layout(align_items="center"))


def _bar_with_label() -> tuple[widgets.FloatProgress, widgets.HTML, widgets.HBox]:
    bar = widgets.FloatProgress(min=0.0, max=1.0, value=0.0, layout=widgets.Layout(width="7em", flex="0 0 auto"))
    # HTML, not a Label: a Label's text is cut with an ellipsis where the column is too narrow
    # ("12GiB in host memory (susp…"); HTML wraps onto a second line instead.
    label = widgets.HTML()
    return bar, label, widgets.HBox([bar, label])


class SliceRow:
    """One sliced kernel: what it holds and uses, and, where the panel's client may resize it,
    controls to do so."""

    def __init__(self, model: dict[str, Any], devices: list[dict[str, Any]], panel: SlicePanel):
        self.kernel_id = model["kernel_id"]
        self.panel = panel
        self.limits: dict[str, Any] = {}
        # The slice as the row's message found it (state and limits): the message goes once
        # either changes, as it no longer describes the slice ("resized: 5GiB" after another resize).
        self.shown: tuple[str, dict[str, Any]] = ("", {})
        self.said_about: tuple[str, dict[str, Any]] | None = None
        self.name = widgets.Label()
        self.device = widgets.Label()
        self.memory_bar, self.memory_label, memory = _bar_with_label()
        self.sm_bar, self.sm_label, sm = _bar_with_label()
        self.policy = widgets.Label()
        self.message = widgets.HTML(layout=widgets.Layout(margin=_INDENT))
        self.warnings = widgets.HTML(layout=widgets.Layout(margin=_INDENT))
        children: list[widgets.Widget] = [_row(self.name, self.device, memory, sm, self.policy), self.warnings]
        # The server answers a kernel's resize of another kernel's slice with 403 (its credential
        # writes only its own): controls it could never use are not shown at all.
        self.resizable = panel.may_resize(self.kernel_id)
        if self.resizable:
            self.memory_input = widgets.Text(description="memory", style=_LABELLED, layout=widgets.Layout(width="12em"))
            self.cores_input = widgets.BoundedIntText(
                min=1, max=100, description="SM share %", style=_LABELLED, layout=widgets.Layout(width="11em")
            )
            self.policy_input = widgets.Dropdown(
                options=POLICIES, description="policy", style=_LABELLED, layout=widgets.Layout(width="10em")
            )
            self.apply_button = widgets.Button(description="Apply", layout=widgets.Layout(width="6em", flex="0 0 auto"))
            self.apply_button.on_click(lambda _button: self.apply())
            controls = widgets.HBox(
                [self.memory_input, self.cores_input, self.policy_input, self.apply_button],
                layout=widgets.Layout(margin=_INDENT, align_items="center", grid_gap="0.5em"),
            )
            children += [controls, self.message]
        self.widget = widgets.VBox(children, layout=widgets.Layout(margin="0 0 0.6em 0"))
        self.update(model, devices)

    def update(self, model: dict[str, Any], devices: list[dict[str, Any]]) -> None:
        limits, usage = model["limits"], model["usage"]
        self.shown = (model.get("state", ""), dict(limits))
        if self.said_about is not None and self.said_about != self.shown:
            self.say("")
        own = " (this kernel)" if self.kernel_id == self.panel.client.kernel_id else ""
        self.name.value = slice_name(model) + own
        self.device.value = device_label(model, devices)
        on_gpu = gpu_memory_used(model)  # none while suspended: the bar's GPU part stays empty
        self.memory_bar.max = float(limits["memory_bytes"])
        self.memory_bar.value = float(min(on_gpu, limits["memory_bytes"]))
        self.memory_bar.bar_style = "danger" if on_gpu >= limits["memory_bytes"] else ""
        held_none = {"lent": "none on the GPU (lent)", "queued": "none yet (queued)"}.get(model.get("state", ""))
        self.memory_label.value = _escape(
            in_host_memory(model)
            or (held_none and f"{held_none} / {format_size(limits['memory_bytes'])}")
            or f"{format_size(on_gpu)} / {format_size(limits['memory_bytes'])}"
        )
        self.sm_bar.max = float(limits["cores"])
        self.sm_bar.value = float(min(usage["sm_util"], limits["cores"]))
        self.sm_label.value = f"{usage['sm_util']:.0f} / {limits['cores']} %"
        self.policy.value = limits["policy"]
        # What the server noticed about the slice (limits rewritten from inside the kernel and
        # restored, ...): said where its numbers are, in JupyterLab's warning colour.
        # Then where it stands in the line while it waits for room (a queued start, a suspended or
        # lent kernel's cell) and what the idle policy did to it (lowered, suspended), in the info colour.
        info = [text for text in (describe_queue(model), slice_notice(model)) if text]
        self.warnings.value = "<br>".join(
            [
                *(
                    f'<span style="color: var(--jp-warn-color1, #f57c00)">{_escape(warning)}</span>'
                    for warning in model.get("warnings", ())
                ),
                *(f'<span style="color: var(--jp-info-color1, #0288d1)">{_escape(text)}</span>' for text in info),
            ]
        )
        if self.resizable:
            self._follow_limits(limits)

    def _follow_limits(self, limits: dict[str, Any]) -> None:
        """Controls show the current limits, except where the user has typed something else.
        The memory control holds an exact size: format_size rounds 1400MiB to 1.4GiB, which Apply
        would then send as a change nobody asked for."""
        previous, self.limits = self.limits, dict(limits)
        if not previous or self.memory_input.value == exact_size(previous["memory_bytes"]):
            self.memory_input.value = exact_size(limits["memory_bytes"])
        if not previous or self.cores_input.value == previous["cores"]:
            self.cores_input.value = limits["cores"]
        if not previous or self.policy_input.value == previous["policy"]:
            self.policy_input.value = limits["policy"]

    def changes(self) -> dict[str, str]:
        """What the controls ask for that differs from the current limits."""
        changes = {}
        if parse_size(self.memory_input.value) != self.limits["memory_bytes"]:
            changes["memory"] = self.memory_input.value.strip()
        if self.cores_input.value != self.limits["cores"]:
            changes["cores"] = str(self.cores_input.value)
        if self.policy_input.value != self.limits["policy"]:
            changes["policy"] = self.policy_input.value
        return changes

    def apply(self) -> None:
        try:
            changes = self.changes()
        except SliceValueError as error:
            self.show_refusal(str(error))
            return
        if not changes:
            self.say("nothing to change")
            return
        try:
            model = self.panel.client.resize(self.kernel_id, **changes)
        except (RequestRefused, ServerUnavailable) as error:
            self.show_refusal(str(error))
            return
        with self.panel.lock:
            self.update(model, self.panel.devices)
        self.say(f"resized: {_escape(describe_limits(model))}")

    def show_refusal(self, reason: str) -> None:
        self.say(f'<span style="color: var(--jp-error-color1, #d32f2f)">refused: {_escape(reason)}</span>')

    def say(self, html: str) -> None:
        """The row's message, about the slice as the row shows it now (nothing: none)."""
        self.message.value = html
        self.said_about = self.shown if html else None


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class SlicePanel(widgets.VBox):
    """Every sliced kernel of the server, one row each, refreshed in the background."""

    def __init__(self, client: ServerClient, interval: float = REFRESH_SECONDS, **kwargs):
        super().__init__(**kwargs)
        self.client = client
        self.interval = interval
        self.rows: dict[str, SliceRow] = {}
        self.devices: list[dict[str, Any]] = []
        self.status = widgets.Label()
        self.header = _row(
            *(
                widgets.HTML(f"<b>{title}</b>")
                for title in ("notebook", "device", "memory used / cap", "SM measured / share", "policy")
            )
        )
        self.lock = threading.Lock()
        self.closed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.children = [self.header, self.status]

    def may_resize(self, kernel_id: str) -> bool:
        """Whether the panel's client may resize that kernel's slice: a kernel's own credential
        resizes only its own slice (server/handlers.py's KernelScope); a user's token, any."""
        return not self.client.kernel_id or kernel_id == self.client.kernel_id

    def refresh(self) -> None:
        """Ask the server for every slice and show what it says (or why it cannot)."""
        try:
            slices, devices = self.client.slices(), self.client.devices()
        except (RequestRefused, ServerUnavailable) as error:
            self.status.value = f"not refreshed: {error}"
            return
        self.show(slices, devices)

    def show(self, slices: list[dict[str, Any]], devices: list[dict[str, Any]]) -> None:
        with self.lock:
            self.devices = devices
            current = {model["kernel_id"]: model for model in slices}
            for kernel_id in set(self.rows) - set(current):
                self.rows.pop(kernel_id).widget.close()
            for kernel_id, model in current.items():
                if kernel_id in self.rows:
                    self.rows[kernel_id].update(model, devices)
                else:
                    self.rows[kernel_id] = SliceRow(model, devices, self)
            self.status.value = "" if slices else "no sliced kernels are running"
            self.children = [self.header, *(self.rows[kernel_id].widget for kernel_id in current), self.status]

    def start(self) -> None:
        self._thread = threading.Thread(target=self._refresh_until_closed, name="vgpu-panel", daemon=True)
        self._thread.start()

    def _refresh_until_closed(self) -> None:
        while True:
            self.refresh()
            if self._stop.wait(self.interval):
                return

    def close(self) -> None:
        self.closed = True
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        for row in self.rows.values():
            row.widget.close()
        super().close()
