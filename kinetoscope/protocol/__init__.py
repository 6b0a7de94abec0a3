"""Everything two parts of Kinetoscope must agree on, in one bottom layer.

Why a package of its own: the daemon, the trigger, the store, the catalog and the web app all
speak these formats; defining them here (and nowhere else) keeps every import pointing down.
Nothing in this package imports another Kinetoscope package (only the leaf
:mod:`kinetoscope.errors`, for the user-facing error base class). See docs/protocol.md.

* ``defaults``      — shared defaults: the RPC port, the trace root, the trace-file suffixes
* ``wire``          — byte framing of the libkineto IPC datagrams and of the dyno RPC
* ``kineto_config`` — the Kineto on-demand config text (built as ``dyno gputrace`` builds it)
* ``rpc``           — typed request/response structs of the kscope RPC extensions
* ``structinfo``    — builds msgspec's type information for a module's Structs at import
* ``manifest``      — the kscope manifest (which trace file is which rank)
* ``document_keys`` — the diagnosis' keys of the ``kscope analyze --json`` document
"""
