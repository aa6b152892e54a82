"""The podlet's pure parts: scheduling, `$(VAR)` expansion, the downward API, DNS names, service links, probes' ports.

The podlet's container side runs in the cluster lane (tests/cluster/test_cluster_e2e.py); these need nothing.
"""

from __future__ import annotations

from pathlib import Path

import jwt
import pytest
import sa_tokens
from podlet import (
    container_port,
    dns_aliases,
    expand,
    field_ref,
    memory_backed,
    node_fits,
    parse_taint,
    projected_token_files,
    quantity_bytes,
    service_link_env,
    template_hash,
    terminated_state,
    tmpfs_mount,
)

from rlboost.auth.worker_identity import IdentityRefused, WorkerIdentityVerifier
from rlboost.spec import PoolSpec
from rlboost_operator import children, cluster_keys, spot
from rlboost_operator.config import OperatorSettings

SPOT_NODE = {"metadata": {"name": "s", "labels": {"cloud.google.com/gke-spot": "true"}}, "spec": {}}
PLAIN_NODE = {"metadata": {"name": "r", "labels": {}}, "spec": {}}


def test_the_operators_spot_and_reserved_scheduling_place_pods_on_the_right_nodes() -> None:
    pool = PoolSpec()
    spot_pod, reserved_pod = spot.spot_scheduling(pool), spot.reserved_scheduling(pool)
    assert node_fits(spot_pod, SPOT_NODE) and not node_fits(spot_pod, PLAIN_NODE)
    assert node_fits(reserved_pod, PLAIN_NODE) and not node_fits(reserved_pod, SPOT_NODE)


def test_a_noschedule_taint_keeps_pods_off_unless_tolerated() -> None:
    taint = {"key": "cloud.google.com/impending-node-termination", "effect": "NoSchedule"}
    tainted = {**SPOT_NODE, "spec": {"taints": [taint]}}
    assert not node_fits(spot.spot_scheduling(PoolSpec()), tainted)
    tolerant = {"tolerations": [{"key": taint["key"], "operator": "Exists"}]}
    assert node_fits(tolerant, tainted)
    assert not node_fits({}, {**PLAIN_NODE, "spec": {"unschedulable": True}})


def test_variable_expansion_follows_kubernetes() -> None:
    env = {"POD_NAME": "w-1"}
    assert expand("--worker-id=$(POD_NAME)", env) == "--worker-id=w-1"
    assert expand("$(UNKNOWN) $$(POD_NAME)", env) == "$(UNKNOWN) $(POD_NAME)"


def test_downward_api_fields() -> None:
    pod = {
        "metadata": {"name": "t-0", "namespace": "ns", "labels": {"apps.kubernetes.io/pod-index": "0"}},
        "spec": {"nodeName": "n"},
        "status": {"podIP": "10.0.0.5"},
    }
    assert field_ref("metadata.labels['apps.kubernetes.io/pod-index']", pod) == "0"
    assert (field_ref("spec.nodeName", pod), field_ref("status.podIP", pod)) == ("n", "10.0.0.5")
    with pytest.raises(ValueError, match="not supported"):
        field_ref("spec.nope", pod)


def test_dns_names_of_a_statefulset_pod_and_its_services() -> None:
    pod = {
        "metadata": {"name": "j-trainer-0", "namespace": "ns", "labels": {"c": "trainer"}},
        "spec": {"hostname": "j-trainer-0", "subdomain": "j-trainer"},
    }
    services = [{"metadata": {"name": "j-trainer"}, "spec": {"selector": {"c": "trainer"}}}]
    services.append({"metadata": {"name": "other"}, "spec": {"selector": {"c": "worker"}}})
    names = dns_aliases(pod, services)
    assert "j-trainer.ns.svc" in names and "j-trainer-0.j-trainer.ns.svc" in names
    assert not any(n.startswith("other") for n in names)


def test_service_links_skip_headless_services() -> None:
    services = [
        {"metadata": {"name": "rlboost-nats"}, "spec": {"ports": [{"name": "client", "port": 4222}]}},
        {"metadata": {"name": "hl"}, "spec": {"clusterIP": "None", "ports": [{"port": 1}]}},
    ]
    env = service_link_env(services, {"rlboost-nats": ["10.0.0.9"], "hl": ["10.0.0.8"]})
    assert env["RLBOOST_NATS_SERVICE_HOST"] == "10.0.0.9" and env["RLBOOST_NATS_PORT"] == "tcp://10.0.0.9:4222"
    assert not any(k.startswith("HL_") for k in env)


def test_named_probe_ports_and_template_hashes() -> None:
    container = {"name": "c", "ports": [{"name": "metrics", "containerPort": 9090}]}
    assert container_port(container, "metrics") == 9090 and container_port(container, 8000) == 8000
    with pytest.raises(ValueError, match="named port"):
        container_port(container, "http")
    assert template_hash({"a": 1, "b": 2}) == template_hash({"b": 2, "a": 1}) != template_hash({"a": 2})


