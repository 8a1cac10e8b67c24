"""HTTP pieces of the relay: request targets, plain-text, metrics and CORS responses.

The public port answers (facts file §1.1): ``GET /`` (jetstream's welcome text), ``GET /subscribe``
(the websocket upgrade) and anything else with 404; the metrics port (§4.4, legacy ``:6009``)
answers ``GET /metrics`` (Prometheus text) and 404. ``HEAD`` gets the same status and headers as
``GET`` and no body; other methods than ``GET``, ``HEAD`` and ``OPTIONS`` get 405. CORS follows the
legacy server's echo middleware (any origin, methods GET, HEAD, OPTIONS): a request with an
``Origin`` header gets ``Access-Control-Allow-Origin: *``; ``OPTIONS`` (a preflight) gets 204 with the
allowed methods and the requested headers. Requests are parsed and upgrades validated by
``websockets``' sans-IO ``ServerProtocol``; this module only builds the non-upgrade responses.
"""

from __future__ import annotations

import email.utils
from typing import Final
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from websockets.datastructures import Headers
from websockets.http11 import Response

__all__ = [
    "ALLOWED_METHODS",
    "DEFAULT_METRICS_PORT",
    "METRICS_PATH",
    "SUBSCRIBE_PATH",
    "WELCOME_PATH",
    "WELCOME_TEXT",
    "head_response",
    "method_not_allowed",
    "metrics_response",
    "preflight_response",
    "split_target",
    "text_response",
    "with_cors",
]

SUBSCRIBE_PATH: Final = "/subscribe"
WELCOME_PATH: Final = "/"
METRICS_PATH: Final = "/metrics"
WELCOME_TEXT: Final = "Welcome to Jetstream"
ALLOWED_METHODS: Final = "GET, HEAD, OPTIONS"
#: jetstream's metrics port (legacy ``JETSTREAM_METRICS_LISTEN_ADDR`` :6009).
DEFAULT_METRICS_PORT: Final = 6009


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


def method_not_allowed() -> Response:
    response = text_response(405, "Method Not Allowed", "Method Not Allowed")
    response.headers["Allow"] = ALLOWED_METHODS
    return response


def head_response(response: Response) -> Response:
    """The answer to ``HEAD``: ``response``'s status and headers (its Content-Length too), no body."""
    return Response(response.status_code, response.reason_phrase, response.headers, b"")


def with_cors(response: Response, request_headers: Headers) -> Response:
    """Add the CORS headers to a response to a request that carries an ``Origin``."""
    if "Origin" in request_headers:
        response.headers["Vary"] = "Origin"
        response.headers["Access-Control-Allow-Origin"] = "*"
    return response


def preflight_response(request_headers: Headers) -> Response:
    """``OPTIONS``: 204, and with an ``Origin`` the allowed origin, methods and requested headers."""
    headers = Headers([("Date", email.utils.formatdate(usegmt=True)), ("Connection", "close")])
    if "Origin" in request_headers:
        headers["Vary"] = "Origin, Access-Control-Request-Method, Access-Control-Request-Headers"
        headers["Access-Control-Allow-Origin"] = "*"
        headers["Access-Control-Allow-Methods"] = ALLOWED_METHODS
        requested = request_headers.get("Access-Control-Request-Headers")
        if requested:
            headers["Access-Control-Allow-Headers"] = requested
    return Response(204, "No Content", headers, b"")
