"""The environment a user's single-user server gets from the classroom: their kernels' default
slice, their budget, the broker's URL, the simulated node and the idle policy, in the variables
:class:`~jupyter_vgpu.server.app.VGPUApp` takes its settings from.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from jupyter_vgpu.hub.classroom.model import Budget, Classroom, Size, _names
from jupyter_vgpu.model.sizes import exact_size

# What a single-user server of this classroom reads (VGPUApp takes its settings from these).
ENV_BROKER_URL = "JUPYTER_VGPU_BROKER_URL"
ENV_BROKER_LIMITS_DIR = "JUPYTER_VGPU_BROKER_LIMITS_DIR"
ENV_DEFAULT_MEMORY = "JUPYTER_VGPU_DEFAULT_MEMORY"
ENV_DEFAULT_CORES = "JUPYTER_VGPU_DEFAULT_CORES"
ENV_DEFAULT_POLICY = "JUPYTER_VGPU_DEFAULT_POLICY"
ENV_SERVER_MEMORY_LIMIT = "JUPYTER_VGPU_SERVER_MEMORY_LIMIT"
ENV_SERVER_SLICE_LIMIT = "JUPYTER_VGPU_SERVER_SLICE_LIMIT"
ENV_MAX_CORES = "JUPYTER_VGPU_MAX_CORES"
ENV_SIMULATE = "JUPYTER_VGPU_SIMULATE"
ENV_IDLE_LOWER_AFTER = "JUPYTER_VGPU_IDLE_LOWER_AFTER"
ENV_IDLE_FLOOR_CORES = "JUPYTER_VGPU_IDLE_FLOOR_CORES"
ENV_IDLE_CULL_AFTER = "JUPYTER_VGPU_IDLE_CULL_AFTER"
ENV_IDLE_SUSPEND_AFTER = "JUPYTER_VGPU_IDLE_SUSPEND_AFTER"
ENV_SUSPEND_HOST_MEMORY = "JUPYTER_VGPU_SUSPEND_HOST_MEMORY"
ENV_ROOM_HOLD = "JUPYTER_VGPU_ROOM_HOLD"
ENV_SIM_DEVICES = "VGPU_SIM_DEVICES"
SERVER_ENVIRONMENT = (
    ENV_BROKER_URL,
    ENV_BROKER_LIMITS_DIR,
    ENV_DEFAULT_MEMORY,
    ENV_DEFAULT_CORES,
    ENV_DEFAULT_POLICY,
    ENV_SERVER_MEMORY_LIMIT,
    ENV_SERVER_SLICE_LIMIT,
    ENV_MAX_CORES,
    ENV_SIMULATE,
    ENV_SIM_DEVICES,
    ENV_IDLE_LOWER_AFTER,
    ENV_IDLE_FLOOR_CORES,
    ENV_IDLE_CULL_AFTER,
    ENV_IDLE_SUSPEND_AFTER,
    ENV_SUSPEND_HOST_MEMORY,
    ENV_ROOM_HOLD,
)


def server_environment(
    classroom: Classroom, user_options: Mapping[str, Any] | None, groups: Iterable[str], *, broker: bool = True
) -> dict[str, str]:
    """The variables that size a user's single-user server: their kernels' default slice, their
    budget, the broker's URL (``broker=False`` leaves it out: a KubeSpawner pod's slice is shared
    out by its own embedded ledger). Only what applies is set: no slice limit when the user has
    none, no ``JUPYTER_VGPU_SIMULATE`` (nor the simulated node's ``VGPU_SIM_DEVICES``) when the
    node is real. Refuses a size the user may not pick.

    The budget shown here is for the server's own checks and display; the broker enforces it
    from the hub's ``user_options``, never from what a server says.
    """
    groups = _names(groups)
    size = classroom.size_for(user_options, groups)
    return size_environment(classroom, size, classroom.budget_for(user_options, groups), broker=broker)


def size_environment(classroom: Classroom, size: Size, budget: Budget, *, broker: bool = True) -> dict[str, str]:
    """The variables of :func:`server_environment` for a size and a budget already decided."""
    environment = {
        ENV_DEFAULT_MEMORY: exact_size(budget.kernel_memory),
        ENV_DEFAULT_CORES: str(budget.kernel_cores),
        ENV_DEFAULT_POLICY: size.policy,
        # The most the server may hold: its guarantee plus what it may borrow (the broker decides
        # what is borrowed and takes it back).
        ENV_SERVER_MEMORY_LIMIT: exact_size(budget.max_memory),
        ENV_MAX_CORES: str(budget.max_cores),
    }
    if broker:
        environment[ENV_BROKER_URL] = classroom.broker_url
        environment[ENV_BROKER_LIMITS_DIR] = str(classroom.limits_dir)
    if budget.kernels is not None:
        environment[ENV_SERVER_SLICE_LIMIT] = str(budget.kernels)
    if classroom.simulate:
        environment[ENV_SIMULATE] = "1"
        # The same simulated devices as the broker's (a slice on GPU 1 must find a GPU 1).
        environment[ENV_SIM_DEVICES] = classroom.simulated_devices
    # The idle policy is applied by the user's own server, which knows when its kernels run.
    if classroom.idle.lower_after is not None:
        environment[ENV_IDLE_LOWER_AFTER] = repr(classroom.idle.lower_after)
        environment[ENV_IDLE_FLOOR_CORES] = str(classroom.idle.floor_cores)
    if classroom.idle.cull_after is not None:
        environment[ENV_IDLE_CULL_AFTER] = repr(classroom.idle.cull_after)
    if classroom.idle.suspend_after is not None:
        environment[ENV_IDLE_SUSPEND_AFTER] = repr(classroom.idle.suspend_after)
        # The node's cap, which the broker enforces over every user's suspended kernels; the
        # server checks its own against it too (without it, it would take half the node's RAM).
        if classroom.idle.suspend_host_memory is not None:
            environment[ENV_SUSPEND_HOST_MEMORY] = exact_size(classroom.idle.suspend_host_memory)
    if classroom.idle.room_hold is not None:
        environment[ENV_ROOM_HOLD] = repr(classroom.idle.room_hold)
    return environment
