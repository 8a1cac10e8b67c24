"""logbuf's media driver: owns the shared-memory logs and counters that clients publish and subscribe through."""

from driver.context import DriverContext
from driver.media_driver import ActiveDriverError, MediaDriver

__all__ = ["ActiveDriverError", "DriverContext", "MediaDriver"]
