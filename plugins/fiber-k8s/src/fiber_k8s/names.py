"""Kubernetes names and labels: pod names from job names, and label keys/values
made to fit Kubernetes' syntax (the original values are kept as annotations)."""

from __future__ import annotations

import hashlib
import re
import uuid

_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _squeeze(text: str, allowed: str, limit: int) -> str:
    """Replace characters outside ``allowed`` by '-', strip non-alphanumeric ends and
    shorten to ``limit`` (with a hash of the original when changed)."""
    cleaned = re.sub(f"[^{allowed}]", "-", text)
    cleaned = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", cleaned)
    if cleaned == text and len(cleaned) <= limit:
        return cleaned
    head = cleaned[: limit - 9].rstrip("-_.")
    return f"{head}-{_digest(text)}" if head else _digest(text)


def label_value(value: str) -> str:
    """A valid label value (<= 63 characters of [A-Za-z0-9-_.], alphanumeric ends)
    for ``value``; valid values are returned unchanged, others get a hash suffix so that
    different values stay different."""
    value = str(value)
    if len(value) <= 63 and _LABEL_VALUE.fullmatch(value):
        return value
    return _squeeze(value, "-A-Za-z0-9_.", 63)


def label_key(key: str) -> str:
    """A valid label key (``[prefix/]name``) for ``key``."""
    prefix, slash, name = str(key).rpartition("/")
    if slash:
        prefix = prefix.lower()
        if not (_DNS_SUBDOMAIN.fullmatch(prefix) and len(prefix) <= 253):
            prefix = _squeeze(prefix.lower(), "-a-z0-9.", 253)
    if not (len(name) <= 63 and _LABEL_NAME.fullmatch(name)):
        name = _squeeze(name, "-A-Za-z0-9_.", 63)
    return f"{prefix}/{name}" if slash else name


def labels(mapping: dict[str, str]) -> dict[str, str]:
    return {label_key(k): label_value(v) for k, v in mapping.items()}


def selector(mapping: dict[str, str]) -> str:
    """A label selector string matching every pair of ``mapping`` (sanitized)."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels(mapping).items()))


def pod_name(job_name: str) -> str:
    """A unique pod name (DNS-1123 label, <= 63 characters) derived from a job name."""
    base = re.sub(r"[^a-z0-9-]", "-", str(job_name).lower())
    base = re.sub(r"-+", "-", base).strip("-")[:50].rstrip("-") or "fiber-job"
    if not base[0].isalpha():
        base = "fiber-" + base
        base = base[:50].rstrip("-")
    return f"{base}-{uuid.uuid4().hex[:8]}"
