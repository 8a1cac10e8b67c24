"""logbuf: Aeron-style log buffers in shared memory, from Python."""
