"""What jupyter_vgpu keeps in the user's Jupyter runtime folder is the user's alone (issue 34
item 6): the sessions database (which notebook has which kernel, kept for a restarted server) is
0600 like every other file there, whatever the umask, also where an earlier version left it 0644."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import stat
from pathlib import Path

import pytest


@pytest.fixture
def loose_umask():
    """The umask most users have (022): files made without a mode of their own are 0644."""
    before = os.umask(0o022)
    yield
    os.umask(before)


def modes(folder: Path) -> dict[str, int]:
    return {path.name: stat.S_IMODE(path.stat().st_mode) for path in sorted(folder.iterdir())}


@pytest.mark.parametrize("before", ["none", "left 0644 by an earlier version"])
async def test_the_sessions_database_is_private_to_the_user(before, loose_umask, jp_root_dir, jp_runtime_dir, request):
    folder = Path(jp_runtime_dir) / "vgpu"
    name = f"sessions-{hashlib.sha256(os.path.abspath(jp_root_dir).encode()).hexdigest()[:16]}.sqlite"
    if before != "none":
        folder.mkdir(mode=0o700)
        sqlite3.connect(folder / name).close()
        (folder / name).chmod(0o644)
    server = request.getfixturevalue("jp_serverapp")
    sessions = server.session_manager
    assert sessions.database_filepath == str(folder / name)
    assert await sessions.list_sessions() == []  # the database is open (made, where it was not there)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    found = modes(folder)
    assert name in found and found == dict.fromkeys(found, 0o600)
