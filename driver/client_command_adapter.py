"""Client commands in, handlers called, errors answered: the conductor's side of the to-driver ring.

After Aeron's ``ClientCommandAdapter``: each message read from the to-driver ring is counted,
its correlation id read, and its type id looked up in a dispatch table of handlers (one per
command, each taking the message's bytes). A handler that refuses the command raises
:class:`CommandError` (or the codec's ``MalformedCommandError``, or the channel parser's
``InvalidChannelError``); the adapter answers ON_ERROR with the code and text, counts it in ERRORS
and records it in the distinct error log, and the next command is read. Any other exception is
answered as GENERIC_ERROR: one command never takes the driver down.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from logbuf.channel_uri import InvalidChannelError
from logbuf.conduit import command_descriptor as cmd
from logbuf.conduit.command_descriptor import MalformedCommandError
from logbuf.conduit.error_log import DistinctErrorLog
from logbuf.conduit.ring_buffer import ManyToOneRingBuffer
from logbuf.driver.client_proxy import ClientProxy
from logbuf.driver.system_counters import SystemCounterId, SystemCounters
from logbuf.errors import ErrorCode, LogbufError

__all__ = ["COMMANDS_PER_READ", "ClientCommandAdapter", "CommandError", "CommandHandler"]

COMMANDS_PER_READ = 64
"""Commands read from the ring per call at most."""

CommandHandler = Callable[[memoryview], None]


class CommandError(LogbufError):
    """A command the driver rejects: sent back to the client as ON_ERROR."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class ClientCommandAdapter:
    """Reads the to-driver ring and dispatches each command by its type id to ``handlers``."""

    def __init__(
        self,
        to_driver: ManyToOneRingBuffer,
        handlers: Mapping[int, CommandHandler],
        client_proxy: ClientProxy,
        system_counters: SystemCounters,
        error_log: DistinctErrorLog,
    ) -> None:
        self.to_driver = to_driver
        self._handlers = dict(handlers)
        self._client_proxy = client_proxy
        self._system_counters = system_counters
        self._error_log = error_log

    def receive(self, limit: int = COMMANDS_PER_READ) -> int:
        """Read and handle up to ``limit`` commands; returns how many were read."""
        return self.to_driver.read(self.on_message, limit)

    def on_message(self, msg_type_id: int, buffer: memoryview) -> None:
        self._system_counters.increment(SystemCounterId.COMMANDS_RECEIVED)
        correlation_id = 0
        try:
            if len(buffer) >= cmd.CORRELATED_LENGTH:
                _, correlation_id = cmd.CORRELATED.unpack_from(buffer, 0)
            handler = self._handlers.get(msg_type_id)
            if handler is None:
                raise CommandError(ErrorCode.UNKNOWN_COMMAND_TYPE_ID, f"unknown command type id 0x{msg_type_id:x}")
            handler(buffer)
        except CommandError as e:
            self.on_error(correlation_id, e.code, str(e))
        except MalformedCommandError as e:
            self.on_error(correlation_id, ErrorCode.MALFORMED_COMMAND, str(e))
        except InvalidChannelError as e:
            self.on_error(correlation_id, ErrorCode.INVALID_CHANNEL, str(e))
        except Exception as e:  # never let one command take the driver down
            self.on_error(correlation_id, ErrorCode.GENERIC_ERROR, f"{type(e).__name__}: {e}")

    def on_error(self, correlation_id: int, code: ErrorCode, message: str) -> None:
        self._system_counters.increment(SystemCounterId.ERRORS)
        self._error_log.record(f"{code.name}: {message}")
        self._client_proxy.on_error(correlation_id, code, message)
