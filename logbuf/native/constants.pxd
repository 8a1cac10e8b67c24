# cython: language_level=3
"""Constants shared by the native modules: the frame header and log metadata layouts, flags, limits and
result codes. The descriptor modules (``logbuf.logbuffer.data_header_descriptor``,
``log_buffer_descriptor``) and the result enums are the source of truth; ``constants.NATIVE_CONSTANTS``
exposes these values so a test checks that they agree."""

# Data frame header (data_header_descriptor)
cdef enum:
    HEADER_LENGTH = 32
    FRAME_ALIGNMENT = 32
    VERSION_OFFSET = 4
    FLAGS_OFFSET = 5
    TYPE_OFFSET = 6
    TERM_OFFSET_OFFSET = 8
    SESSION_ID_OFFSET = 12
    STREAM_ID_OFFSET = 16
    TERM_ID_OFFSET = 20
    RESERVED_VALUE_OFFSET = 24
    HDR_TYPE_PAD = 0
    HDR_TYPE_DATA = 1
    BEGIN_FLAG = 0x80
    END_FLAG = 0x40
    EOS_FLAG = 0x20
    UNFRAGMENTED = 0xC0
    MAX_MESSAGE_LENGTH = 16777216
    MAX_UDP_PAYLOAD_LENGTH = 65504

# Log buffer: partitions and metadata (log_buffer_descriptor)
cdef enum:
    PARTITION_COUNT = 3
    TERM_MIN_LENGTH = 65536
    TERM_MAX_LENGTH = 1073741824
    LOG_META_DATA_LENGTH = 4096
    TAIL_COUNTERS_OFFSET = 0
    ACTIVE_TERM_COUNT_OFFSET = 24
    END_OF_STREAM_POSITION_OFFSET = 128
    IS_CONNECTED_OFFSET = 136
    INITIAL_TERM_ID_OFFSET = 264
    MTU_LENGTH_OFFSET = 272
    TERM_LENGTH_OFFSET = 276
    DEFAULT_FRAME_HEADER_OFFSET = 320

# Offer results (negative); mirrored by logbuf.logbuffer.publication.OfferResult.
cdef enum:
    NOT_CONNECTED = -1
    BACK_PRESSURED = -2
    ADMIN_ACTION = -3
    CLOSED = -4
    MAX_POSITION_EXCEEDED = -5

# Internal results of the appender (never returned to Python callers of offer()).
cdef enum:
    TERM_APPEND_FAILED = -2  # term appender: the claim tripped the end of the term
    TRIPPED = -1002  # publication: the claim tripped the term, which was padded and rotated; retry

# Controlled poll actions; mirrored by logbuf.logbuffer.image.ControlledPollAction.
cdef enum:
    ACTION_ABORT = 1
    ACTION_BREAK = 2
    ACTION_COMMIT = 3
    ACTION_CONTINUE = 4

# Reasons check_data_datagram gives for an invalid DATA/PAD datagram (see logbuf.protocol.data).
cdef enum:
    DATAGRAM_OK = 0
    DATAGRAM_SHORT = -1
    DATAGRAM_BAD_VERSION = -2
    DATAGRAM_BAD_TYPE = -3
    DATAGRAM_BAD_LENGTH = -4
    DATAGRAM_NOT_CONSECUTIVE = -5
    DATAGRAM_OUTSIDE_TERM = -6

# What a frame length read from a log is, when it is not a frame (term.pxd: frame_length_fault).
cdef enum:
    FRAME_NOT_YET = 0  # no fault: 0, or a claim being written (-L with HEADER_LENGTH <= L <= the rest of the term)
    FRAME_SHORT = 1  # 1 .. HEADER_LENGTH - 1: shorter than a header
    FRAME_PAST_TERM_END = 2  # longer than what is left of the term
    FRAME_NEGATIVE = 3  # negative, and no claim that fits the term (INT_MIN included)
