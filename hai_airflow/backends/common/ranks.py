"""The per-worker rank launcher: one process per GPU, worker 0's gloo rendezvous, one fate for all ranks.

Started by every backend in place of the job's command when the job's `processes` is per-gpu, as
`python3 -I -S -c SOURCE LOCAL_SIZE FIRST_RANK SERVE COMMAND` inside the worker (a process of the
local backend, a container, a pod). It imports only the standard library of whatever Python 3 the job's
image has, so it needs nothing installed. For each local rank i it starts `/bin/sh -c COMMAND` with the
variables Horovod's own gloo launcher gives its ranks and torch.distributed's, computed from i:
RANK = HOROVOD_RANK = FIRST_RANK + i and LOCAL_RANK = HOROVOD_LOCAL_RANK = i; everything that is the
same for the whole worker (sizes, cross rank, rendezvous address) is already in its environment.

SERVE is "-", or on worker 0 the HOST:PORT where this launcher serves the small HTTP key-value store
Horovod's gloo rendezvous speaks (PUT /scope/key, GET it: 404 until it exists, DELETE at the end). The
store lives in this process, holds only this instance's keys and ends with the instance. Every worker
waits until the store answers at $HOROVOD_GLOO_RENDEZVOUS_ADDR:PORT before it starts its ranks.

Each rank runs in a process group of its own and its output lines get a "[rank N] " prefix.
SIGTERM/SIGINT/SIGHUP to the launcher (all a container's runtime or the kubelet signals) are passed on to
every rank's group (an elastic job saves and exits 75). A rank that fails while nobody asked the worker
to stop takes the others down (SIGTERM, SIGKILL after a few seconds): a gang with a missing member would
wait in a collective for ever. The worker's exit code is that rank's (128 + N for signal N), else 75
if a rank saved on notice, else 0. Worker 0 keeps its store until every worker has checked in.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import http.client
import ipaddress
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from socketserver import ThreadingMixIn

SHELL = "/bin/sh"
TRAP_TERM = "trap 'exit $?' TERM INT HUP\n"
"""Each rank's shell outlives SIGTERM until its command (which got it too) has saved and exited."""
FAILURE_GRACE_SECONDS = 5.0
"""How long the other ranks get to exit on SIGTERM after one failed, before SIGKILL."""
SAVED = 75
RENDEZVOUS_WAIT_SECONDS = 600.0
"""How long the ranks of other workers wait for worker 0 to start (a pod may wait for its image)."""
CHECK_IN_SCOPE = "hai-workers"
"""Where each worker's launcher says it is there (a scope Horovod does not use)."""
MAX_VALUE_BYTES = 1 << 20
"""A rendezvous value is a few dozen bytes of addresses; nothing legitimate comes near this."""
MAX_PENDING = 64 * 1024


class _Store(ThreadingMixIn, HTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], sizes: dict[str, int]) -> None:
        super().__init__(address, _Handler)
        self.lock = threading.Lock()
        self.values: dict[tuple[str, str], bytes] = {}
        self.finished: dict[str, set[str]] = {}
        self.sizes = sizes

    def handle_error(self, request: object, client_address: object) -> None:
        """A peer that hangs up before its answer (a refused stranger resetting) is not an error."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


class _Handler(BaseHTTPRequestHandler):
    server: _Store

    def _key(self) -> tuple[str, str] | None:
        if not _same_user(self.client_address, self.connection.getsockname()):
            self._answer(403)
            return None
        parts = self.path.split("/")
        if len(parts) != 3 or not parts[1] or not parts[2]:
            self._answer(400)
            return None
        return parts[1], parts[2]

    def _answer(self, status: int, body: bytes = b"") -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def do_GET(self) -> None:
        key = self._key()
        if key is None:
            return
        with self.server.lock:
            value = self.server.values.get(key)
        self._answer(404) if value is None else self._answer(200, value)

    def do_PUT(self) -> None:
        key = self._key()
        if key is None:
            return
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 <= length <= MAX_VALUE_BYTES:
            self._answer(413)
            return
        value = self.rfile.read(length)
        with self.server.lock:
            self.server.values[key] = value
        self._answer(200)

    def do_DELETE(self) -> None:
        """A rank finished with a scope; once all of its members have, the scope's keys go, and its
        next use (`hvd.shutdown(); hvd.init()`) counts its members afresh, as Horovod's own server does."""
        key = self._key()
        if key is None:
            return
        scope, member = key
        with self.server.lock:
            done = self.server.finished.setdefault(scope, set())
            done.add(member)
            expected = self.server.sizes.get(scope.split("_", 1)[0])
            if expected is None or len(done) >= expected:
                for k in [k for k in self.server.values if k[0] == scope]:
                    del self.server.values[k]
                del self.server.finished[scope]
        self._answer(200)

    def log_message(self, format: str, *args: object) -> None:
        pass


