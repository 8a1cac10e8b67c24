"""Optional TLS on the relay's listeners (``--tls-cert`` / ``--tls-key``), sans-IO.

Theory of operation
-------------------
The relay's loop owns plain non-blocking sockets and never blocks, so TLS is a layer of bytes, not a
socket wrapper: each TLS connection holds an :class:`ssl.SSLObject` between two memory BIOs
(:class:`TlsSession`). The loop feeds it what ``recv`` returned and gets the plaintext back (the
handshake runs inside that, its answers land in :attr:`TlsSession.out`); to send, it encrypts a
slice of plaintext into :attr:`TlsSession.out` and writes that with ``send``, keeping what the socket
did not take. Encryption never fails for want of socket space, so no ``SSL_write`` retry rules apply,
and the sockets raise the same ``BlockingIOError`` as plain ones.

A TLS client cannot be fed by ``os.sendfile`` (the kernel would send the frame file's plaintext), so
the fan-out reads at most :data:`TLS_CHUNK_LENGTH` bytes of its range with ``os.pread``, encrypts
them, and encrypts the next chunk only once the socket took all of the last: a TLS client holds at
most one chunk of ciphertext in the relay. That costs a copy and AES per client per byte, which is
why an operator with many clients is better served by a proxy terminating TLS (README, operator's
section) or by many relays; kernel TLS (which would keep ``sendfile``) is not used.
"""

from __future__ import annotations

import os
import ssl
from typing import Final

from logbuf.errors import ConfigurationError

__all__ = ["TLS_CHUNK_LENGTH", "TlsSession", "make_server_context"]

TLS_CHUNK_LENGTH: Final = 64 * 1024
"""Plaintext encrypted per step for one TLS client (four TLS records): bounds its ciphertext backlog."""
MAX_RECORD_READ_LENGTH: Final = 64 * 1024


def make_server_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A server context for the certificate chain and key (PEM), TLS 1.2 or later, no client certificates.
    Errors name the setting and the file (``ConfigurationError``)."""
    for name, path in (("tls_cert", cert_file), ("tls_key", key_file)):
        if not os.path.isfile(path):
            raise ConfigurationError(f"{name}={path!r} is not a readable file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    try:
        context.load_cert_chain(cert_file, key_file)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigurationError(
            f"tls_cert={cert_file!r} / tls_key={key_file!r}: not a PEM certificate chain and its key ({exc})"
        ) from None
    return context


class TlsSession:
    """One connection's TLS state: ciphertext in through :meth:`receive`, plaintext in through
    :meth:`encrypt`; ciphertext to send accumulates in :attr:`out` (the caller sends and trims it)."""

    __slots__ = ("_incoming", "_outgoing", "_ssl", "out", "handshake_done", "closed", "notified")

    def __init__(self, context: ssl.SSLContext) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._ssl = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self.out = bytearray()
        self.handshake_done = False
        self.closed = False  # the peer sent close_notify
        self.notified = False  # we queued ours

    def receive(self, data: bytes) -> bytes:
        """Ciphertext from the peer -> the plaintext it completes (maybe ``b""``). Raises ``ssl.SSLError``
        for a failed handshake or a corrupt record (the caller closes the connection)."""
        self._incoming.write(data)
        chunks: list[bytes] = []
        try:
            if not self.handshake_done:
                self._ssl.do_handshake()
                self.handshake_done = True
            while True:
                chunk = self._ssl.read(MAX_RECORD_READ_LENGTH)
                if not chunk:
                    self.closed = True
                    break
                chunks.append(chunk)
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLZeroReturnError:
            self.closed = True
        finally:
            self._drain()
        return b"".join(chunks)

    def encrypt(self, data: bytes | bytearray | memoryview) -> None:
        """Append ``data``'s TLS records to :attr:`out` (always all of it)."""
        if data:
            self._ssl.write(data)
            self._drain()

    def close_notify(self) -> None:
        """Queue our close_notify alert (before shutting the write side); once."""
        if self.notified or not self.handshake_done:
            return
        self.notified = True
        try:
            self._ssl.unwrap()
        except (ssl.SSLWantReadError, ssl.SSLError):
            pass  # the peer's close_notify is not waited for
        self._drain()

    def _drain(self) -> None:
        if self._outgoing.pending:
            self.out += self._outgoing.read()
