"""The notebooks of this server's kernels, as jupyter_server's sessions know them: how every
view and notice names a kernel (client.slice_name: the notebook's file name, else the kernel's
short id)."""

from __future__ import annotations

from typing import Any


async def session_paths(sessions: Any) -> dict[str, str]:
    """Kernel id -> the path of its session (jupyter_server's SessionManager), for the kernels
    that have one."""
    listed = await sessions.list_sessions()
    return {session["kernel"]["id"]: session.get("path", "") for session in listed if session.get("kernel")}
