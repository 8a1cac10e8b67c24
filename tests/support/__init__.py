"""The test kit: real media driver processes, a fake clock and an in-memory datagram link."""
