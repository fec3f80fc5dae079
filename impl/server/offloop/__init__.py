"""Where a router body becomes SampleResponse bytes, off the event loop or on it.

The designs (`--offloop`): `inline` and `threads` (`impl.server.offloop.inline`), decode
processes (`impl.server.offloop.processes`) and fetch processes (`impl.server.offloop.fetch`).
"""
