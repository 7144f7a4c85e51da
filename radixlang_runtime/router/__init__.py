"""The router process (python -m radixlang_runtime.launch_router): a separate HTTP front for several
servers. --pd-disaggregation: each request to one prefill and one decode instance (SGLang's PD
router); else --worker-urls: each request to one co-located server. Torch-free."""
