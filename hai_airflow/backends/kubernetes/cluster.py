"""The cluster as the backend reaches it: the API client, and the calls on objects it owns by name."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.utils.quantity import parse_quantity

from hai_airflow.backends.common.base import Launch, StartError
from hai_airflow.backends.common.inventory import gpu_type
from hai_airflow.backends.kubernetes import manifests as m
from hai_airflow.backends.kubernetes.pods import MpiJobEnd, mpijob_end
from hai_airflow.scheduling.model import Node
from hai_airflow.spec import canonical_gpu_type

log = logging.getLogger(__name__)


def api_client(opts: m.KubernetesOptions) -> client.ApiClient:
    """A client from the configured kubeconfig, else the in-cluster service account, else ~/.kube/config."""
    if opts.kubeconfig:
        return config.new_client_from_config(config_file=opts.kubeconfig, context=opts.context)
    try:
        cfg = client.Configuration()
        config.load_incluster_config(client_configuration=cfg)
        return client.ApiClient(cfg)
    except config.ConfigException:
        return config.new_client_from_config(context=opts.context)


def explain(e: ApiException) -> str:
    """The API server's own words for a refusal."""
    try:
        return str(json.loads(e.body)["message"])
    except (TypeError, ValueError, KeyError):
        # A refused websocket (an exec) carries the API server's answer at the end of its reason.
        said = re.search(r'"message":"((?:[^"\\]|\\.)*)"', str(e.reason))
        return json.loads(f'"{said[1]}"') if said else f"{e.status} {e.reason}"


class Cluster:
    """The API of one namespace, as the options configure it; every call the backend makes on objects."""

    def __init__(self, options: m.KubernetesOptions) -> None:
        self.options = options
        self.api = api_client(options)
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.ns = options.namespace

    def nodes(self) -> list[Node] | None:
        """Schedulable nodes with their allocatable GPUs, CPUs, memory and GPU-type label."""
        try:
            items = self.core.list_node().items
        except ApiException as e:
            log.warning("cannot list nodes (%s); using the configured [[nodes]]", e.reason)
            return None
        opts = self.options
        nodes = []
        for n in items:
            if n.spec is not None and n.spec.unschedulable:
                continue
            alloc = (n.status.allocatable if n.status else None) or {}
            labels = n.metadata.labels or {}
            product = labels.get(opts.gpu_product_label, "")
            named = labels.get(opts.gpu_type_label) or (gpu_type(product) if product else "")
            kind = canonical_gpu_type(named) if named else "none"
            nodes.append(
                Node(
                    name=n.metadata.name,
                    gpu_type=kind,
                    gpus=int(parse_quantity(alloc.get(opts.gpu_resource, "0"))),
                    cpus=float(parse_quantity(alloc.get("cpu", "0"))),
                    memory_gb=round(float(parse_quantity(alloc.get("memory", "0"))) / 1024**3, 1),
                )
            )
        return sorted(nodes, key=lambda node: node.name)

    def delete(self, kind: str, name: str, grace: int) -> None:
        """Delete our `kind` ("pod", "service", "secret", "mpijob") `name`; one already gone is fine."""
        body = client.V1DeleteOptions(grace_period_seconds=grace, propagation_policy="Background")
        # The answer is not read: API servers before 1.22 answer a Service's delete with a Status, which
        # kubernetes>=37's typed client cannot read as the Service it expects.
        raw = {"body": body, "_preload_content": False}
        try:
            if kind == "pod":
                answer = self.core.delete_namespaced_pod(name, self.ns, **raw)
            elif kind == "service":
                answer = self.core.delete_namespaced_service(name, self.ns, **raw)
            elif kind == "secret":
                answer = self.core.delete_namespaced_secret(name, self.ns, **raw)
            else:
                answer = self.custom.delete_namespaced_custom_object(
                    m.MPI_GROUP, m.MPI_VERSION, self.ns, m.MPI_PLURAL, name, **raw
                )
            # Read to the end, so the connection goes back to the pool clean.
            answer.read()
            answer.release_conn()
        except ApiException as e:
            if e.status != 404:
                log.warning("cannot delete %s %s: %s", kind, name, explain(e))

    def delete_all(self, created: list[tuple[str, str]]) -> None:
        """Delete what a start made before it was refused, as (kind, name) pairs."""
        for kind, name in created:
            self.delete(kind, name, 0)

    def delete_credential(self, instance_id: int) -> None:
        """Delete the Secret of the instance's job credential (found by name: the server never lists them)."""
        self.delete("secret", m.credential_name(self.options, instance_id), 0)

    def list_mpijobs(self) -> dict[str, int | None]:
        """This owner's MPIJobs (name -> instance id); none when the CRD is not installed."""
        try:
            listed = self.custom.list_namespaced_custom_object(
                m.MPI_GROUP,
                m.MPI_VERSION,
                self.ns,
                m.MPI_PLURAL,
                label_selector=m.instance_selector(self.options),
            )
        except ApiException as e:
            if e.status in (403, 404):
                return {}
            raise
        out: dict[str, int | None] = {}
        for item in listed.get("items", []):
            meta = item.get("metadata", {})
            label = (meta.get("labels") or {}).get(m.LABEL_INSTANCE)
            out[meta["name"]] = int(label) if label and label.isdigit() else None
        return out

    def mpijob_end(self, name: str) -> MpiJobEnd | None:
        """The MPIJob's end as its operator set it in the status conditions; None while it has not ended."""
        try:
            obj = self.custom.get_namespaced_custom_object(
                m.MPI_GROUP, m.MPI_VERSION, self.ns, m.MPI_PLURAL, name
            )
        except ApiException as e:
            if e.status != 404:
                log.warning("cannot read MPIJob %s: %s", name, explain(e))
            return None
        return mpijob_end(obj)

    def mpi_operator_installed(self) -> bool:
        """Whether distributed jobs may be MPIJobs: as configured, or (auto) as the API serves them."""
        if self.options.mpi_operator != "auto":
            return self.options.mpi_operator == "always"
        try:
            resources = self.custom.get_api_resources(m.MPI_GROUP, m.MPI_VERSION)
        except ApiException as e:
            if e.status == 404:
                return False
            raise StartError(f"cannot tell whether the MPI Operator is installed: {explain(e)}") from None
        return any(r.name == m.MPI_PLURAL for r in (resources.resources or []))

    def master_node_address(self, launch: Launch) -> str:
        """On the host network, where a gang meets: the InternalIP of worker 0's planned node."""
        if self.options.network != "host" or not m.is_distributed(launch) or not launch.placement:
            return ""
        node = launch.placement[0].node
        try:
            addresses = self.core.read_node(node).status.addresses or []
        except ApiException as e:
            raise StartError(f"cannot read node {node}'s address: {explain(e)}") from None
        for kind in ("InternalIP", "ExternalIP"):
            for address in addresses:
                if address.type == kind:
                    return str(address.address)
        raise StartError(f"node {node} reports no InternalIP, so its workers cannot meet on the host network")

    def instance_pods(self, instance_id: int) -> list[Any]:
        """The pods labelled as the instance's."""
        selector = m.instance_selector(self.options, instance_id)
        items: list[Any] = self.core.list_namespaced_pod(self.ns, label_selector=selector).items
        return items

    def close(self) -> None:
        self.api.close()
