"""A real OpenSSH ``sshd`` on 127.0.0.1 for tests and the SSH benchmark.

It has its own host key, client key, ``authorized_keys``, ``known_hosts`` and a
client config with a host alias, all in one temporary directory, so nothing in
``~/.ssh`` is read or written. Sessions get ``XDG_STATE_HOME`` pointing into the
same directory (the remote side's per-user index of runs), ``XDG_CACHE_HOME`` too
(the agent's code cache, attach's files: never root's own ``~/.cache``) and
``SHLVL=1`` (bash then skips ``~/.bashrc``, which costs 160-390 ms per exec on these
machines).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"
ALIAS = "e3-test"


def have_sshd() -> bool:
    return shutil.which(SSHD) is not None


def have_pid_namespaces() -> bool:
    """Whether ``unshare --pid --fork --mount-proc`` works here (root, no seccomp ban)."""
    if shutil.which("unshare") is None:
        return False
    try:
        proc = subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", "true"],
            capture_output=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


INIT = """
import os, signal, subprocess, sys
# PID 1 of a private host: starts sshd, reaps every orphan (a nohup'd training whose
# shell exited), forwards SIGTERM, ends when sshd does; the kernel then ends the rest.
child = subprocess.Popen(sys.argv[1:])
signal.signal(signal.SIGTERM, lambda *_: child.terminate())
while True:
    try:
        pid, status = os.wait()
    except ChildProcessError:
        sys.exit(0)
    if pid == child.pid:
        sys.exit(0)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _keypair(path: Path) -> str:
    """Write an ed25519 private key at ``path`` (OpenSSH format); returns the public line."""
    from eagle3_tui.transport.sshlib import asyncssh

    key = asyncssh.generate_private_key("ssh-ed25519")
    key.write_private_key(str(path))
    path.chmod(0o600)
    public: str = key.export_public_key().decode().strip()
    path.with_suffix(".pub").write_text(public + "\n")
    return public


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rfind(")") + 2 :].split()
        if int(fields[1]) == pid:
            out.append(int(entry))
    return out


