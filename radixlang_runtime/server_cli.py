"""launch_server's command line: one flag per ServerArgs field (`--kebab-case`, defaults read from the
dataclass), grouped by the dataclass's own sections, each with a help line that names its default and
choices; SGLang / vLLM flags radixlang does not implement are refused by name with what to use instead,
and any other mistake is one line, not argparse's usage dump. No torch."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
from dataclasses import fields
from typing import NoReturn, Optional

from radixlang_runtime.server_args import ServerArgs
from radixlang_runtime.server_flags_help import CHOICES, FOREIGN_FLAGS, HELP

PROG = "python -m radixlang_runtime.launch_server"
_SECTION = re.compile(r"^\s*# --- ([^(:-][^(:]*?)\s*(?:\(|:|---)")


def sections() -> list[tuple[str, list[str]]]:
    """The dataclass's `# --- name ---` sections in source order, each with its fields."""
    groups: list[tuple[str, list[str]]] = []
    names = {f.name for f in fields(ServerArgs)}
    for line in inspect.getsource(ServerArgs).splitlines():
        m = _SECTION.match(line)
        if m:
            groups.append((m.group(1).strip(), []))
            continue
        field = re.match(r"^\s{4}(\w+):", line)
        if field and field.group(1) in names and groups:
            groups[-1][1].append(field.group(1))
    return groups


LIST_FIELDS = ("lora_paths", "allowed_media_domains")  # one or more values after the flag
INT_LIST_FIELDS = ("cuda_graph_bs",)  # one or more integers after the flag


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def help_line(f: dataclasses.Field) -> str:
    text = HELP[f.name]
    if f.type not in ("bool", bool) and f.default is not None and f.default is not dataclasses.MISSING:
        text += " (default: %(default)s)"
    return text.replace("%", "%%").replace("%%(default)s", "%(default)s")


class ServerArgumentParser(argparse.ArgumentParser):
    """A mistake is one line naming the flag (and, for another engine's flag, what to use here)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n(--help lists every flag)\n")

    def parse_args(self, args=None, namespace=None):  # noqa: D102 - argparse's signature
        ns, rest = self.parse_known_args(args, namespace)
        if rest:
            self.error(unknown_flag_message(rest))
        return ns


def unknown_flag_message(rest: list[str]) -> str:
    for arg in rest:
        name = arg.split("=", 1)[0]
        if name in FOREIGN_FLAGS:
            return f"{name} is not supported by radixlang: {FOREIGN_FLAGS[name]}"
    unknown = [a.split("=", 1)[0] for a in rest if a.startswith("-")] or rest
    return f"unrecognized argument(s): {' '.join(unknown)}"


def cli_type(name: str) -> type:
    """A flag's value type, read from the field's annotation (int / float / Optional[...] of them; else str)."""
    ann = str(next(f.type for f in fields(ServerArgs) if f.name == name))
    inner = ann.removeprefix("Optional[").removesuffix("]")
    return {"int": int, "float": float}.get(inner, str)


def _metavar(name: str) -> str:
    if name in CHOICES:
        return "{" + ",".join(CHOICES[name]) + "}"
    return {int: "N", float: "X"}.get(cli_type(name), "STR")


def build_parser() -> ServerArgumentParser:
    p = ServerArgumentParser(prog=PROG, allow_abbrev=False, usage="%(prog)s [--model-path PATH] [FLAG ...]",
                             description="Serve a model over HTTP (SGLang's native API and OpenAI's) and the DSL's "
                                         "ZeroMQ link. Flags use SGLang's names.")
    by_name = {f.name: f for f in fields(ServerArgs)}
    for title, names in sections():
        group = p.add_argument_group(title)
        for name in names:
            f = by_name[name]
            default = f.default if f.default is not dataclasses.MISSING else None
            if f.type in ("bool", bool):
                group.add_argument(flag(name), action="store_true", default=default, help=help_line(f))
            elif name in LIST_FIELDS:
                group.add_argument(flag(name), nargs="+", default=default, help=help_line(f), metavar="NAME=PATH")
            elif name in INT_LIST_FIELDS:
                group.add_argument(flag(name), nargs="+", type=int, default=default, help=help_line(f), metavar="N")
            else:
                group.add_argument(flag(name), type=cli_type(name), default=default, help=help_line(f),
                                   metavar=_metavar(name))
    return p


def parse_server_args(argv: Optional[list[str]] = None) -> ServerArgs:
    """argv -> ServerArgs; a refused value (ServerArgs' own checks) exits with its message, one line."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        return ServerArgs(**{f.name: getattr(ns, f.name) for f in fields(ServerArgs)})
    except ValueError as e:
        parser.error(str(e))


if __name__ == "__main__":  # pragma: no cover - `python -m radixlang_runtime.server_cli --help`
    build_parser().parse_args(sys.argv[1:])
