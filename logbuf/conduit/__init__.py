"""The conduit between clients and the media driver: everything in the CnC file.

The many-to-one ring buffer (commands to the driver), the broadcast buffer (responses and events to
clients), counters, the distinct error log, the CnC file that holds them, and the command and
response encodings. Imports only ``logbuf``'s own base modules and the native core.
"""
