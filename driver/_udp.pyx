# cython: language_level=3
"""The media driver's datagram syscalls and its data path: one ``sendmmsg`` sends a run of a term's frames as
datagrams, one ``recvmmsg`` receives a batch into a buffer of slots. Non-blocking; a full socket buffer or an
error (a bad descriptor included) sends or receives fewer, down to none, and is never raised in the duty cycle.

The data path is the same for every transport (the driver's UDP sockets and the tests' in-memory links):

- **receive**: :func:`insert_data_batch` runs over a batch of received datagrams (``udp_receive_data`` is
  recvmmsg then this). Each DATA, PAD or heartbeat datagram of an active image's session, from the image's
  source address, is decided by the image's :class:`ImageReceiver` with the one window rule: inserted into
  its term (raising the high-water mark), or counted as a heartbeat, an over-run or an under-run, with no
  Python per datagram. What it does not take (control frames, new sessions, anything invalid, another
  source) is left for the Python dispatch, which checks, counts and drops it. A datagram the dispatch
  hands to an image one by one (fault injection, a test) goes through the same rule
  (:meth:`ImageReceiver.on_datagram`).
- **send**: :func:`term_datagrams` cuts committed frames of a term into datagrams (``term_send_datagrams`` is
  this then sendmmsg), scanning with the same inline availability scan as the log buffer code
  (``logbuf.native.term``): a frame length read from the term can never put a datagram outside it.
"""

from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memset
from posix.time cimport timespec

from logbuf.native.constants cimport (
    EOS_FLAG,
    FLAGS_OFFSET,
    HDR_TYPE_DATA,
    HDR_TYPE_PAD,
    HEADER_LENGTH,
    SESSION_ID_OFFSET,
    STREAM_ID_OFFSET,
    TERM_ID_OFFSET,
    TERM_OFFSET_OFFSET,
    VERSION_OFFSET,
)
from logbuf.native.log_view cimport LogView
from logbuf.native.term cimport (
    TermBuffer,
    check_data_frames,
    check_term,
    frame_type,
    partition_index,
    rebuild_insert,
    scan_for_availability,
)


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
    cdef struct cmsghdr:
        size_t cmsg_len
        int cmsg_level
        int cmsg_type
    int sendmmsg(int sockfd, mmsghdr *msgvec, unsigned int vlen, int flags)
    int recvmmsg(int sockfd, mmsghdr *msgvec, unsigned int vlen, int flags, void *timeout)
    ssize_t sendmsg(int sockfd, const msghdr *msg, int flags)
    cmsghdr *CMSG_FIRSTHDR(msghdr *msg)
    cmsghdr *CMSG_NXTHDR(msghdr *msg, cmsghdr *cmsg)
    unsigned char *CMSG_DATA(cmsghdr *cmsg)
    size_t CMSG_SPACE(size_t length)
    size_t CMSG_LEN(size_t length)
    enum: MSG_DONTWAIT

cdef extern from "<errno.h>" nogil:
    int errno
    enum: EAGAIN
    enum: ENOBUFS
    enum: EIO
    enum: EINVAL
    enum: EOPNOTSUPP

cdef extern from "<poll.h>" nogil:
    cdef struct pollfd:
        int fd
        short events
        short revents
    ctypedef unsigned long nfds_t
    enum: POLLIN
    int ppoll(pollfd *fds, nfds_t nfds, const timespec *tmo_p, const void *sigmask)

cdef extern from "<netinet/in.h>" nogil:
    enum: IPPROTO_UDP
    cdef struct in_addr:
        uint32_t s_addr
    cdef struct sockaddr_in:
        uint16_t sin_family
        uint16_t sin_port
        in_addr sin_addr

