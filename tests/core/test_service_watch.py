"""A server process in a wait beside the ranks (``core/rank_wait.py``'s ServiceWatch): its part's failure, its
death and its silence each end the wait, named. The server here is a real HTTP server in a thread of the test,
standing in for a ``vllm serve`` (whose own stall is the e2e test in tests/trainer/test_vllm_e2e.py)."""

import threading
import time
from concurrent.futures import Future
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hybridflow.core.rank_wait import (
    Heartbeat,
    ServiceWatch,
    WorkerError,
    WorkerStalledError,
    in_daemon_thread,
)

BEAT = Heartbeat(interval_s=0.1, stall_s=1.0)


class Health(BaseHTTPRequestHandler):
    frozen = threading.Event()  # set: /health never answers, as a stopped process's socket

    def do_GET(self):  # noqa: N802 - http.server's name
        while self.frozen.is_set():
            time.sleep(0.05)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    Health.frozen.clear()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/health"
    Health.frozen.clear()
    httpd.shutdown()


def watch(url, pending):
    return ServiceWatch("test server (pid 7)", "receive_weights", url, pending, BEAT)


def test_a_healthy_server_s_part_returns_its_value(server):
    assert watch(server, in_daemon_thread(lambda: time.sleep(0.5) or 42)).result() == 42


def test_a_silent_server_is_named_within_the_heartbeats_bound(server):
    Health.frozen.set()
    start = time.monotonic()
    with pytest.raises(WorkerStalledError) as info:
        watch(server, Future()).result()  # its part never ends: only the heartbeat can end the wait
    waited = time.monotonic() - start
    assert BEAT.stall_s <= waited < BEAT.interval_s + BEAT.stall_s + 0.5, waited
    assert str(info.value).startswith("receive_weights: test server (pid 7) stopped answering the heartbeat")


def test_a_failed_part_and_a_dead_server_end_the_wait_at_once(server):
    def fail():
        raise RuntimeError("HTTP 500 from /update_weights")

    with pytest.raises(WorkerError, match="receive_weights: test server .pid 7. failed: HTTP 500"):
        watch(server, in_daemon_thread(fail)).result()
    dead = server.rsplit(":", 1)[0] + ":1/health"  # nothing listens on port 1
    start = time.monotonic()
    with pytest.raises(WorkerError, match="is gone"):
        watch(dead, Future()).result()
    assert time.monotonic() - start < 1.0