def test_a_failed_containers_termination_message_is_its_file_else_its_logs_tail() -> None:
    """As the kubelet: the file written at terminationMessagePath wins; FallbackToLogsOnError takes the log's tail
    only for a failure; the operator reads the fetcher's line from here (rlboost_operator.model_source)."""
    fetcher = {"name": "fetch-model", "terminationMessagePolicy": "FallbackToLogsOnError"}
    line = "spec.model.uri: NotFound: s3://nope/model does not exist\n"
    assert terminated_state(3, line, "lots of log", fetcher) == {"exitCode": 3, "reason": "Error", "message": line}
    logs = "\n".join(f"line {i}" for i in range(200))
    fallback = terminated_state(1, "", logs, fetcher)["message"]
    assert fallback.endswith("line 199") and "line 119" not in fallback
    assert "message" not in terminated_state(1, "", logs, {"name": "plain"})  # policy File: the file only
    assert terminated_state(0, "", logs, fetcher) == {"exitCode": 0, "reason": "Completed"}


def _worker_pod(pool: str) -> dict:
    """A worker pod as the podlet makes it from the operator's Deployment (named, with a uid)."""
    deployment = children.worker("job1", "ns1", pool, PoolSpec(), 1, OperatorSettings())
    return {
        "metadata": {"name": f"job1-workers-{pool}-x1", "namespace": "ns1", "uid": "u1"},
        "spec": deployment["spec"]["template"]["spec"],
    }


def _accounts() -> list[dict]:
    return [
        children.service_account("job1", "ns1", pool) | {"metadata": {"name": n, "uid": "s1"}}
        for pool, n in (("reserved", "job1-reserved-worker"), ("spot", "job1-spot-worker"))
    ]


def test_a_projected_token_is_one_the_manager_accepts_for_its_pod_and_pool(tmp_path: Path) -> None:
    key = sa_tokens.load_or_make_key(tmp_path / "sa.key")
    assert sa_tokens.load_or_make_key(tmp_path / "sa.key").private_numbers() == key.private_numbers()  # shared
    pod = _worker_pod("spot")
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "identity")
    files = projected_token_files(volume, pod, _accounts(), key)
    keys = cluster_keys.parse_discovery(sa_tokens.openid_configuration("http://api"), sa_tokens.jwks(key))
    (tmp_path / "worker-identity.json").write_bytes(cluster_keys.identity_item("job1", "ns1", keys))
    verifier = WorkerIdentityVerifier("job1", cluster=tmp_path / "worker-identity.json")
    proven = verifier.verify(files["token"].decode(), "job1-workers-spot-x1", "spot")
    assert (proven.worker_id, proven.pool, proven.kind) == ("job1-workers-spot-x1", "spot", "kubernetes")
    claims = jwt.decode(files["token"], options={"verify_signature": False})
    assert claims["sub"] == "system:serviceaccount:ns1:job1-spot-worker" and claims["exp"] - claims["iat"] == 3600
    other = tmp_path / "job2.json"  # another job's manager: its own item, for its own audience
    other.write_bytes(cluster_keys.identity_item("job2", "ns1", keys))
    with pytest.raises(IdentityRefused, match="Audience"):
        WorkerIdentityVerifier("job2", cluster=other).verify(files["token"].decode(), "job1-workers-spot-x1", "spot")


def test_a_projected_token_needs_the_pods_service_account(tmp_path: Path) -> None:
    pod = _worker_pod("reserved")
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "identity")
    with pytest.raises(ValueError, match="serviceaccount 'job1-reserved-worker' not found"):
        projected_token_files(volume, pod, [], sa_tokens.load_or_make_key(tmp_path / "sa.key"))


def test_a_teams_taint_keeps_off_every_pod_of_a_job_without_its_toleration() -> None:
    """The lane's --platform nodes (--node-taint team=ml:NoSchedule) take the platform example's pods (each component
    tolerates the taint through its podTemplate) and no pod of a job without the toleration."""
    import yaml

    from rlboost.spec import JobSpec, parse_job_spec

    team = {**PLAIN_NODE, "spec": {"taints": [parse_taint("team=ml:NoSchedule")]}}
    assert team["spec"]["taints"] == [{"key": "team", "value": "ml", "effect": "NoSchedule"}]
    root = Path(__file__).resolve().parents[2]
    platform = parse_job_spec(yaml.safe_load((root / "examples" / "rljob-platform.yaml").read_text())["spec"])
    for spec, fits in ((platform, True), (JobSpec(), False)):
        for obj in children.build_children("j", "ns", spec, OperatorSettings(), 0):
            if obj["kind"] in ("Deployment", "StatefulSet") and "spot" not in obj["metadata"]["name"]:
                assert node_fits(obj["spec"]["template"]["spec"], team) is fits, obj["metadata"]["name"]


def test_a_memory_backed_empty_dir_is_a_tmpfs_of_its_size_limit() -> None:
    assert quantity_bytes("256Mi") == 256 << 20 and quantity_bytes("1G") == 10**9 and quantity_bytes("4096") == 4096
    assert memory_backed({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}})
    assert not memory_backed({"name": "scratch", "emptyDir": {}})
    assert tmpfs_mount("/dev/shm", "1Gi") == f"type=tmpfs,destination=/dev/shm,tmpfs-mode=1777,tmpfs-size={1 << 30}"
