"""The %vgpu line magic: this kernel's slice, resizing it, and the panel of every slice.

Loaded with ``%load_ext jupyter_vgpu``; kernels started in slices load it by themselves (the
provisioner adds it to ipykernel's command line).
"""

from __future__ import annotations

from collections.abc import Callable

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from jupyter_vgpu.client import RequestRefused, ServerClient, ServerUnavailable, describe_limits, device_label, slice_name
from jupyter_vgpu.model.sizes import POLICY_HELP, SIZE_HELP, SM_SHARE_HELP, SliceValueError, format_size, parse_policy, parse_size, parse_sm_share

ACTIONS = ("show", "resize", "panel")


def describe_slice(model: dict, devices: list[dict]) -> str:
    """The slice as %vgpu prints it."""
    limits, usage = model["limits"], model["usage"]
    return "\n".join(
        [
            f"GPU slice of {slice_name(model)} ({model['kernel_id']}), {model['state']}",
            f"  device  {device_label(model, devices)}",
            f"  memory  {format_size(usage['memory_bytes'])} used of {format_size(limits['memory_bytes'])} cap",
            f"  SM      {usage['sm_util']:.1f}% measured of {limits['cores']}% share",
            f"  policy  {limits['policy']}",
            *(f"  warning {warning}" for warning in model.get("warnings", ())),
        ]
    )


def requested_changes(memory: str | None, cores: str | None, policy: str | None) -> dict[str, str]:
    """The resize a user asked for, checked here with the server's own vocabulary so a typo is
    refused before anything is sent. Values go to the server as written."""
    changes = {}
    try:
        if memory is not None:
            parse_size(memory)
            changes["memory"] = memory.strip()
        if cores is not None:
            changes["cores"] = str(parse_sm_share(cores))
        if policy is not None:
            changes["policy"] = parse_policy(policy)
    except SliceValueError as error:
        raise UsageError(str(error)) from None
    return changes


@magics_class
class VGPUMagics(Magics):
    def __init__(self, shell, client_factory: Callable[[], ServerClient] = ServerClient.for_kernel):
        super().__init__(shell)
        self.client_factory = client_factory
        self.panel = None  # one live panel per kernel, shown again by every %vgpu panel

    @magic_arguments()
    @argument("action", nargs="?", default="show", choices=ACTIONS, help="show (the default), resize or panel.")
    @argument("--memory", help=f"resize: the new memory cap, {SIZE_HELP}.")
    @argument("--cores", help=f"resize: the new SM share, {SM_SHARE_HELP}.")
    @argument("--policy", help=f"resize: the new policy, {POLICY_HELP}.")
    @line_magic
    def vgpu(self, line: str):
        """This kernel's GPU slice: show it, resize it, or open a live panel of every slice.

        ``%vgpu`` prints the slice: its device, memory used and cap, SM utilisation measured and
        the share, and the policy.

        ``%vgpu resize --memory 6GiB --cores 40 --policy burst`` asks the server for new limits
        (any of the three) and prints the outcome: the limits granted, or the reason the server
        refused (for example what is free on the device). Every process of the kernel obeys the
        new limits on its next CUDA call; shrinking below what is in use refuses new allocations
        and frees nothing.

        ``%vgpu panel`` shows every sliced kernel of this server with memory and SM bars, and
        controls to resize each; it refreshes about once a second in the background.

        The kernel reaches its Jupyter server with a credential of its own, which allows reading
        slices and resizing this kernel's slice only.
        """
        args = parse_argstring(self.vgpu, line)
        changes = requested_changes(args.memory, args.cores, args.policy)
        if args.action != "resize" and changes:
            raise UsageError(f"--memory, --cores and --policy belong to '%vgpu resize', not '%vgpu {args.action}'")
        if args.action == "resize" and not changes:
            raise UsageError("nothing to resize; give --memory, --cores and/or --policy")
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

    def _resize(self, client: ServerClient, changes: dict[str, str]) -> None:
        try:
            model = client.resize(**changes)
        except RequestRefused as error:
            print(f"resize refused: {error.message}")
            return
        print(f"resize granted: {describe_limits(model)}")

    def _show_panel(self, client: ServerClient) -> None:
        from IPython.display import display

        from jupyter_vgpu.notebook.panel import SlicePanel  # ipywidgets loads only for the panel

        if self.panel is None or self.panel.closed:
            self.panel = SlicePanel(client)
            self.panel.start()
        display(self.panel)
