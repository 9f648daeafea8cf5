"""From a pod object (as the API returns it) to a :class:`fiber.job.JobStatus`.

Pending pods carry the reason they wait (``Unschedulable``, ``ErrImagePull``,
``ImagePullBackOff``, ...); ended pods carry the container's exit code, where
``128 + N`` (a container killed by signal N) becomes ``-N``; ``OOMKilled`` and
``Evicted`` are reasons of failed jobs. Images that can never be pulled
(``ErrImageNeverPull``, ``InvalidImageName``) fail the job at once; images that fail to
pull fail it after ``pull_timeout`` seconds.
"""

from __future__ import annotations

from typing import Any

from fiber.backend import JobState, JobStatus

CONTAINER = "job"
#: waiting reasons that will not go away by themselves
FATAL_WAITING = {"ErrImageNeverPull", "InvalidImageName", "CreateContainerConfigError"}
PULL_WAITING = {"ErrImagePull", "ImagePullBackOff", "RegistryUnavailable"}


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        if obj is None:
            return None
        obj = obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)
    return obj


def _container_status(pod: Any) -> Any:
    for status in _get(pod, "status", "container_statuses") or []:
        if _get(status, "name") == CONTAINER:
            return status
    return None


def _terminated(pod: Any) -> Any:
    cs = _container_status(pod)
    return _get(cs, "state", "terminated") or _get(cs, "last_state", "terminated")


def _with_message(reason: str | None, message: str | None) -> str | None:
    if reason and message:
        return f"{reason}: {message.strip()}"
    return reason or message


def pod_status(pod: Any, pull_failing_since: float | None, now: float,
               pull_timeout: float) -> JobStatus:
    """The status of the job running in ``pod``."""
    phase = _get(pod, "status", "phase") or "Pending"
    terminated = _terminated(pod)
    if phase == "Succeeded":
        return JobStatus(JobState.SUCCEEDED, 0)
    if phase == "Failed" or (terminated is not None and phase != "Pending"):
        if terminated is None:
            reason = _get(pod, "status", "reason") or "Failed"  # e.g. Evicted
            return JobStatus(JobState.FAILED, None,
                             _with_message(reason, _get(pod, "status", "message")))
        code = JobStatus.decode_exitcode(_get(terminated, "exit_code"), "shell")
        if code == 0 and phase != "Failed":
            return JobStatus(JobState.SUCCEEDED, 0)
        reason = _get(pod, "status", "reason") or _get(terminated, "reason")
        if reason in (None, "Error", "Completed") and code is not None and code < 0:
            reason = None  # the signal's name
        if reason == "ContainerCannotRun":
            reason = _with_message(reason, _get(terminated, "message"))
        return JobStatus.from_exit(code, failed=True, reason=reason)
    if phase == "Running":
        return JobStatus(JobState.RUNNING)
    if phase == "Unknown":
        return JobStatus(JobState.PENDING, None, "NodeUnreachable")
    # Pending: say why
    waiting = _get(_container_status(pod), "state", "waiting")
    if waiting is not None and _get(waiting, "reason") not in (None, "ContainerCreating"):
        reason = _get(waiting, "reason")
        text = _with_message(reason, _get(waiting, "message"))
        if reason in FATAL_WAITING:
            return JobStatus(JobState.FAILED, None, text)
        if reason in PULL_WAITING and pull_failing_since is not None \
                and now - pull_failing_since >= pull_timeout:
            return JobStatus(JobState.FAILED, None,
                             f"{text} (image not pulled within {pull_timeout:g}s)")
        return JobStatus(JobState.PENDING, None, text)
    for condition in _get(pod, "status", "conditions") or []:
        if _get(condition, "type") == "PodScheduled" and _get(condition, "status") == "False":
            return JobStatus(JobState.PENDING, None,
                             _with_message(_get(condition, "reason") or "Unschedulable",
                                           _get(condition, "message")))
    if waiting is not None:
        return JobStatus(JobState.PENDING, None, _get(waiting, "reason"))
    return JobStatus(JobState.PENDING, None, _get(pod, "status", "reason"))


def pull_failing(pod: Any) -> bool:
    waiting = _get(_container_status(pod), "state", "waiting")
    return _get(waiting, "reason") in PULL_WAITING


def container_started(pod: Any) -> bool:
    """Whether the job's container has started (it runs, or ran and ended)."""
    state = _get(_container_status(pod), "state")
    return bool(_get(state, "running") or _get(state, "terminated")
                or _get(_container_status(pod), "last_state", "terminated"))
