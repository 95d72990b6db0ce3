"""The Queue admission webhook on the real compute API server: a parent that does not exist, a loop,
children guaranteed more than their parent and deleting a parent with children are refused where the
admin looks (kubectl's error); a sound tree is admitted, a parent and its child created back to back too."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from ferry.cluster.process import Component
from tests.helpers import eventually

GROUP, VERSION = "scheduling.kubeferry.io", "v1alpha1"


def queue(name: str, parent: str | None = None, gpus: int = 0) -> dict[str, Any]:
    spec: dict[str, Any] = {"guaranteed": {"gpu": str(gpus)}}
    if parent:
        spec["parent"] = parent
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Queue", "metadata": {"name": name}, "spec": spec}


async def refusal(write: Any) -> str | None:
    """The API server's message if ``write`` is refused, None if it is admitted."""
    try:
        await write
    except ApiException as exc:
        return str(json.loads(exc.body)["message"])
    return None


@pytest.fixture
async def custom(compute_api: client.ApiClient, ferry_scheduler: Component) -> client.CustomObjectsApi:
    api = client.CustomObjectsApi(compute_api)

    async def webhook_answers() -> bool:  # the CA is published and the scheduler serves: a dry run is refused
        why = await refusal(api.create_cluster_custom_object(GROUP, VERSION, "queues",
                                                             queue("probe", "no-such-parent"), dry_run="All"))
        return why is not None and "does not exist" in why

    await eventually(webhook_answers, timeout=30, what="the Queue webhook answering")
    return api


async def test_the_queue_webhook_refuses_what_breaks_the_tree(custom: client.CustomObjectsApi, compute_ns: str) -> None:
    dept, team, other = (f"{x}-{compute_ns}" for x in ("dept", "team", "other"))
    created: list[str] = []

    def create(obj: dict[str, Any]) -> Any:
        return custom.create_cluster_custom_object(GROUP, VERSION, "queues", obj)

    def patch(name: str, body: dict[str, Any]) -> Any:
        return custom.patch_cluster_custom_object(GROUP, VERSION, "queues", name, body,
                                                  _content_type="application/merge-patch+json")

    try:
        for q in (queue(dept, gpus=8), queue(team, dept, 4)):  # a parent, then its child at once
            assert await refusal(create(q)) is None
            created.append(q["metadata"]["name"])
        why = await refusal(create(queue(other, f"gone-{compute_ns}")))
        assert why is not None and f"parent queue 'gone-{compute_ns}' does not exist" in why, why
        assert 'admission webhook "queues.scheduling.kubeferry.io" denied the request' in why
        why = await refusal(create(queue(other, dept, 5)))
        assert why is not None and "guaranteed 9 GPUs, more than its 8" in why, why
        why = await refusal(patch(dept, {"spec": {"parent": team}}))
        assert why is not None and "may not form a loop" in why, why
        why = await refusal(patch(dept, {"spec": {"guaranteed": {"gpu": "2"}}}))
        assert why is not None and f"would break queue '{team}'" in why, why
        why = await refusal(custom.delete_cluster_custom_object(GROUP, VERSION, "queues", dept))
        assert why is not None and f"is the parent of {team}" in why, why
        assert await refusal(create(queue(other, dept, 4))) is None  # exactly the rest of the guarantee
        created.append(other)
        stored = await custom.get_cluster_custom_object(GROUP, VERSION, "queues", dept)
        assert stored["spec"]["guaranteed"]["gpu"] == "8" and "parent" not in stored["spec"]
    finally:
        for name in reversed(created):  # children first: the webhook refuses a parent before them
            await custom.delete_cluster_custom_object(GROUP, VERSION, "queues", name)
