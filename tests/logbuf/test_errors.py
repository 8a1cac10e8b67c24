"""The error vocabulary: every exception class in the package derives from LogbufError, and
ValueError is a second base only where the error is bad input."""

from __future__ import annotations

import importlib
import inspect
import pathlib
import pkgutil
import tomllib
from collections.abc import Iterator
from types import ModuleType

import pytest

import logbuf
from logbuf import errors
from logbuf.errors import LogbufError

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


def top_level_packages() -> set[str]:
    """``logbuf``'s subpackages: the folders inside ``logbuf/`` and those pyproject maps into it."""
    found = {f"logbuf.{m.name}" for m in pkgutil.iter_modules(logbuf.__path__) if m.ispkg}
    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return found | {name for name in package_dir if name != "logbuf"}


def walk(name: str) -> Iterator[ModuleType]:
    """``name`` and every module below it, imported."""
    module = importlib.import_module(name)
    yield module
    for info in pkgutil.iter_modules(getattr(module, "__path__", [])):
        yield from walk(f"{name}.{info.name}")


def every_module() -> list[ModuleType]:
    modules = {m.__name__: m for m in walk("logbuf")}
    for package in top_level_packages():
        modules.update((m.__name__, m) for m in walk(package))
    return sorted(modules.values(), key=lambda m: m.__name__)


def exception_classes() -> dict[str, type[BaseException]]:
    """Every exception class defined in a module of the package, by qualified name."""
    found: dict[str, type[BaseException]] = {}
    for module in every_module():
        for value in vars(module).values():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == module.__name__:
                found[f"{module.__name__}.{value.__qualname__}"] = value
    return found


def test_the_walk_sees_every_component_of_the_package() -> None:
    names = {m.__name__ for m in every_module()}
    for expected in (
        "logbuf.errors",
        "logbuf.conduit.cnc",
        "logbuf.protocol.codec",
        "logbuf.driver.conductor",
        "logbuf.client.aeron",
        "logbuf.archive.catalog",
        "logbuf.archive.spark",
        "logbuf.jetstream.ingest",
    ):
        assert expected in names


def test_every_exception_class_in_the_package_derives_from_logbuf_error() -> None:
    classes = exception_classes()
    assert "logbuf.archive.catalog.CatalogError" in classes and "logbuf.jetstream.ingest.IngestError" in classes
    outside = sorted(name for name, cls in classes.items() if not issubclass(cls, LogbufError))
    assert outside == [], f"exception classes not rooted at LogbufError: {outside}"


def test_logbuf_errors_exports_the_library_hierarchy() -> None:
    exported = {name: getattr(errors, name) for name in errors.__all__ if name != "ErrorCode"}
    assert all(issubclass(cls, LogbufError) for cls in exported.values())
    assert issubclass(errors.ErrorCode, int)  # the error codes ON_ERROR carries, beside the exceptions
    for defined_elsewhere in (
        "logbuf.shm.ShmError",
        "logbuf.conduit.cnc.CncNotReadyError",
        "logbuf.conduit.command_descriptor.MalformedCommandError",
        "logbuf.conduit.broadcast.BroadcastLappedError",
        "logbuf.logbuffer.data_header_descriptor.FrameError",
        "logbuf.logbuffer.log_buffer_descriptor.LogBufferError",
        "logbuf.protocol.MalformedFrameError",
        "logbuf.channel_uri.InvalidChannelError",
    ):
        module, name = defined_elsewhere.rsplit(".", 1)
        assert getattr(importlib.import_module(module), name) is exported[name], defined_elsewhere


@pytest.mark.parametrize(
    "name",
    [
        "ConfigurationError",
        "InvalidChannelError",
        "LogBufferError",
        "FrameError",
        "MalformedFrameError",
        "MalformedCommandError",
    ],
)
def test_errors_about_bad_input_are_value_errors(name: str) -> None:
    assert issubclass(getattr(errors, name), ValueError)


@pytest.mark.parametrize(
    "name",
    [
        "ClosedError",
        "DriverTimeoutError",
        "RegistrationError",
        "ShmError",
        "CncError",
        "CncNotReadyError",
        "CncVersionError",
        "BroadcastLappedError",
    ],
)
def test_lifecycle_errors_are_not_value_errors(name: str) -> None:
    assert not issubclass(getattr(errors, name), ValueError)


def test_a_cnc_that_is_not_ready_is_a_lifecycle_error(tmp_path: pathlib.Path) -> None:
    from logbuf.conduit.cnc import CncFile

    (tmp_path / "cnc.dat").write_bytes(b"")  # a driver that has created the file and not yet sized it
    with pytest.raises(errors.CncNotReadyError, match="is being initialised") as info:
        CncFile.open(str(tmp_path))
    assert isinstance(info.value, errors.ShmError) and not isinstance(info.value, ValueError)


def test_a_registration_error_names_the_code_and_the_correlation_id() -> None:
    error = errors.RegistrationError(42, 1, "bad channel")
    assert str(error) == "INVALID_CHANNEL: bad channel (correlation_id=42)"
    assert (error.correlation_id, error.error_code, error.driver_message) == (42, 1, "bad channel")
