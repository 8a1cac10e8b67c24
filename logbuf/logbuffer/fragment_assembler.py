"""Reassembly of fragmented messages, per session, across polls.

An assembler must live as long as the subscription: a fresh one per poll loses the first
fragments of messages that span polls. Unfragmented messages pass straight through (no copy).
A fragment that does not follow on from the previous one (a gap) drops the partial message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.logbuffer.image import ControlledPollAction
from logbuf.native import Header

FragmentHandler = Callable[[memoryview, Header], Any]

__all__ = ["ControlledFragmentAssembler", "FragmentAssembler", "FragmentHandler"]


class _Builder:
    __slots__ = ("data", "next_term_offset", "active")

    def __init__(self) -> None:
        self.data = bytearray()
        self.next_term_offset = -1
        self.active = False

    def reset(self) -> None:
        try:
            self.data.clear()
        except BufferError:  # the delegate kept a view of the last message: leave it that buffer
            self.data = bytearray()
        self.next_term_offset = -1
        self.active = False


class _Assembler:
    """Per-session builders shared by both assemblers."""

    def __init__(self) -> None:
        self._builders: dict[int, _Builder] = {}

    def _begin(self, buffer: memoryview, header: Header) -> None:
        builder = self._builders.get(header.session_id)
        if builder is None:
            builder = self._builders[header.session_id] = _Builder()
        builder.reset()
        builder.data += buffer
        builder.active = True
        builder.next_term_offset = header.term_offset + dh.align(header.frame_length)

    def _continuing(self, header: Header) -> _Builder | None:
        """The session's builder if this fragment follows on from the last one (a gap drops it)."""
        builder = self._builders.get(header.session_id)
        if builder is None or not builder.active:
            return None
        if header.term_offset != builder.next_term_offset:
            builder.reset()
            return None
        return builder

    def move_session(self, from_session_id: int, to_session_id: int) -> None:
        """Continue a session's partial message under another session id (a catch-up that switches from the
        replay image to the live image at the same position: the next fragment follows on by term offset)."""
        builder = self._builders.pop(from_session_id, None)
        if builder is not None:
            self._builders[to_session_id] = builder

    def free_session(self, session_id: int) -> None:
        """Forget a session's partial message (its image went away)."""
        self._builders.pop(session_id, None)


class FragmentAssembler(_Assembler):
    """Wrap a handler so it sees whole messages: ``image.poll(FragmentAssembler(handler), 10)``."""

    def __init__(self, delegate: FragmentHandler) -> None:
        super().__init__()
        self.delegate = delegate

    @property
    def unfragmented_handler(self) -> FragmentHandler:
        """Where an unfragmented message goes: the delegate itself. ``poll`` calls it straight for such
        fragments, saving a Python call per message (the assembler would only pass them through)."""
        return self.delegate

    def __call__(self, buffer: memoryview, header: Header) -> None:
        flags = header.flags
        if flags & dh.UNFRAGMENTED == dh.UNFRAGMENTED:
            self.delegate(buffer, header)
            return
        if flags & dh.BEGIN_FLAG:
            self._begin(buffer, header)
            return
        builder = self._continuing(header)
        if builder is None:
            return
        builder.data += buffer
        if flags & dh.END_FLAG:
            message = memoryview(builder.data)
            try:
                self.delegate(message, header)
            finally:
                del message
                builder.reset()
        else:
            builder.next_term_offset = header.term_offset + dh.align(header.frame_length)


class ControlledFragmentAssembler(_Assembler):
    """The controlled-poll counterpart: the delegate returns a :class:`ControlledPollAction`.

    If the delegate ABORTs a completed message, the final fragment is taken back out of the
    buffer so the re-delivered fragment completes it again.
    """

    def __init__(self, delegate: Callable[[memoryview, Header], ControlledPollAction | int | None]) -> None:
        super().__init__()
        self.delegate = delegate

    def __call__(self, buffer: memoryview, header: Header) -> int:
        flags = header.flags
        if flags & dh.UNFRAGMENTED == dh.UNFRAGMENTED:
            action = self.delegate(buffer, header)
            return ControlledPollAction.CONTINUE if action is None else int(action)
        if flags & dh.BEGIN_FLAG:
            self._begin(buffer, header)
            return ControlledPollAction.CONTINUE
        builder = self._continuing(header)
        if builder is None:
            return ControlledPollAction.CONTINUE
        before = len(builder.data)
        builder.data += buffer
        if not flags & dh.END_FLAG:
            builder.next_term_offset = header.term_offset + dh.align(header.frame_length)
            return ControlledPollAction.CONTINUE
        message = memoryview(builder.data)
        try:
            action = self.delegate(message, header)
        finally:
            del message
        result = ControlledPollAction.CONTINUE if action is None else int(action)
        if result == ControlledPollAction.ABORT:
            try:
                del builder.data[before:]
            except BufferError:  # a view of the message is still held: rebuild from a copy
                builder.data = bytearray(builder.data[:before])
        else:
            builder.reset()
        return result
