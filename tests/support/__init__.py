"""The test kit: real media driver processes, a fake clock and a lossy in-memory datagram link.

Agents are tested on one thread (STYLE section 9): build them with a :class:`~tests.support.clock.FakeClock`
and, for UDP, a :class:`~tests.support.link.LinkNetwork` through the driver context, call
``do_work()``, advance time by hand.
"""