def _same_user(peer: tuple[str, int], local: tuple[str, int]) -> bool:
    """Whether the peer may use the store: its socket is this user's, or it lives in another network
    namespace (another container or pod of the instance, which this namespace's tables do not list).

    The peer's socket is the one whose own address is the peer's and whose remote end is this very
    connection's (the whole four-tuple: a port the peer freed and another process reused to reach
    elsewhere is not it). A peer on this machine's own address (loopback, or the address the store was
    reached at) must be found, and found to be this user's: a socket that is gone already (a request
    sent, then reset) is refused, never taken for a stranger's namespace. On the local backend every job
    of the machine is listed, and jobs run as their owners' accounts (`run_as`) cannot read each other's
    store. Horovod opens a connection per request, so this runs for each one.
    """
    try:
        owner = _owner_by_diag(peer, local) if _diag_works() else _owner_by_proc(peer, local)
    except OSError:  # a netlink socket refused for the moment (no file descriptor left): the slow way
        owner = _owner_by_proc(peer, local)
    if owner is None:
        return not _on_this_machine(peer[0], local[0])
    return owner == os.getuid()


GONE = -1
"""The owner of a socket with the peer's four-tuple that no process holds any more (closed, reset, or
in TIME_WAIT): never this user."""
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 1
NLMSG_ERROR = 2
TCP_LISTEN = 10
NO_COOKIE = 0xFFFFFFFF


