"""The local holder: a slice as a region file."""

from __future__ import annotations

import time

import pytest

from jupyter_vgpu.holders.local import REGION_PATH_KEY, LocalHolder
from jupyter_vgpu.ledger import Allocation, UnknownSlice

GIB = 1 << 30


def test_resizing_a_slice_whose_kernel_just_ended_says_so(tmp_path, native_libs):
    """A batch kernel's region is removed by its own provisioner when the kernel ends; a resize the
    server carries out a moment later finds no region and says the slice is gone (a 404 at the
    REST edge), rather than failing with an error no client can read."""
    allocation = Allocation(
        "k1",
        "GPU-0",
        0,
        2 * GIB,
        50,
        "hard",
        "ada",
        time.time(),
        metadata={REGION_PATH_KEY: str(tmp_path / "standalone" / "k1.region")},
    )
    with pytest.raises(UnknownSlice, match="the slice of kernel 'k1' is gone .*its kernel has ended"):
        LocalHolder(tmp_path / "regions").apply_limits(allocation)
