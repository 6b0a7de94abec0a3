"""Build msgspec's type information for a module's Structs while one thread runs.

Why: msgspec (0.22, on CPython with the GIL) builds a Struct class's type information the first
time the class is decoded or converted, and publishes it on the class *before* its field types
are filled in. Building calls back into Python, so another thread can run meanwhile; if it
decodes the same class then, it reads the half-built information and the process dies with
SIGSEGV and no Python traceback. Kinetoscope decodes the same answers from several threads at
once (the autopilot's discovery sweep asks every host in parallel, the trigger fans out, the
web app serves requests from a thread pool), so a fresh process could die on its first sweep.

The cure: every module that defines Structs calls :func:`prime_structs` with its
``globals()`` as its last statement. Python's import lock keeps other threads from using a
module's classes until its import finishes, so the information is complete before any thread
can decode one. ``PRIMED`` records the classes built, so a test can check that no module forgot.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

# Every Struct class whose type information was built at import (tests check it is all of them)
PRIMED: set[type] = set()


def prime_structs(namespace: Mapping[str, object]) -> None:
    """Build the type information of every Struct class defined in the module whose
    ``globals()`` is ``namespace`` (classes it merely imports are primed by their own module)."""
    module = namespace["__name__"]
    for value in tuple(namespace.values()):
        if isinstance(value, type) and issubclass(value, msgspec.Struct) and value.__module__ == module:
            msgspec.json.Decoder(value)
            PRIMED.add(value)