@dataclass
class Sshd:
    root: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    host_public: str = ""
    login_shell_rc: bool = False
    """Let bash read ~/.bashrc on each exec (slow here: pyenv init), as a real login would."""
    private: bool = False
    """A host of its own: sshd in new PID and mount namespaces, so its sessions see only
    the processes started through it (a test's trainings, not other tests')."""
    public_keys: Path | None = None
    """Where to put ``authorized_keys`` so that users other than root can log in too (sshd
    reads it as the user: a directory they can traverse)."""
    alias: str = ALIAS
    hostname: str | None = None
    """Run sshd (and so every session) in a UTS namespace of its own with this host name:
    several instances then look like several machines to what runs in them."""
    set_env: dict[str, str] = field(default_factory=dict)
    """More variables for every session (sshd's SetEnv)."""
    state_home: Path = field(init=False)
    cache_home: Path = field(init=False)

    def __post_init__(self) -> None:
        self.state_home = self.root / "state"
        self.cache_home = self.root / "cache"

    @property
    def client_key(self) -> Path:
        return self.root / "client_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    @property
    def ssh_config(self) -> Path:
        return self.root / "ssh_config"

    @property
    def host_key(self) -> Path:
        return self.root / "host_ed25519"

    @property
    def authorized_keys(self) -> Path:
        base = self.public_keys if self.public_keys is not None else self.root
        return base / "authorized_keys"

    def args(self) -> list[str]:
        """Client options that reach this sshd through the alias :data:`ALIAS`."""
        return ["-F", str(self.ssh_config)]

    def explicit_args(self) -> list[str]:
        """The same without a config file: -p, -i, -o UserKnownHostsFile."""
        return [
            "-p",
            str(self.port),
            "-i",
            str(self.client_key),
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
        ]

    def start(self) -> Sshd:
        self.root.mkdir(parents=True, exist_ok=True)
        self.state_home.mkdir(exist_ok=True)
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        if not self.host_key.exists():
            self.host_public = _keypair(self.host_key)
            client_public = _keypair(self.client_key)
            (self.root / "authorized_keys").write_text(client_public + "\n")
        self.host_public = self.host_key.with_suffix(".pub").read_text().strip()
        if self.public_keys is not None:
            self.public_keys.mkdir(parents=True, exist_ok=True)
            self.public_keys.chmod(0o755)
            shutil.copyfile(self.root / "authorized_keys", self.authorized_keys)
            self.authorized_keys.chmod(0o644)
        for _attempt in range(5):
            self.port = free_port()
            self._write_configs()
            log = open(self.root / "sshd.log", "ab")  # noqa: SIM115 - owned by the child
            command = [SSHD, "-D", "-e", "-f", str(self.root / "sshd_config")]
            if self.private:
                init = self.root / "init.py"
                init.write_text(INIT)
                command = [
                    *("unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "--"),
                    *(sys.executable, str(init), *command),
                ]
            if self.hostname is not None:
                shell = 'hostname "$0" && exec "$@"'
                command = ["unshare", "--uts", "sh", "-c", shell, self.hostname, *command]
            self.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
            log.close()
            if self._wait_banner():
                return self
            self.stop()
        raise RuntimeError(f"sshd did not start: {(self.root / 'sshd.log').read_text()[-2000:]}")

    def _write_configs(self) -> None:
        (self.root / "sshd_config").write_text(
            f"Port {self.port}\n"
            "ListenAddress 127.0.0.1\n"
            f"HostKey {self.host_key}\n"
            f"AuthorizedKeysFile {self.authorized_keys}\n"
            f"PidFile {self.root / 'sshd.pid'}\n"
            "UsePAM no\n"
            "StrictModes no\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "PermitRootLogin prohibit-password\n"
            "MaxStartups 100:30:200\n"
            "MaxSessions 100\n"
            "Subsystem sftp internal-sftp\n"
            f"SetEnv {'' if self.login_shell_rc else 'SHLVL=1 '}XDG_STATE_HOME={self.state_home}"
            f" XDG_CACHE_HOME={self.cache_home}"
            + "".join(f" {k}={v}" for k, v in self.set_env.items())
            + "\n"
        )
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {self.host_public}\n")
        self.ssh_config.write_text(
            f"Host {self.alias}\n"
            "    HostName 127.0.0.1\n"
            f"    Port {self.port}\n"
            "    User root\n"
            f"    IdentityFile {self.client_key}\n"
            "    IdentitiesOnly yes\n"
            f"    UserKnownHostsFile {self.known_hosts}\n"
        )

    def _wait_banner(self, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as s:
                    if s.recv(4).startswith(b"SSH-"):
                        return True
            except OSError:
                time.sleep(0.02)
        return False

    def sessions(self) -> list[int]:
        """PIDs of the per-connection sshd processes (children of the listener)."""
        return children(self.proc.pid) if self.proc is not None else []

    def kill_sessions(self) -> int:
        """SIGKILL every per-connection sshd (not the listener, not the user's processes):
        the connections drop as when a network path dies or sshd is killed."""
        killed = 0
        for pid in self.session_tree():
            if comm(pid) != "sshd":
                continue
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        return killed

    def session_tree(self) -> list[int]:
        """Every process under the listener: per-connection sshd, shells, agents."""
        out: list[int] = []
        todo = self.sessions()
        while todo:
            pid = todo.pop()
            out.append(pid)
            todo.extend(children(pid))
        return out

    def freeze_sessions(self) -> list[int]:
        """SIGSTOP every session (a hung host: no FIN, no RST); returns the PIDs."""
        pids = self.session_tree()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        return pids

    def ssh(self, command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """``command`` run on the host by the ``ssh`` binary, as a user types it."""
        return subprocess.run(
            ["ssh", "-F", str(self.ssh_config), "-o", "BatchMode=yes", self.alias, command],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.private:  # the namespace's PID 1 dies with unshare: everything in it too
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
            return
        self.kill_sessions()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
