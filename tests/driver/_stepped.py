"""A media driver built in a directory and stepped by hand on the test's thread, and a client that
speaks the CnC protocol by hand: no driver process, no runner thread, no sleeps.

The real client (:mod:`logbuf.client`) waits for the driver's answer on the calling thread, so it
cannot share one thread with a driver the test steps; :class:`CncClient` writes the same commands
into the CnC ring and reads the same responses from the broadcast buffer, one step at a time.
"""

from __future__ import annotations

from logbuf.conduit import command_descriptor as cmd
from logbuf.conduit import counters_descriptor as cd
from logbuf.conduit.broadcast import CopyBroadcastReceiver
from logbuf.conduit.cnc import CncFile
from logbuf.conduit.ring_buffer import ManyToOneRingBuffer
from logbuf.logbuffer.image import Image
from logbuf.logbuffer.log_buffer import LogBuffers
from logbuf.logbuffer.publication import Publication

SMALL_TERM = 64 * 1024


class CncClient:
    """A client of a :class:`SteppedDriver`: sends commands, collects responses, maps logs."""

    def __init__(self, directory: str) -> None:
        self.cnc = CncFile.open(directory)
        self.to_driver = ManyToOneRingBuffer(self.cnc.to_driver)
        self.to_clients = CopyBroadcastReceiver(self.cnc.to_clients)
        self.client_id = self.to_driver.next_correlation_id()
        self.responses: list[tuple[int, bytes]] = []
        self._mapped: list[LogBuffers] = []
        self._views: list[Publication | Image] = []

    def _send(self, msg_type_id: int, payload: bytes) -> None:
        assert self.to_driver.write(msg_type_id, payload), "the to-driver ring is full"

    def add_publication(self, channel: str, stream_id: int, *, exclusive: bool = False) -> int:
        correlation_id = self.to_driver.next_correlation_id()
        command = cmd.PublicationCommand(self.client_id, correlation_id, stream_id, channel)
        self._send(cmd.ADD_EXCLUSIVE_PUBLICATION if exclusive else cmd.ADD_PUBLICATION, command.encode())
        return correlation_id

    def remove_publication(self, registration_id: int) -> int:
        correlation_id = self.to_driver.next_correlation_id()
        command = cmd.RemoveCommand(self.client_id, correlation_id, registration_id)
        self._send(cmd.REMOVE_PUBLICATION, command.encode())
        return correlation_id

    def add_subscription(self, channel: str, stream_id: int) -> int:
        correlation_id = self.to_driver.next_correlation_id()
        command = cmd.SubscriptionCommand(self.client_id, correlation_id, -1, stream_id, channel)
        self._send(cmd.ADD_SUBSCRIPTION, command.encode())
        return correlation_id

    def keepalive(self) -> None:
        command = cmd.CorrelatedCommand(self.client_id, self.to_driver.next_correlation_id())
        self._send(cmd.CLIENT_KEEPALIVE, command.encode())

    def poll(self) -> list[tuple[int, bytes]]:
        """Collect every response broadcast since the last poll (also kept in :attr:`responses`)."""
        new: list[tuple[int, bytes]] = []
        while self.to_clients.receive(lambda msg_type_id, payload: new.append((msg_type_id, payload))):
            pass
        self.responses.extend(new)
        return new

    def of_type(self, msg_type_id: int) -> list[bytes]:
        self.poll()
        return [payload for t, payload in self.responses if t == msg_type_id]

    def publication(self, ready: cmd.PublicationReady, *, exclusive: bool = False) -> Publication:
        """The publication a PUBLICATION_READY names, mapped as the real client maps it."""
        log = LogBuffers.open_file(ready.log_file_name)
        self._mapped.append(log)
        publication = Publication(
            log.view, self.cnc.counters_values, cd.values_offset(ready.position_limit_counter_id), exclusive, None
        )
        self._views.append(publication)
        return publication

    def image(self, ready: cmd.ImageReady) -> Image:
        """The image an AVAILABLE_IMAGE names, mapped as the real client maps it."""
        log = LogBuffers.open_file(ready.log_file_name)
        self._mapped.append(log)
        image = Image(log.view, self.cnc.counters_values, cd.values_offset(ready.subscriber_position_id))
        self._views.append(image)
        return image

    def close(self) -> None:
        for view in self._views:
            view.close()
        for log in self._mapped:
            log.close()
        self.cnc.close()
