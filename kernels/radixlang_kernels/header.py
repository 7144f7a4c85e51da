"""The op table's source of truth: csrc/cpu/kernels.h, parsed into ctypes signatures (torch-free).

A strict reader of a small subset of C, enough for the header and nothing more:
  - `typedef struct { fields } name;` where each field line is `type decl, decl, ...;`
  - prototypes `int|void name(params);`, params `void` or `type decl` separated by commas
  - `type` = [const] one of void, int, int64_t, uint8_t, int8_t, uint16_t, float, or a struct declared
    above; `decl` = pointer stars (each optionally followed by const) and a name
  - comments, and the include guard / `#include` lines
Anything else (a macro with arguments, an array, a function pointer, varargs, an unknown type, a struct
passed by value) raises HeaderError naming the declaration: the header is kept in the subset, the parser
never guesses.

Types map as: int -> c_int, int64_t -> c_int64, float -> c_float; T* -> c_void_p (tensors pass their
data_ptr()), struct* -> POINTER(struct) (callers pass the Structure itself), T** -> POINTER(c_void_p).
Return: int -> c_int, void -> None.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass
from typing import Any

SCALARS = {"int": ctypes.c_int, "int64_t": ctypes.c_int64, "float": ctypes.c_float}
POINTEES = {"void", "int", "int64_t", "uint8_t", "int8_t", "uint16_t", "float"}
RETURNS = {"int": ctypes.c_int, "void": None}
_IDENT = r"[A-Za-z_]\w*"
_PROTO = re.compile(rf"^({_IDENT})\s+({_IDENT})\s*\((.*)\)$", re.S)
_STRUCT = re.compile(rf"^typedef\s+struct\s*\{{(.*)\}}\s*({_IDENT})$", re.S)
_DECL = re.compile(rf"^((?:\*\s*(?:const\s+)?)*)({_IDENT})$")
_GUARD = re.compile(r"^#\s*(ifndef|endif|include|define\s+\w+\s*$)")


class HeaderError(ValueError):
    """The header holds a declaration outside the parser's subset (the message names it)."""


@dataclass(frozen=True)
class Prototype:
    name: str
    restype: Any  # a ctypes type or None (void)
    argtypes: tuple  # ctypes types, one per parameter
    params: tuple[str, ...]  # the parameters' names, for messages and docs


@dataclass(frozen=True)
class Header:
    prototypes: dict[str, Prototype]
    structs: dict[str, type]  # name -> ctypes.Structure subclass with the header's fields


def _strip(text: str, origin: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    lines = []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("#"):
            if not _GUARD.match(s):
                raise HeaderError(f"{origin}: preprocessor line {s!r} is outside the parsed subset "
                                  "(write the declaration out)")
            continue
        lines.append(line)
    return "\n".join(lines)


def _type(words: list[str], stars: int, structs: dict[str, type], where: str) -> Any:
    base = [w for w in words if w != "const"]
    if len(base) != 1:
        raise HeaderError(f"{where}: cannot parse type {' '.join(words)!r}")
    t = base[0]
    if t in structs:
        if stars == 1:
            return ctypes.POINTER(structs[t])
        if stars == 0 and where.startswith("struct"):
            return structs[t]  # a struct field may hold another struct by value
        raise HeaderError(f"{where}: struct {t} must be passed by one pointer")
    if t not in POINTEES:
        raise HeaderError(f"{where}: unknown type {t!r}")
    if stars == 0:
        if t not in SCALARS:
            raise HeaderError(f"{where}: {t} is not a scalar parameter type ({', '.join(SCALARS)})")
        return SCALARS[t]
    if stars == 1:
        return ctypes.c_void_p
    if stars == 2:
        return ctypes.POINTER(ctypes.c_void_p)
    raise HeaderError(f"{where}: {stars} levels of pointers")


def _split_decl(text: str, where: str) -> tuple[list[str], list[tuple[int, str]]]:
    """'const int64_t *a, *const *b' -> (['const', 'int64_t'], [(1, 'a'), (2, 'b')])."""
    if any(c in text for c in "[]()."):
        raise HeaderError(f"{where}: cannot parse {text.strip()!r} (arrays, function pointers and varargs "
                          "are outside the subset)")
    parts = [p.strip() for p in text.split(",")]
    first = parts[0].replace("*", " * ").split()
    i = next((k for k, w in enumerate(first) if w == "*"), len(first) - 1)
    words, decls = first[:i], [" ".join(first[i:])] + parts[1:]
    out = []
    for d in decls:
        m = _DECL.match(" ".join(d.replace("*", " * ").split()))
        if m is None or not words:
            raise HeaderError(f"{where}: cannot parse declarator {d!r}")
        out.append((m.group(1).count("*"), m.group(2)))
    return words, out


def _struct(body: str, name: str, structs: dict[str, type]) -> type:
    fields = []
    for line in (s.strip() for s in body.split(";")):
        if line:
            words, decls = _split_decl(line, f"struct {name}")
            fields += [(n, _type(words, stars, structs, f"struct {name}.{n}")) for stars, n in decls]
    return type(name, (ctypes.Structure,), {"_fields_": fields})


def _prototype(m: re.Match, structs: dict[str, type]) -> Prototype:
    ret, name, params = m.group(1), m.group(2), m.group(3).strip()
    if ret not in RETURNS:
        raise HeaderError(f"{name}: return type {ret!r} is outside the subset ({', '.join(RETURNS)})")
    argtypes, names = [], []
    if params != "void":
        for p in params.split(","):
            words, decls = _split_decl(p, name)
            if len(decls) != 1:
                raise HeaderError(f"{name}: cannot parse parameter {p.strip()!r}")
            stars, pname = decls[0]
            argtypes.append(_type(words, stars, structs, f"{name}({pname})"))
            names.append(pname)
    return Prototype(name, RETURNS[ret], tuple(argtypes), tuple(names))


def parse_header(text: str, origin: str = "kernels.h") -> Header:
    """Every prototype and struct of `text`; HeaderError names the first declaration it cannot read."""
    structs: dict[str, type] = {}
    prototypes: dict[str, Prototype] = {}
    for decl in (" ".join(d.split()) for d in _statements(_strip(text, origin))):
        if not decl:
            continue
        m = _STRUCT.match(decl)
        if m is None and decl.startswith("typedef struct"):
            raise HeaderError(f"{origin}: cannot parse {decl[:60]!r}... (typedef struct {{ ... }} name; only)")
        if m is not None:
            structs[m.group(2)] = _struct(m.group(1), m.group(2), structs)
            continue
        p = _PROTO.match(decl)
        if p is None:
            raise HeaderError(f"{origin}: cannot parse declaration {decl!r}")
        if p.group(2) in prototypes:
            raise HeaderError(f"{origin}: {p.group(2)} declared twice")
        prototypes[p.group(2)] = _prototype(p, structs)
    return Header(prototypes, structs)


def _statements(text: str) -> list[str]:
    """Split at top-level semicolons (a struct body's own semicolons stay inside its statement)."""
    out, depth, cur = [], 0, []
    for c in text:
        depth += (c == "{") - (c == "}")
        if c == ";" and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    tail = "".join(cur).strip()
    if tail:
        out.append(tail)
    return out


def read_header(path: str) -> Header:
    with open(path, encoding="utf-8") as f:
        return parse_header(f.read(), path)