cdef enum: MAX_BATCH = 64
cdef enum: UDP_SEGMENT = 103  # linux/udp.h: the sender's GSO segment size (a cmsg or socket option)
cdef enum: UDP_GRO = 104  # linux/udp.h: receive coalesced datagrams with their segment size (a cmsg)
cdef enum: MAX_GRO_SEGMENTS = 64  # the kernel's UDP_GRO_CNT_MAX: datagrams in one coalesced read
cdef enum: MAX_GSO_PAYLOAD = 65507  # one IPv4 UDP send: 65535 - 20 (IP) - 8 (UDP)
cdef enum: CMSG_ROOM = 64  # bytes of room for the UDP_SEGMENT or UDP_GRO cmsg of one send or read
cdef enum: CMSG_WORDS = CMSG_ROOM // 8  # control buffers are uint64_t arrays: aligned for struct cmsghdr
UDP_GRO_SEGMENTS = MAX_GRO_SEGMENTS
"""The most datagrams one coalesced (UDP_GRO) read holds: receive arrays need this many entries per slot."""
UDP_GRO_OPTION = UDP_GRO
"""The IPPROTO_UDP socket option that turns coalesced reads on (what :func:`udp_receive_batch` splits)."""
UDP_SEGMENT_OPTION = UDP_SEGMENT
"""The IPPROTO_UDP socket option (or cmsg) giving a send's GSO segment size."""


def wait_readable(int fd, int64_t timeout_ns) -> bool:
    """Wait, with the GIL released, until ``fd`` is readable or ``timeout_ns`` has passed: the idle park
    on the driver's epoll sets. ``ppoll`` takes nanoseconds and any descriptor number, where
    ``epoll.poll`` and ``poll`` round a timeout up to a whole millisecond (a 20 us park would take 1 ms)
    and ``select`` fails on descriptors past 1023. Returns whether it is readable (False on a timeout, a
    signal or an error)."""
    if timeout_ns < 0:
        raise ValueError(f"timeout_ns={timeout_ns} must not be negative")
    cdef pollfd entry
    cdef timespec timeout
    cdef int ready
    entry.fd = fd
    entry.events = POLLIN
    entry.revents = 0
    timeout.tv_sec = timeout_ns // 1_000_000_000
    timeout.tv_nsec = timeout_ns % 1_000_000_000
    with nogil:
        ready = ppoll(&entry, 1, &timeout, NULL)
    return ready > 0 and (entry.revents & POLLIN) != 0


cdef int _plan(TermBuffer b, int32_t term_offset, int32_t max_length, int32_t mtu, int max_datagrams,
               iovec *iovs, int32_t *covers) noexcept:
    """The datagrams of committed whole frames from ``term_offset``: each at most ``mtu``, together at most
    ``max_length`` of the term, at most ``max_datagrams`` (<= MAX_BATCH); a PAD frame travels as its 32-byte
    header. Fills ``iovs`` (what goes on the wire) and ``covers`` (the term bytes each stands for); returns
    the count."""
    cdef const char *term = <const char *>b.view.buf
    cdef int32_t term_length = <int32_t>b.view.len
    cdef int32_t offset = term_offset, remaining = max_length, available, wire
    cdef int n = 0
    while n < max_datagrams and remaining > 0:
        available = scan_for_availability(term, offset, mtu if mtu < remaining else remaining, term_length)
        if available <= 0:
            break
        wire = HEADER_LENGTH if frame_type(term + offset) == HDR_TYPE_PAD else available
        iovs[n].iov_base = <void *>(term + offset)
        iovs[n].iov_len = wire
        covers[n] = available
        offset += available
        remaining -= available
        n += 1
    return n


def term_datagrams(term_buffer, int32_t term_offset, int32_t max_length, int32_t mtu, int max_datagrams,
                   int32_t[::1] offsets not None, int32_t[::1] lengths not None, int32_t[::1] covers not None) -> int:
    """The sender's cut of a term into datagrams, as :func:`term_send_datagrams` sends them, for transports
    that deliver them otherwise (the tests' in-memory links): datagram i is ``lengths[i]`` bytes of the term
    at ``offsets[i]`` and stands for ``covers[i]`` term bytes (a PAD travels as its header). At most
    ``max_datagrams`` and the arrays' length (<= 64); returns the count."""
    cdef TermBuffer b = TermBuffer(term_buffer, False)
    check_term(b, term_offset)
    cdef Py_ssize_t room = min(offsets.shape[0], lengths.shape[0], covers.shape[0])
    if max_datagrams > room:
        max_datagrams = <int>room
    if max_datagrams > MAX_BATCH:
        max_datagrams = MAX_BATCH
    cdef iovec iovs[MAX_BATCH]
    cdef int32_t spans[MAX_BATCH]
    cdef int n = _plan(b, term_offset, max_length, mtu, max_datagrams, iovs, spans), i
    for i in range(n):
        offsets[i] = <int32_t>(<const char *>iovs[i].iov_base - <const char *>b.view.buf)
        lengths[i] = <int32_t>iovs[i].iov_len
        covers[i] = spans[i]
    return n


