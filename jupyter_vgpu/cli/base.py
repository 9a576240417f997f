"""What every ``jupyter vgpu`` command shares: strict options, one-line usage errors, the
bases of the GPU commands, of the commands that ask the server and of the command groups."""

from __future__ import annotations

import sys
from typing import NoReturn

from jupyter_core.application import JupyterApp
from traitlets import Bool, Unicode, default
from traitlets.config.loader import KVArgParseConfigLoader

# Only what every command needs is imported here: a command imports the rest of jupyter_vgpu
# (holders, ledger, slice manager) and of Jupyter (jupyter_client, jupyter_server) when it runs,
# so `jupyter vgpu status` answers in a fraction of a second (tests/cli/test_cli_imports.py).
from jupyter_vgpu._version import __version__
from jupyter_vgpu.client import RequestRefused, ServerClient, ServerUnavailable
from jupyter_vgpu.model.devices import DeviceError, list_devices, use_simulator
from jupyter_vgpu.native import NativeLibraryMissing


class UsageError(Exception):
    """Bad command-line input: printed as one line, exit status 2, nothing started."""


class _StrictLoader(KVArgParseConfigLoader):
    """Command-line options where one the command does not have is refused (one line, exit 2),
    not warned about and ignored: `--prefix DIR` to a command without it must not install
    somewhere else."""

    command = "jupyter vgpu"

    def _handle_unrecognized_alias(self, arg: str) -> None:
        self._refuse(f"unknown option --{arg}")

    def _create_parser(self) -> None:
        super()._create_parser()
        # argparse's own errors (an unknown --flag without a value: "expected one argument")
        # read the same: one line, exit 2.
        self.parser.error = self._refuse  # type: ignore[method-assign]

    def _refuse(self, message: str) -> NoReturn:
        if message.startswith("argument --") and message.endswith("expected one argument"):
            option = message.split()[1].rstrip(":").split("/")[0].removeprefix("--")
            # argparse names an alias by its trait: --RunApp.memory for --memory
            alias = next((name for name, trait in self.aliases.items() if option in (name, trait)), None)
            message = f"--{alias} needs a value" if alias else f"unknown option --{option}"
        print(f"{self.command}: {message}; `{self.command} --help` lists the options it takes", file=sys.stderr)
        sys.exit(2)


class _StrictOptions(JupyterApp):
    """A `jupyter vgpu` command: its unknown options are refused (see _StrictLoader), and its
    help names no private class of this module (the bases below)."""

    # One line for the table of `jupyter vgpu --help`: a whole sentence, never cut.
    summary = ""

    def _create_loader(self, argv, aliases, flags, classes) -> KVArgParseConfigLoader:
        loader = _StrictLoader(argv, aliases, flags, classes=classes, log=self.log, subcommands=self.subcommands)
        loader.command = self.name.replace("-", " ")
        return loader

    @classmethod
    def class_get_help(cls, inst=None) -> str:
        # traitlets heads the section "RunApp(_GPUCommand) options", naming a private base
        first, _, rest = super().class_get_help(inst).partition("\n")
        return f"{cls.__name__} options\n{rest}" if first.endswith(" options") else f"{first}\n{rest}"

    def _classes_inc_parents(self, classes=None):
        # --help-all lists a section for every configurable class; the private bases here are
        # not for users to configure.
        for cls in super()._classes_inc_parents(classes):
            if not cls.__name__.startswith("_"):
                yield cls


# flags, aliases and subcommands are traitlets' class-level tables, which Application annotates
# as instance attributes (a ClassVar here is a mypy error) and only reads: RUF012 does not apply.
def _aliases(app: str, *options: str) -> dict[str, str]:
    """traitlets' aliases of an app's options, in the order given: ``trait`` is the option
    ``--trait`` (``_`` written ``-``), ``alias=trait`` another name for it."""
    aliases = {}
    for option in options:
        alias, _, trait = option.rpartition("=")
        aliases[(alias or trait).replace("_", "-")] = f"{app}.{trait}"
    return aliases


class _VGPUSubcommand(_StrictOptions):
    version = __version__

    def start(self) -> None:
        command = self.name.replace("-", " ")  # jupyter vgpu kernelspec install
        try:
            self.exit(self.run() or 0)
        except UsageError as error:
            print(f"{command}: {error}", file=sys.stderr)
            self.exit(2)
        except RequestRefused as error:
            print(f"{command}: {error.message} (HTTP {error.status})", file=sys.stderr)
            self.exit(1)
        except (DeviceError, NativeLibraryMissing, FileNotFoundError, ServerUnavailable) as error:
            print(f"{command}: {error}", file=sys.stderr)
            self.exit(1)

    def run(self) -> int:
        raise NotImplementedError


class _GPUCommand(_VGPUSubcommand):
    """A subcommand that uses this machine's GPUs, or the simulated ones (--simulate)."""

    simulate = Bool(False, config=True, help="Use the simulated GPU instead of the machine's driver.")

    def devices(self):
        if self.simulate:
            use_simulator()
        return list_devices()


class _ServerCommand(_VGPUSubcommand):
    """A subcommand that talks to the running Jupyter server's /api/vgpu as its user (the
    server's GPU, real or simulated, is the server's business: no --simulate)."""

    flags = {}  # noqa: RUF012 -- traitlets' class-level table

    server = Unicode(
        "",
        config=True,
        help="URL of the Jupyter server, with its token in $JUPYTER_TOKEN. Empty: the one found in Jupyter's runtime files.",
    )

    def client(self) -> ServerClient:
        return ServerClient.for_user(self.server)


class _CommandGroup(_StrictOptions):
    """A command of subcommands (``jupyter vgpu``, ``jupyter vgpu kernelspec``, ...): without one
    it prints its usage and exits 2."""

    version = __version__

    @default("subcommand_description")
    def _subcommand_description_default(self) -> str:
        # traitlets' own names the command by its name here (jupyter-vgpu-kernelspec), which is
        # no program; its text is then format()ted, so braces are doubled.
        command = self.name.replace("-", " ")
        return f"Run a command as `{command} COMMAND [options]`; `{command} COMMAND --help` lists its options."

    def usage(self) -> str:
        raise NotImplementedError

    def start(self) -> None:
        if self.subapp is None:
            print(f"usage: {self.usage()}", file=sys.stderr)
            self.exit(2)
        super().start()
