"""The classroom file's keys: the table of keys each part of the file accepts, the defaults of
those left out, and what each key means (``KEY_HELP``).

The reader (:mod:`jupyter_vgpu.hub.classroom.load`) accepts exactly these tables, and the docs'
reference of the file is made from them at build time (docs/_ext/vgpu_docs.py), so the two cannot
drift: a ``_*_KEYS`` table in no ``KEY_SECTIONS`` entry, a key without help, or help for a key no
table has fails the docs build.
"""

from __future__ import annotations

from jupyter_vgpu.model.sizes import SIZE_HELP

DEFAULT_SERVICE_NAME = "vgpu"
DEFAULT_BROKER_PORT = 10101
DEFAULT_STATE_DIR = "vgpu-broker"
DEFAULT_SMS = 100
DEFAULT_FLOOR_CORES = 5
DURATION_HELP = "a duration like 90s, 20m, 2h or a bare number of seconds"

_TOP_KEYS = (
    "gpus",
    "simulate",
    "broker",
    "groups",
    "admins",
    "admin_groups",
    "sizes",
    "limits",
    "oversubscribe",
    "idle",
)
_GPU_KEYS = ("count", "memory", "sms", "reserve", "burst_oversubscription", "placement")
_BROKER_KEYS = ("port", "name", "state_dir")
_SIZE_KEYS = (
    "name",
    "display_name",
    "description",
    "memory",
    "cores",
    "policy",
    "groups",
    "default",
    "kernel",
    "borrow",
)
_KERNEL_KEYS = ("memory", "cores")
_BORROW_KEYS = ("memory", "cores")
_LIMIT_KEYS = ("kernels", "memory", "groups")
_GROUP_LIMIT_KEYS = ("kernels", "memory")
_IDLE_KEYS = ("lower_after", "floor_cores", "suspend_after", "suspend_host_memory", "cull_after", "room_hold")

