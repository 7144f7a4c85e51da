"""The runtime's version (one place: the package, /server_info, /v1/models, the OpenAPI page read it)."""

__version__ = "0.1.0"
