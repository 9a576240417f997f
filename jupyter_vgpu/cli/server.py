"""The commands that ask the running Jupyter server's /api/vgpu: ``jupyter vgpu status``,
``resize``, ``suspend`` and ``resume``."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from traitlets import Bool, Unicode

from jupyter_vgpu.cli.base import UsageError, _aliases, _ServerCommand
from jupyter_vgpu.client import (
    describe_queue,
    gpu_memory_used,
    in_host_memory,
    resize_changes,
    resize_waiting,
    state_meaning,
)
from jupyter_vgpu.model import SliceValueError, format_size


def short_ids(kernel_ids: list[str]) -> dict[str, str]:
    """Each kernel id cut to 8 characters, or to as many as tell the ids apart."""
    length = 8
    while len({kernel_id[:length] for kernel_id in kernel_ids}) < len(set(kernel_ids)):
        length += 1
    return {kernel_id: kernel_id[:length] for kernel_id in kernel_ids}


# Where JupyterHub serves its API unless configured otherwise (JupyterHub.hub_bind_url).
DEFAULT_HUB_API_URL = "http://127.0.0.1:8081/hub/api"


def _where(item: dict[str, Any]) -> str:
    """What a slice is for, in one line: its notebook, else the command that started it."""
    return item["path"] or " ".join(item.get("command", "").split()) or "-"


def _gpu_column(item: dict[str, Any]) -> str:
    """The slice's GPU index; ``any`` for a start waiting for whichever GPU has room first, ``-``
    for a pod's slice (on no GPU of this machine)."""
    device = item.get("device")
    if device:
        return str(device["index"])
    return "any" if item.get("state") == "queued" else "-"


