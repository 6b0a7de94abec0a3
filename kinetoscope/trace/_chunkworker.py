"""Worker process for :mod:`kinetoscope.trace.parallel` (``python -m kinetoscope.trace._chunkworker
FD SLOTS SLOT_BYTES``): decodes chunks of a trace file from shared memory and sends their
tables back as Arrow IPC. A separate interpreter, so that no Polars thread pool is forked."""

from kinetoscope.trace.parallel import worker_main

if __name__ == "__main__":
    worker_main()
