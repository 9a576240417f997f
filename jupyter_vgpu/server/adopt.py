"""A restarted server adopts the sliced kernels its predecessor left running (issue 26).

A sliced kernel outlives its server for ``VGPUApp.kernel_survival`` seconds
(notebook/survive.py); the restarted server's ``SliceManager.reconcile`` keeps those that still
run and can be reached (``SliceManager.survivors``). Each is put into jupyter_server's kernel
manager through its public ``start_kernel``, with the kernel's own id and kernelspec and the
vGPU provisioner's ``vgpu_adopt`` argument: the provisioner then launches nothing, the kernel
manager reads the kernel's connection file, and the provisioner watches the kernel's process by
pid (provisioning/local.py). From then on it is a kernel of this server like any other: listed by
``GET /api/kernels`` (and, its session row kept, ``/api/sessions``), reached over the websocket,
restarted, interrupted and shut down as usual, under the idle policy and the line. This runs
before the server answers its first request, so no session row is read before its kernel is
back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from queue import Empty
from typing import Any

from jupyter_vgpu.manager import KERNEL_NAME_KEY, SliceManager, this_process
from jupyter_vgpu.provisioning.base import ADOPT_ARGUMENT
from jupyter_vgpu.provisioning.waiting import SINCE_ARGUMENT, WaitingStarts


def this_server(url: str) -> dict[str, Any]:
    """What names this server beside an adopted kernel's region: its process and URL."""
    return {**this_process(), "url": url}


# What an adopted kernel reads until it has said what it does: unknown counts as busy.
UNKNOWN_STATE = "busy"
# How long a restarted server waits, before it answers its first request, for its adopted kernels
# to say whether they run a cell (an idle kernel answers within milliseconds). Those still running
# one go on reading busy until their cell ends; so does an idle one slower than this, a little longer.
LEARN_BEFORE_SERVING_S = 1.0
# After the kernel answered, how long the server's watcher of its IOPub messages may take to
# record the idle status that came with the answer before the kernel is asked again (a status
# published before that watcher's subscription reached the kernel is lost to it).
SEEN_WITHIN_S = 0.5
# How often an answered kernel is asked again when the watcher saw no status of the answer: past
# that, the kernel keeps reading busy (and a warning says why).
ASK_AGAIN = 20
# How often a wait for a kernel's answer looks whether the kernel is still there to answer.
LOOK_EVERY_S = 1.0


async def learn_execution_state(kernels: Any, kernel_id: str, log: logging.Logger) -> str | None:
    """Learn whether an adopted kernel runs a cell: it reads ``busy`` until the kernel has run an
    empty silent cell of the server's, which it runs once what it runs has ended, and whose status
    messages jupyter_server's watcher of the kernel records (``idle``, or ``busy`` again where a
    cell sent after it runs). Returns the state learned, None where the kernel went away first."""
    kernel = kernels.get_kernel(kernel_id)
    kernel.execution_state = UNKNOWN_STATE
    ports = list(kernel.ports)
    client = None
    try:
        for _ in range(ASK_AGAIN):
            if client is None:
                client = kernel.client()
                client.start_channels(shell=True, iopub=False, stdin=False, hb=False, control=False)
            msg_id = client.execute("", silent=True, store_history=False, allow_stdin=False, stop_on_error=False)
            outcome = await _answer(client, msg_id, kernels, kernel_id, kernel)
            if outcome == "gone":
                return None
            if outcome == "recorded" or (outcome == "answered" and await _recorded(kernel)):
                return str(kernel.execution_state)
            if outcome == "restarted":
                # Its process was replaced before it answered (it died and the restarter started
                # it again, or Kernel > Restart): ask the new one, on its ports.
                client.stop_channels()
                client = None
                if list(kernel.ports) != ports:
                    # jupyter_server watches the new ports only after a restart through its API;
                    # after the restarter's (new random ports) it would see nothing of the kernel.
                    kernels.stop_watching_activity(kernel_id)
                    kernels.start_watching_activity(kernel_id)
                    kernel.execution_state = UNKNOWN_STATE
                ports = list(kernel.ports)
            # Else a cell sent after ours runs (it reads busy again, rightly), or the watcher
            # missed the status: ask again, behind whatever runs.
        log.warning(
            "jupyter_vgpu: adopted kernel %s answers but its status messages do not reach the server; "
            "it counts as busy",
            kernel_id,
        )
        return None
    finally:
        if client is not None:
            client.stop_channels()


async def _learn(kernels: Any, kernel_id: str, log: logging.Logger) -> str | None:
    """:func:`learn_execution_state`, its failure logged: the kernel then reads busy (unknown)."""
    began = time.monotonic()
    try:
        state = await learn_execution_state(kernels, kernel_id, log)
        if state is not None:
            took = time.monotonic() - began
            log.info("jupyter_vgpu: adopted kernel %s is %s (it said so after %.2f s)", kernel_id, state, took)
        return state
    except asyncio.CancelledError:
        raise
    except Exception as error:  # noqa: BLE001 -- whatever failed, the kernel stays busy (unknown) and is said
        log.warning("jupyter_vgpu: what adopted kernel %s does is not known (%s); it counts as busy", kernel_id, error)
        return None


