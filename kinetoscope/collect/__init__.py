"""Trace collection: ``kscope trace`` as a library.

* ``client``   — RPC client for kscope/Dynolog daemons (dyno framing, typed errors)
* ``trigger``  — trigger a trace on many hosts, wait for the files, explain failures
* ``render``   — Rich tables shared by ``kscope trace`` and ``kscope demo``

The manifest format (which file is which rank) is :mod:`kinetoscope.protocol.manifest`.
See docs/collect.md.
"""
