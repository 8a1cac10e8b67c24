"""logbuf's media driver: owns the shared-memory logs and counters that clients publish and subscribe through."""

from logbuf.driver.context import DriverContext
from logbuf.driver.media_driver import ActiveDriverError, MediaDriver

__all__ = ["ActiveDriverError", "DriverContext", "MediaDriver"]
