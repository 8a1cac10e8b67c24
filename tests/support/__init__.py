"""The test kit: a fake clock, a lossy in-memory datagram link, real driver processes.

Agents are tested on one thread (STYLE section 9): build them with a :class:`~tests.support.clock.FakeClock`
and, for UDP, a :class:`~tests.support.link.LinkNetwork` through the driver context, call
``do_work()``, advance time by hand.
"""