# Where each table of keys above stands in the file, and what each key means. The docs' reference
# of the classroom file (docs/reference/classroom-file.md) is made from these two at build time,
# and the build fails where a key has no help here or help names a key the reader does not accept.
KEY_SECTIONS: dict[str, tuple[str, ...]] = {
    "": _TOP_KEYS,
    "gpus": _GPU_KEYS,
    "broker": _BROKER_KEYS,
    "sizes[]": _SIZE_KEYS,
    "sizes[].kernel": _KERNEL_KEYS,
    "sizes[].borrow": _BORROW_KEYS,
    "limits": _LIMIT_KEYS,
    "limits.groups.GROUP": _GROUP_LIMIT_KEYS,
    "idle": _IDLE_KEYS,
}
KEY_HELP: dict[str, str] = {
    "gpus": "Required. What the node has and how the broker shares each GPU out (the keys below).",
    "simulate": "true: the broker and the users' servers use the simulated GPU (demos, CI, a machine without a "
    "GPU). Default false.",
    "broker": "The broker, the hub-managed service that owns the node's ledger (the keys below; all optional).",
    "groups": "JupyterHub groups and their members, like `students: [alice, bob]`; the hub creates them (merged "
    "with its own `load_groups`). Sizes, limits and `admin_groups` may name these and the hub's own groups.",
    "admins": "Users given the vgpu-admin role: they see and resize every user's slices.",
    "admin_groups": "Groups whose members get the vgpu-admin role.",
    "sizes": "Required. The list of sizes a user picks from when their server starts (the keys of each under "
    "`sizes[]`). A size is a budget all of the user's kernels share.",
    "limits": "Per-user limits checked at each admission (the keys below). Absent: no limit.",
    "oversubscribe": "false (the default): every listed member's default size must fit on the node at once (memory "
    "against each GPU's memory less reserve, hard shares against 100% a GPU, all shares against "
    "`burst_oversubscription` x 100%), else the file is refused. true: skip that check.",
    "idle": "What each user's server does with its idle kernels (the keys below). Absent: nothing.",
    "gpus.count": "Required. How many GPUs the node has (1 to 64); the broker checks them when it starts.",
    "gpus.memory": f"Required. Each GPU's memory: {SIZE_HELP}.",
    "gpus.sms": f"Each GPU's SM count, for the simulated GPU. Default {DEFAULT_SMS}.",
    "gpus.reserve": "Memory kept free on each GPU (the driver, other tools), never given to slices. Default 0.",
    "gpus.burst_oversubscription": "Burst shares may add up to this many times 100% of each GPU (hard ones to "
    "100% at most): a number of 1.0 or more. Default 1.0.",
    "gpus.placement": "Where a new slice goes: binpack (the fullest GPU it fits on, the default) or spread (the "
    "emptiest).",
    "broker.port": f"The port the broker listens on (on the hub's host). Default {DEFAULT_BROKER_PORT}.",
    "broker.name": "The broker's service name in the hub: lowercase letters, digits, - and _. Default "
    f"{DEFAULT_SERVICE_NAME!r}.",
    "broker.state_dir": "The broker's folder (its ledger and the kernels' limits pages), relative to this file's "
    f"folder unless absolute. Default {DEFAULT_STATE_DIR!r}.",
    "sizes[].name": "Required. The size's name: lowercase letters, digits and -, unique in the file.",
    "sizes[].display_name": "What the spawn form shows. Default: made from the name, memory and share, like "
    "'Small: 2GiB, 20% of a GPU'.",
    "sizes[].description": "A sentence under the name on the spawn form. Default: what the size gives.",
    "sizes[].memory": f"Required. The memory all of the user's kernels share, guaranteed: {SIZE_HELP}; at most "
    "one GPU's memory less its reserve.",
    "sizes[].cores": "Required. The SM share all of the user's kernels share, guaranteed, in percent of one GPU (1 to "
    "100).",
    "sizes[].policy": "hard (never above the share, the default) or burst (may use SMs others leave idle).",
    "sizes[].groups": "The groups whose members may pick the size. Absent: every user.",
    "sizes[].default": "true: the size the spawn form preselects (at most one size). Default false.",
    "sizes[].kernel": "Each kernel's slice unless the notebook asks for another (the keys below). Absent: the "
    "budget divided by the user's kernel limit (none: the whole budget).",
    "sizes[].kernel.memory": "A kernel's default memory cap, at most the size's memory.",
    "sizes[].kernel.cores": "A kernel's default SM share in percent, at most the size's cores.",
    "sizes[].borrow": "How far above its guarantee (`memory`, `cores`) the size may borrow room nobody uses (the "
    "keys below; either may be left out: 0). Borrowed room is taken back when a user within their guarantee "
    "needs it: the borrower's most recent borrowing kernel is paused (suspended, even mid-cell) until room frees. "
    "Absent: no borrowing.",
    "sizes[].borrow.memory": f"Memory the user may hold above the size's `memory`: {SIZE_HELP}; the two together at "
    "most one GPU's memory less its reserve.",
    "sizes[].borrow.cores": "SM share in percent the user may hold above the size's `cores`; the two together at most "
    "100.",
    "limits.kernels": "Sliced kernels one user may run at once (1 or more).",
    "limits.memory": "The memory one user may hold in all, whatever the size; never below a size they may pick.",
    "limits.groups": "Limits per group, like `staff: {kernels: 6}` (the keys under `limits.groups.GROUP`); a user "
    "in several groups gets the most generous of each.",
    "limits.groups.GROUP.kernels": "Sliced kernels a member of the group may run at once.",
    "limits.groups.GROUP.memory": "The memory a member of the group may hold in all.",
    "idle.lower_after": "An idle kernel's SM share is lowered to `floor_cores` after this long: like every "
    f"duration here, {DURATION_HELP}. It gets its share back when it runs again.",
    "idle.floor_cores": f"The SM share (percent) an idle kernel is lowered to. Default {DEFAULT_FLOOR_CORES}.",
    "idle.suspend_after": "An idle kernel is suspended after this long: its GPU memory moves to host memory and "
    "is lent to others until its next cell. Less than `cull_after`.",
    "idle.suspend_host_memory": "The host memory the node's suspended kernels may hold together. Default: half "
    "the node's RAM. Needs `suspend_after`.",
    "idle.cull_after": "An idle kernel is stopped after this long, freeing its GPU memory.",
    "idle.room_hold": "How long after a kernel got its GPU room (started, or resumed) making room for another "
    "request leaves it alone (0: no hold). Default 30s. Borrowed room is taken back regardless.",
}
