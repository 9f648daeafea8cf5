"""Pure functions of fiber-k8s (no cluster): label and name sanitizing, setting
parsers, resource validation, the pod manifest and the pod-to-status mapping. The
status tests feed pod objects written as dicts in the API's shape -- a stand-in for
pods, used only where a real cluster cannot produce the state (an eviction); the same
mapping is exercised on real pods in test_k8s_status.py."""

from __future__ import annotations

import re

import pytest

from fiber.backend import JobCreationError
from fiber.backend.job import JobSpec, JobState, JobStatus
from fiber.backend.options import ConfigOption
from fiber_k8s import names
from fiber_k8s.manifest import INSTANCE_LABEL, pod_manifest
from fiber_k8s.plugin import OPTIONS
from fiber_k8s.resources import parse_extra_resources, pod_resources
from fiber_k8s.settings import parse_host_paths, parse_tolerations, parse_volumes
from fiber_k8s.status import container_started, pod_status

LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


@pytest.mark.parametrize("value", ["run-1", "a" * 80, "user@host:/x y", "-x-", "__", "é!"])
def test_label_values_are_valid_and_distinct(value):
    clean = names.label_value(value)
    assert len(clean) <= 63 and LABEL_VALUE.fullmatch(clean)
    if len(value) <= 63 and LABEL_VALUE.fullmatch(value):
        assert clean == value
    assert names.label_value(value + "z") != clean


def test_label_keys_and_selector():
    assert names.label_key("fiber.run") == "fiber.run"
    # private: the digest a shortened label key ends with (computing it here would copy it)
    assert names.label_key("Example.COM/my key") == "example.com/my-key-" + names._digest("my key")
    assert names.selector({"fiber.run": "r 1"}) == f"fiber.run={names.label_value('r 1')}"


def test_pod_names_are_dns_labels_and_unique():
    seen = set()
    for job_name in ["Process-1", "x" * 100, "9lives", "fiber_pool_worker:3", ""]:
        name = names.pod_name(job_name)
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 63
        seen.add(name)
    assert len(seen) == 5


def test_setting_parsers():
    assert [t.manifest() for t in parse_tolerations("gpu=yes:NoSchedule,spot:NoExecute")] == [
        {"key": "gpu", "operator": "Equal", "value": "yes", "effect": "NoSchedule"},
        {"key": "spot", "operator": "Exists", "effect": "NoExecute"},
    ]
    with pytest.raises(ValueError, match="Effect one of"):
        parse_tolerations("gpu=yes:Sometimes")
    assert parse_volumes("data:/data:ro")[0].read_only
    with pytest.raises(ValueError, match="claim-name"):
        parse_volumes("Data_Claim:/data")
    assert parse_host_paths("/src:ro")[0].path == "/src"
    with pytest.raises(ValueError, match="/host/path"):
        parse_host_paths("relative:/x")


def test_resource_validation():
    assert parse_extra_resources("ephemeral-storage=1Gi") == ["ephemeral-storage=1Gi"]
    for bad in ["ephemeral-storage=1GB", "cpu=lots", "memory=-1Gi", "bad name!=1"]:
        with pytest.raises(ValueError):
            parse_extra_resources(bad)
    option = next(o for o in OPTIONS if o.name == "kubernetes_resources")
    assert isinstance(option, ConfigOption)
    assert pod_resources(0.5, 256, 1, {}) == {
        "requests": {"cpu": "500m", "memory": "256Mi"},
        "limits": {"memory": "256Mi", "nvidia.com/gpu": "1"},
    }
    with pytest.raises(JobCreationError, match="invalid cpu request 'lots'"):
        pod_resources("lots", None, None, {})
    with pytest.raises(JobCreationError, match="invalid gpu request"):
        pod_resources(None, None, 1.5, {})


