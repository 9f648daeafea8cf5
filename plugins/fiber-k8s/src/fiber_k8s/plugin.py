"""The fiber hooks of fiber-k8s: the ``kubernetes`` backend and its settings.

Every setting is prefixed ``kubernetes_`` (environment ``FIBER_KUBERNETES_*``).

Every fiber process imports this module when it reads its settings (jobs of any backend
included), so it imports only fiber's contract and the light parser modules
:mod:`fiber_k8s.settings` and :mod:`fiber_k8s.resources`; the backend, and the
Kubernetes client library with it, is imported by fiber's registry from the dotted path
of :data:`plugin`, the first time the ``kubernetes`` backend is used.
"""

from __future__ import annotations

from fiber.backend import (
    ConfigOption,
    Plugin,
    parse_bool,
    parse_list,
    parse_positive_float,
)
from fiber_k8s.resources import parse_extra_resources
from fiber_k8s.settings import (
    parse_host_paths,
    parse_node_selector,
    parse_tolerations,
    parse_volumes,
)

PULL_POLICIES = ("Always", "IfNotPresent", "Never")

OPTIONS = [
    ConfigOption("kubernetes_namespace", str, None,
                 "namespace of job pods (default: this pod's namespace in a cluster, "
                 "else the kubeconfig context's, else 'default')"),
    ConfigOption("kubernetes_kubeconfig", str, None,
                 "kubeconfig file used outside a cluster (default: $KUBECONFIG or ~/.kube/config)"),
    ConfigOption("kubernetes_context", str, None,
                 "kubeconfig context to use (default: the current context)"),
    ConfigOption("kubernetes_listen_address", str, None,
                 "address of this process that job pods can reach (default: this pod's IP "
                 "in a cluster, else this machine's address on the route to the API server)"),
    ConfigOption("kubernetes_service_account", str, None, "service account of job pods"),
    ConfigOption("kubernetes_image_pull_policy", str, None,
                 "imagePullPolicy of job pods (Always, IfNotPresent, Never)", PULL_POLICIES),
    ConfigOption("kubernetes_node_selector", parse_node_selector, [],
                 "node labels job pods must match: key=value[,key=value...]"),
    ConfigOption("kubernetes_tolerations", parse_tolerations, [],
                 "taints job pods tolerate: key[=value]:Effect[,...] (Effect: NoSchedule, "
                 "PreferNoSchedule or NoExecute; key alone = Exists)"),
    ConfigOption("kubernetes_volumes", parse_volumes, [],
                 "persistent volume claims to mount: claim:/mount/path[:ro][,...]"),
    ConfigOption("kubernetes_host_paths", parse_host_paths, [],
                 "node directories to mount: /host/path[:/pod/path][:ro][,...]"),
    ConfigOption("kubernetes_host_network", parse_bool, False,
                 "run job pods in the node's network namespace (hostNetwork)"),
    ConfigOption("kubernetes_host_pid", parse_bool, False,
                 "run job pods in the node's PID namespace (hostPID), so that process ids "
                 "of jobs on one node differ"),
    ConfigOption("kubernetes_resources", parse_extra_resources, [],
                 "extra resource requests: name=quantity[,...] (e.g. ephemeral-storage=1Gi)"),
    ConfigOption("kubernetes_grace_period", parse_positive_float, 3.0,
                 "seconds a terminated pod gets between SIGTERM and SIGKILL"),
    ConfigOption("kubernetes_pull_timeout", parse_positive_float, 120.0,
                 "seconds a pod may fail to pull its image before its job counts as failed"),
    ConfigOption("kubernetes_labels", parse_list, [],
                 "extra labels of job pods: key=value[,...]"),
    ConfigOption("kubernetes_request_timeout", parse_positive_float, 60.0,
                 "seconds an API call may take; a slower one is a transient error, retried"),
]


plugin = Plugin(
    package="fiber-k8s",
    contract=1,  # the version of fiber's plugin contract this package implements
    backends={"kubernetes": "fiber_k8s.backend:KubernetesBackend"},
    options=OPTIONS,
)
