"""The rank launcher's rendezvous store: Horovod's gloo HTTP protocol, scopes, and strangers refused."""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterator

import pytest

from hai_airflow.backends.common import ranks
from hai_airflow.backends.common.workerenv import free_port


@pytest.fixture(params=["sock_diag", "/proc/net/tcp"])
def store(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, int]]:
    """The store in this process, its peer check asking the kernel by sock_diag where it answers, and
    reading /proc/net/tcp where it does not: both must refuse the same peers."""
    if request.param == "sock_diag" and not ranks._diag_works():
        pytest.skip("this kernel answers no sock_diag lookups")
    if request.param != "sock_diag":
        monkeypatch.setattr(ranks, "_diag_works", lambda: False)
    port = free_port()
    server = ranks.serve(f"127.0.0.1:{port}", size=4, local_size=2, cross_size=2)
    try:
        yield "127.0.0.1", port
    finally:
        server.shutdown()
        server.server_close()


def call(where: tuple[str, int], method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(*where, timeout=5)
    try:
        conn.request(method, path, body=body)
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


def test_a_key_is_404_until_put_then_its_value(store: tuple[str, int]) -> None:
    assert call(store, "GET", "/global/rank_1")[0] == 404
    assert call(store, "PUT", "/global/rank_1", b"\x00addr:1234")[0] == 200
    assert call(store, "GET", "/global/rank_1") == (200, b"\x00addr:1234")
    assert call(store, "GET", "/local_worker-0/rank_1")[0] == 404, "scopes are separate"


def test_a_scope_is_cleared_once_every_member_is_done_with_it(store: tuple[str, int]) -> None:
    call(store, "PUT", "/local_worker-1/0", b"a")
    call(store, "PUT", "/global/0", b"g")
    assert call(store, "DELETE", "/local_worker-1/0")[0] == 200
    assert call(store, "GET", "/local_worker-1/0") == (200, b"a"), "one of two local ranks is still reading"
    call(store, "DELETE", "/local_worker-1/1")
    assert call(store, "GET", "/local_worker-1/0")[0] == 404
    assert call(store, "GET", "/global/0") == (200, b"g"), "the global scope has 4 members"


def test_a_scope_used_again_counts_its_members_afresh(store: tuple[str, int]) -> None:
    """`hvd.shutdown(); hvd.init()` meets in the same scopes: once both local ranks were done with one,
    the first rank done with its next use must not clear what the other has yet to read."""
    for member in ("0", "1"):
        call(store, "DELETE", f"/local_worker-0/{member}")
    call(store, "PUT", "/local_worker-0/rank_1", b"again")
    call(store, "DELETE", "/local_worker-0/0")
    assert call(store, "GET", "/local_worker-0/rank_1") == (200, b"again")


def test_a_path_that_is_not_scope_and_key_is_refused(store: tuple[str, int]) -> None:
    assert call(store, "GET", "/global")[0] == 400
    assert call(store, "PUT", "/a/b/c", b"x")[0] == 400


SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or "/usr/bin/python3"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another OS user")
def test_a_process_of_another_user_on_this_machine_is_refused(store: tuple[str, int]) -> None:
    call(store, "PUT", "/global/0", b"secret address")
    probe = (
        "import http.client, os, sys\n"
        "os.setgid(65534); os.setuid(65534)\n"
        f"c = http.client.HTTPConnection('127.0.0.1', {store[1]}, timeout=5)\n"
        "c.request('GET', '/global/0'); r = c.getresponse(); print(r.status, r.read())\n"
    )
    # The system interpreter: one the other user can read (a venv under /root may not be).
    out = subprocess.run([SYSTEM_PYTHON, "-I", "-c", probe], capture_output=True, text=True, timeout=30)
    assert out.stdout.split()[0] == "403", out.stderr
    assert "secret" not in out.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another OS user")
def test_a_put_whose_socket_is_gone_before_the_check_is_refused(store: tuple[str, int]) -> None:
    """Another user sends a whole PUT and resets the connection at once (SO_LINGER 0): no socket is
    left to look up by the time the store checks; it must refuse, not take the peer for a stranger's
    namespace (issue 37, finding 4)."""
    probe = (
        "import os, socket, struct\n"
        "os.setgid(65534); os.setuid(65534)\n"
        "body = b'injected'\n"
        "for i in range(60):\n"
        f"    s = socket.create_connection(('127.0.0.1', {store[1]}))\n"
        "    s.sendall(b'PUT /global/rank_%d HTTP/1.1\\r\\nHost: x\\r\\nContent-Length: %d\\r\\n\\r\\n' "
        "% (i, len(body)) + body)\n"
        "    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack('ii', 1, 0))\n"
        "    s.close()\n"
    )
    out = subprocess.run([SYSTEM_PYTHON, "-I", "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    stored = [i for i in range(60) if call(store, "GET", f"/global/rank_{i}")[0] == 200]
    assert stored == [], f"{len(stored)} of 60 values from another user were stored"


def test_a_peer_on_this_machine_that_cannot_be_found_is_refused() -> None:
    # a port no socket of this machine has: as if its owner had reset the connection already
    gone = ("127.0.0.1", free_port())
    store = ("127.0.0.1", free_port())
    assert not ranks._same_user(gone, store)
    # the address the store was reached at is this machine too
    assert not ranks._same_user(("198.18.0.3", gone[1]), ("198.18.0.3", store[1]))
    # a peer in another network namespace (another container or pod of the instance) is not listed here
    assert ranks._same_user(("198.18.0.4", gone[1]), ("198.18.0.3", store[1]))


def test_a_port_reused_by_this_user_to_reach_elsewhere_is_not_the_peer() -> None:
    """The peer resets its connection and this user's own process reuses the freed port to reach
    another server: that socket is this user's, but it is not the peer's connection to the store."""
    with (
        socket.create_server(("127.0.0.1", 0)) as elsewhere,
        socket.create_connection(elsewhere.getsockname()) as reused,
    ):
        port = reused.getsockname()[1]
        store = ("127.0.0.1", free_port())
        assert not ranks._same_user(("127.0.0.1", port), store)
        # the very connection (its remote end is the server's address) is this user's
        assert ranks._same_user(("127.0.0.1", port), elsewhere.getsockname())


def lookups() -> list[object]:
    return [
        pytest.param(ranks._owner_by_diag, id="sock_diag",
                     marks=pytest.mark.skipif(not ranks._diag_works(), reason="no sock_diag here")),
        pytest.param(ranks._owner_by_proc, id="/proc/net/tcp"),
    ]  # fmt: skip


@pytest.mark.parametrize("owner", lookups())
def test_the_peer_socket_is_found_by_its_whole_four_tuple(owner: Callable[..., int | None]) -> None:
    """What the store learns of a peer, by either lookup: the live connection's owner, nothing for a
    port no connection to the store holds (free, or reused to reach elsewhere), GONE for a closed one."""
    with (
        socket.create_server(("127.0.0.1", 0)) as server,
        socket.create_server(("127.0.0.1", 0)) as elsewhere,
    ):
        store = server.getsockname()
        with socket.create_connection(store) as live, server.accept()[0]:
            assert owner(live.getsockname(), store) == os.getuid()
        assert owner(("127.0.0.1", free_port()), store) is None
        with socket.create_connection(elsewhere.getsockname()) as reused:
            assert owner(reused.getsockname(), store) is None
        with socket.create_connection(store) as closed, server.accept()[0]:
            peer = closed.getsockname()
            closed.close()  # the peer hangs up first; its end lingers with no process holding it
            assert owner(peer, store) == ranks.GONE
