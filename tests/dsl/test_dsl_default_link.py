"""The DSL's ZeroMQ link is on by default. A server started as tests/server_utils.py starts it (no
--frontend-port) reports its link in /server_info and /get_model_info; `RuntimeEndpoint("http://...")`
finds it and runs programs over it (the frontend's request counters show it), with the greedy text of
HTTP and of transformers; `--frontend-port -1` turns it off and the same call runs over HTTP with the
same text; --api-key holds on the link; --chat-template reaches /get_model_info and the DSL's roles.
gen(ebnf=) on a server with --grammar-backend xgrammar (refused by name where outlines is pinned); separate_reasoning
on the embedded model's greedy output."""

from __future__ import annotations

import httpx
import pytest

import radixlang as sgl
from radixlang.errors import BackendError
from grammars import ARITH_EBNF, ARITH_LARK
from server_utils import ServerProcess

pytestmark = pytest.mark.slow
KEY = "link-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
SYSTEM = "You are a terse test assistant."
TEMPLATE = ("{% for m in messages %}{% if loop.first and m['role'] != 'system' %}"
            "{{ '<|im_start|>system\\n" + SYSTEM + "<|im_end|>\\n' }}{% endif %}"
            "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
FLAGS = ("--dtype", "float32", "--max-total-tokens", "4096")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = tmp_path_factory.mktemp("tmpl") / "chat.jinja"
    path.write_text(TEMPLATE)
    srv = ServerProcess(*FLAGS, "--api-key", KEY, "--chat-template", str(path), "--grammar-backend", "outlines")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def server_without_link():  # also the xgrammar one (gen(ebnf=))
    srv = ServerProcess(*FLAGS, "--frontend-port", "-1", "--grammar-backend", "xgrammar")
    yield srv
    srv.stop()


def get(srv: ServerProcess, path: str) -> dict:
    r = httpx.get(srv.url + path, headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def served(srv: ServerProcess) -> dict:
    return get(srv, "/server_info")["frontend"]["requests_by_method"]


@sgl.function
def plain(s):
    s += "The capital of France is" + sgl.gen("a", max_tokens=8, temperature=0)


@sgl.function
def chat(s):
    s += sgl.user("Name a colour.")
    s += sgl.assistant(sgl.gen("a", max_tokens=6, temperature=0))


@pytest.fixture(scope="module")
def links(server):
    zmq = sgl.RuntimeEndpoint(server.url, api_key=KEY)
    http = sgl.RuntimeEndpoint(server.url, api_key=KEY, link="http")
    yield {"zmq": zmq, "http": http}
    zmq.shutdown()


def test_the_default_server_reports_its_link_and_the_dsl_runs_over_it(server, links):
    info = get(server, "/server_info")
    port = info["frontend_port"]
    assert isinstance(port, int) and port > 0 and info["frontend"]["port"] == port
    assert get(server, "/get_model_info")["frontend_port"] == port
    assert links["zmq"].transport == "zmq" and links["zmq"].base_url == f"tcp://127.0.0.1:{port}"
    assert links["http"].transport == "http"

    before = served(server).get("generate", 0)
    over_zmq = plain.run(backend=links["zmq"])
    assert over_zmq.error() is None and served(server).get("generate", 0) == before + 1  # one gen, one request
    over_http = plain.run(backend=links["http"])
    assert over_http.error() is None and served(server).get("generate", 0) == before + 1  # not over the link
    assert over_zmq["a"] == over_http["a"]
    assert over_zmq.get_meta_info("a")["completion_tokens"] == 8


def test_the_link_gives_transformers_greedy_text(server, links):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = get(server, "/get_model_info")["model_path"]
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    st = plain.run(backend=links["zmq"])
    ids = tok.encode("The capital of France is", add_special_tokens=False)
    n = st.get_meta_info("a")["completion_tokens"]
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=2, pad_token_id=2)
    assert st["a"] == tok.decode(out[0, len(ids):].tolist(), skip_special_tokens=True)


def test_the_chat_template_flag_reaches_model_info_and_the_roles(server, links):
    assert get(server, "/get_model_info")["chat_template"] == TEMPLATE
    texts = []
    for name in ("zmq", "http"):
        assert links[name].get_chat_template().default_system_prompt == SYSTEM
        st = chat.run(backend=links[name])
        assert st.error() is None
        assert st.text().startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nName a colour.")
        texts.append(st.text())
    assert texts[0] == texts[1]


def test_the_api_key_holds_on_the_link(server):
    address = f"tcp://127.0.0.1:{get(server, '/server_info')['frontend_port']}"
    before = served(server)
    for key in ("wrong", None):
        with pytest.raises(BackendError, match="401.*invalid or missing API key") as e:
            sgl.RuntimeEndpoint(address, api_key=key)
        assert e.value.status == 401
    with pytest.raises(BackendError, match="401"):  # HTTP refuses it first: the link's port is not even told
        sgl.RuntimeEndpoint(server.url, api_key="wrong")
    assert served(server) == before  # nothing refused was counted as served


def test_without_the_link_the_same_call_runs_over_http(server_without_link, links):
    info = httpx.get(server_without_link.url + "/server_info", timeout=60).json()
    assert info["frontend_port"] is None and info["frontend"] is None
    assert httpx.get(server_without_link.url + "/get_model_info", timeout=60).json()["frontend_port"] is None
    backend = sgl.RuntimeEndpoint(server_without_link.url)
    assert backend.transport == "http"
    assert plain.run(backend=backend)["a"] == plain.run(backend=links["zmq"])["a"]
    with pytest.raises(BackendError, match="link='zmq'.*no ZeroMQ link"):
        sgl.RuntimeEndpoint(server_without_link.url, link="zmq")




@sgl.function
def arithmetic(s):
    s += sgl.user("Write an arithmetic expression that equals 12.")
    s += sgl.assistant(sgl.gen("expr", max_tokens=24, temperature=0, ebnf=ARITH_EBNF))


def test_gen_ebnf_output_parses_and_outlines_refuses_it_by_name(server_without_link, links):
    from lark import Lark

    st = arithmetic.run(backend=sgl.RuntimeEndpoint(server_without_link.url))
    Lark(ARITH_LARK, parser="earley").parse(st["expr"])  # raises on text outside the grammar
    assert st.get_meta_info("expr")["finish_reason"]["type"] == "stop"
    st = arithmetic.run(backend=links["zmq"])  # --grammar-backend outlines, pinned
    with pytest.raises(Exception, match="ebnf grammars need --grammar-backend xgrammar or llguidance"):
        st.sync()
        st["expr"]


THOUGHT = r"[A-Z][a-z]+( [a-z]+){1,5}\.\n</think>\n\n[A-Z][a-z]+( [a-z]+){0,3}\."


@sgl.function
def think(s, separate: bool):
    s += "Question: name a fruit. Think first, then answer.\nThinking:"
    gen = sgl.gen("answer", max_tokens=40, temperature=0, regex=THOUGHT)
    s += sgl.separate_reasoning(gen, model_type="deepseek-r1") if separate else gen
    s += "\nEnd."


def test_separate_reasoning_splits_the_models_own_output(links):
    from radixlang_runtime.reasoning_parser import get_reasoning_parser

    raw = think.run(separate=False, backend=links["zmq"])["answer"]
    split = get_reasoning_parser("deepseek-r1").parse(raw)
    assert "</think>" in raw and split.reasoning and split.content  # the regex made the model write both parts
    st = think.run(separate=True, backend=links["zmq"])
    assert (st["answer"], st["answer_reasoning_content"]) == (split.content, split.reasoning)
    assert st.text().endswith(split.content + "\nEnd.") and "</think>" not in st.text()
