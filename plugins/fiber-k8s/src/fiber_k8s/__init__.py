"""fiber-k8s: the ``kubernetes`` backend of fiber, where every job is a pod.

Install it next to fiber-core and select it with ``FIBER_BACKEND=kubernetes``; the
settings it reads are declared in :mod:`fiber_k8s.plugin`, the backend is
:class:`fiber_k8s.backend.KubernetesBackend` (imported lazily: the Kubernetes client is
loaded only when the backend is used).
"""

from fiber_k8s._version import __version__

__all__ = ["__version__"]
