"""A SuperLink and N SuperNodes as real processes, and ``flwr run`` against them.

Used by the loopback tests, the benchmark and ``hybridfl deploy-local``. By default the SuperLink
serves TLS (a CA and certificate made with ``openssl``) and authenticates SuperNodes the way Flower
1.41 does (``--enable-supernode-auth``: every SuperNode has its own ECDSA P-384 key pair, the
public key is registered with ``flwr supernode register`` before the node starts, and a node whose
key is not registered cannot join). ``tls=False`` (``--insecure``) is for local experiments only.

All processes run on 127.0.0.1, or, with ``hosts`` (:class:`~hybridfl.runtime.flower.netns.Hosts`),
each SuperNode in its own network namespace reaching the SuperLink at its own host address. Every
process is started in its own process group and :meth:`LocalFederation.stop` kills the groups
(SIGTERM, then SIGKILL after a grace period), also when start-up or the run fails. Ports are
chosen free at run time. ``FLWR_HOME`` is a directory of the federation (a temporary one by
default), so the user's Flower configuration is never touched.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from hybridfl.runtime.flower import APP_DIR

if TYPE_CHECKING:
    from hybridfl.runtime.flower.netns import Hosts

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def make_certificates(
    out_dir: str | Path, hosts: tuple[str, ...] = (LOOPBACK, "localhost"), days: int = 365
) -> dict[str, Path]:
    """A self-signed CA and a SuperLink certificate signed by it, with ``openssl``.

    The same commands are in ``docs/deploy.md``. ``hosts`` become the certificate's subject
    alternative names (IP addresses or DNS names the SuperNodes use to reach the SuperLink).

    Returns:
        ``{"ca": ca.crt, "cert": server.pem, "key": server.key}`` paths.

    Raises:
        RuntimeError: ``openssl`` is missing or failed (its message is included).
    """
    import ipaddress

    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    san = []
    for h in hosts:
        try:
            ipaddress.ip_address(h)
            san.append(f"IP:{h}")
        except ValueError:
            san.append(f"DNS:{h}")
    cmds = [  # argv lists (no shell): a CA, the SuperLink's key and request, its certificate signed by the CA
        f"openssl req -x509 -newkey rsa:2048 -nodes -days {days} -subj /CN=hybridfl-ca -keyout ca.key -out ca.crt",
        "openssl req -newkey rsa:2048 -nodes -subj /CN=hybridfl-superlink -keyout server.key -out server.csr",
        f"openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days {days} -sha256 "
        "-out server.pem -extfile san.cnf",
    ]
    (d / "san.cnf").write_text("subjectAltName = " + ",".join(san) + "\n")
    for c in cmds:
        try:
            r = subprocess.run(c.split(), cwd=d, capture_output=True, text=True, timeout=120)
        except FileNotFoundError:
            raise RuntimeError("openssl is not installed; it is needed to make TLS certificates.") from None
        if r.returncode != 0:
            raise RuntimeError(
                f"openssl failed: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}"
            )
    return {"ca": d / "ca.crt", "cert": d / "server.pem", "key": d / "server.key"}


def make_node_key(out_dir: str | Path, name: str) -> tuple[Path, Path]:
    """A SuperNode's authentication key pair, as Flower 1.41 expects it: ECDSA on NIST P-384 in
    OpenSSH format, ``<name>.key`` (private, mode 0600, for ``flower-supernode
    --auth-supernode-private-key``) and ``<name>.pub`` (for ``flwr supernode register``).

    Returns:
        ``(private key path, public key path)``.

    Raises:
        DataError: the private key file exists already.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from hybridfl.files import atomic_write, create_private

    d = Path(out_dir)
    key = ec.generate_private_key(ec.SECP384R1())
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    create_private(d / f"{name}.key", private, "SuperNode key file")
    atomic_write(d / f"{name}.pub", public + b"\n")
    return d / f"{name}.key", d / f"{name}.pub"


