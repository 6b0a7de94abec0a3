"""Worker process for :mod:`kinetoscope.trace.parallel` when no fork server is available
(``python -m kinetoscope.trace._chunkworker SHM_FD IN_FD OUT_FD SLOTS SLOT_BYTES``)."""

from kinetoscope.trace.parallel import worker_main

if __name__ == "__main__":
    worker_main()
