"""jupyter-vgpu: GPU slicing for Jupyter kernels."""

from typing import Any

from jupyter_vgpu._version import __version__


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    from jupyter_vgpu.server.app import VGPUApp

    return [{"module": "jupyter_vgpu", "app": VGPUApp}]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext jupyter_vgpu``: the %vgpu magic (sliced kernels load it by themselves)."""
    from jupyter_vgpu.notebook.magic import VGPUMagics

    ipython.register_magics(VGPUMagics)


__all__ = ["__version__", "load_ipython_extension"]
