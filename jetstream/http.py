"""HTTP pieces of the relay's one port: request targets, plain-text and metrics responses.

The relay answers four things on its port (facts file §1.1, §4.4): ``GET /`` (jetstream's welcome
text), ``GET /metrics`` (Prometheus text), ``GET /subscribe`` (the websocket upgrade) and anything
else with 404. Requests are parsed and upgrades validated by ``websockets``' sans-IO
``ServerProtocol``; this module only builds the non-upgrade responses.
"""

from __future__ import annotations

import email.utils
from typing import Final
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from websockets.datastructures import Headers
from websockets.http11 import Response

__all__ = [
    "METRICS_PATH",
    "SUBSCRIBE_PATH",
    "WELCOME_PATH",
    "WELCOME_TEXT",
    "metrics_response",
    "split_target",
    "text_response",
]

SUBSCRIBE_PATH: Final = "/subscribe"
WELCOME_PATH: Final = "/"
METRICS_PATH: Final = "/metrics"
WELCOME_TEXT: Final = "Welcome to Jetstream"


def split_target(target: str) -> tuple[str, dict[str, list[str]]]:
    """The path and the percent-decoded query (repeated keys as lists, blank values kept)."""
    parts = urlsplit(target)
    return parts.path, parse_qs(parts.query, keep_blank_values=True)


def _response(status: int, reason: str, content_type: str, body: bytes) -> Response:
    headers = Headers(
        [
            ("Date", email.utils.formatdate(usegmt=True)),
            ("Connection", "close"),
            ("Content-Length", str(len(body))),
            ("Content-Type", content_type),
        ]
    )
    return Response(status, reason, headers, body)


def text_response(status: int, reason: str, text: str) -> Response:
    """A plain-text response that ends the connection (jetstream's 400s are plain text)."""
    return _response(status, reason, "text/plain; charset=utf-8", text.encode())


def metrics_response(registry: CollectorRegistry) -> Response:
    return _response(200, "OK", CONTENT_TYPE_LATEST, generate_latest(registry))
