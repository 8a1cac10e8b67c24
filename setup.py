"""Build the native core (logbuf._native) from its Cython source; everything else is pure Python."""

from Cython.Build import cythonize
from setuptools import Extension, setup

extensions = [
    Extension(
        "logbuf._native",
        sources=["logbuf/_native.pyx"],
        include_dirs=["logbuf"],
        extra_compile_args=["-O3", "-std=c11"],
    )
]

setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives={
            "language_level": "3",
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": False,
        },
    )
)
