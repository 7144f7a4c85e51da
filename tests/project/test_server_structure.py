"""The server is made of modules: short functions (an ast walk), routes as top-level handlers in routers,
and a ZeroMQ frontend that calls the service layer rather than FastAPI's route functions."""

from __future__ import annotations

import ast
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[2]
ROOT = REPO / "radixlang_runtime"
MAX_FUNCTION_LINES = 80
# every package: the runtime, the DSL, the kernels' Python side
CHECKED = sorted([*ROOT.rglob("*.py"), *(REPO / "radixlang").rglob("*.py"),
                  *(REPO / "kernels").rglob("*.py")])


def test_no_function_over_80_lines():
    long = []
    for path in CHECKED:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({n} lines)")
    assert long == []


def test_routes_are_top_level_handlers_and_the_frontend_uses_the_services():
    from radixlang_runtime.server import control_api, dashboard, generate_api, openai_api

    for module in (generate_api, control_api, openai_api, dashboard):
        for route in module.router.routes:
            assert route.endpoint.__qualname__ == route.endpoint.__name__, route.path  # not a closure
    paths = {r.path for m in (generate_api, control_api, openai_api, dashboard) for r in m.router.routes}
    assert {"/generate", "/model_info", "/server_info", "/flush_cache", "/v1/chat/completions",
            "/dashboard"} <= paths
    tree = ast.parse((ROOT / "server" / "frontend_zmq.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    used = {n.attr for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "services"}
    assert {"intake_generate", "generate_finals", "generate_events", "model_info", "server_info", "flush_cache",
            "pin_prefix", "unpin_prefix"} <= used
    assert "json" not in imported and not any(m.startswith(("fastapi", "starlette")) for m in imported if m)
