"""Fork server for :mod:`kinetoscope.trace.parallel` (``python -m kinetoscope.trace._zygote FD``):
imports the loader once, then forks a chunk worker for each request on the socket ``FD``."""

from kinetoscope.trace.parallel import zygote_main

if __name__ == "__main__":
    zygote_main()
