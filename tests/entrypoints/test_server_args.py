"""ServerArgs: SGLang flag names, defaults read from the dataclass, validation, device resolution."""

from __future__ import annotations

import pytest

from radixlang_runtime.server_args import ServerArgs, server_args_from_kwargs
from radixlang_runtime.server_cli import build_parser, parse_server_args


def parse(argv):
    return parse_server_args(argv)


def test_cli_uses_sglang_flag_names_and_dataclass_defaults():
    a = parse(["--model-path", "/m", "--page-size", "16", "--max-total-tokens", "4096", "--disable-radix-cache",
               "--schedule-policy", "fcfs", "--mem-fraction-static", "0.8"])
    assert (a.model_path, a.page_size, a.max_total_tokens, a.disable_radix_cache, a.schedule_policy) == \
        ("/m", 16, 4096, True, "fcfs")
    assert a.mem_fraction_static == 0.8
    d = parse([])
    assert d == ServerArgs()
    assert (d.host, d.port) == ("127.0.0.1", 30000)


@pytest.mark.parametrize("field,value", [
    ("dtype", "int8"), ("page_size", 0), ("schedule_policy", "random"), ("attention_backend", "flash"),
    ("mem_fraction_static", 1.5), ("max_running_requests", 0), ("chunked_prefill_size", 0),
    ("model_impl", "hf"),
])
def test_invalid_values_are_rejected(field, value):
    with pytest.raises(ValueError, match=field.split("_")[0]):
        ServerArgs(**{field: value})


def test_resolve_for_device_fills_only_auto_values():
    cpu = ServerArgs().resolve_for_device("cpu")
    assert (cpu.page_size, cpu.max_prefill_tokens, cpu.chunked_prefill_size) == (16, 4096, 4096)
    gpu = ServerArgs().resolve_for_device("cuda")
    assert (gpu.page_size, gpu.max_prefill_tokens, gpu.chunked_prefill_size) == (1, 16384, 8192)
    assert ServerArgs(page_size=1, chunked_prefill_size=-1).resolve_for_device("cpu").chunked_prefill_size == -1


def test_unknown_kwargs_are_named():
    with pytest.raises(TypeError, match="nope"):
        server_args_from_kwargs(None, nope=1)


def test_the_api_key_is_redacted_wherever_args_are_shown():
    a = parse(["--api-key", "sekrit", "--max-request-body-bytes", "4096"])
    assert a.api_key == "sekrit" and a.to_dict()["api_key"] == "sekrit"  # the server's own processes need it
    assert a.to_public_dict()["api_key"] == "<redacted>" and "sekrit" not in repr(a)
    assert a.max_request_body_bytes == 4096 and a.to_public_dict()["max_request_body_bytes"] == 4096
    assert ServerArgs().to_public_dict()["api_key"] is None  # no key: nothing to hide, and its absence shows
    with pytest.raises(ValueError, match="max_request_body_bytes"):
        ServerArgs(max_request_body_bytes=10)


def test_the_frontend_link_is_on_by_default_and_minus_one_turns_it_off(capsys):
    assert ServerArgs().frontend_port == 0 and parse([]).frontend_port == 0  # 0: a free port, picked at start
    assert parse(["--frontend-port", "-1"]).frontend_port == -1
    assert parse(["--frontend-port", "30001"]).frontend_port == 30001
    for bad in (-2, 65536, None, "30001"):
        with pytest.raises(ValueError, match="frontend_port must be 0 .* or -1 \\(no ZeroMQ link\\)"):
            ServerArgs(frontend_port=bad)
    build_parser().print_help()
    assert "-1 = no link" in " ".join(capsys.readouterr().out.split())


def test_the_chat_template_is_a_template_or_an_existing_file(tmp_path):
    f = tmp_path / "t.jinja"
    f.write_text("{{ messages }}")
    assert ServerArgs(chat_template=str(f)).chat_template == str(f)
    assert ServerArgs(chat_template="{% for m in messages %}{{ m }}{% endfor %}").chat_template
    with pytest.raises(ValueError, match="chat_template must be a Jinja template or the path of a file"):
        ServerArgs(chat_template=str(tmp_path / "missing.jinja"))


