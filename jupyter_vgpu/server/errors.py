"""HTTP errors whose message reaches the client exactly as written."""

from __future__ import annotations

import logging

from tornado.web import HTTPError

from jupyter_vgpu.manager import SliceRefused

# cluster: the Kubernetes API, its scheduler or the kernel pod said no, or the start timed out.
# unavailable: the ledger (its file, or the node's broker) did not decide.
REFUSAL_STATUS = {"capacity": 409, "invalid": 400, "cluster": 503, "unavailable": 503}


class VGPUHTTPError(HTTPError):
    """An HTTPError with a plain message (no %-formatting).

    jupyter_server's APIHandler writes ``log_message`` into the JSON reply, and tornado doubles
    every '%' in ``log_message`` for old callers that format it; slice messages are full of
    percentages ("20% of its SMs"), so this error hands out its message unchanged.
    """

    def __init__(self, status_code: int, message: str):
        super().__init__(status_code, message, reason=message.split(":")[0][:80])
        self.message = message

    @property
    def log_message(self) -> str:
        return self.message

    def __str__(self) -> str:
        return self.message


class StartRefused(VGPUHTTPError, SliceRefused):
    """A kernel start the slice manager refused, as the error jupyter_server passes on to the
    client of POST /api/kernels with its status (409, 400 or 503) and message; POST /api/sessions
    turns any start error into a 500 but keeps the message."""

    logged = False  # said in the server's log already (StartRefusalLog)

    def __init__(self, refusal: SliceRefused):
        VGPUHTTPError.__init__(self, REFUSAL_STATUS[refusal.kind], f"Kernel not started. {refusal}")
        self.kind = refusal.kind


def refusal_for_http(refusal: SliceRefused) -> StartRefused:
    return StartRefused(refusal)


class StartRefusalLog(logging.Filter):
    """One WARNING line, without a traceback, for a kernel start the slice manager refused.

    jupyter_client logs such a start twice with its traceback, as ERROR (the kernel manager's
    start, then the multi-kernel manager waiting on it), though nothing failed: the refusal is
    the answer the client gets (and tornado logs it again with its status)."""

    def filter(self, record: logging.LogRecord) -> bool:
        refusal = record.exc_info[1] if record.exc_info else None
        if not isinstance(refusal, StartRefused):
            return True
        if getattr(refusal, "logged", False):
            return False
        refusal.logged = True
        record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
        record.msg, record.args = "%s", (str(refusal),)
        record.exc_info, record.exc_text = None, None
        return True
