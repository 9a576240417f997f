"""How a batch run's refused kernel start reads on a terminal: one line that says what to do.

A batch kernel (nbconvert, ``jupyter execute``, papermill, nbclient) whose slice is refused (no
GPU, a size that does not fit, a bad value) makes the program running it fail, and Python prints
the refusal under two tracebacks of some hundred lines: jupyter_client logs the failed start with
its traceback, then the program dies of the same exception. The refusal already says what to
do, so it is all that is printed: the log record of the start is dropped and an uncaught
refusal is printed as its message. Other exceptions and log records are left as they are.
"""

from __future__ import annotations

import logging
import sys
from types import TracebackType
from typing import Any

from jupyter_vgpu.manager import SliceRefused


class _WithoutRefusals(logging.Filter):
    """Drops the records that carry a refusal (jupyter_client's "failed start" record): the
    program's exit says it once."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], SliceRefused))


def say_refusals_in_one_line(log: Any) -> None:
    """From now on in this process: a refusal that reaches the top is printed as one line,
    ``jupyter-vgpu: <message>`` (exit status 1), and ``log`` (the kernel manager's logger, or
    an adapter of it) does not log it with a traceback. Installed once; later calls do nothing."""
    logger = log.logger if isinstance(log, logging.LoggerAdapter) else log
    if isinstance(logger, logging.Logger) and not any(isinstance(f, _WithoutRefusals) for f in logger.filters):
        logger.addFilter(_WithoutRefusals())
    if getattr(sys.excepthook, "vgpu_refusals", False):
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, traceback: TracebackType | None) -> None:
        if isinstance(value, SliceRefused):
            print(f"jupyter-vgpu: {value}", file=sys.stderr)
        else:
            previous(kind, value, traceback)

    hook.vgpu_refusals = True  # type: ignore[attr-defined]
    sys.excepthook = hook
