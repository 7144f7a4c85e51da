"""radixlang: a language for LM programs (gen, select, fork/join, roles, constrained gen).

The DSL lands with its own issue; the package exists now so the layout and packaging are stable.
It imports no torch.
"""

__version__ = "0.1.0"
