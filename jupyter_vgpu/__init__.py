"""jupyter-vgpu: GPU slicing for Jupyter kernels."""

from typing import Any

from jupyter_vgpu._version import __version__


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    from jupyter_vgpu.server.app import VGPUApp

    return [{"module": "jupyter_vgpu", "app": VGPUApp}]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext jupyter_vgpu``: the %vgpu magic (sliced kernels load it by themselves, before
    ipykernel starts; a sliced kernel then also outlives its server for a while, for a restarted server to adopt it:
    notebook/survive.py, and empties the frameworks' caches before a suspend: notebook/release.py)."""
    from jupyter_vgpu.notebook.magic import VGPUMagics

    ipython.register_magics(VGPUMagics)
    try:
        from ipykernel.kernelapp import IPKernelApp
    except ImportError:  # IPython without ipykernel (a terminal)
        return
    if IPKernelApp.initialized():
        from jupyter_vgpu.notebook.release import watch_release_requests
        from jupyter_vgpu.notebook.survive import outlive_server

        outlive_server(IPKernelApp.instance())
        watch_release_requests()  # PyTorch's and CuPy's caches emptied before a suspend


__all__ = ["__version__", "load_ipython_extension"]