def term_send_datagrams(int fd, term_buffer, int32_t term_offset, int32_t max_length, int32_t mtu,
                        const unsigned char[::1] address not None, int max_datagrams, bint gso=False) -> tuple:
    """The sender's hot loop: the datagrams :func:`term_datagrams` cuts (at most ``max_datagrams``, <= 64)
    sent to ``address`` (a packed ``struct sockaddr``), non-blocking.

    With ``gso``, each run of datagrams that lie back to back in the term, all as long as the first but the
    last (no longer), goes with one ``sendmsg`` and a UDP_SEGMENT cmsg: the kernel cuts it into exactly the
    datagrams sendmmsg would have sent (what reaches the wire, or a peer's socket, is the same), but runs
    its send path once per run instead of once per datagram. The rest go with one sendmmsg.

    Returns (term bytes the sent datagrams cover, datagrams sent, bytes sent, whether a GSO send was
    refused by the kernel: the caller then stops asking for GSO); a full socket buffer or a send error
    sends fewer (0 on error)."""
    cdef TermBuffer b = TermBuffer(term_buffer, False)
    check_term(b, term_offset)
    if max_datagrams > MAX_BATCH:
        max_datagrams = MAX_BATCH
    cdef mmsghdr msgs[MAX_BATCH]
    cdef iovec iovs[MAX_BATCH]
    cdef int32_t covers[MAX_BATCH]
    cdef int n = _plan(b, term_offset, max_length, mtu, max_datagrams, iovs, covers), sent, i
    cdef int64_t covered = 0, sent_bytes = 0
    for i in range(n):
        memset(&msgs[i], 0, sizeof(mmsghdr))
        msgs[i].msg_hdr.msg_name = <void *>&address[0]
        msgs[i].msg_hdr.msg_namelen = <socklen_t>address.shape[0]
        msgs[i].msg_hdr.msg_iov = &iovs[i]
        msgs[i].msg_hdr.msg_iovlen = 1
    if n == 0:
        return (0, 0, 0, False)
    cdef int done = 0, run
    cdef int64_t run_bytes
    cdef bint refused = False
    if gso:
        while done < n - 1:
            run = _gso_run(iovs, covers, done, n, &run_bytes)
            if run < 2:
                break
            sent = _send_gso(fd, &address[0], <socklen_t>address.shape[0], iovs[done].iov_base, run_bytes,
                             covers[done])
            if sent == -1:  # the kernel cannot segment on this route: sendmmsg from here on
                refused = True
                break
            if sent <= 0:  # socket buffer full, or a send error (as sendmmsg's: fewer sent, none raised)
                return (covered, done, sent_bytes, False)
            covered += run_bytes  # whole datagrams: each covers what it carries
            sent_bytes += run_bytes
            done += run
    if done < n:
        with nogil:
            sent = sendmmsg(fd, &msgs[done], n - done, MSG_DONTWAIT)
        if sent > 0:
            for i in range(done, done + sent):
                covered += covers[i]
                sent_bytes += msgs[i].msg_len
            done += sent
    return (covered, done, sent_bytes, refused)


cdef int _gso_run(iovec *iovs, const int32_t *covers, int first, int n, int64_t *total) noexcept:
    """How many datagrams from ``first`` one GSO send can carry: whole (not a PAD header standing for more
    term), as long as the first but the last (no longer), together within one UDP payload; their bytes go
    to ``total``."""
    cdef int32_t segment = covers[first]
    cdef int i = first
    total[0] = 0
    while i < n and i - first < MAX_GRO_SEGMENTS:
        if <int32_t>iovs[i].iov_len != covers[i] or covers[i] > segment or total[0] + covers[i] > MAX_GSO_PAYLOAD:
            break
        total[0] += covers[i]
        i += 1
        if covers[i - 1] != segment:  # a shorter datagram ends the run
            break
    return i - first


