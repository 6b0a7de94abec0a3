"""Type stub of the C extension (kinetoscope/trace/_native/_decoder.c)."""

from typing import Any

I64: int
F64: int
STR: int

class Column:
    """One column's buffers; Arrow PyCapsule interface (the buffers move to the array)."""

    def __arrow_c_array__(self, requested_schema: object | None = None) -> tuple[object, object]: ...
    def rows(self) -> int: ...

def configure(keys: list[tuple[str, int, int]], ncols: int) -> None: ...
def decode_chunk(data: Any) -> tuple[Any, ...]: ...