class StatusApp(_ServerCommand):
    name = "jupyter-vgpu-status"
    description = "Show every GPU slice of the running Jupyter server, like nvidia-smi for slices."
    show_all = Bool(
        False,
        config=True,
        help="Every user's slices on the node, from its broker, by GPU (a JupyterHub with jupyter_vgpu.hub). "
        "Needs a hub token with custom:vgpu:admin (the vgpu-admin role) in $JUPYTERHUB_API_TOKEN.",
    )
    broker = Unicode(
        "",
        config=True,
        help="The broker's URL for --all. Empty: $JUPYTER_VGPU_BROKER_URL, else the URL of the hub's service "
        "--service, asked of the hub's API at $JUPYTERHUB_API_URL (else JupyterHub's default, "
        f"{DEFAULT_HUB_API_URL}).",
    )
    service = Unicode(
        "vgpu", config=True, help="For --all: the broker's service name in the hub (the classroom file's broker.name)."
    )
    aliases = _aliases("StatusApp", "server", "broker", "service")
    flags = {"all": ({"StatusApp": {"show_all": True}}, show_all.help)}  # noqa: RUF012 -- traitlets' class-level table

    def run(self) -> int:
        if self.show_all:
            return self.run_all()
        client = self.client()
        slices = client.slices()
        print(
            f"{'KERNEL':<10}{'NOTEBOOK':<28}{'GPU':>4}{'MEMORY USED / CAP':>22}{'SM % / SHARE':>15}{'POLICY':>8}  STATE"
        )
        for item in slices:
            limits, usage = item["limits"], item["usage"]
            used = gpu_memory_used(item)  # none on the GPU while suspended: the state says where it is
            memory = f"{format_size(used) if used else '0'} / {format_size(limits['memory_bytes'])}"
            sm = f"{usage['sm_util']:.0f} / {limits['cores']}"
            print(
                f"{item['kernel_id'][:8]:<10}{_where(item)[-27:]:<28}{_gpu_column(item):>4}"
                f"{memory:>22}{sm:>15}{limits['policy']:>8}  {in_host_memory(item) or item['state']}"
            )
            # A start waiting in line, or a suspended or lent kernel's cell waiting for its room.
            place = describe_queue(item)
            if place:
                print(f"{'':<10}{place}")
            for warning in item.get("warnings", ()):
                print(f"{'':<10}warning: {warning}")
        if not slices:
            print("(no slices)")
        for state in dict.fromkeys(item["state"] for item in slices):
            if meaning := state_meaning(state):
                print(meaning)
        for device in client.devices():
            # Memory the GPU holds beyond the slices: not free, whatever the caps leave.
            outside, over_cap = device.get("memory_outside_bytes", 0), device.get("memory_over_cap_bytes", 0)
            if outside or over_cap:
                print(
                    f"GPU {device['index']}: {format_size(outside) if outside else '0'} in use outside any slice, "
                    f"{format_size(over_cap) if over_cap else '0'} over its slice's cap; "
                    f"{format_size(device['memory_free_bytes']) if device['memory_free_bytes'] else '0'} free for slices"
                )
        return 0

    def run_all(self) -> int:
        from jupyter_vgpu.ledger import LedgerError
        from jupyter_vgpu.ledger.remote import RemoteLedger

        token = os.environ.get("JUPYTERHUB_API_TOKEN", "")
        if not token:
            raise UsageError(
                "--all needs a hub token with custom:vgpu:admin (the vgpu-admin role) in $JUPYTERHUB_API_TOKEN"
            )
        url = self.broker or os.environ.get("JUPYTER_VGPU_BROKER_URL", "") or self.broker_from_hub(token)
        try:
            with RemoteLedger(url.rstrip("/") + "/ledger", token, name="the node's GPU broker") as ledger:
                usages, allocations = ledger.devices_usage(), ledger.allocations()
        except (LedgerError, ValueError) as error:
            print(f"jupyter vgpu status: {error}", file=sys.stderr)
            return 1
        owners = {allocation.owner for allocation in allocations}
        print(f"{len(allocations)} slice(s) of {len(owners)} user(s) on {len(usages)} GPU(s)")
        for usage in usages:
            device = usage.device
            print(
                f"\nGPU {device.index} {device.name}: {format_size(usage.memory_allocated)} of "
                f"{format_size(usage.memory_capacity)} promised, {usage.total_share}% of the SMs "
                f"({usage.hard_share}% hard), {usage.slices} slice(s)"
            )
            held = [allocation for allocation in allocations if allocation.device_uuid == device.uuid]
            if held:
                print(f"  {'USER':<16}{'KERNEL':<10}{'MEMORY':>10}{'SHARE':>7}{'POLICY':>8}")
            for allocation in sorted(held, key=lambda allocation: (allocation.owner, allocation.created_at)):
                print(
                    f"  {allocation.owner or '-':<16}{allocation.kernel_id[:8]:<10}"
                    f"{format_size(allocation.memory_limit):>10}{allocation.sm_share:>6}%{allocation.policy:>8}"
                )
        return 0

    def broker_from_hub(self, token: str) -> str:
        """The broker's URL as the hub knows its service (its url and prefix); a UsageError that
        says what to pass where the hub cannot say."""
        import urllib.error
        import urllib.request

        hub = os.environ.get("JUPYTERHUB_API_URL", "") or DEFAULT_HUB_API_URL
        where = f"{hub.rstrip('/')}/services/{self.service}"
        pass_instead = (
            "give --broker URL (the broker's own address and prefix: http://127.0.0.1:<broker.port>/services/"
            f"{self.service}/ with the classroom file's broker.port), or set $JUPYTERHUB_API_URL to the hub's API "
            "(e.g. http://127.0.0.1:8081/hub/api)"
        )
        request = urllib.request.Request(where, headers={"Authorization": f"token {token}"})
        try:
            with urllib.request.urlopen(request, timeout=30) as reply:
                model = json.loads(reply.read())
        except urllib.error.HTTPError as error:
            why = (
                f"the hub has no service {self.service!r} (see --service) or this token may not read it "
                "(the vgpu-admin role may)"
                if error.code in (403, 404)
                else f"the hub answered {error.code} {error.reason}"
            )
            raise UsageError(f"--all: {why} ({where}); {pass_instead}") from None
        except (OSError, ValueError) as error:
            raise UsageError(f"--all: cannot ask the hub at {hub} for the broker ({error}); {pass_instead}") from None
        url, prefix = (model.get("url") or "", model.get("prefix") or "") if isinstance(model, dict) else ("", "")
        if not url:
            raise UsageError(f"--all: the hub's service {self.service!r} has no URL ({where}); {pass_instead}")
        return url.rstrip("/") + "/" + prefix.lstrip("/")