cdef int _send_gso(int fd, const unsigned char *name, socklen_t name_length, void *start, int64_t length,
                   int32_t segment) noexcept:
    """One sendmsg of the ``length`` bytes at ``start`` (datagrams back to back), cut by the kernel every
    ``segment`` bytes: 1 when sent, 0 when the socket buffer is full, -1 when the kernel refuses to segment
    (no checksum offload on the route's device, an old kernel), -2 on another send error."""
    cdef iovec whole
    cdef msghdr msg
    cdef uint64_t control[CMSG_WORDS]
    cdef cmsghdr *cmsg
    whole.iov_base = start
    whole.iov_len = <size_t>length
    memset(&msg, 0, sizeof(msghdr))
    memset(control, 0, sizeof(control))
    msg.msg_name = <void *>name
    msg.msg_namelen = name_length
    msg.msg_iov = &whole
    msg.msg_iovlen = 1
    msg.msg_control = <void *>control
    msg.msg_controllen = CMSG_SPACE(sizeof(uint16_t))
    cmsg = CMSG_FIRSTHDR(&msg)
    cmsg.cmsg_level = IPPROTO_UDP
    cmsg.cmsg_type = UDP_SEGMENT
    cmsg.cmsg_len = CMSG_LEN(sizeof(uint16_t))
    (<uint16_t *>CMSG_DATA(cmsg))[0] = <uint16_t>segment
    cdef ssize_t rc
    with nogil:
        rc = sendmsg(fd, &msg, MSG_DONTWAIT)
    if rc >= 0:
        return 1
    if errno == EAGAIN or errno == ENOBUFS:  # EWOULDBLOCK is EAGAIN on Linux
        return 0
    if errno == EIO or errno == EINVAL or errno == EOPNOTSUPP:
        return -1
    return -2


