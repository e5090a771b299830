"""Run a command (the Milvus server) in the network namespace this process is in, a fresh one, with one TCP port
reachable from outside it: a loopback listening socket of the outer namespace, inherited, forwarded to the same port
on the namespace's own loopback.

Milvus 2.3 listens on every interface (its proxy, eight component ports, the HTTP port of ``/healthz`` and metrics)
and no setting binds them to an address (:mod:`harness.milvus`). In a namespace of its own, "every interface" is
that namespace's loopback: nothing outside it reaches those ports, and its embedded etcd's fixed ports 2379-2380 no
longer clash with the host's. Only the proxy port is forwarded, from the outer loopback.

``harness/milvus.py`` starts it as::

    unshare --net [--map-root-user] python milvus_netns.py --listen-fd FD --port P -- milvus-server ...

with FD a socket already listening on ``127.0.0.1:P`` in the outer namespace (``unshare`` creates the namespace,
then execs this script, which keeps the inherited descriptor). The script brings the namespace's loopback up, starts
the command, forwards every connection accepted on FD to ``127.0.0.1:P`` inside, and exits with the command's status
when it exits (the listening socket closes with it: a client then gets "connection refused", as from a stopped
server). SIGINT to the process group stops the command (this script waits for it); SIGTERM to this script alone is
passed on to the command as SIGINT. It imports nothing from the project. Python standard library only; Linux only.
"""

from __future__ import annotations

import argparse
import fcntl
import signal
import socket
import struct
import subprocess
import sys
import threading

SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
IFREQ = "16sH22x"  # struct ifreq: the interface name, then ifr_flags in a 24-byte union


def loopback_up() -> None:
    """Bring ``lo`` up (a new network namespace starts with it down); needs CAP_NET_ADMIN in the namespace."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack(IFREQ, fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack(IFREQ, b"lo", 0)))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack(IFREQ, b"lo", flags | IFF_UP))


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy ``src`` to ``dst`` until ``src`` ends, then end ``dst``'s sending side."""
    try:
        while data := src.recv(1 << 16):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _serve(client: socket.socket, port: int) -> None:
    """Forward one accepted connection to ``127.0.0.1:port`` here; closed at once if nothing listens there yet."""
    try:
        upstream = socket.create_connection(("127.0.0.1", port), timeout=5)
    except OSError:
        client.close()
        return
    upstream.settimeout(None)
    for s in (client, upstream):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # gRPC's small frames: no Nagle delay per hop
    back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
    back.start()
    _pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def forward(listener: socket.socket, port: int) -> None:
    """Accept on ``listener`` forever, one thread per connection."""
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=_serve, args=(client, port), daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    """Command line (see the module docstring); returns the command's exit status."""
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--listen-fd", type=int, required=True, help="a listening socket of the outer namespace")
    p.add_argument("--port", type=int, required=True, help="the port to forward to on this namespace's loopback")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the command to run")
    a = p.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        p.error("no command")
    listener = socket.socket(fileno=a.listen_fd)
    loopback_up()
    child = subprocess.Popen(cmd)  # the listening socket is not passed on (close_fds)

    def stop(_sig: int, _frame: object) -> None:
        if child.poll() is None:
            child.send_signal(signal.SIGINT)  # the wrapper stops its server on SIGINT

    signal.signal(signal.SIGINT, lambda *_: None)  # sent to the process group: the command has it too
    signal.signal(signal.SIGTERM, stop)
    threading.Thread(target=forward, args=(listener, a.port), daemon=True).start()
    rc = child.wait()
    listener.close()
    return rc


if __name__ == "__main__":
    sys.exit(main())
