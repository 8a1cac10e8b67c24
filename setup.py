"""Build the native core from its Cython sources: one extension per module of ``logbuf/native/`` and the
driver's datagram syscalls (``driver/_udp.pyx`` → ``logbuf.driver._udp``); everything else is pure Python."""

from Cython.Build import cythonize
from setuptools import Extension, setup

NATIVE_MODULES = ["constants", "atomics", "term", "log_view", "topic_filter", "reader", "publisher"]

extensions = [
    Extension(
        f"logbuf.native.{name}",
        sources=[f"logbuf/native/{name}.pyx"],
        include_dirs=["logbuf/native"],
        extra_compile_args=["-O3", "-std=c11"],
    )
    for name in NATIVE_MODULES
] + [
    Extension(
        "logbuf.driver._udp",
        sources=["driver/_udp.pyx"],
        include_dirs=["logbuf/native"],
        extra_compile_args=["-O3", "-std=c11"],
    )
]

setup(
    ext_modules=cythonize(
        extensions,
        include_path=["."],  # `cimport logbuf.native.*` from driver/_udp.pyx too
        compiler_directives={
            "language_level": "3",
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": False,
        },
    )
)