def _gone(kernels: Any, kernel_id: str, kernel: Any) -> bool:
    """Whether ``kernel`` is no longer the kernel ``kernel_id`` of ``kernels`` (shut down)."""
    return kernel_id not in kernels or kernels.get_kernel(kernel_id) is not kernel


async def _answer(client: Any, msg_id: str, kernels: Any, kernel_id: str, kernel: Any) -> str:
    """Wait for the reply to ``msg_id``: "answered"; or what came first: "gone" (the kernel was
    shut down), "recorded" (jupyter_server recorded a state of the kernel's own: the cell it ran
    ended), "restarted" (its process was replaced, so the request is lost)."""
    process = getattr(kernel.provisioner, "pid", None)
    while True:
        try:
            reply = await client.get_shell_msg(timeout=LOOK_EVERY_S)
        except Empty:
            if _gone(kernels, kernel_id, kernel):
                return "gone"
            if kernel.execution_state != UNKNOWN_STATE:
                return "recorded"
            if getattr(kernel.provisioner, "pid", None) != process:
                return "restarted"
            continue
        if reply.get("parent_header", {}).get("msg_id") == msg_id:
            return "answered"


async def _recorded(kernel: Any) -> bool:
    """Whether jupyter_server's watcher records a state other than busy within SEEN_WITHIN_S."""
    deadline = time.monotonic() + SEEN_WITHIN_S
    while kernel.execution_state == UNKNOWN_STATE and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return bool(kernel.execution_state != UNKNOWN_STATE)


async def adopt_survivors(
    slices: SliceManager,
    kernels: Any,
    server: dict[str, Any],
    log: logging.Logger,
    *,
    learning: set[asyncio.Task[str | None]],
    learn_within: float = LEARN_BEFORE_SERVING_S,
) -> list[str]:
    """Adopt every survivor into ``kernels`` (jupyter_server's MappingKernelManager); the ids
    adopted. One that cannot be is kept suspended, or stopped (``SliceManager.not_adopted``).
    Each adopted kernel reads busy until it has said what it does (:func:`learn_execution_state`),
    waited for here up to ``learn_within`` seconds; the tasks that learn it go on in
    ``learning`` (which the caller holds, and cancels at its end) where a kernel runs a cell
    longer."""
    adopted = []
    learners = set()
    for allocation in slices.survivors():
        kernel_id = allocation.kernel_id
        if kernel_id in kernels:
            continue
        try:
            await kernels.start_kernel(
                kernel_id=kernel_id,
                kernel_name=allocation.metadata[KERNEL_NAME_KEY],
                **{ADOPT_ARGUMENT: slices.adoption(allocation)},
            )
            # With pending kernels start_kernel returns before the (instant) start has run.
            await kernels.get_kernel(kernel_id).ready
        except Exception as error:  # noqa: BLE001 -- any failure leaves the kernel where it was: not adopted
            if kernel_id in kernels:
                kernels.remove_kernel(kernel_id)  # out of the map, its process untouched
            slices.not_adopted(allocation, f"{type(error).__name__}: {error}")
            continue
        # Before anything else can look at it: unknown counts as busy.
        kernels.get_kernel(kernel_id).execution_state = UNKNOWN_STATE
        learners.add(asyncio.ensure_future(_learn(kernels, kernel_id, log)))
        slices.adopted(kernel_id, server)
        log.info("jupyter_vgpu: adopted kernel %s, which outlived the last server", kernel_id)
        adopted.append(kernel_id)
    for learner in learners:
        learning.add(learner)
        learner.add_done_callback(learning.discard)
    if learners:
        await asyncio.wait(learners, timeout=learn_within)
    return adopted


async def start_waiting_starts_again(store: WaitingStarts, kernels: Any, log: logging.Logger) -> list[str]:
    """Start again, oldest first, each start the last server left waiting in its line
    (provisioning/waiting.py): the same kernel id, kernelspec, folder and size, and the time it
    first asked, so that its notebook's session keeps its kernel and the start its place. Each
    answers once it waits in line again or runs; the kernel ids started again."""
    started = []
    for kernel_id, entry in store.left_by_a_gone_server().items():
        if kernel_id in kernels:
            continue
        try:
            await kernels.start_kernel(
                kernel_id=kernel_id,
                kernel_name=entry["kernel_name"],
                path=entry["path"] or None,
                vgpu_slice=entry["size"],
                **{SINCE_ARGUMENT: entry["since"]},
            )
        except Exception as error:  # noqa: BLE001 -- whatever failed is said; the other starts go on
            log.warning(
                "jupyter_vgpu: kernel %s waited in line when the last server ended; it was not started again: %s",
                kernel_id,
                error,
            )
            continue
        log.info(
            "jupyter_vgpu: kernel %s waited in line when the last server ended; it waits again in its place", kernel_id
        )
        started.append(kernel_id)
    return started


__all__ = ["UNKNOWN_STATE", "adopt_survivors", "learn_execution_state", "start_waiting_starts_again", "this_server"]
