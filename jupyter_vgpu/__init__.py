"""jupyter-vgpu: GPU slicing for Jupyter kernels."""

from ._version import __version__


def _jupyter_server_extension_points() -> list[dict]:
    from .app import VGPUApp

    return [{"module": "jupyter_vgpu", "app": VGPUApp}]


__all__ = ["__version__"]
