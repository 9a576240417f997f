"""The program a pod kernel's container runs: ``python -m jupyter_vgpu.pod_agent SECRET_DIR``.

It puts the kernel in a slice inside the pod (a region with the slice's limits, the interposer
preloaded), runs ipykernel on the connection file from the kernel's Secret, and every
``report_interval`` seconds reports the slice's usage to the Jupyter server with the kernel's
credential; the reply carries the slice's limits, which it writes into the region, so a resize
made in the server reaches every process of the kernel on its next CUDA call. It exits with the
kernel's exit status. The server is never needed to keep the kernel inside its slice: if it cannot
be reached, the limits in force stay.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from jupyter_vgpu.client import CREDENTIAL_HEADER, kernel_environment
from jupyter_vgpu.holders.local import FORWARDED_SIGNALS, LocalHolder, slice_environment
from jupyter_vgpu.holders.region import Region, RegionError
from jupyter_vgpu.model import SliceLimits, list_devices, select_device, use_simulator
from jupyter_vgpu.pods.manifest import CONNECTION_FILE, SLICE_FILE
from jupyter_vgpu.provisioning.local import LOAD_MAGIC_ARGUMENT

log = logging.getLogger("jupyter_vgpu.pod_agent")


def report(region: Region) -> dict[str, Any]:
    """The slice's usage as the server's UsageReport: per process, the slice's SM use, and the
    limits in force (so the server can show a resize the pod has not applied yet)."""
    limits = region.limits
    return {
        "processes": [vars(process) for process in region.processes()],
        "sm_util": region.sm_util_permille / 10,
        "limits": {"memory_bytes": limits.memory_limit, "cores": limits.sm_share, "policy": limits.policy},
    }


class Reporter(threading.Thread):
    """Reports usage and applies the limits the server answers with, until stopped."""

    def __init__(self, region: Region, server_url: str, kernel_id: str, credential: str, interval: float):
        super().__init__(name="vgpu-usage-reports", daemon=True)
        self.region, self.interval = region, interval
        self.url = f"{server_url.rstrip('/')}/api/vgpu/slices/{urllib.parse.quote(kernel_id, safe='')}/usage"
        self.credential = credential
        self.stopped = threading.Event()
        self._unreachable = False

    def run(self) -> None:
        while not self.stopped.is_set():
            self.once()
            self.stopped.wait(self.interval)

    def once(self) -> None:
        body = json.dumps(report(self.region)).encode()
        request = urllib.request.Request(
            self.url,
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", CREDENTIAL_HEADER: self.credential},
        )
        try:
            with urllib.request.urlopen(request, timeout=max(2.0, self.interval)) as response:
                limits = json.loads(response.read())["limits"]
        except (urllib.error.URLError, OSError, ValueError, KeyError) as error:
            if not self._unreachable:  # once per outage, not once per interval
                log.warning(
                    "cannot report to the Jupyter server at %s (%s); the slice keeps its limits", self.url, error
                )
            self._unreachable = True
            return
        self._unreachable = False
        wanted = SliceLimits(limits["memory_bytes"], limits["cores"], limits["policy"])
        if wanted != self.region.limits:
            self.region.set_limits(memory_limit=wanted.memory_limit, sm_share=wanted.sm_share, policy=wanted.policy)
            log.info("slice limits now %s", wanted.describe())


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(
            "usage: python -m jupyter_vgpu.pod_agent SECRET_DIR  (the folder of the kernel's Secret)", file=sys.stderr
        )
        return 2
    logging.basicConfig(level=logging.INFO, format="[jupyter-vgpu agent] %(message)s")
    secret_dir = Path(args[0])
    try:
        slice_file = json.loads((secret_dir / SLICE_FILE).read_text())
        connection_file = secret_dir / CONNECTION_FILE
        limits = slice_file["limits"]
        wanted = SliceLimits(limits["memory_bytes"], limits["cores"], limits["policy"])
    except (OSError, ValueError, KeyError) as error:
        print(f"jupyter-vgpu agent: cannot read the kernel's Secret in {secret_dir}: {error}", file=sys.stderr)
        return 2
    simulate = bool(slice_file.get("simulate"))
    if simulate:
        use_simulator()
    try:
        device = select_device(list_devices(), 0)  # the pod sees the GPU the cluster gave it
    except Exception as error:  # noqa: BLE001 -- NVML missing or no GPU: say so and stop, rather than run unsliced
        print(f"jupyter-vgpu agent: no GPU in this pod: {error}", file=sys.stderr)
        return 3
    holder = LocalHolder(Path(tempfile.mkdtemp(prefix="jupyter-vgpu-")), simulate=simulate)
    kernel_id = slice_file["kernel_id"]
    region = holder.new_region(kernel_id, wanted, device)
    env = slice_environment(region, simulate=simulate)
    server_url, credential = slice_file.get("server_url", ""), slice_file.get("credential", "")
    if server_url and credential:
        env.update(kernel_environment(server_url, kernel_id, credential))
    command = [sys.executable, "-m", "ipykernel_launcher", "-f", str(connection_file), LOAD_MAGIC_ARGUMENT]
    kernel = subprocess.Popen(command, env=env)
    for number in FORWARDED_SIGNALS:
        signal.signal(number, lambda received, _frame: kernel.send_signal(received))
    reporter = None
    if server_url and credential:
        reporter = Reporter(region, server_url, kernel_id, credential, float(slice_file.get("report_interval", 1.0)))
        reporter.start()
    status = kernel.wait()
    if reporter is not None:
        reporter.stopped.set()
    try:
        region.close()
    except RegionError:
        pass
    holder.release(kernel_id)
    return 128 - status if status < 0 else status


if __name__ == "__main__":
    sys.exit(main())
