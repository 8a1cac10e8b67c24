"""The native core's shared constants (``logbuf/native/constants.pxd``) equal the Python ones they mirror."""

from __future__ import annotations

from enum import IntEnum
from types import ModuleType

from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.logbuffer import log_buffer_descriptor as lbd
from logbuf.logbuffer.image import ControlledPollAction
from logbuf.logbuffer.publication import OfferResult
from logbuf.native import NATIVE_CONSTANTS

DESCRIPTORS: tuple[ModuleType, ...] = (dh, lbd)
ENUMS: dict[str, type[IntEnum]] = {"OfferResult": OfferResult, "ControlledPollAction": ControlledPollAction}


def python_value(name: str) -> int:
    """The Python constant a native constant is named after: ``Enum.MEMBER`` or a descriptor constant."""
    if "." in name:
        enum_name, member = name.split(".")
        return int(ENUMS[enum_name][member])
    holders = [module for module in DESCRIPTORS if hasattr(module, name)]
    assert holders, f"NATIVE_CONSTANTS[{name!r}] names no constant of {[m.__name__ for m in DESCRIPTORS]}"
    values = {int(getattr(module, name)) for module in holders}
    assert len(values) == 1, f"{name} differs between {[m.__name__ for m in holders]}: {values}"
    return values.pop()


def test_every_native_constant_equals_the_python_constant_it_mirrors() -> None:
    assert len(NATIVE_CONSTANTS) >= 35
    wrong = {
        name: (value, python_value(name)) for name, value in NATIVE_CONSTANTS.items() if value != python_value(name)
    }
    assert wrong == {}, f"native value, Python value: {wrong}"


def test_every_offer_result_and_poll_action_has_a_native_twin() -> None:
    for enum_name, enum in ENUMS.items():
        missing = [m.name for m in enum if f"{enum_name}.{m.name}" not in NATIVE_CONSTANTS]
        assert missing == [], f"{enum_name} members the native core does not define: {missing}"


def test_the_check_catches_a_wrong_value() -> None:
    assert python_value("TERM_ID_FIELD_OFFSET") == 20
    assert python_value("OfferResult.ADMIN_ACTION") == -3
    assert python_value("LOG_MTU_LENGTH_OFFSET") != NATIVE_CONSTANTS["LOG_TERM_LENGTH_OFFSET"]
