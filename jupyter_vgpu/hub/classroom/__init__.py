"""The classroom file: one YAML file that says what a JupyterHub's users may have of the node's GPUs.

It names the node's GPUs, the hub's groups and their members, the GPU sizes users pick from when
their server starts (each a budget that all of a user's kernels share), per-user limits and the
idle policy. :func:`load_classroom` reads and checks it; everything else (the hub configuration,
KubeSpawner profiles, the broker) reads the :class:`Classroom` it returns. Sizes and SM shares are
parsed by :mod:`jupyter_vgpu.model`, so they accept and refuse what every other entry point does.

A bad file is refused as a whole with a :class:`ClassroomError` that names the file, and for each
problem the key and what is accepted; nothing quietly guesses. Every entry is read, so one
refusal lists every problem of the file's entries at once; the checks across entries (user
limits against the sizes offered, the default budgets against the node) follow once the entries
are right.

This package is the public face: import from here. Its modules, each importing only those
before it:

- ``keys``: the keys each part of the file accepts, their defaults and help (the docs' reference
  of the file is made from them);
- ``model``: :class:`Classroom` and its parts (:class:`Gpus`, :class:`Size`, :class:`Limits`,
  :class:`IdlePolicy`), :class:`ClassroomError`, and a user's size, limits and :class:`Budget`;
- ``reader``: reading values so that one refusal lists every problem; :func:`parse_duration`;
- ``load``: :func:`load_classroom`, each part of the file read and the checks across entries;
- ``environment``: what a user's server gets (``ENV_*``, :func:`server_environment`).
"""

from __future__ import annotations

from jupyter_vgpu.hub.classroom.environment import (
    ENV_BROKER_LIMITS_DIR,
    ENV_BROKER_URL,
    ENV_DEFAULT_CORES,
    ENV_DEFAULT_MEMORY,
    ENV_DEFAULT_POLICY,
    ENV_IDLE_CULL_AFTER,
    ENV_IDLE_FLOOR_CORES,
    ENV_IDLE_LOWER_AFTER,
    ENV_IDLE_SUSPEND_AFTER,
    ENV_MAX_CORES,
    ENV_ROOM_HOLD,
    ENV_SERVER_MEMORY_LIMIT,
    ENV_SERVER_SLICE_LIMIT,
    ENV_SIM_DEVICES,
    ENV_SIMULATE,
    ENV_SUSPEND_HOST_MEMORY,
    SERVER_ENVIRONMENT,
    server_environment,
    size_environment,
)
from jupyter_vgpu.hub.classroom.keys import (
    DEFAULT_BROKER_PORT,
    DEFAULT_FLOOR_CORES,
    DEFAULT_SERVICE_NAME,
    DEFAULT_SMS,
    DEFAULT_STATE_DIR,
    DURATION_HELP,
    KEY_HELP,
    KEY_SECTIONS,
)
from jupyter_vgpu.hub.classroom.load import load_classroom
from jupyter_vgpu.hub.classroom.model import (
    MIB,
    SIMULATED_GPU_NAME,
    Budget,
    Classroom,
    ClassroomError,
    Gpus,
    GroupLimits,
    IdlePolicy,
    Limits,
    Size,
    UserLimits,
)
from jupyter_vgpu.hub.classroom.reader import parse_duration

# exact_size too, as the module this package was offered it (tests write sizes with it).
from jupyter_vgpu.model.sizes import exact_size

__all__ = [
    "DEFAULT_BROKER_PORT",
    "DEFAULT_FLOOR_CORES",
    "DEFAULT_SERVICE_NAME",
    "DEFAULT_SMS",
    "DEFAULT_STATE_DIR",
    "DURATION_HELP",
    "ENV_BROKER_LIMITS_DIR",
    "ENV_BROKER_URL",
    "ENV_DEFAULT_CORES",
    "ENV_DEFAULT_MEMORY",
    "ENV_DEFAULT_POLICY",
    "ENV_IDLE_CULL_AFTER",
    "ENV_IDLE_FLOOR_CORES",
    "ENV_IDLE_LOWER_AFTER",
    "ENV_IDLE_SUSPEND_AFTER",
    "ENV_MAX_CORES",
    "ENV_ROOM_HOLD",
    "ENV_SERVER_MEMORY_LIMIT",
    "ENV_SERVER_SLICE_LIMIT",
    "ENV_SIMULATE",
    "ENV_SIM_DEVICES",
    "ENV_SUSPEND_HOST_MEMORY",
    "KEY_HELP",
    "KEY_SECTIONS",
    "MIB",
    "SERVER_ENVIRONMENT",
    "SIMULATED_GPU_NAME",
    "Budget",
    "Classroom",
    "ClassroomError",
    "Gpus",
    "GroupLimits",
    "IdlePolicy",
    "Limits",
    "Size",
    "UserLimits",
    "exact_size",
    "load_classroom",
    "parse_duration",
    "server_environment",
    "size_environment",
]
