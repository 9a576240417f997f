"""How a classroom file's values are read so that one refusal lists every problem at once.

:class:`_Reader` raises errors that name the file and the key; a part read with its ``part()`` or
``attempt()`` keeps its problem and reading goes on, and ``refuse()`` raises one
:class:`~jupyter_vgpu.hub.classroom.ClassroomError` listing them all. :func:`parse_duration`
reads the file's durations, as :mod:`jupyter_vgpu.model` reads sizes and SM shares.
"""

from __future__ import annotations

import contextlib
import difflib
import re
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from jupyter_vgpu.hub.classroom.keys import DURATION_HELP
from jupyter_vgpu.hub.classroom.model import ClassroomError
from jupyter_vgpu.model import SliceValueError

_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}

_T = TypeVar("_T")


def parse_duration(value: object) -> float:
    """Seconds from a duration: ``90s``, ``20m``, ``2h``, ``1d`` or a bare number of seconds."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise SliceValueError(f"{value!r:.40} is not {DURATION_HELP}")
    if isinstance(value, str):
        match = _DURATION.match(value)
        if not match or match.group(2).lower() not in _DURATION_UNITS:
            raise SliceValueError(f"{value[:40]!r} is not {DURATION_HELP}")
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2).lower()]
    else:
        seconds = float(value)
    if not 0 < seconds < float("inf"):
        raise SliceValueError(f"{str(value)[:40]!r} must be more than zero; use {DURATION_HELP}")
    return seconds


class _Reader:
    """Reads one classroom file's values, raising errors that name the file and the key; where a
    part is read with :meth:`part` (or :meth:`attempt`), its problem is kept and reading goes on,
    so :meth:`refuse` can list every problem at once."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.problems: list[str] = []

    def error(self, key: str, message: str) -> ClassroomError:
        problem = f"{key}: {message}" if key else message
        return ClassroomError(f"{self.label}: {problem}", [problem])

    def note(self, error: ClassroomError) -> None:
        """Keep the problems of ``error`` and read on."""
        if not isinstance(error, _AlreadySaid):
            self.problems.extend(error.problems or [str(error)])

    @contextlib.contextmanager
    def part(self) -> Iterator[None]:
        """Read one part of the file; a problem in it is kept, and the next part is read."""
        try:
            yield
        except ClassroomError as error:
            self.note(error)

    def attempt(self, read: Callable[..., _T], *args: Any) -> _T | None:
        """``read(*args)``, or None where it found a problem (kept)."""
        try:
            return read(*args)
        except ClassroomError as error:
            self.note(error)
            return None

    def refuse(self) -> None:
        """Raise one ClassroomError with every problem kept so far, if any."""
        if len(self.problems) == 1:
            raise ClassroomError(f"{self.label}: {self.problems[0]}", self.problems)
        if self.problems:
            listed = "".join(f"\n  - {problem}" for problem in self.problems)
            raise ClassroomError(f"{self.label}: {len(self.problems)} problems:{listed}", self.problems)

    def mapping(self, value: object, key: str, accepted: tuple[str, ...]) -> dict[str, Any]:
        """``value``, a mapping whose keys are all ``accepted``: each unknown key is a problem
        (kept) and left out."""
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.error(key, f"must be a mapping with keys {', '.join(accepted)}, not {_shown(value)}")
        for name in value:
            if name not in accepted:
                close = (
                    difflib.get_close_matches(str(name), accepted, n=1)
                    or [key for key in accepted if key.startswith(str(name)) or str(name).startswith(key)][:1]
                )
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                where = f"{key}.{name}" if key else str(name)
                self.note(self.error(where, f"unknown key{hint}; accepted: {', '.join(accepted)}"))
        return {name: item for name, item in value.items() if name in accepted}

    def text(self, value: object, key: str, what: str = "text") -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.error(key, f"must be {what}, not {_shown(value)} (quote it in YAML if it reads as a number)")
        return value.strip()

    def names(self, value: object, key: str, what: str) -> tuple[str, ...]:
        if value is None:
            return ()
        if not isinstance(value, list):
            raise self.error(key, f"must be a list of {what} like [alice, bob], not {_shown(value)}")
        read = [self.attempt(self.text, item, f"{key}[{index}]", f"a {what[:-1]}") for index, item in enumerate(value)]
        for index, name in enumerate(read):
            if name is not None and name in read[:index]:
                self.note(self.error(f"{key}[{index}]", f"{name!r} is listed twice"))
        return tuple(name for name in read if name is not None)

    def flag(self, value: object, key: str, default: bool) -> bool:
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(key, f"must be true or false, not {_shown(value)}")
        return value

    def count(self, value: object, key: str, low: int, high: int | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
            span = f"from {low} to {high}" if high is not None else f"of {low} or more"
            raise self.error(key, f"must be a whole number {span}, not {_shown(value)}")
        return value

    def parsed(self, parse: Callable[[Any], _T], value: object, key: str) -> _T:
        try:
            return parse(value)
        except SliceValueError as error:
            raise self.error(key, str(error)) from None


def _shown(value: object) -> str:
    return "nothing" if value is None else repr(value)[:60]


class _AlreadySaid(ClassroomError):
    """A part that cannot be made because of problems already kept: nothing more to say."""


def _already_said() -> ClassroomError:
    return _AlreadySaid("problems already kept")