def group_members(pgid: int) -> list[int]:
    """PIDs of live (not zombie) processes in process group ``pgid`` (Linux ``/proc``)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(d.name))
    return out


def _wait_port(port: int, timeout: float, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode} during start-up.")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(0.5)
            if s.connect_ex((LOOPBACK, port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"{what} did not open port {port} within {timeout:g} s.")


@dataclass
class LocalFederation:
    """A SuperLink and one SuperNode per client directory, all on 127.0.0.1.

    Args:
        client_dirs: one exported client directory per SuperNode (its ``data-dir``).
        fast: start the SuperNodes with :mod:`hybridfl.runtime.flower.supernode` (poll interval
            ``poll_interval``) instead of the stock ``flower-supernode`` (3 s).
        poll_interval: the fast SuperNodes' poll interval in seconds.
        work_dir: where ``FLWR_HOME``, the SuperLink database (if any) and the logs go (temporary
            if None).
        start_timeout: seconds each process may take to come up.
        tls: serve the SuperLink over TLS with certificates from :func:`make_certificates`
            (made in ``work_dir/certs``); SuperNodes and ``flwr run`` verify it with the CA.
            False: ``--insecure``, for local experiments only.
        auth: Flower's SuperNode authentication (needs ``tls``): one key pair per SuperNode
            (:func:`make_node_key`, in ``work_dir/node-keys``), each public key registered with
            ``flwr supernode register`` before its node starts; the node IDs are in
            :attr:`node_ids`. A SuperNode killed and started again keeps its node ID but can join
            only once the SuperLink has marked its previous session offline (Flower's heartbeat
            patience, up to 2 x 30 s); until then it exits at start-up.
        hosts: run SuperNode ``i`` in network namespace ``i`` of these
            :class:`~hybridfl.runtime.flower.netns.Hosts` (entered by the caller), reaching the
            SuperLink at ``hosts.host_address(i)``; the SuperLink then listens on all addresses and
            its certificate names every host address. None: everything on 127.0.0.1.
        warm: each SuperNode runs with ``--isolation process`` and the warm executor
            (:mod:`hybridfl.runtime.flower.executor`, one long-lived process per SuperNode, in its
            process group) instead of Flower's SuperExec, which starts a ClientApp process per
            message. ``None``: the same as ``fast`` (the warm executor needs the fast launcher).
        inline: with ``warm``, answer every message in the SuperNode's own process
            (``supernode --inline``: the warm executor's code on Flower's Runtime API handlers, no
            executor process, no HTTP hand-off; the default, measured fastest); False: the warm
            executor as a process of its own next to each SuperNode (``supernode --warm``).
        idle_poll_interval: the longest interval between two polls of a fast SuperNode that has had
            no message for a while (it waits a tenth of the time since its last message, between
            ``poll_interval`` and this; None: ``max(poll_interval, 0.2)``).
        database: keep the SuperLink's state in ``work_dir/superlink.db`` (Flower's ``--database``)
            instead of in memory (slower: about 0.35 s per exchange more, measured here).
        node_configs: per client directory, more node config entries of its SuperNode (e.g. an
            organisation's ``predict-table``, :mod:`hybridfl.runtime.flower.tasks`).
        gate: start the SuperLink with :mod:`hybridfl.runtime.flower.superlink` (its six
            Control-API and plugin middleware layers skipped where they would only pass a request
            on; measured faster) instead of the stock ``flower-superlink``.
    """

    client_dirs: list[Path]
    fast: bool = True
    poll_interval: float = 0.05
    work_dir: Path | None = None
    start_timeout: float = 90.0
    tls: bool = True
    warm: bool | None = None
    inline: bool = True
    idle_poll_interval: float | None = None
    database: bool = False
    auth: bool = True
    hosts: Hosts | None = None
    node_configs: list[dict[str, str]] | None = None
    gate: bool = True
    procs: list[tuple[str, subprocess.Popen]] = field(default_factory=list)
    stopped: list[subprocess.Popen] = field(default_factory=list)
    node_cmds: list[list[str]] = field(default_factory=list)
    _tmp: tempfile.TemporaryDirectory | None = None

    def __post_init__(self) -> None:
        if self.warm is None:
            self.warm = self.fast
        if self.warm and not self.fast:
            raise ValueError("the warm executor runs with the fast SuperNode launcher: use fast=True with warm=True.")
        if self.auth and not self.tls:
            raise ValueError("SuperNode authentication needs TLS: use tls=True with auth=True (or neither).")
        if self.hosts is not None and len(self.hosts.names) < len(self.client_dirs):
            raise ValueError(
                f"{len(self.client_dirs)} SuperNodes need as many network namespaces; hosts has {len(self.hosts.names)} "
                "(enter the Hosts context first)."
            )
        self.node_ids: list[int] = []
        self._node_sec: list[str] = []
        if self.work_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="hybridfl-flower-")
            self.work_dir = Path(self._tmp.name)
        self.work_dir = Path(self.work_dir).resolve()  # absolute: the processes run in it
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.flwr_home = self.work_dir / "flwr_home"
        self.flwr_home.mkdir(exist_ok=True)
        self.bin = Path(sys.executable).parent
        self.port = 0

    # ------------------------------------------------------------------ environment
    def env(self) -> dict[str, str]:
        """The environment of every process started here: this one's, with the federation's
        ``FLWR_HOME``, this interpreter's ``bin`` first on ``PATH``, no runtime dependency
        installation, telemetry off and ``OMP_NUM_THREADS=1`` unless set."""
        e = dict(os.environ)
        e["FLWR_HOME"] = str(self.flwr_home)
        e["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
        e["PATH"] = f"{self.bin}{os.pathsep}{e.get('PATH', '')}"
        e.setdefault("OMP_NUM_THREADS", "1")
        e.setdefault("FLWR_TELEMETRY_ENABLED", "0")
        return e

    def _spawn(self, name: str, cmd: list[str]) -> subprocess.Popen:
        logf = open(self.work_dir / f"{name}.log", "wb")
        p = subprocess.Popen(
            cmd, stdout=logf, stderr=subprocess.STDOUT, env=self.env(), cwd=self.work_dir, start_new_session=True
        )
        logf.close()
        self.procs.append((name, p))
        return p

    # ------------------------------------------------------------------ start / stop
    def start(self) -> LocalFederation:
        """Start the SuperLink (TLS or ``--insecure``) on a free loopback port, then one SuperNode per
        client directory, and write ``FLWR_HOME/config.toml`` for ``flwr run``. Returns ``self``.

        Raises:
            TimeoutError: the SuperLink did not open its port within ``start_timeout`` seconds.
            RuntimeError: the SuperLink exited during start-up, or ``openssl`` failed (with ``tls``).
            Every process started so far is stopped before the error propagates.
        """
        try:
            # Flower 1.41 serves the Fleet, Control and Runtime APIs on one HTTP port
            self.port = free_port()
            if self.tls:  # the certificate names every address a SuperNode reaches the SuperLink at
                host_addresses = [] if self.hosts is None else [self.hosts.host_address(k) for k in range(self.hosts.n)]
                self.certs = make_certificates(self.work_dir / "certs", (LOOPBACK, "localhost", *host_addresses))
                link_sec = [
                    "--ssl-certfile",
                    str(self.certs["cert"]),
                    "--ssl-keyfile",
                    str(self.certs["key"]),
                    "--ssl-ca-certfile",
                    str(self.certs["ca"]),
                    *(["--enable-supernode-auth"] if self.auth else []),
                ]
                node_sec = ["--root-certificates", str(self.certs["ca"])]
                toml_sec = f'root-certificates = "{self.certs["ca"]}"\n'
            else:
                link_sec, node_sec, toml_sec = ["--insecure"], ["--insecure"], "insecure = true\n"
            (self.flwr_home / "config.toml").write_text(
                f'[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = "{LOOPBACK}:{self.port}"\n' + toml_sec
            )
            link = self._spawn(
                "superlink",
                [
                    *([sys.executable, "-m", "hybridfl.runtime.flower.superlink"] if self.gate else []),
                    *([] if self.gate else [str(self.bin / "flower-superlink")]),
                    *link_sec,
                    "--host",
                    LOOPBACK if self.hosts is None else "0.0.0.0",
                    "--port",
                    str(self.port),
                    *(["--database", str(self.work_dir / "superlink.db")] if self.database else []),
                    "--disable-runtime-dependency-installation",
                ],
            )
            _wait_port(self.port, self.start_timeout, link, "flower-superlink")
            self._node_sec = node_sec
            for i, d in enumerate(self.client_dirs):
                self.add_node(d, i, extra=self.node_configs[i] if self.node_configs else None)
        except BaseException:
            self.stop()
            raise
        return self

    def add_node(
        self, data_dir: str | Path, host: int = 0, registered: bool | None = None, extra: dict[str, str] | None = None
    ) -> subprocess.Popen:
        """Start one more SuperNode (``supernode-<n>``, the next number) for ``data_dir``, in
        network namespace ``host`` when the federation has ``hosts``. ``start`` starts one per
        client directory with this.

        Args:
            registered: with ``auth``, register the node's new key with the SuperLink first (the
                default); False: start it with a key the SuperLink does not know (a node that must
                not get in, for tests). Ignored without ``auth``.
            extra: more node config entries (string values; a path is made absolute).

        Returns:
            The SuperNode's process (also in :attr:`procs`).
        """
        i = len(self.node_cmds)
        args = [
            *self._node_sec,
            "--superlink",
            f"{LOOPBACK if self.hosts is None else self.hosts.host_address(host)}:{self.port}",
            "--host",
            LOOPBACK,
            "--port",
            str(free_port()),
            "--node-config",
            " ".join([f'data-dir="{Path(data_dir).resolve()}"', *(f'{k}="{v}"' for k, v in (extra or {}).items())]),
        ]
        if self.auth:
            key, pub = make_node_key(self.work_dir / "node-keys", f"supernode-{i}")
            if registered is None or registered:
                self.node_ids.append(self.register_node(pub))
            args += ["--auth-supernode-private-key", str(key)]
        if self.fast:
            cmd = [
                sys.executable,
                "-m",
                "hybridfl.runtime.flower.supernode",
                "--poll-interval",
                str(self.poll_interval),
                *(["--idle-poll-interval", str(self.idle_poll_interval)] if self.idle_poll_interval else []),
                *((["--inline"] if self.inline else ["--warm"]) if self.warm else []),
                *args,
            ]
        else:
            cmd = [str(self.bin / "flower-supernode"), *args]
        if self.hosts is not None:
            cmd = self.hosts.command(host, cmd)
        self.node_cmds.append(cmd)
        return self._spawn(f"supernode-{i}", cmd)

    def register_node(self, public_key: Path) -> int:
        """Register a SuperNode's public key with the SuperLink (``flwr supernode register KEY
        local``, through the Control API) and return the node ID the SuperLink gave it.

        Raises:
            RuntimeError: the registration failed (Flower's message is included).
        """
        import json

        p = subprocess.run(
            [str(self.bin / "flwr"), "supernode", "register", str(public_key), "local", "--format", "json"],
            capture_output=True,
            text=True,
            env=self.env(),
            cwd=self.work_dir,
            timeout=self.start_timeout,
        )
        try:
            out = json.loads(p.stdout[p.stdout.index("{") :])
            return int(out["node-id"])
        except (ValueError, KeyError, TypeError):
            why = (p.stdout + p.stderr).strip().splitlines()
            raise RuntimeError(
                f"registering SuperNode key {public_key.name} failed: {why[-1] if why else p.returncode}"
            ) from None

    def node_proc(self, i: int) -> subprocess.Popen:
        """The live process of SuperNode ``i`` (the latest one started for it)."""
        for name, p in reversed(self.procs):
            if name == f"supernode-{i}" and p.poll() is None:
                return p
        raise LookupError(f"SuperNode {i} is not running.")

    def kill_node(self, i: int) -> None:
        """SIGKILL SuperNode ``i`` with its whole process group (its SuperExec and ClientApp
        processes, or its warm executor): a crash, nothing is deregistered at the SuperLink."""
        p = self.node_proc(i)
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(timeout=30)
        deadline = time.monotonic() + 10
        while group_members(p.pid) and time.monotonic() < deadline:
            time.sleep(0.05)

    def restart_node(self, i: int) -> subprocess.Popen:
        """Start SuperNode ``i`` again with the command and node config it was started with (its
        log continues in ``supernode-<i>.log``)."""
        logf = open(self.work_dir / f"supernode-{i}.log", "ab")
        p = subprocess.Popen(
            self.node_cmds[i],
            stdout=logf,
            stderr=subprocess.STDOUT,
            env=self.env(),
            cwd=self.work_dir,
            start_new_session=True,
        )
        logf.close()
        self.procs.append((f"supernode-{i}", p))
        return p

    def stop(self, grace: float = 10.0) -> None:
        """Terminate every process group started here (SIGTERM, SIGKILL after ``grace`` s)."""
        for _, p in reversed(self.procs):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace
        for _, p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for _, p in self.procs:
            try:  # also children (SuperExec, ClientApp processes) left in the group
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + grace
        while any(group_members(p.pid) for _, p in self.procs) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.stopped = [p for _, p in self.procs]
        self.procs.clear()

    def close(self) -> None:
        """:meth:`stop` every process and remove the temporary work directory, if one was made."""
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> LocalFederation:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ runs
    def _run_cmd(self, run_config: dict[str, object], app_dir: Path | None) -> list[str]:
        parts = []
        for k, v in run_config.items():
            parts.append(f'{k}="{v}"' if isinstance(v, (str, Path)) else f"{k}={v}")
        return [
            str(self.bin / "flwr"),
            "run",
            str(app_dir or self.app_dir()),
            "local",
            "--stream",
            "--run-config",
            " ".join(parts),
        ]

    def run(
        self, run_config: dict[str, object], timeout: float = 600.0, app_dir: Path | None = None
    ) -> subprocess.CompletedProcess:
        """``flwr run APP local --stream --run-config ...``; returns the finished process.

        Raises:
            RuntimeError: ``flwr run`` failed (its output's last lines are in the message).
            subprocess.TimeoutExpired: the run took longer than ``timeout`` seconds.
        """
        cmd = self._run_cmd(run_config, app_dir)
        p = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            env=self.env(),
            cwd=self.work_dir,
            timeout=timeout,
            start_new_session=True,
        )
        return self._check_run(p)

    def start_run(self, run_config: dict[str, object], app_dir: Path | None = None) -> subprocess.Popen:
        """Start ``flwr run`` without waiting (its own process group, output to ``flwr-run.log``);
        finish with :meth:`finish_run`. Used to act on the federation during a run."""
        logf = open(self.work_dir / "flwr-run.log", "w")
        p = subprocess.Popen(
            self._run_cmd(run_config, app_dir),
            stdout=logf,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.env(),
            cwd=self.work_dir,
            start_new_session=True,
        )
        logf.close()
        self.procs.append(("flwr-run", p))
        return p

    def finish_run(self, p: subprocess.Popen, timeout: float = 600.0) -> subprocess.CompletedProcess:
        """Wait for a run started with :meth:`start_run` and check it like :meth:`run`.

        Raises:
            RuntimeError: ``flwr run`` failed.
            subprocess.TimeoutExpired: it took longer than ``timeout`` seconds (it is killed).
        """
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=10)
            raise
        out = (self.work_dir / "flwr-run.log").read_text(errors="replace")
        return self._check_run(subprocess.CompletedProcess(p.args, p.returncode, out, ""), write=False)

    def _check_run(self, p: subprocess.CompletedProcess, write: bool = True) -> subprocess.CompletedProcess:
        if write:
            (self.work_dir / "flwr-run.log").write_text(p.stdout + "\n--- stderr ---\n" + p.stderr)
        text = p.stdout + p.stderr
        # `flwr run --stream` exits 0 even when the ServerApp raised: look for Flower's report
        if p.returncode != 0 or "ServerApp raised an exception" in text:
            lines = [ln for ln in text.strip().splitlines() if ln.strip()]
            cause = next(
                (ln for ln in reversed(lines) if "Error:" in ln or "Exception:" in ln), lines[-1] if lines else ""
            )
            raise RuntimeError(f"the Flower run failed (flwr run status {p.returncode}): {cause.strip()}")
        return p

    def app_dir(self) -> Path:
        """A copy of the Flower app directory (only its pyproject.toml) in the work dir."""
        d = self.work_dir / "app"
        d.mkdir(exist_ok=True)
        shutil.copy(APP_DIR / "pyproject.toml", d / "pyproject.toml")
        return d

    def logs(self, lines: int = 30) -> str:
        """The last lines of every process log (for failure reports)."""
        out = []
        for f in sorted(self.work_dir.glob("*.log")):
            out.append(f"==> {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(out)
