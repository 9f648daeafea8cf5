"""One watch over the pods a backend instance created (selected by the instance's
label), feeding a cache of the latest pod objects that ``status``/``wait`` read.

The thread lists the pods once, then watches from the list's resource version; it
re-lists after a watch error or an expired resource version (410 Gone). A pod's
DELETED event keeps its last object, marked deleted, so that an ended job's status
stays known until the job is released. Should the thread die, the cache stops being
trusted (not synced): statuses are read from the API server directly.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kubernetes import watch
from kubernetes.client.rest import ApiException

from fiber.backend import FiberThreadError, start_thread
from fiber_k8s.status import pull_failing

logger = logging.getLogger("fiber.kubernetes")


@dataclass
class PodRecord:
    pod: Any
    deleted: bool = False
    pull_failing_since: float | None = None
    seen: float = field(default_factory=time.monotonic)


class PodWatcher:
    """Cache of the pods matching ``selector`` in ``namespace``, kept fresh by a
    daemon thread. ``changed`` is notified on every event."""

    def __init__(self, api: Any, namespace: str, selector: str) -> None:
        self.api = api
        self.namespace = namespace
        self.selector = selector
        self.changed = threading.Condition()
        self._records: dict[str, PodRecord] = {}
        self._ignored: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._response: Any = None
        self.synced = threading.Event()
        self.error: BaseException | None = None

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        with self.changed:
            if self._thread is None:
                self._thread = start_thread("fiber-k8s-watch", self._run,
                                            fails=self._died)

    def _died(self, error: FiberThreadError) -> None:
        """The thread died (logged): the cache is no longer kept fresh, so it is no
        longer synced, and the backend reads every status from the API server
        directly (``KubernetesBackend.status``) rather than trust a stale pod."""
        with self.changed:
            self.error = error
            self.synced.clear()
            self.changed.notify_all()

    def stop(self) -> None:
        """End the thread: unblock its read of the watch stream and join it."""
        self._stop.set()
        response = self._response
        if response is not None:
            unblock = getattr(response, "shutdown", None)  # urllib3 >= 2.3
            try:
                (unblock or response.close)()
            except Exception:  # noqa: BLE001 -- already closed
                pass
        if self._thread is not None:
            self._thread.join(10)

    # -- cache ---------------------------------------------------------------------
    def get(self, name: str) -> PodRecord | None:
        with self.changed:
            return self._records.get(name)

    def forget(self, name: str) -> None:
        """Drop a released pod; later events about it are ignored."""
        with self.changed:
            self._records.pop(name, None)
            self._ignored.add(name)

    def expect(self, pod: Any) -> None:
        """Record a pod just created (its ADDED event may come later)."""
        self._apply("ADDED", pod)

    def _apply(self, kind: str, pod: Any) -> None:
        name = pod.metadata.name
        now = time.monotonic()
        with self.changed:
            if name in self._ignored:
                if kind == "DELETED":
                    self._ignored.discard(name)
                return
            record = self._records.get(name)
            if record is None:
                record = self._records[name] = PodRecord(pod)
            elif _version(pod) < _version(record.pod) and kind != "DELETED":
                return  # an older object than the one cached (create() raced the watch)
            record.pod = pod
            record.seen = now
            if kind == "DELETED":
                record.deleted = True
            if pull_failing(pod):
                if record.pull_failing_since is None:
                    record.pull_failing_since = now
            else:
                record.pull_failing_since = None
            self.changed.notify_all()

    # -- the thread ----------------------------------------------------------------
    def _relist(self) -> str:
        listing = self.api.list_namespaced_pod(self.namespace, label_selector=self.selector)
        present = set()
        for pod in listing.items:
            present.add(pod.metadata.name)
            self._apply("MODIFIED", pod)
        listed = _version(listing)
        with self.changed:
            for name, record in self._records.items():
                # absent from the list but older than it: its DELETED event was missed
                if name not in present and not record.deleted and _version(record.pod) <= listed:
                    record.deleted = True
            self.changed.notify_all()
        self.synced.set()
        return listing.metadata.resource_version

    def _run(self) -> None:
        version: str | None = None
        decoder = watch.Watch()
        while not self._stop.is_set():
            try:
                if version is None:
                    version = self._relist()
                    self.error = None
                response = self.api.list_namespaced_pod(
                    self.namespace, label_selector=self.selector, watch=True,
                    resource_version=version, timeout_seconds=60,
                    _preload_content=False, _request_timeout=(10, 90))
                self._response = response
                try:
                    # stop() may have come while the request was under way: it found
                    # no response to close, and this one would be read until the
                    # server ends the watch (timeout_seconds) while stop() waits
                    if self._stop.is_set():
                        response.close()
                        break
                    for line in watch.watch.iter_resp_lines(response):
                        if self._stop.is_set():
                            break
                        event = decoder.unmarshal_event(line, "V1Pod")
                        if event["type"] == "ERROR":
                            version = None  # e.g. 410 Gone: list again
                            break
                        if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                            self._apply(event["type"], event["object"])
                            version = decoder.resource_version or version
                finally:
                    self._response = None
                    response.release_conn()
            except ApiException as exc:
                version = None
                if exc.status != 410:
                    self.error = exc
                    logger.debug("pod watch failed: %s", exc)
                    self._stop.wait(1.0)
            except Exception as exc:  # noqa: BLE001 -- any network error: retry
                version = None
                if not self._stop.is_set():
                    self.error = exc
                    logger.debug("pod watch failed: %s", exc)
                    self._stop.wait(1.0)


def _version(pod: Any) -> int:
    try:
        return int(pod.metadata.resource_version or 0)
    except (TypeError, ValueError):
        return 0
