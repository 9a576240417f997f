"""Suspending idle kernels to host memory (issue 18), the server's side: the settings the REST
handlers read, and the resume on demand (a kernel that goes busy, or whose processes make a CUDA
call while suspended, is resumed by the slice watcher)."""

from __future__ import annotations

# Where the handlers find VGPUApp.suspend_lock_timeout (seconds a process may take to finish its
# GPU work before a suspend leaves the kernel running).
SUSPEND_LOCK_TIMEOUT_SETTING = "jupyter_vgpu_suspend_lock_timeout"

__all__ = ["SUSPEND_LOCK_TIMEOUT_SETTING"]
