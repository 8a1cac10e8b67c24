"""Helpers of logbuf's own tests that are no use outside them (standalone logs, archive control messages,
the SBE judge). The public test kit (fake clock, lossy link network, driver processes, stepped drivers,
``wait_until``) is :mod:`logbuf.testing`.
"""