def _owner_by_diag(peer: tuple[str, int], local: tuple[str, int]) -> int | None:
    """The uid holding the peer's socket, GONE, or None where this namespace has no such socket.

    One sock_diag query asks the kernel for the socket by its exact four-tuple (what `ss` does): a
    hash lookup, where reading /proc/net/tcp walks every bucket of the table (milliseconds a read, and
    Horovod polls every 10 ms per rank). OSError where the kernel does not answer.
    """
    family = socket.AF_INET6 if ":" in peer[0] else socket.AF_INET

    def raw(host: str) -> bytes:
        return socket.inet_pton(family, host).ljust(16, b"\0")

    request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF)
    request += struct.pack("!HH16s16s", peer[1], local[1], raw(peer[0]), raw(local[0]))
    request += struct.pack("=III", 0, NO_COOKIE, NO_COOKIE)
    header = struct.pack("=IHHII", 16 + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as diag:
        diag.settimeout(5)
        diag.send(header + request)
        answer = diag.recv(8192)
    if struct.unpack_from("=H", answer, 4)[0] == NLMSG_ERROR:
        error = -struct.unpack_from("=i", answer, 16)[0]
        if error == errno.ENOENT:
            return None
        raise OSError(error, os.strerror(error))
    # struct inet_diag_msg after the 16-byte header: family, state, timer, retrans, the socket's id
    # (ports, addresses, interface, cookie: 48 bytes), expires, queues, then uid and inode.
    state, ports = answer[17], struct.unpack_from("!HH", answer, 20)
    uid, inode = struct.unpack_from("=II", answer, 80)
    if state == TCP_LISTEN or ports != (peer[1], local[1]):
        return None  # a listener on the peer's port is not the peer's connection
    return GONE if inode == 0 else int(uid)


@functools.lru_cache(maxsize=None)  # noqa: UP033 (functools.cache is new in 3.9; images may be older)
def _diag_works() -> bool:
    """Whether this kernel answers sock_diag lookups (no tcp_diag, or a sandbox, reads as "no such
    socket"): a connection of this very process must be found, and found to be its own."""
    try:
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen(1)
            with socket.create_connection(server.getsockname(), timeout=5) as client:
                return _owner_by_diag(client.getsockname(), server.getsockname()) == os.getuid()
    except OSError:
        return False


def _owner_by_proc(peer: tuple[str, int], local: tuple[str, int]) -> int | None:
    """What `_owner_by_diag` finds, read from /proc/net/tcp{,6} where the kernel answers no sock_diag."""
    found = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and _address(fields[1]) == peer[:2] and _address(fields[2]) == local[:2]:
                found = True
                # inode 0: no process holds this socket any more (closed, reset, or an earlier
                # connection from the same port in TIME_WAIT), and its uid reads 0: look on for the live one
                if fields[9] != "0":
                    return int(fields[7])
    return GONE if found else None


def _on_this_machine(host: str, local_host: str) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return True  # what cannot be read is not trusted
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return (mapped or address).is_loopback or host == local_host


def _address(field: str) -> tuple[str, int]:
    """The IPv4 address and port of a /proc/net/tcp{,6} address field (IPv4-mapped in tcp6); the
    address is "" for anything else."""
    raw, _, port = field.partition(":")
    if len(raw) == 32 and raw[:24].upper() == "0000000000000000FFFF0000":
        raw = raw[24:]
    host = ".".join(str(int(raw[i : i + 2], 16)) for i in (6, 4, 2, 0)) if len(raw) == 8 else ""
    return host, int(port or "0", 16)


def serve(address: str, size: int, local_size: int, cross_size: int) -> _Store:
    """Serve the rendezvous store at HOST:PORT in a background thread."""
    host, _, port = address.rpartition(":")
    # Scopes are "global", "local_<host>" and "cross_<local rank>" (Horovod's gloo context).
    store = _Store((host, int(port)), {"global": size, "local": local_size, "cross": cross_size})
    _diag_works()  # decided once, before the first rank asks
    threading.Thread(target=store.serve_forever, name="rendezvous", daemon=True).start()
    return store


def _exit_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


class Ranks:
    """The worker's rank processes and how they ended."""

    def __init__(self, command: str, local_size: int, first_rank: int) -> None:
        self.pids: dict[int, int] = {}
        self.codes: dict[int, int] = {}
        self.outputs: dict[int, tuple[int, bytes]] = {}
        self.failed: tuple[int, int] | None = None
        self.stop_asked = False
        self.kill_at: float | None = None
        for i in range(local_size):
            self._start(command, first_rank, i)

    def _start(self, command: str, first_rank: int, local: int) -> None:
        rank = first_rank + local
        env = dict(os.environ)
        env.update(
            RANK=str(rank), HOROVOD_RANK=str(rank), LOCAL_RANK=str(local), HOROVOD_LOCAL_RANK=str(local)
        )
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(read)
                os.dup2(write, 1)
                os.dup2(write, 2)
                os.close(write)
                os.setpgid(0, 0)
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE, signal.SIGXFSZ):
                    signal.signal(sig, signal.SIG_DFL)
                os.execve(SHELL, [SHELL, "-c", TRAP_TERM + command], env)
            finally:
                os._exit(127)
        os.close(write)
        with contextlib.suppress(OSError):  # the child may have done it (or exec'd) first
            os.setpgid(pid, pid)
        self.pids[pid] = rank
        self.outputs[read] = (rank, b"")

    def signal_all(self, sig: int) -> None:
        """Signal every rank's process group: the rank's command and whatever it started."""
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)

    def on_signal(self, signum: int, frame: object) -> None:
        self.stop_asked = True
        self.signal_all(signum)

    def run(self) -> int:
        while self.pids or self.outputs:
            self._pump(0.1)
            self._reap()
            if self.kill_at is not None and time.monotonic() >= self.kill_at:
                self.signal_all(signal.SIGKILL)
                self.kill_at = None
        if self.failed is not None:
            return self.failed[1]
        codes = list(self.codes.values())
        if SAVED in codes:
            return SAVED
        return next((c for c in codes if c != 0), 0)

    def _reap(self) -> None:
        while self.pids:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.pids.clear()
                return
            if pid == 0:
                return
            rank = self.pids.pop(pid, None)
            if rank is None:
                continue
            code = self.codes[rank] = _exit_code(status)
            if code not in (0, SAVED) and self.failed is None and not self.stop_asked:
                self.failed = (rank, code)
                how = f"was killed by signal {code - 128}" if code > 128 else f"exited with code {code}"
                left = sorted(self.pids.values())
                note = f"; stopping rank(s) {', '.join(map(str, left))}" if left else ""
                _say(f"rank {rank} {how}{note}")
                if left:
                    self.signal_all(signal.SIGTERM)
                    self.kill_at = time.monotonic() + FAILURE_GRACE_SECONDS

    def _pump(self, timeout: float) -> None:
        if not self.outputs:
            time.sleep(timeout)
            return
        try:
            ready = select.select(list(self.outputs), [], [], timeout)[0]
        except InterruptedError:
            return
        for fd in ready:
            rank, pending = self.outputs[fd]
            data = os.read(fd, 65536)
            prefix = f"[rank {rank}] ".encode()
            if not data:
                if pending:
                    _write(prefix + pending + b"\n")
                os.close(fd)
                del self.outputs[fd]
                continue
            head, sep, rest = (pending + data).rpartition(b"\n")
            if sep:
                _write(b"".join(prefix + line + b"\n" for line in head.split(b"\n")))
            elif len(rest) > MAX_PENDING:
                _write(prefix + rest + b"\n")
                rest = b""
            self.outputs[fd] = (rank, rest)