def test_manifest_carries_spec_and_settings():
    spec = JobSpec(command=["/py", "-m", "fiber.runtime.bootstrap"], env={"_FIBER_X": "1"}, cwd="/w",
                   cpu=1, memory=100, name="Proc 1", labels={"fiber.run": "r:1"})
    options = {"kubernetes_host_network": True, "kubernetes_service_account": "sa",
               "kubernetes_node_selector": {"disk": "ssd"},
               "kubernetes_tolerations": parse_tolerations("a:NoSchedule"),
               "kubernetes_volumes": parse_volumes("claim:/data"),
               "kubernetes_image_pull_policy": "Never", "kubernetes_grace_period": 2.0}
    pod = pod_manifest(spec, pod_name="proc-1-abc", namespace="ns", image="img:1",
                       instance="i1", options=options,
                       owner={"kind": "Pod", "name": "p", "uid": "u", "apiVersion": "v1"})
    container = pod["spec"]["containers"][0]
    assert container["command"] == spec.command and container["workingDir"] == "/w"
    assert {"name": "_FIBER_X", "value": "1"} in container["env"]
    assert any(e["name"] == "POD_NAME" and "valueFrom" in e for e in container["env"])
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["hostNetwork"] is True
    assert pod["spec"]["serviceAccountName"] == "sa"
    assert pod["spec"]["nodeSelector"] == {"disk": "ssd"}
    assert pod["spec"]["terminationGracePeriodSeconds"] == 2
    assert pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "claim"
    assert pod["metadata"]["labels"]["fiber.run"] == names.label_value("r:1")
    assert pod["metadata"]["labels"][INSTANCE_LABEL] == "i1"
    assert pod["metadata"]["ownerReferences"][0]["name"] == "p"


def _pod(phase, *, waiting=None, terminated=None, reason=None, conditions=()):
    state = {}
    if waiting:
        state["waiting"] = {"reason": waiting, "message": "details"}
    if terminated:
        state["terminated"] = terminated
    return {"status": {"phase": phase, "reason": reason, "conditions": list(conditions),
                       "container_statuses": [{"name": "job", "state": state}]}}


def test_status_mapping():
    assert JobStatus.decode_exitcode(137, "shell") == -9
    assert JobStatus.decode_exitcode(3, "shell") == 3
    assert pod_status(_pod("Succeeded"), None, 0, 60).state is JobState.SUCCEEDED
    oom = pod_status(_pod("Failed", terminated={"exit_code": 137, "reason": "OOMKilled"}),
                     None, 0, 60)
    assert (oom.state, oom.exitcode, oom.reason) == (JobState.FAILED, -9, "OOMKilled")
    evicted = pod_status({"status": {"phase": "Failed", "reason": "Evicted",
                                     "message": "low on memory"}}, None, 0, 60)
    assert evicted.state is JobState.FAILED and evicted.reason.startswith("Evicted")
    pending = pod_status(_pod("Pending", waiting="ImagePullBackOff"), 10.0, 20.0, 60)
    assert pending.state is JobState.PENDING and pending.reason.startswith("ImagePullBackOff")
    failed = pod_status(_pod("Pending", waiting="ImagePullBackOff"), 10.0, 80.0, 60)
    assert failed.state is JobState.FAILED and "not pulled within 60s" in failed.reason
    unsched = pod_status(_pod("Pending", conditions=[
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/1 nodes are available"}]), None, 0, 60)
    assert unsched.reason.startswith("Unschedulable")


def test_container_started():
    """A pod whose container waits (being created, image pulls) has not started; one
    whose container runs or ran has (terminate() deletes only the former at once)."""
    assert not container_started({"status": {"phase": "Pending"}})
    assert not container_started(_pod("Pending", waiting="ContainerCreating"))
    assert not container_started(_pod("Pending", waiting="ErrImagePull"))
    running = _pod("Running")
    running["status"]["container_statuses"][0]["state"] = {"running": {"started_at": "t"}}
    assert container_started(running)
    assert container_started(_pod("Failed", terminated={"exit_code": 1}))


@pytest.mark.parametrize("name, text", [
    ("kubernetes_node_selector", "disk=ssd,zone=a"),
    ("kubernetes_tolerations", "gpu=yes:NoSchedule,spot:NoExecute"),
    ("kubernetes_volumes", "data:/data:ro,scratch:/scratch"),
    ("kubernetes_host_paths", "/src:ro,/a:/b"),
    ("kubernetes_resources", "ephemeral-storage=1Gi,example.com/dongle=2"),
])
def test_settings_survive_the_trip_to_a_child(name, text):
    """The core hands settings to children as text (``str`` of each list item, joined
    by commas): parsing that text again must give the same value."""
    option = next(o for o in OPTIONS if o.name == name)
    value = option.convert(text, "test")
    again = option.convert(",".join(map(str, value)), "child environment")
    assert again == value
