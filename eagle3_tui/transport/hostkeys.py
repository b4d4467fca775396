"""Host keys over asyncssh: the user's known_hosts files checked as OpenSSH checks them
(``StrictHostKeyChecking`` yes or accept-new), and a refusal said with the command
that fixes it. Used by :mod:`eagle3_tui.transport.ssh`; no textual.
"""

from __future__ import annotations

import contextlib
import os
import shlex
from collections.abc import Sequence
from pathlib import Path

from eagle3_tui.transport.sshlib import asyncssh
from eagle3_tui.transport.target import SshOptions

DEFAULT_KNOWN_HOSTS = ("~/.ssh/known_hosts", "/etc/ssh/ssh_known_hosts")


def key_type(key: asyncssh.SSHKey) -> str:
    alg = key.get_algorithm()
    for prefix, name in (("ssh-ed25519", "ED25519"), ("ecdsa", "ECDSA"), ("ssh-rsa", "RSA")):
        if alg.startswith(prefix):
            return name
    return alg


def host_pattern(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def _import_known_hosts(text: str) -> asyncssh.SSHKnownHosts:
    """Like OpenSSH, skip the lines that do not parse instead of failing on them."""
    try:
        return asyncssh.import_known_hosts(text + "\n")
    except (ValueError, asyncssh.KeyImportError):
        pass
    good = []
    for line in text.splitlines():
        try:
            asyncssh.import_known_hosts(line + "\n")
        except (ValueError, asyncssh.KeyImportError):
            continue
        good.append(line)
    return asyncssh.import_known_hosts("\n".join(good) + "\n")


class HostKeyCheck:
    """The known_hosts files of one connection, and what happened to the offered key."""

    def __init__(self, files: Sequence[Path], policy: str, destination: str) -> None:
        self.files = list(files)
        self.policy = policy
        self.destination = destination
        texts = []
        for path in self.files:
            with contextlib.suppress(OSError):
                texts.append(path.read_text(errors="replace"))
        self.known = _import_known_hosts("\n".join(texts))
        self.offered: tuple[str, str, int, asyncssh.SSHKey] | None = None
        self.verdict = ""

    def decide(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        """Called for a key that is not trusted: accept it only if new and allowed."""
        self.offered = (host, addr, port, key)
        keys, ca_keys, *_ = self.known.match(host, addr, port if port != 22 else None)
        if keys or ca_keys:
            self.verdict = "changed"
            return False
        if self.policy != "accept-new" or not self.files:
            self.verdict = "unknown"
            return False
        line = (
            f"{host_pattern(host, port)} {' '.join(key.export_public_key().decode().split()[:2])}\n"
        )
        path = self.files[0]
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with open(path, "a") as f:
                f.write(line)
        except OSError as e:
            self.verdict = f"unwritable: {e.strerror}"
            return False
        self.verdict = "accepted"
        return True

    def _offending(self, host: str, addr: str, port: int) -> str:
        for path in self.files:
            try:
                lines = path.read_text(errors="replace").splitlines()
            except OSError:
                continue
            for n, line in enumerate(lines, 1):
                if not line.strip() or line.lstrip().startswith("#"):
                    continue
                try:
                    found = asyncssh.import_known_hosts(line + "\n").match(
                        host, addr, port if port != 22 else None
                    )
                except (ValueError, asyncssh.KeyImportError):
                    continue
                if found[0] or found[1]:
                    return f"{path}:{n}"
        return ", ".join(str(p) for p in self.files)

    def message(self, reason: str) -> str:
        if self.offered is None:
            return f"{self.destination}: host key refused ({reason})"
        host, addr, port, key = self.offered
        pattern = host_pattern(host, port)
        fp = f"{key_type(key)} key {key.get_fingerprint('sha256')}"
        files = ", ".join(str(p) for p in self.files) or "no known_hosts file"
        if self.verdict == "changed":
            where = self._offending(host, addr, port)
            remove = f"ssh-keygen -R {shlex.quote(pattern)}"
            if self.files and where.startswith(str(self.files[0])):
                remove += f" -f {shlex.quote(str(self.files[0]))}"
            return (
                f"{self.destination}: HOST KEY CHANGED for {pattern}: the server offers {fp}, "
                f"which does not match {where}. Someone may be intercepting the connection; "
                f"if the change is expected, remove the old key ({remove}) and connect again"
            )
        if self.verdict.startswith("unwritable"):
            return (
                f"{self.destination}: cannot record the host key in {self.files[0]}: {self.verdict}"
            )
        keyscan = f"ssh-keyscan {'-p ' + str(port) + ' ' if port != 22 else ''}{host}"
        into = shlex.quote(str(self.files[0])) if self.files else "~/.ssh/known_hosts"
        return (
            f"{self.destination}: unknown host key for {pattern}: {fp} (not in {files}). "
            f"If that is the host's key, accept it deliberately: "
            f"-o StrictHostKeyChecking=accept-new (or {keyscan} >> {into})"
        )


class HostKeyClient(asyncssh.SSHClient):
    def __init__(self, check: HostKeyCheck) -> None:
        self.check = check

    def validate_host_public_key(
        self, host: str, addr: str, port: int, key: asyncssh.SSHKey
    ) -> bool:
        return self.check.decide(host, addr, port, key)


def known_hosts_files(options: SshOptions, from_config: object) -> list[Path]:
    if options.known_hosts is not None:
        names: Sequence[str] = options.known_hosts
    elif isinstance(from_config, list) and from_config:
        names = [str(x) for x in from_config]
    else:
        names = DEFAULT_KNOWN_HOSTS
    return [Path(os.path.expanduser(n)) for n in names if n.lower() != "none"]


# ---- errors ----------------------------------------------------------------------------
