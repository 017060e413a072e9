"""A TCP proxy on the loopback that a test can cut and restore: a network partition between one process
and a server (a `hai serve` and its database), without touching the machine's network."""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading


class Proxy:
    """Forwards 127.0.0.1:`port` to `target`. `cut()` drops every connection and refuses new ones (they
    are accepted and closed at once, as a broken route would); `restore()` lets them through again."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._cut = False
        self._closing = False
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            dropped, self._open = self._open, []
        for sock in dropped:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def restore(self) -> None:
        with self._lock:
            self._cut = False

    def close(self) -> None:
        self._closing = True
        self.cut()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                cut = self._cut
            if cut:
                client.close()
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open += [client, server]
            threading.Thread(target=self._pump, args=(client, server), name="proxy-pump", daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(a, selectors.EVENT_READ, b)
            sel.register(b, selectors.EVENT_READ, a)
            while True:
                try:
                    for key, _ in sel.select(timeout=1):
                        data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                        if not data:
                            raise OSError("closed")
                        key.data.sendall(data)
                except (OSError, ValueError):
                    break
        for sock in (a, b):
            with contextlib.suppress(OSError):
                sock.close()
