"""The core's retry honours a cluster's Retry-After (``BackendError.retry_after``): the
next try comes no sooner than the cluster asked, although the backoff's first pause is
shorter. The backend here is a plain function that fails once (no cluster: the
kubernetes backend's test through a fault proxy in front of a real API server,
tests/k8s/test_k8s_api_faults.py, checks the same end to end)."""

from __future__ import annotations

import time

from fiber.errors import TransientBackendError
from fiber.runtime import retry


def test_retry_waits_for_retry_after():
    calls: list[float] = []

    def create() -> str:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise TransientBackendError("429 Too Many Requests", retry_after=1.0)
        return "job"

    assert retry.FIRST_PAUSE < 1.0
    assert retry.call("test", "create a job", create, 10) == "job"
    assert len(calls) == 2
    assert calls[1] - calls[0] >= 1.0


def test_retry_after_never_outlasts_the_budget():
    began = time.monotonic()

    def create() -> str:
        raise TransientBackendError("429 Too Many Requests", retry_after=60.0)

    try:
        retry.call("test", "create a job", create, 1.0)
    except TransientBackendError:
        pass
    else:
        raise AssertionError("a call that always fails must raise")
    assert time.monotonic() - began < 3
