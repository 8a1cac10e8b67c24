"""Type stubs for logbuf.native.constants (constants.pyx)."""

NATIVE_CONSTANTS: dict[str, int]
