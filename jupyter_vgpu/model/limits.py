"""One slice's limits, the one type every layer passes around: the parser at the edge, the
ledger, the holders and the region all speak :class:`SliceLimits`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from jupyter_vgpu.model.sizes import (
    POLICIES,
    POLICY_HELP,
    SM_SHARE_HELP,
    SliceValueError,
    format_size,
    parse_policy,
    parse_size,
    parse_sm_share,
)

FULL_SHARE = 100


@dataclass(frozen=True)
class SliceLimits:
    """What a slice may use.

    ``memory_limit``: bytes of device memory (0 only in a region, where it means "no cap").
    ``sm_share``: the share of the device's streaming multiprocessors in percent, 1..100. The
    REST API, the CLI and kernelspecs call it ``cores``, as HAMi's ``nvidia.com/gpucores`` does.
    ``policy``: ``hard`` (never above the share) or ``burst`` (may use idle SMs).
    """

    memory_limit: int
    sm_share: int = FULL_SHARE
    policy: str = "hard"

    def __post_init__(self) -> None:
        # The constructor takes values already parsed (ints, a policy word); text from people
        # goes through parse(), which says what is accepted. Callers with JSON in hand may pass
        # anything, so the fields are checked as the objects they are, not as their annotations.
        memory: object = self.memory_limit
        share: object = self.sm_share
        if isinstance(memory, bool) or not isinstance(memory, int) or memory < 0:
            raise SliceValueError(f"memory limit {memory!r} must be a whole number of bytes, 0 or more")
        if isinstance(share, bool) or not isinstance(share, int) or not 1 <= share <= FULL_SHARE:
            raise SliceValueError(f"SM share {share!r} is not {SM_SHARE_HELP}")
        if self.policy not in POLICIES:
            raise SliceValueError(f"policy {self.policy!r} is not {POLICY_HELP}")

    @classmethod
    def parse(cls, memory: str | float, cores: str | int = FULL_SHARE, policy: str = "hard") -> SliceLimits:
        """Limits from what people write: ``memory`` a size (a bare number is MiB), ``cores`` a
        percentage, ``policy`` hard or burst."""
        return cls(parse_size(memory), parse_sm_share(cores), parse_policy(policy))

    def changed(self, memory=None, cores=None, policy=None) -> SliceLimits:
        """These limits with the given ones (in the parse() vocabulary) changed; None keeps one."""
        return replace(
            self,
            memory_limit=self.memory_limit if memory is None else parse_size(memory),
            sm_share=self.sm_share if cores is None else parse_sm_share(cores),
            policy=self.policy if policy is None else parse_policy(policy),
        )

    @property
    def hard_share(self) -> int:
        """The share this slice holds against the 100% that hard slices may add up to."""
        return self.sm_share if self.policy == "hard" else 0

    def check_within(self, largest: SliceLimits | None, current: SliceLimits | None = None) -> None:
        """Refuse these limits above a server's largest slice (``None``: no largest); a resize
        from ``current`` is held to it only where it grows."""
        if largest is None:
            return
        grown_memory = current is None or self.memory_limit > current.memory_limit
        if grown_memory and self.memory_limit > largest.memory_limit:
            most = format_size(largest.memory_limit)
            raise SliceValueError(
                f"a slice may have at most {most} of GPU memory on this server, not "
                f"{format_size(self.memory_limit)}; ask for {most} or less"
            )
        grown_share = current is None or self.sm_share > current.sm_share
        if grown_share and self.sm_share > largest.sm_share:
            raise SliceValueError(
                f"a slice may have at most {largest.sm_share}% of a GPU's SMs on this server, not "
                f"{self.sm_share}%; ask for {largest.sm_share}% or less"
            )

    def describe(self) -> str:
        """``memory cap 6GiB, SM share 40%, policy hard``."""
        memory = format_size(self.memory_limit) if self.memory_limit else "none"
        return f"memory cap {memory}, SM share {self.sm_share}%, policy {self.policy}"


# A slice's size when nobody chose one: the start request, the kernelspec and the server's
# configuration all left it unset.
DEFAULT_LIMITS = SliceLimits(4 << 30, FULL_SHARE, "hard")

# A notebook's slice when nobody chose a size (the shipped "Python 3 (GPU slice)" kernelspec sets
# none), and a `jupyter vgpu run`'s beside a server: several of them share a GPU without their
# user learning sizes first. A burst share of a fifth is the whole GPU while the other kernels are
# idle and at least a fifth while they are busy, so five fit by SM share; 4GiB lets four fit on a
# 16 GiB GPU. (DEFAULT_LIMITS, all the SMs as a hard share, sizes a batch run, which has the GPU
# to itself where no server runs.)
NOTEBOOK_DEFAULTS = SliceLimits(4 << 30, 20, "burst")


def decide_limits(defaults: SliceLimits, *layers: Mapping[str, Any]) -> SliceLimits:
    """The one rule for a slice's size: each layer (e.g. the kernelspec's config, then the start
    request) overrides the one before, ``defaults`` first; in each, ``memory``, ``cores`` and
    ``policy`` are in the parse() vocabulary and an empty or missing value is unset."""
    limits = defaults
    for layer in layers:
        limits = limits.changed(**{key: value for key, value in layer.items() if value not in (None, "")})
    return limits
