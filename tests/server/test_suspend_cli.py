"""`jupyter vgpu suspend | resume` against a Jupyter server as a user runs it (a separate process,
on the simulated GPU): the kernel's memory leaves the GPU and comes back intact."""

from __future__ import annotations

from support import written_with_a_pattern
from test_server_process import KERNEL_NAME, Server, run_code, user_env, vgpu_cli, vgpu_kernelspec_dir

__all__ = ["user_env", "vgpu_kernelspec_dir"]  # the fixtures this module takes from there

PATTERN = """
pointer = ctypes.c_uint64()
assert cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(1 << 30)) == 0
""" + written_with_a_pattern("pointer", 251 * 4096)


def test_cli_suspends_and_resumes_a_kernel_of_the_running_server(user_env, tmp_path, cuda_prelude):
    server = Server(tmp_path, user_env)
    try:
        started = server.api("POST", "api/vgpu/kernels", {"name": KERNEL_NAME, "memory": "2GiB", "cores": 40})
        kernel_id = started["kernel"]["id"]
        run_code(user_env, kernel_id, cuda_prelude + PATTERN)

        suspended = vgpu_cli(user_env, "suspend", kernel_id[:8])
        assert suspended.returncode == 0, suspended.stderr
        assert suspended.stdout.strip() == (
            f"suspended {kernel_id[:8]}: 1GiB moved to host memory; it resumes on its next cell, or with "
            f"`jupyter vgpu resume {kernel_id[:8]}`"
        )
        (listed,) = server.api("GET", "api/vgpu/slices")
        assert (listed["state"], listed["host_memory_bytes"]) == ("suspended", 1 << 30)
        again = vgpu_cli(user_env, "suspend", kernel_id[:8])  # says so, not "moved" again (issue 27 #6)
        assert again.returncode == 0, again.stderr
        assert again.stdout.strip() == (
            f"{kernel_id[:8]} was already suspended: its 1GiB is in host memory; "
            f"`jupyter vgpu resume {kernel_id[:8]}` resumes it"
        )
        # `jupyter vgpu status`: nothing of it on the GPU, and where its memory is.
        status = vgpu_cli(user_env, "status")
        assert status.returncode == 0, status.stderr
        (row,) = [line for line in status.stdout.splitlines() if line.startswith(kernel_id[:8])]
        assert row.split()[3:6] == ["0", "/", "2GiB"], row
        assert row.endswith("  1GiB in host memory (suspended)"), row

        resumed = vgpu_cli(user_env, "resume", kernel_id[:8])
        assert resumed.returncode == 0, resumed.stderr
        assert resumed.stdout.strip() == f"resumed {kernel_id[:8]}: its 2GiB slice runs again"
        assert run_code(user_env, kernel_id, "print(intact())").strip() == "True"
        running = vgpu_cli(user_env, "resume", kernel_id[:8])  # not "resumed ... runs again"
        assert running.returncode == 0, running.stderr
        assert running.stdout.strip() == f"{kernel_id[:8]} was not suspended (it is running): nothing to resume"

        usage = vgpu_cli(user_env, "suspend")
        assert usage.returncode == 2 and "usage: jupyter vgpu suspend KERNEL_ID" in usage.stderr
        unknown = vgpu_cli(user_env, "resume", "zzzz")
        assert unknown.returncode == 2 and "no sliced kernel's id starts with 'zzzz'" in unknown.stderr
    finally:
        server.stop()