def _write(data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]


def _say(text: str) -> None:
    _write(f"hai: {text}\n".encode())


def check_in(host: str, port: int, worker: int, seconds: float) -> bool:
    """Wait until worker 0's store answers (Horovod gives up after three tries 1.5 s apart), and say so.

    Worker 0 keeps its store until every worker has checked in, so a worker starting late still finds
    it even when worker 0's ranks had nothing to wait for and are done already.
    """
    deadline = time.monotonic() + seconds
    while True:
        try:
            conn = http.client.HTTPConnection(host, port, timeout=5)
            conn.request("PUT", f"/{CHECK_IN_SCOPE}/{worker}", body=b"1")
            ok = conn.getresponse().status == 200
            conn.close()
            if ok:
                return True
        except OSError:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def linger(store: _Store, workers: int, seconds: float) -> None:
    """Keep worker 0's store up until every other worker has checked in (or `seconds` passed)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with store.lock:
            arrived = sum(1 for scope, _ in store.values if scope == CHECK_IN_SCOPE)
        if arrived >= workers:
            return
        time.sleep(0.05)


def main(argv: list[str]) -> int:
    local_size, first_rank, serving, command = int(argv[1]), int(argv[2]), argv[3], argv[4]
    env = os.environ
    workers = int(env["HOROVOD_CROSS_SIZE"])
    store = serve(serving, int(env["HOROVOD_SIZE"]), local_size, workers) if serving != "-" else None
    host, port = env["HOROVOD_GLOO_RENDEZVOUS_ADDR"], int(env["HOROVOD_GLOO_RENDEZVOUS_PORT"])
    worker = first_rank // max(1, local_size)
    if not check_in(host, port, worker, RENDEZVOUS_WAIT_SECONDS):
        _say(f"worker 0's rendezvous at {host}:{port} did not answer within {RENDEZVOUS_WAIT_SECONDS:.0f} s")
        return 1
    ranks = Ranks(command, local_size, first_rank)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, ranks.on_signal)
    code = ranks.run()
    if store is not None and code in (0, SAVED) and not ranks.stop_asked:
        linger(store, workers, RENDEZVOUS_WAIT_SECONDS)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
