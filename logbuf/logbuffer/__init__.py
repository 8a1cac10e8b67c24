"""The log buffer: three rotating terms plus metadata, and what appends to and reads from them.

Descriptors (``log_buffer_descriptor``, ``data_header_descriptor``), the term algorithms behind
``publication`` and ``image``, reassembly (``fragment_assembler``), flow control and cleaning
(``flow_control``), unblocking a dead claim (``term_unblocker``) and logs with no driver
(``standalone``). Imports only ``logbuf``'s own base modules and the native core.
"""
