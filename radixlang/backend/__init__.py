"""Backends: base.py (the contract), native.py (the native protocol over any transport), http.py,
zmq.py, engine.py (in-process), fake.py (tests), runtime_endpoint.py (RuntimeEndpoint, Runtime).
Modules import lazily: pyzmq or the runtime load only when their backend is constructed."""
