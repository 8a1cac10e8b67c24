# cython: language_level=3
"""The media driver's datagram syscalls: one ``sendmmsg`` sends a run of a term's frames as datagrams, one
``recvmmsg`` receives a batch into a buffer of slots. Non-blocking; a full socket buffer or an error
(a bad descriptor included) sends or receives fewer, down to none, and is never raised in the duty cycle.

The sender scans the term with the same inline availability scan as the log buffer code
(``logbuf.native.term``): a frame length read from the term can never put an iovec outside it.
"""

from libc.stdint cimport int32_t, int64_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memset

from logbuf.native.constants cimport HDR_TYPE_PAD, HEADER_LENGTH
from logbuf.native.term cimport TermBuffer, check_term, frame_type, scan_for_availability


cdef extern from "<sys/uio.h>" nogil:
    cdef struct iovec:
        void *iov_base
        size_t iov_len

cdef extern from "<sys/socket.h>" nogil:
    ctypedef unsigned int socklen_t
    cdef struct msghdr:
        void *msg_name
        socklen_t msg_namelen
        iovec *msg_iov
        size_t msg_iovlen
        void *msg_control
        size_t msg_controllen
        int msg_flags
    cdef struct mmsghdr:
        msghdr msg_hdr
        unsigned int msg_len
    int sendmmsg(int sockfd, mmsghdr *msgvec, unsigned int vlen, int flags)
    int recvmmsg(int sockfd, mmsghdr *msgvec, unsigned int vlen, int flags, void *timeout)
    enum: MSG_DONTWAIT

cdef extern from "<netinet/in.h>" nogil:
    cdef struct in_addr:
        uint32_t s_addr
    cdef struct sockaddr_in:
        uint16_t sin_family
        uint16_t sin_port
        in_addr sin_addr

cdef enum: MAX_BATCH = 64


def term_send_datagrams(int fd, term_buffer, int32_t term_offset, int32_t max_length, int32_t mtu,
                        const unsigned char[::1] address not None, int max_datagrams) -> tuple:
    """The sender's hot loop: datagrams of committed whole frames from ``term_offset`` (each at most
    ``mtu``, together at most ``max_length`` of the term; a PAD frame travels as its 32-byte header)
    sent to ``address`` (a packed ``struct sockaddr``) with one non-blocking sendmmsg, at most
    ``max_datagrams`` (<= 64). Returns (term bytes the sent datagrams cover, datagrams sent, bytes
    sent); a full socket buffer or a send error sends fewer (0 on error)."""
    cdef TermBuffer b = TermBuffer(term_buffer, False)
    check_term(b, term_offset)
    if max_datagrams > MAX_BATCH:
        max_datagrams = MAX_BATCH
    cdef mmsghdr msgs[MAX_BATCH]
    cdef iovec iovs[MAX_BATCH]
    cdef int32_t covers[MAX_BATCH]
    cdef const char *term = <const char *>b.view.buf
    cdef int32_t term_length = <int32_t>b.view.len
    cdef int32_t offset = term_offset, remaining = max_length, available, wire
    cdef int n = 0, sent, i
    cdef int64_t covered = 0, sent_bytes = 0
    while n < max_datagrams and remaining > 0:
        available = scan_for_availability(term, offset, mtu if mtu < remaining else remaining, term_length)
        if available <= 0:
            break
        wire = HEADER_LENGTH if frame_type(term + offset) == HDR_TYPE_PAD else available
        iovs[n].iov_base = <void *>(term + offset)
        iovs[n].iov_len = wire
        memset(&msgs[n], 0, sizeof(mmsghdr))
        msgs[n].msg_hdr.msg_name = <void *>&address[0]
        msgs[n].msg_hdr.msg_namelen = <socklen_t>address.shape[0]
        msgs[n].msg_hdr.msg_iov = &iovs[n]
        msgs[n].msg_hdr.msg_iovlen = 1
        covers[n] = available
        offset += available
        remaining -= available
        n += 1
    if n == 0:
        return (0, 0, 0)
    with nogil:
        sent = sendmmsg(fd, msgs, n, MSG_DONTWAIT)
    if sent <= 0:
        return (0, 0, 0)
    for i in range(sent):
        covered += covers[i]
        sent_bytes += msgs[i].msg_len
    return (covered, sent, sent_bytes)


def udp_receive_batch(int fd, buffer, int32_t slot_length, int32_t[::1] lengths not None,
                      uint64_t[::1] sources not None) -> int:
    """Receive up to ``len(lengths)`` (<= 64) datagrams with one non-blocking recvmmsg into
    ``buffer``, datagram i at offset ``i * slot_length``; its length goes to ``lengths[i]`` and its
    IPv4 source to ``sources[i]`` (address << 16 | port, both in host order). Returns the count (0
    when nothing is waiting or on an error such as a pending ICMP error)."""
    cdef TermBuffer b = TermBuffer(buffer, True)
    cdef int count = lengths.shape[0] if lengths.shape[0] < MAX_BATCH else MAX_BATCH
    if slot_length <= 0:
        raise ValueError(f"slot_length={slot_length} must be positive")
    if sources.shape[0] < count or <Py_ssize_t>count * slot_length > b.view.len:
        raise ValueError(f"buffer of {b.view.len} bytes or sources[{sources.shape[0]}] too small for {count} "
                         f"datagrams of {slot_length} bytes")
    cdef mmsghdr msgs[MAX_BATCH]
    cdef iovec iovs[MAX_BATCH]
    cdef sockaddr_in names[MAX_BATCH]
    cdef int i, received
    for i in range(count):
        iovs[i].iov_base = <char *>b.view.buf + <Py_ssize_t>i * slot_length
        iovs[i].iov_len = slot_length
        memset(&msgs[i], 0, sizeof(mmsghdr))
        msgs[i].msg_hdr.msg_name = &names[i]
        msgs[i].msg_hdr.msg_namelen = sizeof(sockaddr_in)
        msgs[i].msg_hdr.msg_iov = &iovs[i]
        msgs[i].msg_hdr.msg_iovlen = 1
    with nogil:
        received = recvmmsg(fd, msgs, count, MSG_DONTWAIT, NULL)
    if received <= 0:
        return 0
    for i in range(received):
        lengths[i] = <int32_t>msgs[i].msg_len
        sources[i] = ((<uint64_t>_ntohl(names[i].sin_addr.s_addr)) << 16) | _ntohs(names[i].sin_port)
    return received


cdef inline uint32_t _ntohl(uint32_t v) noexcept nogil:
    return ((v & 0xFF) << 24) | ((v & 0xFF00) << 8) | ((v >> 8) & 0xFF00) | (v >> 24)


cdef inline uint16_t _ntohs(uint16_t v) noexcept nogil:
    return <uint16_t>(((v & 0xFF) << 8) | (v >> 8))
