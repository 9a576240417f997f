"""Limits pages published by the node's broker, one per slice, in a folder of its own.

The broker runs under its own account (the hub's); users' servers and kernels run under theirs.
A page the broker creates is readable by everyone and writable by the broker alone, so a kernel,
whatever it runs, cannot lift its own limits: it can only read them (libvgpu.so maps the page
read-only). The users' servers still make each kernel's region (its usage, which the kernel's
processes write) and point the kernel at the broker's page (``VGPU_LIMITS``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from jupyter_vgpu.holders.region import LimitsPage, RegionError
from jupyter_vgpu.ledger import SUSPEND_REQUESTED_KEY, TAKE_BACK_KEY, Allocation

log = logging.getLogger(__name__)

PAGE_SUFFIX = ".limits"
# Readable by every account (a page says nothing but a slice's device and limits), writable by the
# broker alone; the folder can be passed through but not listed: a user opens their kernels' pages
# by name and learns nothing of other users' kernels.
PUBLIC_FILE = 0o644
PUBLIC_FOLDER = 0o711
# A kernel id that is a plain file name: Jupyter's kernel ids are UUIDs.
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def page_path(folder: str | Path, kernel_id: str) -> Path:
    """Where the page of ``kernel_id``'s slice is in ``folder``; ValueError for a kernel id that is
    not a plain file name."""
    if not _SAFE_NAME.fullmatch(kernel_id):
        raise ValueError(
            f"kernel id {kernel_id!r} cannot name a limits page: letters, digits, '.', '_' and '-' are accepted "
            "(a Jupyter kernel id is a UUID)"
        )
    return Path(folder) / f"{kernel_id}{PAGE_SUFFIX}"


class PagePublisher:
    """Keeps a folder of limits pages equal to a ledger's local slices: an observer of the ledger
    (``EmbeddedLedger(observers=[publisher])``) told of every admission, resize and release."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.folder.chmod(PUBLIC_FOLDER)

    def __call__(self, before: Allocation | None, after: Allocation | None) -> None:
        if after is None:
            if before is not None:
                self._guarded(before, self._remove)
        elif after.holder == "local":
            self._guarded(after, self._create if before is None else self._update)

    def set_suspended(self, allocation: Allocation, suspended: bool) -> None:
        """Raise or clear the page's suspended flag (the slice's CUDA calls then count resume
        requests): the broker's pages are its own to write, so it follows the ledger's lending."""
        self._guarded(allocation, lambda allocation: self._flag(allocation, suspended))

    def set_taken_back(self, allocation: Allocation, taken_back: bool) -> None:
        """Raise the page's suspended flag because borrowed room is taken back (ahead of the
        suspend its server carries out), or lower it where that request lapsed."""

        def flag(allocation: Allocation) -> None:
            with LimitsPage.open(page_path(self.folder, allocation.kernel_id)) as page:
                page.set_taken_back(taken_back)

        self._guarded(allocation, flag)

    def _flag(self, allocation: Allocation, suspended: bool) -> None:
        with LimitsPage.open(page_path(self.folder, allocation.kernel_id)) as page:
            page.set_suspended(suspended)

    def sync(self, allocations: Iterable[Allocation]) -> None:
        """Make the folder hold exactly the pages of ``allocations`` (at start, after a crash):
        each page updated in place to the ledger's limits (its kernel may have it mapped), pages
        of released slices removed."""
        kept = set()
        for allocation in allocations:
            if allocation.holder == "local":
                kept.add(allocation.kernel_id)
                self._guarded(allocation, self._update)
                request = allocation.metadata.get(SUSPEND_REQUESTED_KEY)
                if not allocation.suspended and isinstance(request, dict) and request.get(TAKE_BACK_KEY) is True:
                    self.set_taken_back(allocation, True)  # its calls still wait for the suspend
                else:
                    self.set_suspended(allocation, allocation.suspended)
        for path in self.folder.glob(f"*{PAGE_SUFFIX}"):
            if path.name[: -len(PAGE_SUFFIX)] not in kept:
                path.unlink(missing_ok=True)

    @staticmethod
    def _guarded(allocation: Allocation, step: Callable[[Allocation], None]) -> None:
        try:
            step(allocation)
        except (OSError, RegionError, ValueError) as error:
            # The decision stands (it is committed); a kernel without its page fails closed.
            log.error("cannot publish the limits page of kernel %s: %s", allocation.kernel_id, error)

    def _create(self, allocation: Allocation) -> None:
        # A new slice's page replaces any file of that name whole (made aside and renamed in).
        LimitsPage.create(
            page_path(self.folder, allocation.kernel_id),
            allocation.limits,
            device_uuid=allocation.device_uuid,
            device_index=allocation.device_index,
            mode=PUBLIC_FILE,
        ).close()

    def _update(self, allocation: Allocation) -> None:
        # In place: the kernel maps this very file, and would not see a replacement.
        try:
            page = LimitsPage.open(page_path(self.folder, allocation.kernel_id))
        except RegionError:
            self._create(allocation)  # missing or foreign: nothing maps a usable one
            return
        with page:
            page.restore(allocation.limits)

    def _remove(self, allocation: Allocation) -> None:
        page_path(self.folder, allocation.kernel_id).unlink(missing_ok=True)
