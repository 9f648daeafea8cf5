"""Resource requests of job pods: validation of Kubernetes quantities and the
``resources`` block built from a job's cpu / memory / gpu."""

from __future__ import annotations

import math
import re
from typing import Any

from fiber.backend import JobCreationError

GPU_RESOURCE = "nvidia.com/gpu"
# Kubernetes' quantity syntax: a signed decimal number with an optional binary
# (Ki..Ei), decimal (n, u, m, k, M, G, T, P, E) or exponent suffix.
_QUANTITY = re.compile(
    r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?"
)
_RESOURCE_NAME = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)


def check_quantity(name: str, text: str) -> str:
    """Return ``text`` if it is a valid, non-negative Kubernetes quantity."""
    text = str(text).strip()
    if not _QUANTITY.fullmatch(text) or text.startswith("-"):
        raise ValueError(
            f"{name}={text!r} is not a Kubernetes quantity: use a number with an optional "
            "suffix such as 500m, 2, 512Mi, 4Gi or 1e3"
        )
    return text


def parse_extra_resources(value: Any) -> list[str]:
    """``name=quantity`` items (or a dict), each name and quantity checked; kept as
    text so that children get the same setting."""
    from fiber_k8s.settings import parse_key_values

    result = {}
    for name, quantity in parse_key_values(value).items():
        if not _RESOURCE_NAME.fullmatch(name) or len(name) > 253:
            raise ValueError(f"{name!r} is not a Kubernetes resource name")
        result[name] = check_quantity(name, quantity)
    return [f"{k}={v}" for k, v in result.items()]


def _positive(name: str, value: Any, kind: type) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            value = kind(str(value).strip())
        except ValueError:
            raise JobCreationError(
                f"invalid {name} request {value!r}: expected a {kind.__name__} "
                f"(for instance {name}={'2' if kind is int else '0.5'})"
            ) from None
    if not math.isfinite(value) or value < 0 or (kind is int and value != int(value)):
        raise JobCreationError(f"invalid {name} request {value!r}: expected a number >= 0")
    return value


def pod_resources(cpu: Any, memory: Any, gpu: Any, extra: Any) -> dict[str, dict]:
    """The container ``resources`` for a job: cpu and memory are requested (memory is
    also the limit, so a job using more is OOM-killed); GPUs are a limit, as Kubernetes
    requires for extended resources. Raises :class:`JobCreationError` on bad values."""
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if cpu is not None:
        cores = _positive("cpu", cpu, float)
        if cores:
            requests["cpu"] = f"{max(1, round(cores * 1000))}m"
    if memory is not None:
        mib = _positive("memory", memory, float)
        if mib:
            requests["memory"] = limits["memory"] = f"{max(1, int(mib))}Mi"
    if gpu is not None:
        count = int(_positive("gpu", gpu, int))
        if count:
            limits[GPU_RESOURCE] = str(count)
    from fiber_k8s.settings import parse_key_values

    for name, quantity in parse_key_values(extra or {}).items():
        try:
            requests[name] = check_quantity(name, quantity)
        except ValueError as exc:
            raise JobCreationError(str(exc)) from None
        if "/" in name:  # extended resources must be limits (equal to the request)
            limits[name] = requests[name]
    result = {}
    if requests:
        result["requests"] = requests
    if limits:
        result["limits"] = limits
    return result
