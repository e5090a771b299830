"""Every TCP port of the session's Milvus server (the process :mod:`harness.milvus` starts and its children) is
either bound to loopback or in a network namespace that has no interface but its own loopback, so nothing outside
this host reaches any of them, and none answers a request without credentials: no REST API (Milvus 2.3 served
``/api/v1`` on its HTTP port, 9091, without authentication: collections, users, texts, deletes), and gRPC on the
proxy port wants a token.

The listening sockets are read from ``/proc`` (each process's socket descriptors, matched against the TCP table of
its own network namespace), not from ``ss``, which a CI machine may lack. With the server in the host's namespace (as
before harness/milvus_netns.py, or with ``EMBED_TEST_MILVUS_NETNS=0``) the first test fails: Milvus's ports listen on
every interface.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from harness.milvus import milvus_client

#: paths of Milvus's REST APIs (2.3: ``/api/v1`` on the HTTP port, ``/v1`` on the proxy port) that read or change data
REST_PATHS = ("/api/v1/collections", "/api/v1/credential/users", "/v1/vector/collections")


def _tree(root: int) -> list[int]:
    """``root`` and every process descended from it."""
    parent: dict[int, int] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                parent[int(p.name)] = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    pids, frontier = [root], [root]
    while frontier:
        frontier = [c for c, pp in parent.items() if pp in frontier]
        pids += frontier
    return pids


def _addr(hex_addr: str) -> str:
    """An address of ``/proc/net/tcp{,6}`` (host-order 32-bit words in hex) as text."""
    raw = bytes.fromhex(hex_addr)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def _listening(pids: list[int]) -> list[dict]:
    """The listening TCP sockets held by ``pids``: ``{pid, comm, netns, addr, port}`` each."""
    tables: dict[str, dict[int, tuple[str, int]]] = {}
    out = []
    for pid in pids:
        try:
            ns = os.readlink(f"/proc/{pid}/ns/net")
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            inodes = set()
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if link.startswith("socket:["):
                    inodes.add(int(link[8:-1]))
            if ns not in tables:  # the TCP table of the namespace ``pid`` is in
                table = {}
                for name in ("tcp", "tcp6"):
                    for line in Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:]:
                        f = line.split()
                        if f[3] == "0A":  # TCP_LISTEN
                            local, port = f[1].split(":")
                            table[int(f[9])] = (_addr(local), int(port, 16))
                tables[ns] = table
        except OSError:  # the process ended meanwhile
            continue
        out += [{"pid": pid, "comm": comm, "netns": ns, "addr": tables[ns][i][0], "port": tables[ns][i][1]}
                for i in sorted(inodes) if i in tables[ns]]  # fmt: skip
    return out


def _interfaces(pid: int) -> set[str]:
    """The network interfaces of the namespace ``pid`` is in."""
    lines = Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]
    return {line.split(":", 1)[0].strip() for line in lines}


def _host_addresses() -> list[str]:
    """This host's own addresses other than loopback (IPv4 from ``/proc/net/fib_trie``, global IPv6 from
    ``/proc/net/if_inet6``)."""
    addrs: set[str] = set()
    last = ""
    for line in Path("/proc/net/fib_trie").read_text().splitlines():
        s = line.strip()
        if s.startswith("|--") or s.startswith("+--"):
            last = s[3:].strip().split("/")[0]
        elif s.endswith("host LOCAL") and last:
            addrs.add(last)
    if Path("/proc/net/if_inet6").exists():
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            hex_addr, _, _, scope = line.split()[:4]
            if scope == "00":  # global scope
                addrs.add(str(ipaddress.ip_address(bytes.fromhex(hex_addr))))
    return sorted(a for a in addrs if not ipaddress.ip_address(a).is_loopback)


def _connects(addr: str, port: int) -> bool:
    try:
        with socket.create_connection((addr, port), timeout=1.0):
            return True
    except OSError:
        return False


#: run inside Milvus's namespace (``python -c PROBE PATHS_JSON PORT...``): GET each path on each port, no credentials
_PROBE = """
import json, sys, urllib.error, urllib.request
out = {}
for port in sys.argv[2:]:
    for path in ["/healthz", *json.loads(sys.argv[1])]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as r:
                out[port + path] = [r.status, r.read(200).decode(errors="replace")]
        except urllib.error.HTTPError as e:
            out[port + path] = [e.code, ""]
        except Exception as e:
            out[port + path] = [None, type(e).__name__]
