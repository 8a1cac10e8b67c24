"""Build the native core from its Cython sources: one extension per module of ``logbuf/native/`` and the
driver's datagram syscalls (``driver/_udp.pyx`` → ``logbuf.driver._udp``); everything else is pure Python."""

import os

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class ParallelBuildExt(build_ext):
    """Compile the extensions side by side, one per core, unless ``--parallel`` says otherwise: the reader's
    and the publisher's generated C take most of a build, and CI builds the core three times."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1


NATIVE_MODULES = ["constants", "atomics", "term", "log_view", "topic_filter", "reader", "publisher"]

extensions = [
    Extension(
        f"logbuf.native.{name}",
        sources=[f"logbuf/native/{name}.pyx"],
        include_dirs=["logbuf/native"],
        extra_compile_args=["-O3", "-std=c11", "-g0"],
    )
    for name in NATIVE_MODULES
] + [
    Extension(
        "logbuf.driver._udp",
        sources=["driver/_udp.pyx"],
        include_dirs=["logbuf/native"],
        extra_compile_args=["-O3", "-std=c11", "-g0"],
    )
]

setup(
    cmdclass={"build_ext": ParallelBuildExt},
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
    ),
)
