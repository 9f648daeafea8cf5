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

from fiber.backend import BackendError, ClusterUnreachableError, JobCreationError

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
    api = client.CoreV1Api(client.ApiClient(configuration))
    return Connection(api, namespace, configuration.host, use_cluster)


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


def translate(exc: BaseException, what: str, namespace: str, host: str) -> BackendError:
    """A fiber error for an exception raised by the Kubernetes client."""
    if isinstance(exc, ApiException):
        if exc.status == 403:
            return ForbiddenError(
                f"Kubernetes refused to {what} in namespace {namespace!r} (403 Forbidden: "
                f"{_message(exc)}).\n" + RBAC_HINT.format(ns=namespace)
            )
        if exc.status == 401:
            return ClusterUnreachableError(
                f"the Kubernetes API server at {host} rejected the credentials (401 "
                "Unauthorized) while trying to " + what + "; renew the token or check the "
                "kubeconfig user"
            )
        if exc.status == 0 or exc.status is None:
            return ClusterUnreachableError(
                f"cannot reach the Kubernetes API server at {host} to {what}: {exc.reason}"
            )
        return JobCreationError(
            f"Kubernetes could not {what} ({exc.status} {exc.reason}): {_message(exc)}"
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
