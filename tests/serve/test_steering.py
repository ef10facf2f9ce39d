"""The handoff's steering on the real kernel: once the successor has attached its reuseport program, every
new connection on the port lands on it, so the predecessor's accept queue stays empty and closing it resets
nothing. Without the program the kernel spreads connections over both listeners by hash."""

from __future__ import annotations

import socket

from kernels.serve.lifecycle import bind_socket, steer_to_newest

from .conftest import free_port

CONNECTIONS = 32


def _accept_all(sock: socket.socket) -> int:
    sock.setblocking(False)
    n = 0
    while True:
        try:
            conn, _ = sock.accept()
        except BlockingIOError:
            return n
        conn.close()
        n += 1


def _connect(port: int, count: int) -> list[socket.socket]:
    # distinct source ports: the kernel's hash spreads them when no program steers
    return [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(count)]


def test_without_steering_connections_spread_over_both_listeners() -> None:
    port = free_port()
    old, new = bind_socket("127.0.0.1", port), bind_socket("127.0.0.1", port)
    old.listen(64)
    new.listen(64)
    clients = _connect(port, CONNECTIONS)
    try:
        on_old, on_new = _accept_all(old), _accept_all(new)
        assert on_old + on_new == CONNECTIONS and on_old > 0 and on_new > 0
    finally:
        for c in clients:
            c.close()
        old.close()
        new.close()


def test_steering_sends_every_new_connection_to_the_successor() -> None:
    port = free_port()
    old, new = bind_socket("127.0.0.1", port), bind_socket("127.0.0.1", port)
    old.listen(64)
    new.listen(64)
    assert steer_to_newest(new)
    clients = _connect(port, CONNECTIONS)
    try:
        assert _accept_all(old) == 0
        assert _accept_all(new) == CONNECTIONS
        old.close()  # nothing was queued there: nothing to reset
        # with the predecessor gone, index 1 no longer exists: the kernel falls back to the one left
        later = _connect(port, 4)
        assert _accept_all(new) == 4
        for c in later:
            c.close()
    finally:
        for c in clients:
            c.close()
        new.close()
