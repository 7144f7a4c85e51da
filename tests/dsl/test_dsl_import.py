"""`import radixlang` needs no torch (nor transformers): a subprocess blocks them on the meta path and
runs a program on the fake backend; a backend whose extra is missing names the pip install."""

from __future__ import annotations

import subprocess
import sys
import textwrap

BLOCKER = textwrap.dedent("""
    import sys
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "transformers", "tqdm"):
                raise ImportError(f"blocked: {name}", name=name.split(".")[0])
    sys.meta_path.insert(0, Block())
""")


def run_blocked(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCKER + textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=60)


def test_import_and_run_without_torch():
    out = run_blocked("""
        import radixlang as sgl
        from radixlang.backend.fake import FakeBackend
        import radixlang.backend.http, radixlang.backend.zmq, radixlang.backend.runtime_endpoint
        @sgl.function
        def f(s):
            s += "Q:" + sgl.gen("a", max_tokens=3) + sgl.select("c", ["x", "y"])
        st = f.run(backend=FakeBackend())
        assert st["a"] == " ok" and st["c"] in ("x", "y")
        assert "torch" not in sys.modules and "transformers" not in sys.modules
        print("OK")
    """)
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr


def test_missing_extras_name_the_install():
    out = run_blocked("""
        import radixlang as sgl
        from radixlang.backend.fake import FakeBackend
        try:
            sgl.Engine()
        except ImportError as e:
            print("ENGINE:", e)
        @sgl.function
        def f(s, x):
            s += x
        try:
            f.run_batch([{"x": "a"}], backend=FakeBackend(), progress_bar=True)
        except ImportError as e:
            print("TQDM:", e)
    """)
    assert "ENGINE:" in out.stdout and "pip install 'radixlang[runtime]'" in out.stdout, out.stdout + out.stderr
    assert "TQDM:" in out.stdout and "pip install 'radixlang[frontend]'" in out.stdout, out.stdout + out.stderr
