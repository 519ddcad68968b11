"""Separate network "hosts" on one Linux machine, for deployment tests: one network namespace per
organisation, joined to the host by a veth pair (``ip netns`` and ``ip link``, root only).

Organisation ``k`` gets the namespace ``<prefix>-<k>`` with its own loopback and the address
``10.<a>.<k>.2/24``; the host side of its pair is ``10.<a>.<k>.1``. A process started with
:meth:`Hosts.command` (``ip netns exec <ns> ...``) sees only its namespace's interfaces: it reaches
the SuperLink at the host address of its pair and nothing on the host's loopback, as a SuperNode on
another machine would. ``tc netem`` is not available here, so latency is not emulated.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field


class NetnsUnavailable(RuntimeError):
    """This machine cannot make network namespaces (not root, or no ``ip`` command)."""


def _ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise NetnsUnavailable(f"`ip {' '.join(args)}` failed: {r.stderr.strip() or r.returncode}")


@dataclass
class Hosts:
    """``n`` network namespaces, each a "host" with its own address (a context manager: made on
    enter, deleted with their veth pairs on exit).

    Attributes:
        n: the number of namespaces.
        prefix: name prefix (default: ``hfl<pid>``, so parallel test runs do not collide).
        subnet: the second octet ``a`` of the ``10.a.k.0/24`` networks.
    """

    n: int
    prefix: str = ""
    subnet: int = 231
    names: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.prefix:
            self.prefix = f"hfl{os.getpid() % 100000}"

    def host_address(self, k: int) -> str:
        """The host side of namespace ``k``'s pair: where its processes reach the host."""
        return f"10.{self.subnet}.{k}.1"

    def address(self, k: int) -> str:
        """Namespace ``k``'s own address."""
        return f"10.{self.subnet}.{k}.2"

    def command(self, k: int, cmd: list[str]) -> list[str]:
        """``cmd`` run inside namespace ``k``."""
        return ["ip", "netns", "exec", self.names[k], *cmd]

    def __enter__(self) -> Hosts:
        """Make the namespaces and pairs.

        Raises:
            NetnsUnavailable: not root, no ``ip``, or an ``ip`` command failed (nothing left behind).
        """
        if os.geteuid() != 0 or shutil.which("ip") is None:
            raise NetnsUnavailable("network namespaces need root and the `ip` command (iproute2).")
        try:
            for k in range(self.n):
                ns, veth = f"{self.prefix}-{k}", f"{self.prefix}v{k}"
                _ip("netns", "add", ns)
                self.names.append(ns)
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth}n")
                _ip("link", "set", f"{veth}n", "netns", ns)
                _ip("addr", "add", f"{self.host_address(k)}/24", "dev", veth)
                _ip("link", "set", veth, "up")
                _ip("-n", ns, "addr", "add", f"{self.address(k)}/24", "dev", f"{veth}n")
                _ip("-n", ns, "link", "set", f"{veth}n", "up")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        """Delete the namespaces (their ends of the pairs go with them) and the host ends."""
        for k, ns in enumerate(self.names):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            subprocess.run(["ip", "link", "del", f"{self.prefix}v{k}"], capture_output=True)
        self.names = []
