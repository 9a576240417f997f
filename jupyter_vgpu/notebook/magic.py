"""The %vgpu line magic: this kernel's slice, resizing it, and the panel of every slice.

Loaded with ``%load_ext jupyter_vgpu``; kernels started in slices load it by themselves (the
provisioner adds it to ipykernel's command line).

A kernel a server started asks that server (REST, with the kernel's own credential). A kernel
started without one (a batch run: nbconvert, papermill, nbclient) is in a slice all the same, and
``%vgpu`` reads that slice from its region; it cannot be resized from the notebook, and there is
no panel of other slices, so those print what to do instead (a notebook written interactively
still runs unattended).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from jupyter_vgpu.client import (
    KERNEL_ID_VARIABLE,
    KERNEL_VARIABLES,
    RequestRefused,
    ResizeChanges,
    ServerClient,
    ServerUnavailable,
    describe_limits,
    describe_queue,
    device_label,
    in_host_memory,
    resize_changes,
    resize_waiting,
    slice_name,
    slice_notice,
    state_meaning,
)
from jupyter_vgpu.model.sizes import POLICY_HELP, SIZE_HELP, SM_SHARE_HELP, SliceValueError, format_size

if TYPE_CHECKING:
    from jupyter_vgpu.notebook.panel import SlicePanel

ACTIONS = ("show", "resize", "panel")
BATCH_NOTE = "started without a vGPU server (a batch run): its size was chosen when the run started"


def resize_in_batch(kernel_id: str, memory: str) -> str:
    """Why %vgpu resize does nothing in a kernel no server started, and how to get a larger slice."""
    advice = (
        f"this kernel was started without a vGPU server (nbconvert, papermill, nbclient), so its slice "
        f"cannot be resized from the notebook; choose the size when starting the run: "
        f"jupyter nbconvert --execute --VGPUProvisioner.memory={memory} ..., or papermill -k NAME with a "
        f"kernelspec made by jupyter vgpu kernelspec install --memory {memory} --name NAME"
    )
    from jupyter_vgpu.provisioning.local import LEDGER_VARIABLE

    if os.environ.get(LEDGER_VARIABLE):
        advice += (
            f". Its slice is in the ledger of the vGPU server on this machine; while that server runs, it can "
            f"resize it from a terminal: jupyter vgpu resize {kernel_id[:8]} --memory {memory}"
        )
    return advice


PANEL_NEEDS_SERVER = (
    "%vgpu panel shows and resizes the slices of a vGPU server's kernels, and this kernel was started "
    "without a server (a batch run); %vgpu shows its own slice"
)


def _memory_line(model: dict[str, Any]) -> str:
    limits = model["limits"]
    cap = f"{format_size(limits['memory_bytes'])} cap" if limits["memory_bytes"] else "no cap"
    suspended = in_host_memory(model)
    if suspended:
        return f"  memory  {suspended}, none on the GPU; {cap}"
    if model.get("state") == "lent":
        return f"  memory  none on the GPU: its room is lent to others until its first GPU call; {cap}"
    return f"  memory  {format_size(model['usage']['memory_bytes'])} used of {cap}"


def describe_slice(model: dict[str, Any], devices: list[dict[str, Any]]) -> str:
    """The slice as %vgpu prints it."""
    limits, usage = model["limits"], model["usage"]
    return "\n".join(
        [
            f"GPU slice of {slice_name(model)} ({model['kernel_id']}), {model['state']}",
            *([f"  state   {meaning}"] if (meaning := state_meaning(model["state"])) else []),
            f"  device  {device_label(model, devices)}",
            _memory_line(model),
            f"  SM      {usage['sm_util']:.1f}% measured of {limits['cores']}% share",
            f"  policy  {limits['policy']}",
            # Where its request for room stands, while it waits (a suspended or lent kernel's).
            *([f"  queue   {place}"] if (place := describe_queue(model)) else []),
            *(f"  warning {warning}" for warning in model.get("warnings", ())),
            *(f"  note    {note}" for note in model.get("notes", ())),
            # What the server's idle policy did to this kernel (lowered, suspended, not given back).
            *([f"  idle    {notice}"] if (notice := slice_notice(model)) else []),
        ]
    )


def batch_region() -> str | None:
    """The region of this kernel's slice when no server started it, else None (a server's
    kernel has the server's link; a kernel outside any slice has no region)."""
    from jupyter_vgpu.holders.local import REGION_VARIABLE  # the holders load only where needed

    if all(os.environ.get(name) for name in KERNEL_VARIABLES):
        return None
    return os.environ.get(REGION_VARIABLE) or None


def region_model(path: str) -> dict[str, Any]:
    """This kernel's slice as GET slices would answer it, read from its region file."""
    from jupyter_vgpu.holders.local import LIMITS_VARIABLE, REGION_SUFFIX
    from jupyter_vgpu.holders.region import Region, RegionError
    from jupyter_vgpu.provisioning.local import LEDGER_VARIABLE

    try:
        with Region.open(path, limits_path=os.environ.get(LIMITS_VARIABLE) or None, publisher=False) as region:
            limits, processes = region.limits, region.processes()
            device = {"index": region.device_index, "uuid": region.device_uuid}
            sm_util = region.sm_util_permille / 10 if processes else 0.0
    except RegionError as error:
        raise UsageError(f"this kernel's GPU slice cannot be read: {error}") from None
    kernel_id = os.environ.get(KERNEL_ID_VARIABLE) or os.path.basename(path).removesuffix(REGION_SUFFIX)
    ledger = os.environ.get(LEDGER_VARIABLE)
    notes = [BATCH_NOTE]
    if ledger:
        notes.append(f"counted in the vGPU server's ledger {ledger}, beside the server's slices")
    return {
        "kernel_id": kernel_id,
        "path": "",
        "state": "running" if processes else "unused",
        "device": device,
        "limits": {"memory_bytes": limits.memory_limit, "cores": limits.sm_share, "policy": limits.policy},
        "usage": {"memory_bytes": sum(process.used for process in processes), "sm_util": sm_util},
        "warnings": [],
        "notes": notes,
    }


