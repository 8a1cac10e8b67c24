"""Type stubs for logbuf.native.topic_filter (topic_filter.pyx)."""

from collections.abc import Callable

TOPIC_ID_MASK: int

class TopicFilter:
    deliver_untagged: bool
    delivered: int
    skipped: int
    unresolved: int
    definitions: int
    resolutions: int
    def __init__(
        self,
        resolver: Callable[[int], bool | None],
        on_definition: Callable[[int, bytes], object],
        deliver_untagged: bool = False,
        max_entries: int = ...,
    ) -> None: ...
    @property
    def cached(self) -> int: ...
    def reset(self) -> None: ...
    def accepts(self, value: int, payload: bytes = ...) -> bool: ...
