"""The classroom's sizes as KubeSpawner profiles, each asking HAMi for its slice.

Under KubeSpawner the cluster's GPU-sharing scheduler (HAMi's ``nvidia.com/gpu``,
``nvidia.com/gpumem`` in MiB, ``nvidia.com/gpucores`` in percent) places each user's pod and
enforces its slice, so there is no broker service: inside the pod the server's embedded ledger
shares the pod's slice out among the user's kernels, sized by the ``JUPYTER_VGPU_*`` variables
each profile sets. A profile a user's groups may not pick is not in their list, so KubeSpawner
itself refuses it.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from jupyter_vgpu.hub.classroom import (
    ENV_SERVER_SLICE_LIMIT,
    MIB,
    Budget,
    Classroom,
    Size,
    size_environment,
)
from jupyter_vgpu.hub.options import user_groups

HAMI_GPU = "nvidia.com/gpu"
HAMI_MEMORY = "nvidia.com/gpumem"
HAMI_CORES = "nvidia.com/gpucores"
HAMI_POLICY = "GPU_CORE_UTILIZATION_POLICY"


def profile_list(classroom: Classroom, groups: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """KubeSpawner ``profile_list`` entries (JSON-serialisable) for a user in ``groups``: the
    sizes they may pick, their default marked. With ``groups=None``, every size, each sized for
    the least generous limits of the users who may pick it (a static list cannot tell them apart).

    Display names and descriptions are HTML-escaped: KubeSpawner's form shows them unescaped.
    A ``None`` in ``environment`` removes a variable an earlier start of the same spawner set
    (KubeSpawner merges overrides into the spawner's dicts, and ``None`` deletes a key).
    """
    if groups is None:
        sizes = list(classroom.sizes)
        budgets = [classroom.strictest_budget(size) for size in sizes]
        default = classroom.default_size or (sizes[0] if sizes else None)
    else:
        names = (groups,) if isinstance(groups, str) else tuple(groups)
        sizes = classroom.sizes_for(names)
        budgets = [classroom.budget_for({"profile": size.name}, names) for size in sizes]
        default = classroom.size_for(None, names) if sizes else None
    return [_profile(classroom, size, budget, size == default) for size, budget in zip(sizes, budgets, strict=True)]


def _profile(classroom: Classroom, size: Size, budget: Budget, default: bool) -> dict[str, Any]:
    # HAMi grants whole MiB: the server's budget is what the pod gets.
    memory = budget.memory // MIB * MIB
    budget = replace(budget, memory=memory, kernel_memory=min(budget.kernel_memory, memory))
    environment: dict[str, str | None] = {
        ENV_SERVER_SLICE_LIMIT: None,
        **size_environment(classroom, size, budget, broker=False),
        HAMI_POLICY: "force" if size.policy == "hard" else None,
    }
    return {
        "display_name": html.escape(size.display_name),
        "slug": size.name,
        "description": html.escape(size.description),
        "default": default,
        "kubespawner_override": {
            "extra_resource_limits": {
                HAMI_GPU: "1",
                HAMI_MEMORY: str(budget.memory // MIB),
                HAMI_CORES: str(budget.cores),
            },
            "environment": environment,
        },
    }


def kubespawner_profile_list(classroom: Classroom) -> Callable[[Any], list[dict[str, Any]]]:
    """``c.KubeSpawner.profile_list``: called with the spawner, the profiles its user's groups allow."""

    def profiles(spawner: Any) -> list[dict[str, Any]]:
        return profile_list(classroom, user_groups(spawner))

    return profiles