def device_names(uuid: str) -> list[dict[str, Any]]:
    """The device with that UUID as GET devices lists it (its name from NVML), or none."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByUUID(uuid))
        return [{"uuid": uuid, "name": name}]
    except pynvml.NVMLError:
        return []
    finally:
        pynvml.nvmlShutdown()


@magics_class
class VGPUMagics(Magics):
    def __init__(self, shell: Any, client_factory: Callable[[], ServerClient] = ServerClient.for_kernel):
        super().__init__(shell)
        self.client_factory = client_factory
        self.panel: SlicePanel | None = None  # one live panel per kernel, shown again by every %vgpu panel

    @magic_arguments()
    @argument("-h", "--help", action="store_true", help="Show this help (as %%vgpu? does) and do nothing else.")
    @argument("action", nargs="?", default="show", choices=ACTIONS, help="show (the default), resize or panel.")
    @argument("--memory", help=f"resize: the new memory cap, {SIZE_HELP}.")
    @argument("--cores", help=f"resize: the new SM share, {SM_SHARE_HELP}.")
    @argument("--policy", help=f"resize: the new policy, {POLICY_HELP}.")
    @line_magic
    def vgpu(self, line: str):
        """This kernel's GPU slice: show it, resize it, or open a live panel of every slice.

        ``%vgpu`` prints the slice: its device, memory used and cap, SM utilisation measured and
        the share, and the policy; and, when the server's idle policy lowered this kernel's SM
        share or suspended it (or could not give it back, or waits for room to resume it), why. A
        suspended kernel's memory is in host memory: the memory line says how much.

        ``%vgpu resize --memory 6GiB --cores 40 --policy burst`` asks the server for new limits
        (any of the three) and prints the outcome: the limits granted, or the reason the server
        refused (for example what is free on the device). Every process of the kernel obeys the
        new limits on its next CUDA call. A growth that does not fit yet waits in the GPU's line:
        the magic returns at once saying where it stands, and the resize happens by itself when
        room comes. Shrinking the memory below what the kernel holds is refused with what it holds.

        ``%vgpu panel`` shows every sliced kernel of this server with memory and SM bars, and
        controls to resize this kernel's slice (other kernels are resized from JupyterLab's
        sidebar or ``jupyter vgpu resize``); it refreshes about once a second in the background.

        The kernel reaches its Jupyter server with a credential of its own, which allows reading
        slices and resizing this kernel's slice only.

        In a kernel started without a server (nbconvert, papermill, nbclient), ``%vgpu`` shows the
        slice it is in, read from its region; resize and panel print what to do instead.
        """
        args = parse_argstring(self.vgpu, line)
        if args.help:  # IPython's magic arguments have no --help of their own
            print(self.vgpu.parser.format_help())
            return
        try:
            changes = resize_changes(args.memory, args.cores, args.policy)
        except SliceValueError as error:
            raise UsageError(str(error)) from None
        if args.action != "resize" and changes:
            raise UsageError(f"--memory, --cores and --policy belong to '%vgpu resize', not '%vgpu {args.action}'")
        if args.action == "resize" and not changes:
            raise UsageError("nothing to resize; give --memory, --cores and/or --policy")
        region = batch_region()
        if region is not None:
            self._batch(args.action, changes, region)
            return
        try:
            client = self.client_factory()
            if args.action == "show":
                print(describe_slice(client.slice(), client.devices()))
            elif args.action == "resize":
                self._resize(client, changes)
            else:
                self._show_panel(client)
        except ServerUnavailable as error:
            raise UsageError(str(error)) from None

    def _batch(self, action: str, changes: ResizeChanges, region: str) -> None:
        """%vgpu in a kernel no server started: its slice from its region."""
        model = region_model(region)
        if action == "show":
            print(describe_slice(model, device_names(model["device"]["uuid"])))
        elif action == "resize":
            memory = changes.get("memory") or format_size(model["limits"]["memory_bytes"] or 4 << 30)
            print(f"resize refused: {resize_in_batch(model['kernel_id'], memory)}")
        else:
            print(PANEL_NEEDS_SERVER)

    def _resize(self, client: ServerClient, changes: ResizeChanges) -> None:
        try:
            model = client.resize(**changes)
        except RequestRefused as error:
            print(f"resize refused: {error.message}")
            return
        # A growth that waits for room returns at once: a cell that blocked would keep the kernel
        # busy, and a busy kernel is never suspended, so it could hold up the room it waits for.
        print(resize_waiting(model) or f"resize granted: {describe_limits(model)}")

    def _show_panel(self, client: ServerClient) -> None:
        from IPython.display import display

        from jupyter_vgpu.notebook.panel import SlicePanel  # ipywidgets loads only for the panel

        if self.panel is None or self.panel.closed:
            self.panel = SlicePanel(client)
            self.panel.start()
        display(self.panel)
