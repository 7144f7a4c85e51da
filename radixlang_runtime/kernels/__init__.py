"""Attention kernels. `reference.py` is the plain-torch reference every kernel is tested against;
the Triton extend/decode kernels land beside it (see the Triton issue)."""
