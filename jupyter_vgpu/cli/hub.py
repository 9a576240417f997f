"""JupyterHub's commands: ``jupyter vgpu broker`` (the node's GPU ledger, a hub service) and
``jupyter vgpu hub profiles`` (the KubeSpawner profile_list of a classroom file)."""

from __future__ import annotations

import json
import sys

from traitlets import Float, List, Unicode

from jupyter_vgpu._version import __version__
from jupyter_vgpu.cli.base import _aliases, _CommandGroup, _StrictOptions


class BrokerApp(_StrictOptions):
    name = "jupyter-vgpu-broker"
    version = __version__
    description = (
        "The node's GPU ledger for a JupyterHub's users, run by the hub as a managed service "
        "(jupyter_vgpu.hub.configure(c, 'classroom.yaml') in jupyterhub_config.py adds it)."
    )
    classroom = Unicode("", config=True, help="The classroom file (YAML) the hub was configured with.")
    reconcile_interval = Float(
        30.0,
        config=True,
        help="Seconds between asking the hub which users still run a server (others' slices are given back).",
    )
    aliases = _aliases("BrokerApp", "classroom", "reconcile_interval")

    def start(self) -> None:
        if not self.classroom:
            print("jupyter vgpu broker: --classroom FILE is required (the hub's classroom file)", file=sys.stderr)
            self.exit(2)
        import logging

        from jupyter_vgpu.hub.broker import run

        level = self.log_level  # traitlets' Enum of level numbers and names
        assert isinstance(level, (int, str)), level
        logging.basicConfig(level=level, format="[%(levelname)1.1s %(asctime)s %(name)s] %(message)s")
        self.exit(run(self.classroom, reconcile_interval=self.reconcile_interval))


class HubProfilesApp(_StrictOptions):
    name = "jupyter-vgpu-hub-profiles"
    version = __version__
    description = "Print, as JSON, the KubeSpawner profile_list a classroom file makes (all sizes, or a group's)."
    config_file_name = Unicode("", config=True, help="The classroom file (YAML).")
    groups = List(Unicode(), config=True, help="Only the sizes these JupyterHub groups may pick. Empty: every size.")
    aliases = _aliases("HubProfilesApp", "config=config_file_name", "group=groups")

    def start(self) -> None:
        from jupyter_vgpu.hub.classroom import ClassroomError, load_classroom
        from jupyter_vgpu.hub.profiles import profile_list

        if not self.config_file_name:
            print("jupyter vgpu hub profiles: --config FILE is required (the classroom file)", file=sys.stderr)
            self.exit(2)
        try:
            classroom = load_classroom(self.config_file_name, hub_groups=None)
        except (ClassroomError, OSError) as error:
            print(f"jupyter vgpu hub profiles: {error}", file=sys.stderr)
            self.exit(2)
        print(json.dumps(profile_list(classroom, self.groups or None), indent=2))


class HubApp(_CommandGroup):
    name = "jupyter-vgpu-hub"
    description = "JupyterHub integration: what a classroom file makes."
    subcommands = {"profiles": (HubProfilesApp, HubProfilesApp.description)}  # noqa: RUF012 -- traitlets' class-level table

    def usage(self) -> str:
        return "jupyter vgpu hub profiles --config FILE  (jupyter vgpu hub profiles --help)"
