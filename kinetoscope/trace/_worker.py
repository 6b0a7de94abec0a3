"""Worker process for ``load_traces``: parse trace files into the Parquet cache.

Run as ``python -m kinetoscope.trace._worker`` with a JSON job on stdin:
``{"root": cache dir, "jobs": [{"path", "key", "salvage"}, ...]}``. Prints one JSON line per
job: ``{"i": n, "ok": true}`` or ``{"i": n, "ok": false, "error": {TraceError fields}}``.
A separate interpreter (not multiprocessing) so that the caller's ``__main__`` is never
re-imported and Polars' thread pool is never forked.
"""

from __future__ import annotations

import sys
from typing import Any

import orjson


def main() -> None:
    job = orjson.loads(sys.stdin.buffer.read())
    from kinetoscope.trace.cache import TraceCache
    from kinetoscope.trace.errors import TraceError
    from kinetoscope.trace.loader import parse_trace

    store = TraceCache(job["root"])
    for i, item in enumerate(job["jobs"]):
        try:
            trace = parse_trace(item["path"], salvage=item["salvage"], locate=False)
            ok = store.put(item["key"], trace) is not None
            del trace
            out: dict[str, Any] = {"i": i, "ok": ok}
        except TraceError as e:
            out = {
                "i": i,
                "ok": False,
                "error": {
                    "path": e.path,
                    "problem": e.problem,
                    "offset": e.offset,
                    "event_index": e.event_index,
                    "field": e.field,
                },
            }
        except Exception as e:  # noqa: BLE001 - reported; the parent re-parses in-process
            out = {"i": i, "ok": False, "crash": f"{type(e).__name__}: {e}"}
        sys.stdout.buffer.write(orjson.dumps(out) + b"\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
