"""TraceError: a bad trace file, named with where it went wrong."""

from __future__ import annotations

from typing import Any

from kinetoscope.errors import KinetoscopeError


class TraceError(KinetoscopeError):
    """A trace file could not be read. The message names the file and, where known, the byte
    offset (in the decompressed JSON) or the index of the offending event in ``traceEvents``."""

    def __init__(
        self,
        path: str,
        problem: str,
        *,
        offset: int | None = None,
        event_index: int | None = None,
        field: str | None = None,
    ) -> None:
        self.path = str(path)
        self.problem = problem
        self.offset = offset
        self.event_index = event_index
        self.field = field
        where = []
        if offset is not None:
            where.append(f"byte {offset}")
        if event_index is not None:
            where.append(f"traceEvents[{event_index}]")
        if field is not None:
            where.append(f"field {field!r}")
        loc = f" ({', '.join(where)})" if where else ""
        super().__init__(f"{self.path}{loc}: {problem}")

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:  # picklable across worker processes (load_traces)
        return (
            _rebuild_trace_error,
            (self.path, self.problem, self.offset, self.event_index, self.field),
        )


def _rebuild_trace_error(
    path: str, problem: str, offset: int | None, event_index: int | None, field: str | None
) -> TraceError:
    return TraceError(path, problem, offset=offset, event_index=event_index, field=field)
