"""logbuf's client API: connect to a media driver, publish and subscribe through shared memory."""

from logbuf.client.aeron import Aeron, Context, Image, Publication, Subscription
from logbuf.client.topics import TopicPublication, TopicSubscription
from logbuf.directory import DirectoryPermissionError
from logbuf.errors import ClosedError, DriverTimeoutError, LogbufError, RegistrationError
from logbuf.logbuffer.fragment_assembler import ControlledFragmentAssembler, FragmentAssembler
from logbuf.logbuffer.image import ControlledPollAction, FragmentBatch, Header
from logbuf.logbuffer.publication import BufferClaim, OfferResult
from logbuf.native import TopicHandle
from logbuf.topic_names import TopicNameError

__all__ = [
    "Aeron",
    "BufferClaim",
    "ClosedError",
    "Context",
    "ControlledFragmentAssembler",
    "ControlledPollAction",
    "DirectoryPermissionError",
    "DriverTimeoutError",
    "FragmentAssembler",
    "Header",
    "FragmentBatch",
    "Image",
    "LogbufError",
    "OfferResult",
    "Publication",
    "RegistrationError",
    "Subscription",
    "TopicHandle",
    "TopicNameError",
    "TopicPublication",
    "TopicSubscription",
]
