"""The native libraries run on glibc 2.28 (RHEL 8, Rocky 8; the wheel's tag is manylinux_2_28 or
older), however new the glibc they are built on: native/include/vgpu/glibc_floor.h binds glibc's
functions to their old versions. Read from the libraries that native/build.py makes, for this
machine and cross-built for aarch64, in a second rather than a wheel build (test_wheel.py checks
the wheels' tags with auditwheel)."""

from __future__ import annotations

import re
from pathlib import Path

from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerNeedSection

GLIBC_FLOOR = (2, 28)
# glibc < 2.34 keeps these functions in libpthread.so.0 and libdl.so.2, which the libraries must
# then load themselves (on newer glibc both are empty stubs and libc.so.6 has the functions).
SPLIT_OFF = {
    "libpthread.so.0": re.compile(r"pthread_"),
    "libdl.so.2": re.compile(r"dl(open|close|sym|vsym|error|addr)$"),
}


def libraries(machine) -> list[Path]:
    return [machine.libs.vgpu, *sorted(machine.libs.sim_dir.glob("*.so.1"))]


def glibc_needs(path: Path) -> tuple[list[str], dict[str, str]]:
    """(the libraries `path` needs, {each undefined glibc function it calls: the version it asks for})."""
    with path.open("rb") as file:
        elf = ELFFile(file)
        needed = [
            tag.needed for tag in elf.get_section_by_name(".dynamic").iter_tags() if tag.entry.d_tag == "DT_NEEDED"
        ]
        versions = {}
        for section in elf.iter_sections():
            if isinstance(section, GNUVerNeedSection):
                for _library, auxiliaries in section.iter_versions():
                    for auxiliary in auxiliaries:
                        versions[auxiliary.entry.vna_other] = auxiliary.name
        symbols = elf.get_section_by_name(".dynsym")
        version_indices = elf.get_section_by_name(".gnu.version")
        calls = {}
        for index, symbol in enumerate(symbols.iter_symbols()):
            version = versions.get(version_indices.get_symbol(index).entry.ndx)
            if symbol.entry.st_shndx == "SHN_UNDEF" and version and version.startswith("GLIBC_"):
                calls[symbol.name] = version
    return needed, calls


def glibc_version(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.removeprefix("GLIBC_").split("."))


def test_no_library_asks_for_a_glibc_newer_than_2_28(machine):
    for path in libraries(machine):
        _needed, calls = glibc_needs(path)
        assert calls, f"{path.name}: no versioned glibc functions found (not read right?)"
        too_new = {name: version for name, version in calls.items() if glibc_version(version) > GLIBC_FLOOR}
        assert not too_new, f"{machine.name} {path.name} needs a glibc newer than 2.28 for {too_new}"


def test_libraries_load_libpthread_and_libdl_that_older_glibc_keeps_their_functions_in(machine):
    for path in libraries(machine):
        needed, calls = glibc_needs(path)
        for library, pattern in SPLIT_OFF.items():
            users = sorted(name for name in calls if pattern.match(name))
            assert not users or library in needed, f"{machine.name} {path.name} calls {users} but needs {needed}"