class ResizeApp(_ServerCommand):
    name = "jupyter-vgpu-resize"
    description = "Resize a running kernel's slice: jupyter vgpu resize KERNEL_ID [--memory] [--cores] [--policy]."
    memory = Unicode("", config=True, help="New memory cap: 512MiB, 4GiB, 4G or MiB.")
    cores = Unicode("", config=True, help="New SM share in percent, 1..100.")
    policy = Unicode("", config=True, help="New policy: hard or burst.")
    aliases = _aliases("ResizeApp", "memory", "cores", "policy", "server")

    def run(self) -> int:
        if len(self.extra_args) != 1:
            raise UsageError("usage: jupyter vgpu resize KERNEL_ID [--memory SIZE] [--cores PCT] [--policy hard|burst]")
        try:
            # An empty option is one not given.
            change = resize_changes(self.memory or None, self.cores or None, self.policy or None)
        except SliceValueError as error:
            raise UsageError(error) from None
        if not change:
            raise UsageError("nothing to change; give --memory, --cores and/or --policy")
        client = self.client()
        kernel_id = self.find_kernel(self.extra_args[0], client.slices())
        model = client.resize(kernel_id, **change)
        waiting = resize_waiting(model)
        if waiting is not None:
            print(f"{kernel_id[:8]}: {waiting}")
            return 0
        limits = model["limits"]
        print(
            f"resized {kernel_id[:8]}: memory {format_size(limits['memory_bytes'])}, cores {limits['cores']} %, policy {limits['policy']}"
        )
        return 0

    @staticmethod
    def find_kernel(wanted: str, slices: list[dict[str, Any]]) -> str:
        """The one sliced kernel whose id starts with ``wanted``; else say which ones there are,
        so the next try can be typed from the message."""
        matches = [item for item in slices if item["kernel_id"].startswith(wanted)]
        if len(matches) == 1:
            kernel_id: str = matches[0]["kernel_id"]  # a str: startswith(str) just took it
            return kernel_id
        if not slices:
            raise UsageError(f"no kernel id starts with {wanted!r}: this server has no sliced kernels")
        shown = matches or slices
        ids = short_ids([item["kernel_id"] for item in shown])
        listed = ", ".join(f"{ids[item['kernel_id']]} ({item['path'] or 'no notebook'})" for item in shown)
        if matches:
            raise UsageError(f"{wanted!r} matches {len(matches)} sliced kernels: {listed}; give more of the kernel id")
        raise UsageError(f"no sliced kernel's id starts with {wanted!r}; the sliced kernels are {listed}")


class SuspendApp(_ServerCommand):
    name = "jupyter-vgpu-suspend"
    description = "Suspend a kernel: its GPU memory moves to host memory and its slice's room is lent: jupyter vgpu suspend KERNEL_ID."
    aliases = _aliases("SuspendApp", "server")
    verb = "suspend"

    def run(self) -> int:
        if len(self.extra_args) != 1:
            raise UsageError(f"usage: jupyter vgpu {self.verb} KERNEL_ID")
        client = self.client()
        slices = client.slices()
        kernel_id = ResizeApp.find_kernel(self.extra_args[0], slices)
        # The server answers a kernel already in the state asked for as it is (200): what this
        # says comes from the state the kernel was in before.
        before = next(item for item in slices if item["kernel_id"] == kernel_id)["state"]
        was_suspended = before == "suspended"
        model = client.resume(kernel_id) if self.verb == "resume" else client.suspend(kernel_id)
        short = kernel_id[:8]
        if self.verb == "resume" and before not in ("suspended", "lent"):  # lent: its room, without memory
            print(f"{short} was not suspended (it is {model['state']}): nothing to resume")
        elif self.verb == "resume":
            print(f"resumed {short}: its {format_size(model['limits']['memory_bytes'])} slice runs again")
        elif was_suspended:
            print(
                f"{short} was already suspended: its {format_size(model['host_memory_bytes'] or 0)} is in host "
                f"memory; `jupyter vgpu resume {short}` resumes it"
            )
        else:
            print(
                f"suspended {short}: {format_size(model['host_memory_bytes'])} moved to host memory; it resumes on "
                f"its next cell, or with `jupyter vgpu resume {short}`"
            )
        return 0


class ResumeApp(SuspendApp):
    name = "jupyter-vgpu-resume"
    description = (
        "Resume a suspended kernel (its room on the GPU first, then its memory): jupyter vgpu resume KERNEL_ID."
    )
    aliases = _aliases("ResumeApp", "server")
    verb = "resume"
