"""HTTP errors whose message reaches the client exactly as written."""

from __future__ import annotations

from tornado.web import HTTPError


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