@pytest.mark.parametrize("kwargs,needle", [
    ({"disaggregation_mode": "both"}, "disaggregation_mode must be null, prefill or decode"),
    ({"disaggregation_mode": "prefill", "disaggregation_transfer_backend": "mooncake"}, "'mooncake' is not impl"),
    ({"disaggregation_mode": "decode", "disaggregation_transfer_backend": "nixl"}, "'nixl' is not implemented"),
    ({"disaggregation_mode": "decode", "disaggregation_bootstrap_port": 9000}, "applies to disaggregation_mode pre"),
    ({"disaggregation_bootstrap_port": 9000}, "applies to disaggregation_mode prefill"),
    ({"disaggregation_mode": "prefill", "disaggregation_transfer_timeout": 0}, "disaggregation_transfer_timeout"),
    ({"disaggregation_mode": "decode", "disaggregation_heartbeat_timeout": -1}, "disaggregation_heartbeat_timeout"),
    ({"disaggregation_mode": "decode", "speculative_algorithm": "NGRAM"}, "speculative_algorithm with disagg"),
    ({"disaggregation_mode": "prefill", "enable_hierarchical_cache": True}, "enable_hierarchical_cache with disagg"),
    ({"disaggregation_mode": "prefill", "dp_size": 2}, "dp_size > 1 with disaggregation_mode prefill"),
    ({"disaggregation_mode": "decode", "enable_priority_scheduling": True}, "enable_priority_scheduling with disagg"),
    ({"disaggregation_mode": "prefill", "max_queued_requests": 8}, "max_queued_requests with disaggregation"),
])
def test_disaggregation_flags_refused_by_name(kwargs, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        ServerArgs(**kwargs)


def test_disaggregation_takes_tensor_parallelism_over_nodes():
    a = ServerArgs(disaggregation_mode="prefill", tp_size=2, nnodes=2, node_rank=1, dist_init_addr="127.0.0.1:5000")
    assert (a.tp_size, a.nnodes, a.disaggregation_bootstrap_port) == (2, 2, 8998)
    assert ServerArgs(disaggregation_mode="decode", tp_size=2).tp_size == 2


def test_disaggregation_flags_parse_and_default_the_bootstrap_port():
    a = parse(["--disaggregation-mode", "prefill", "--disaggregation-transfer-timeout", "5"])
    assert (a.disaggregation_mode, a.disaggregation_bootstrap_port, a.disaggregation_transfer_timeout) == \
        ("prefill", 8998, 5.0)
    assert parse(["--disaggregation-mode", "decode"]).disaggregation_bootstrap_port is None
    assert parse([]).disaggregation_mode == "null"


@pytest.mark.parametrize("kwargs,needle", [
    ({"max_queued_requests": 0}, "max_queued_requests must be >= 1"),
    ({"priority_scheduling_preemption_threshold": -1}, "priority_scheduling_preemption_threshold must be >= 0"),
    ({"schedule_low_priority_values_first": True}, "apply with enable_priority_scheduling only"),
    ({"priority_scheduling_preemption_threshold": 3}, "apply with enable_priority_scheduling only"),
    ({"sampling_defaults": "vllm"}, "sampling_defaults must be model or openai"),
    ({"override_generation_config": '{"seed": 1}'}, "--override-generation-config: unknown key"),
])
def test_scheduling_and_sampling_flags_refused_by_name(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        ServerArgs(**kwargs)
    a = parse(["--enable-priority-scheduling", "--schedule-low-priority-values-first",
               "--priority-scheduling-preemption-threshold", "0", "--max-queued-requests", "4",
               "--sampling-defaults", "openai"])
    assert (a.enable_priority_scheduling, a.schedule_low_priority_values_first,
            a.priority_scheduling_preemption_threshold, a.max_queued_requests, a.sampling_defaults) == \
        (True, True, 0, 4, "openai")


def test_override_generation_config_flag(capsys):
    raw = '{"temperature": 0.5, "max_new_tokens": 64}'
    assert parse(["--override-generation-config", raw]).override_generation_config == raw
    assert parse([]).override_generation_config is None
    with pytest.raises(SystemExit):
        parse(["--override-generation-config", '{"max_new_tokens": -1}'])
    assert "--override-generation-config: max_new_tokens must be an integer >= 1" in capsys.readouterr().err