cdef int _receive(int fd, Py_buffer *b, int32_t slot_length, int32_t[::1] offsets, int32_t[::1] lengths,
                  uint64_t[::1] sources) except -1:
    """One non-blocking recvmmsg into ``b``'s slots. Each datagram read gets an entry: its offset in ``b``,
    its length and its source. A coalesced read (UDP_GRO on the socket: datagrams of one flow, all of the
    segment size its cmsg gives but the last) gets one entry per datagram in it, so callers see exactly the
    datagrams sent. Returns the entry count.

    ``lengths`` (and ``offsets``, ``sources``, at least as long) hold the entries: with at least
    ``UDP_GRO_SEGMENTS`` entries per slot a coalesced read always fits; with fewer, only one per slot is
    read (a socket without UDP_GRO). Slots are ``slot_length`` apart, at most 64 of them."""
    cdef Py_ssize_t capacity = lengths.shape[0]
    if slot_length <= 0:
        raise ValueError(f"slot_length={slot_length} must be positive")
    if offsets.shape[0] < capacity or sources.shape[0] < capacity:
        raise ValueError(f"offsets[{offsets.shape[0]}] and sources[{sources.shape[0]}] must be as long as "
                         f"lengths[{capacity}]")
    cdef Py_ssize_t count = min(<Py_ssize_t>MAX_BATCH, b.len // slot_length)
    if capacity >= MAX_GRO_SEGMENTS:
        count = min(count, capacity // MAX_GRO_SEGMENTS)
    else:
        count = min(count, capacity)
    if count <= 0:
        raise ValueError(f"buffer of {b.len} bytes or lengths[{capacity}] too small for one datagram of "
                         f"{slot_length} bytes")
    cdef mmsghdr msgs[MAX_BATCH]
    cdef iovec iovs[MAX_BATCH]
    cdef sockaddr_in names[MAX_BATCH]
    cdef uint64_t controls[MAX_BATCH][CMSG_WORDS]
    cdef int i, received
    for i in range(count):
        iovs[i].iov_base = <char *>b.buf + <Py_ssize_t>i * slot_length
        iovs[i].iov_len = slot_length
        memset(&msgs[i], 0, sizeof(mmsghdr))
        msgs[i].msg_hdr.msg_name = &names[i]
        msgs[i].msg_hdr.msg_namelen = sizeof(sockaddr_in)
        msgs[i].msg_hdr.msg_iov = &iovs[i]
        msgs[i].msg_hdr.msg_iovlen = 1
        msgs[i].msg_hdr.msg_control = <void *>controls[i]
        msgs[i].msg_hdr.msg_controllen = CMSG_ROOM
    with nogil:
        received = recvmmsg(fd, msgs, <unsigned int>count, MSG_DONTWAIT, NULL)
    if received <= 0:
        return 0
    cdef int entries = 0
    cdef int32_t length, segment, offset, base
    cdef uint64_t source
    cdef cmsghdr *cmsg
    for i in range(received):
        length = <int32_t>msgs[i].msg_len
        source = ((<uint64_t>_ntohl(names[i].sin_addr.s_addr)) << 16) | _ntohs(names[i].sin_port)
        base = <int32_t>(i * slot_length)
        segment = 0
        cmsg = CMSG_FIRSTHDR(&msgs[i].msg_hdr)
        while cmsg != NULL:
            if cmsg.cmsg_level == IPPROTO_UDP and cmsg.cmsg_type == UDP_GRO and cmsg.cmsg_len >= CMSG_LEN(sizeof(int)):
                segment = (<int *>CMSG_DATA(cmsg))[0]
            cmsg = CMSG_NXTHDR(&msgs[i].msg_hdr, cmsg)
        if segment <= 0 or segment >= length:
            segment = length if length > 0 else 1
        offset = 0
        while True:
            if entries >= capacity:  # more than UDP_GRO_SEGMENTS in one read: the rest is lost, as on a full socket
                return entries
            offsets[entries] = base + offset
            lengths[entries] = min(segment, length - offset)
            sources[entries] = source
            entries += 1
            offset += segment
            if offset >= length:
                break
    return entries


def udp_receive_batch(int fd, buffer, int32_t slot_length, int32_t[::1] offsets not None,
                      int32_t[::1] lengths not None, uint64_t[::1] sources not None) -> int:
    """Receive datagrams with one non-blocking recvmmsg into ``buffer``'s slots (``slot_length`` apart;
    see ``_receive`` for how many): datagram i is ``lengths[i]`` bytes at ``offsets[i]``, from the IPv4
    ``sources[i]`` (address << 16 | port, both in host order). Returns the count (0 when nothing is
    waiting or on an error such as a pending ICMP error)."""
    cdef TermBuffer b = TermBuffer(buffer, True)
    return _receive(fd, &b.view, slot_length, offsets, lengths, sources)


cdef enum:
    NOT_TAKEN = 0
    INSERTED = 1
    HEARTBEAT = 2
    BEHIND = 3
    OVER_RUN = 4
    UNDER_RUN = 5

DATA_NOT_TAKEN = NOT_TAKEN
""":meth:`ImageReceiver.on_datagram`: invalid (the caller counts it as an invalid packet)."""
DATA_INSERTED = INSERTED
"""Inserted into its term (possibly a duplicate of frames already there: the rebuild skips them)."""
DATA_HEARTBEAT = HEARTBEAT
"""A heartbeat (no term bytes): its position may raise the HWM or mark the end of the stream."""
DATA_BEHIND = BEHIND
"""Behind rcv-pos but not behind the subscribers: already rebuilt, dropped uncounted."""
DATA_OVER_RUN = OVER_RUN
"""Past the window above the slowest subscriber: dropped and counted ("Flow control over runs")."""
DATA_UNDER_RUN = UNDER_RUN
"""Behind the slowest subscriber: dropped and counted ("Flow control under runs")."""


cdef class ImageReceiver:
    """The native half of one publication image's receive path: the one rule deciding each DATA, PAD or
    heartbeat datagram of the image, for :func:`insert_data_batch` and :meth:`on_datagram`.

    The image's identity (session, stream, the source address its SETUP came from, as ``address << 16 |
    port``; 0 matches no datagram of a batch) and its log are fixed; before each batch its owner sets
    ``rebuild`` (rcv-pos), ``floor`` (the slowest subscriber's position), ``hwm`` and ``eos_position``,
    zeroes the tallies, and reads them back after it. The rule: a heartbeat inside the window
    (``position <= floor + term/2``) may raise the HWM, and marks the end of the stream if it has the EOS
    flag and is not behind rcv-pos; data is inserted if ``rebuild <= position``, ``floor <= position`` and
    ``position + length <= floor + term/2`` (a PAD writes only its header, as Aeron's check does), else
    counted as an over-run (at or past rcv-pos) or an under-run (behind the subscribers). A heartbeat past
    the window, or an over-run, raises the HWM to the window's end: the sender has sent all of the window,
    so what is missing of it gets NAKed, and the window moves as subscribers consume it (without this, a
    receiver over half a term behind a sender paced by a faster receiver, fc=max, never learned of the
    data it dropped once the sender stopped, and stalled until the publication went). A stale ``floor``
    can only be lower than the truth: the window is then stricter, never looser.
    """

    cdef LogView _log
    cdef char *_terms[3]
    cdef int32_t _shift
    cdef readonly int32_t session_id
    cdef readonly int32_t stream_id
    cdef readonly int32_t term_length
    cdef readonly int32_t initial_term_id
    cdef readonly uint64_t source_key
    cdef public int64_t rebuild
    cdef public int64_t floor
    cdef public int64_t hwm
    cdef public int64_t eos_position
    cdef public int64_t received  # datagrams decided since the tallies were zeroed (all the kinds below)
    cdef public int64_t inserted
    cdef public int64_t heartbeats
    cdef public int64_t over_runs
    cdef public int64_t under_runs

    def __cinit__(self, LogView log not None, int32_t session_id, int32_t stream_id, uint64_t source_key):
        if log.closed:
            raise ValueError("log is closed")
        self._log = log
        for i in range(3):
            self._terms[i] = log.terms[i]
        self.term_length = log.term_length
        self._shift = log.position_bits_to_shift
        self.initial_term_id = log.initial_term_id
        self.session_id = session_id
        self.stream_id = stream_id
        self.source_key = source_key
        self.rebuild = self.floor = self.hwm = 0
        self.eos_position = -1
        self.received = self.inserted = self.heartbeats = self.over_runs = self.under_runs = 0

    cdef int _on_data(self, const char *p, int32_t length) noexcept:
        """Decide one DATA-path datagram of this image by the rule above; returns a DATA_* code."""
        if self._log.base == NULL:  # the log was closed under us: the dispatch drops it
            return NOT_TAKEN
        cdef int64_t covered = check_data_frames(p, length, self.term_length)
        if covered < 0:
            return NOT_TAKEN
        cdef int32_t term_offset = (<int32_t *>(p + TERM_OFFSET_OFFSET))[0]
        cdef int32_t term_count = <int32_t>((<int32_t *>(p + TERM_ID_OFFSET))[0] - self.initial_term_id)
        cdef int64_t position = ((<int64_t>term_count) << self._shift) + term_offset
        cdef int64_t window_end = self.floor + (self.term_length >> 1)
        self.received += 1
        if covered == 0:  # a heartbeat
            if position <= window_end:
                if (<uint8_t *>(p + FLAGS_OFFSET))[0] & EOS_FLAG and self.rebuild <= position:
                    self.eos_position = position  # a sender's end is never behind what was rebuilt
                if position > self.hwm:
                    self.hwm = position
            elif window_end > self.hwm:
                self.hwm = window_end  # the sender is past the window: all of it was sent, NAK what is missing
            self.heartbeats += 1
            return HEARTBEAT
        if position < self.rebuild or position < self.floor or position + length > window_end:
            if position >= self.rebuild:
                if window_end > self.hwm:
                    self.hwm = window_end  # as for a heartbeat past the window
                self.over_runs += 1
                return OVER_RUN
            if position < self.floor:  # behind what the subscribers consumed: a retransmit someone else asked for
                self.under_runs += 1
                return UNDER_RUN
            return BEHIND
        rebuild_insert(self._terms[partition_index(term_count)] + term_offset, p, length)
        if position + covered > self.hwm:
            self.hwm = position + covered
        self.inserted += 1
        return INSERTED

    def on_datagram(self, packet) -> int:
        """Decide one DATA, PAD or heartbeat datagram of this image (its session and source already
        checked by the caller) by the same rule as a batch: a DATA_* code, DATA_NOT_TAKEN if invalid."""
        cdef TermBuffer d = TermBuffer(packet, False)
        if d.view.len > 0x7FFFFFFF:
            return 0
        return self._on_data(<const char *>d.view.buf, <int32_t>d.view.len)


cdef int64_t _insert_batch(Py_buffer *b, int count, int32_t[::1] offsets, int32_t[::1] lengths,
                           uint64_t[::1] sources, list receivers) except -1:
    """The data path over ``count`` datagrams of a batch: each DATA-path datagram of one of ``receivers``
    from its source that the receiver decides is marked taken (length -1). Returns the bytes of the batch."""
    cdef Py_ssize_t k, n_receivers = PyList_GET_SIZE(receivers)
    for k in range(n_receivers):
        if not isinstance(<object>PyList_GET_ITEM(receivers, k), ImageReceiver):
            raise TypeError("receivers must hold ImageReceiver objects only")
    if count < 0 or count > lengths.shape[0] or count > offsets.shape[0] or count > sources.shape[0]:
        raise ValueError(f"count={count} is outside the batch's {lengths.shape[0]} entries")
    cdef int i
    cdef int64_t total = 0
    cdef int32_t length, offset, session_id, stream_id
    cdef const char *p
    cdef uint16_t type_
    cdef ImageReceiver r
    for i in range(count):
        length = lengths[i]
        offset = offsets[i]
        if length < 0:
            continue
        total += length
        if length < HEADER_LENGTH or offset < 0 or <Py_ssize_t>offset + length > b.len:
            continue
        p = <const char *>b.buf + offset
        type_ = frame_type(p)
        if (<uint8_t *>(p + VERSION_OFFSET))[0] != 0 or (type_ != HDR_TYPE_DATA and type_ != HDR_TYPE_PAD):
            continue
        session_id = (<int32_t *>(p + SESSION_ID_OFFSET))[0]
        stream_id = (<int32_t *>(p + STREAM_ID_OFFSET))[0]
        for k in range(n_receivers):
            r = <ImageReceiver>PyList_GET_ITEM(receivers, k)
            if r.session_id == session_id and r.stream_id == stream_id:
                if r.source_key != 0 and r.source_key == sources[i] and r._on_data(p, length) != NOT_TAKEN:
                    lengths[i] = -1
                break
    return total


def insert_data_batch(buffer, int count, int32_t[::1] offsets not None, int32_t[::1] lengths not None,
                      uint64_t[::1] sources not None, list receivers not None) -> int:
    """The receive data path over a batch already in ``buffer`` (datagram i: ``lengths[i]`` bytes at
    ``offsets[i]`` from ``sources[i]``, as :func:`udp_receive_batch` leaves them): each DATA-path datagram
    that one of ``receivers`` (:class:`ImageReceiver`) decides is marked taken, its length set to -1;
    every other datagram keeps its length for the caller's dispatch. Returns the bytes of the batch."""
    cdef TermBuffer b = TermBuffer(buffer, True)
    return _insert_batch(&b.view, count, offsets, lengths, sources, receivers)


def udp_receive_data(int fd, buffer, int32_t slot_length, int32_t[::1] offsets not None,
                     int32_t[::1] lengths not None, uint64_t[::1] sources not None, list receivers not None) -> tuple:
    """:func:`udp_receive_batch`, then :func:`insert_data_batch` over it. Returns (datagrams, bytes) received."""
    cdef Py_ssize_t k
    for k in range(PyList_GET_SIZE(receivers)):  # before reading: a bad list must not lose a batch
        if not isinstance(<object>PyList_GET_ITEM(receivers, k), ImageReceiver):
            raise TypeError("receivers must hold ImageReceiver objects only")
    cdef TermBuffer b = TermBuffer(buffer, True)
    cdef int count = _receive(fd, &b.view, slot_length, offsets, lengths, sources)
    return count, _insert_batch(&b.view, count, offsets, lengths, sources, receivers)


cdef inline uint32_t _ntohl(uint32_t v) noexcept nogil:
    return ((v & 0xFF) << 24) | ((v & 0xFF00) << 8) | ((v >> 8) & 0xFF00) | (v >> 24)


cdef inline uint16_t _ntohs(uint16_t v) noexcept nogil:
    return <uint16_t>(((v & 0xFF) << 8) | (v >> 8))