print(json.dumps(out))
"""


def _http_get(addr: str, port: int, path: str) -> tuple[int | None, str]:
    """GET ``path`` without credentials: (status, body start), or (None, the error's name)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{addr}:{port}{path}", timeout=3) as r:
            return r.status, r.read(200).decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, ""
    except Exception as e:  # reset, refused, not HTTP
        return None, type(e).__name__


def _why(server) -> str:
    return getattr(server, "not_isolated_because", "harness.milvus has no network namespace")


@pytest.fixture(scope="module")
def server(milvus):
    if milvus is None:
        pytest.skip("EMBED_TEST_MILVUS_URI names a server this session did not start: its processes are not ours")
    return milvus


def test_every_milvus_port_is_loopback_or_in_a_namespace_of_its_own(server):
    socks = _listening(_tree(server.proc.pid))
    ports = {s["port"] for s in socks}
    assert server.port in ports and any(s["comm"] == "milvus" for s in socks), socks  # the server itself found
    here = os.readlink("/proc/self/ns/net")
    exposed = [s for s in socks if s["netns"] == here and not ipaddress.ip_address(s["addr"]).is_loopback]
    assert not exposed, (
        f"Milvus ports listening on more than loopback in this host's network namespace: "
        f"{sorted((s['port'], s['addr'], s['comm']) for s in exposed)}"
        + ("" if getattr(server, "isolated", False) else f" (no namespace of its own: {_why(server)})")
    )
    for s in socks:  # a namespace of its own: nothing but its loopback, so nothing outside reaches it
        if s["netns"] != here:
            assert _interfaces(s["pid"]) == {"lo"}, (s, _interfaces(s["pid"]))
    reached = [(a, p) for a in _host_addresses() for p in sorted(ports) if _connects(a, p)]
    assert not reached, f"Milvus ports reachable on this host's other addresses: {reached}"
    # from here, every port that answers on loopback refuses a request without credentials
    for s in socks:
        if s["netns"] == here:
            for path in REST_PATHS:
                status, body = _http_get("127.0.0.1", s["port"], path)
                assert status != 200, f"{s['port']}{path} answered without credentials: {body}"
    with pytest.raises(Exception, match="(?i)unauthenticated|authorization|auth"):
        c = milvus_client(server.uri, token="")
        try:
            c.list_collections()
        finally:
            c.close()


def test_no_rest_api_inside_the_namespace(server):
    """Inside Milvus's namespace too (where anything that shares its network, such as a container network, would
    reach it): the HTTP port answers ``/healthz`` (so the probe got there) and no REST path."""
    socks = [s for s in _listening(_tree(server.proc.pid)) if s["comm"] == "milvus"]
    if not getattr(server, "isolated", False):
        pytest.skip("Milvus runs in this host's namespace: the first test probed its ports from here")
    assert socks, "no listening socket of the milvus process"
    pid = socks[0]["pid"]
    enter = (["nsenter", f"--net=/proc/{pid}/ns/net"] if os.geteuid() == 0
             else ["nsenter", "--target", str(pid), "--user", "--net", "--preserve-credentials"])  # fmt: skip
    ports = sorted({s["port"] for s in socks})
    try:
        r = subprocess.run([*enter, sys.executable, "-c", _PROBE, json.dumps(list(REST_PATHS)), *map(str, ports)],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    except FileNotFoundError:
        pytest.skip("no nsenter (util-linux) to probe inside the namespace")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert any(v == [200, "OK"] for k, v in got.items() if k.endswith("/healthz")), got
    answered = {k: v for k, v in got.items() if any(k.endswith(p) for p in REST_PATHS) and v[0] == 200}
    assert not answered, f"REST paths answered without credentials inside Milvus's namespace: {answered}"
