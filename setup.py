"""Build of the optional native trace decoder (kinetoscope/trace/_native/_decoder.c).

Everything else about the package is in pyproject.toml. The extension is ``optional``: when
it cannot be compiled (no C compiler), ``pip install`` still succeeds and the trace loader uses
its Python path (docs/trace-loading.md, "Native decoder"). ``KSCOPE_NATIVE_CFLAGS`` adds
compiler flags (``make asan`` builds it with AddressSanitizer/UBSan that way).
"""

from __future__ import annotations

import os
import shlex

from setuptools import Extension, setup  # type: ignore[import-untyped]

extra = shlex.split(os.environ.get("KSCOPE_NATIVE_CFLAGS", ""))
setup(
    ext_modules=[
        Extension(
            "kinetoscope.trace._native._decoder",
            sources=["kinetoscope/trace/_native/_decoder.c"],
            extra_compile_args=["-O3", "-std=c99", "-Wall", "-Wno-unused-function", *extra],
            extra_link_args=[f for f in extra if f.startswith("-fsanitize")],
            optional=True,
        )
    ]
)
