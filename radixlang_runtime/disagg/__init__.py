"""Prefill-decode disaggregation (--disaggregation-mode prefill | decode; docs/DISAGGREGATION.md).

link.py     the ZeroMQ transport (bootstrap ROUTER on the prefill, DEALERs on the decode, one I/O thread each,
            heartbeats answered off the scheduler loop)
prefill.py  PrefillRole: streams a request's K/V (chunk by chunk) and first token to the decode that registered
decode.py   DecodeRole: pre-allocation queue (flow control), registration, K/V written into the pool, ready
"""
