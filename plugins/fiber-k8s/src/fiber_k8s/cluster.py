"""Connecting to the cluster: in-cluster configuration inside a pod, a kubeconfig
otherwise; finding the pod this process runs in; turning API errors into fiber's
errors with a message that says what to do."""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from fiber.backend import (
    BackendError,
    ClusterUnreachableError,
    JobCreationError,
    TransientBackendError,
)

logger = logging.getLogger("fiber.kubernetes")

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
RBAC_HINT = """\
The account needs this Role in namespace {ns} (plugins/fiber-k8s/rbac.yaml has the
full manifest with a ServiceAccount and RoleBinding):

  apiVersion: rbac.authorization.k8s.io/v1
  kind: Role
  metadata: {{name: fiber, namespace: {ns}}}
  rules:
  - apiGroups: [""]
    resources: [pods]
    verbs: [create, get, list, watch, delete]
  - apiGroups: [""]
    resources: [pods/log]
    verbs: [get]
  - apiGroups: [""]
    resources: [secrets]  # the run's secret, one Secret per run
    verbs: [create, get, delete]
"""


class ForbiddenError(JobCreationError):
    """The cluster's RBAC refused an operation of the backend."""


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and (
        SERVICE_ACCOUNT_DIR / "token"
    ).is_file()


@dataclass
class Connection:
    api: client.CoreV1Api
    namespace: str
    host: str  # the API server URL
    in_cluster: bool


def connect(options: dict[str, Any]) -> Connection:
    """Load the configuration and return a CoreV1Api. Raises
    :class:`ClusterUnreachableError` when no configuration can be found."""
    kubeconfig = options.get("kubernetes_kubeconfig")
    context = options.get("kubernetes_context")
    namespace = options.get("kubernetes_namespace")
    configuration = client.Configuration()
    use_cluster = in_cluster() and not kubeconfig and not context
    if use_cluster:
        config.load_incluster_config(client_configuration=configuration)
        if not namespace:
            namespace = (SERVICE_ACCOUNT_DIR / "namespace").read_text().strip()
    else:
        path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or str(
            Path.home() / ".kube" / "config"
        )
        if not Path(path).is_file():
            raise ClusterUnreachableError(
                f"no Kubernetes configuration: {path} does not exist and this process does "
                "not run in a pod; set kubernetes_kubeconfig (FIBER_KUBERNETES_KUBECONFIG) "
                "or KUBECONFIG to your cluster's kubeconfig file",
                transient=False)
        try:
            config.load_kube_config(config_file=path, context=context,
                                    client_configuration=configuration)
            contexts, current = config.list_kube_config_contexts(config_file=path)
        except config.ConfigException as exc:
            raise ClusterUnreachableError(
                f"cannot use kubeconfig {path}"
                + (f" with context {context!r}" if context else "")
                + f": {exc}; check kubernetes_kubeconfig and kubernetes_context",
                transient=False) from None
        if not namespace:
            chosen = next((c for c in contexts if c["name"] == context), None) if context \
                else current
            namespace = ((chosen or {}).get("context") or {}).get("namespace") or "default"
    configuration.retries = 1
    api_client = client.ApiClient(configuration)
    _bound(api_client, float(options.get("kubernetes_request_timeout") or 60.0))
    api = client.CoreV1Api(api_client)
    return Connection(api, namespace, configuration.host, use_cluster)


def _bound(api_client: client.ApiClient, seconds: float) -> None:
    """Give every call of ``api_client`` that sets no time-out of its own (a watch
    sets one) ``seconds``: the client's default is to wait for ever for an API server
    that accepted the connection and does not answer."""
    rest = api_client.rest_client
    unbounded = rest.request

    def request(method: str, url: str, **kwargs: Any) -> Any:
        kwargs["_request_timeout"] = kwargs.get("_request_timeout") or seconds
        return unbounded(method, url, **kwargs)

    rest.request = request  # type: ignore[method-assign,assignment]  # this client's calls only


def own_pod_name() -> str:
    """The name of the pod this process runs in: $POD_NAME (downward API) or the
    hostname, which Kubernetes sets to the pod name (also for generateName pods)."""
    return os.environ.get("POD_NAME") or os.environ.get("HOSTNAME") or socket.gethostname()


def local_address_towards(url: str) -> str:
    """This machine's address on the route to ``url``'s host (no packet is sent: a
    UDP socket is only connected). Falls back to 127.0.0.1."""
    parsed = urlparse(url)
    host = parsed.hostname or "127.0.0.1"
    try:
        infos = socket.getaddrinfo(host, parsed.port or 443, type=socket.SOCK_DGRAM)
        family, _, _, _, sockaddr = infos[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(sockaddr)
            return probe.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def is_local_address(address: str) -> bool:
    """Whether ``address`` belongs to this machine (a socket can bind to it)."""
    try:
        infos = socket.getaddrinfo(address, 0, type=socket.SOCK_DGRAM)
        family, _, _, _, sockaddr = infos[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind(sockaddr)
        return True
    except OSError:
        return False


#: HTTP statuses that mean "not now": too many requests, request timeout, and every
#: server error (500, 502 from a load balancer, 503 while the server starts or is
#: overloaded, 504): retried, as client-go retries them (docs/backend-errors.md)
def _transient_status(status: int) -> bool:
    return status in (408, 429) or 500 <= status <= 599


def retry_after(exc: ApiException) -> float | None:
    """The seconds of the response's ``Retry-After`` header (a number of seconds, as
    the API server sends it), or None."""
    headers = exc.headers or {}
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None  # an HTTP date: the backoff decides
    return seconds if seconds is not None and seconds >= 0 else None


def translate(exc: BaseException, what: str, namespace: str, host: str) -> BackendError:
    """A fiber error for an exception raised by the Kubernetes client: transient for
    429 (with its Retry-After), 408 and 5xx answers and for a connection that failed,
    was reset or timed out; permanent, with the server's message, for every other
    answer (400, 401, 403, 404, 409, 422, ...)."""
    if isinstance(exc, ApiException):
        status = exc.status or 0
        if status == 403:
            return ForbiddenError(
                f"Kubernetes refused to {what} in namespace {namespace!r} (403 Forbidden: "
                f"{_message(exc)}).\n" + RBAC_HINT.format(ns=namespace)
            )
        if status == 401:
            return ClusterUnreachableError(
                f"the Kubernetes API server at {host} rejected the credentials (401 "
                f"Unauthorized: {_message(exc)}) while trying to {what}; renew the token "
                "or check the kubeconfig's user (kubernetes_kubeconfig, kubernetes_context)",
                transient=False)
        if status == 0:
            return ClusterUnreachableError(
                f"cannot reach the Kubernetes API server at {host} to {what}: {exc.reason}"
            )
        if _transient_status(status):
            return TransientBackendError(
                f"the Kubernetes API server at {host} could not {what} now ({status} "
                f"{exc.reason}: {_message(exc)})", retry_after=retry_after(exc))
        return JobCreationError(
            f"Kubernetes could not {what} ({status} {exc.reason}): {_message(exc)}"
        )
    return ClusterUnreachableError(
        f"cannot reach the Kubernetes API server at {host} to {what}: "
        f"{type(exc).__name__}: {exc}; is the cluster running and the kubeconfig right?"
    )


def _message(exc: ApiException) -> str:
    import json

    if exc.body is None:
        return str(exc.reason)
    try:
        return json.loads(exc.body).get("message") or exc.reason
    except (TypeError, ValueError, AttributeError):
        return str(exc.reason)
