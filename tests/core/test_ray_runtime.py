"""init_ray: a local instance without token auth, started once, joined again cheaply."""

from __future__ import annotations

import os

from hybridflow.core import init_ray


def test_local_instance_has_token_auth_off_and_init_is_idempotent(ray_session) -> None:
    if "RAY_ADDRESS" not in os.environ:  # the session started a local instance
        assert os.environ.get("RAY_AUTH_MODE") == "disabled"
    node = ray_session.get_runtime_context().get_node_id()
    resources = init_ray()  # already connected: nothing restarts
    assert ray_session.get_runtime_context().get_node_id() == node
    assert resources["CPU"] == ray_session.cluster_resources()["CPU"]
