"""Where ``watch``'s alerts go: a command, a webhook (generic JSON, Slack, Discord), the
desktop; each destination's deliveries tried, retried with backoff, in a thread of its
own, so a slow or failing destination holds up neither the watching nor another
destination.

``--notify`` specs:

- ``exec:CMD`` — ``CMD`` run by ``/bin/sh -c`` with the alert as JSON on stdin and in
  ``EAGLE3_TUI_ALERT_*`` environment variables (``_ID``, ``_AT``, ``_KIND``, ``_RUN``,
  ``_HOST``, ``_PID``, ``_HEALTH``, ``_REASON``, ``_COMMAND``, ``_JSON``); exit status 0
  is delivered;
- ``http://…``/``https://…`` — a POST: Slack's ``{"text"}`` for a Slack incoming
  webhook (``hooks.slack.com``), Discord's ``{"content"}`` for a Discord one
  (``…/api/webhooks/…``), the alert's JSON otherwise; ``slack:URL``, ``discord:URL``
  and ``json:URL`` choose the payload whatever the URL; a 2xx answer is delivered;
- ``desktop`` — ``notify-send`` where there is one, else the terminal's bell and a line
  on stderr.

What an alert quotes of a run (its reason, its directory) came from the run: it is
passed as data (JSON, environment variables), never as shell code.

Each alert has an ``id`` (the same on every try, and after a restart: a receiver drops
a repeat, one that came again after a try timed out) and the time it was raised; the
deliveries to one destination go in the order their alerts were raised.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import os
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from eagle3_tui.model.inert import printable

EXEC_TIMEOUT_S = 30.0
HTTP_TIMEOUT_S = 10.0
RETRY_FIRST_S = 5.0
"""The first retry's wait; each next one doubles, up to :data:`RETRY_MAX_S`."""
RETRY_MAX_S = 300.0
ATTEMPTS = 8
"""Tries of one delivery before it is given up (and said so): ~17 min of backoff."""

ALARMS = ("silent", "stalled", "dead", "diverged", "disk_full", "unreadable", "link_down")
"""Alert kinds that need a human; the others are good news (finished, stopped, recovered)."""


@dataclass(frozen=True)
class Alert:
    """One change of a watched run's verdict, as it is sent."""

    kind: str
    """The new verdict (``silent``, ``stalled``, ``dead``, ``diverged``, ``disk_full``,
    ``unreadable``, ``finished``, ``stopped``), ``link_down``, ``recovered``, or
    ``ended`` (a run whose alarm was sent ended still in it: a diverged run that
    finished or was stopped; ``health`` says which)."""
    run: str
    """The run as a target names it (``HOST:DIR``, a local directory, ``HOST pid N``)."""
    host: str
    pid: int | None
    health: str
    previous: str | None
    reason: str
    """The diagnosis sentence, as the monitor and ``summary`` say it."""
    step: int | None
    total_steps: int | None
    epoch: int | None
    epochs: int | None
    command: str | None
    """The command that acts on it (attach, kill, resume), or None."""
    at: float
    """When it was raised (seconds since the epoch)."""
    id: str = ""
    """Unique per alert, the same on each try of it (a receiver drops a repeat). One of a
    state file written without it is made of what it says (the same after a restart)."""

    def __post_init__(self) -> None:
        if not self.id:
            said = json.dumps([self.kind, self.run, self.host, self.pid, self.at, self.reason])
            object.__setattr__(self, "id", hashlib.sha1(said.encode()).hexdigest()[:32])

    def raised(self) -> str:
        """When it was raised, ISO 8601 in UTC: a delivery may come long after."""
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.at))

    def to_json(self) -> dict[str, Any]:
        return {"event": "eagle3-tui.alert", **asdict(self), "raised": self.raised()}

    def headline(self) -> str:
        """One line: what happened to which run."""
        word = self.kind.replace("_", " ").upper()
        where = f" (pid {self.pid})" if self.pid and f"pid {self.pid}" not in self.run else ""
        at = ""
        if self.step is not None:
            of = f"/{self.total_steps:,}" if self.total_steps else ""
            at = f" at step {self.step:,}{of}"
        return f"eagle3-tui: {word}: {self.run}{where}{at}"

    def text(self, raised: bool = False) -> str:
        """The headline, the reason and the command: a chat message (``raised``: with when
        it was raised, for one delivered late), a desktop note."""
        lines = [self.headline(), self.reason]
        if self.command:
            lines.append(f"→ {self.command}")
        if raised:
            lines.append(f"raised {self.raised().replace('T', ' ').replace('Z', ' UTC')}")
        return "\n".join(printable(line) for line in lines if line)


class Notifier(Protocol):
    """A destination: ``send`` delivers one alert or raises :class:`DeliveryError`."""

    spec: str

    def send(self, alert: Alert) -> None: ...


class DeliveryError(Exception):
    """One failed try, with what the destination said (one line)."""


@dataclass
class ExecNotifier:
    spec: str
    command: str

    def send(self, alert: Alert) -> None:
        payload = json.dumps(alert.to_json())
        env = dict(os.environ)
        for key in ("id", "at", "kind", "run", "host", "pid", "health", "reason", "command"):
            value = getattr(alert, key)
            env[f"EAGLE3_TUI_ALERT_{key.upper()}"] = "" if value is None else str(value)
        env["EAGLE3_TUI_ALERT_JSON"] = payload
        try:
            done = subprocess.run(
                ["/bin/sh", "-c", self.command],
                input=payload.encode(),
                capture_output=True,
                timeout=EXEC_TIMEOUT_S,
                env=env,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise DeliveryError(f"did not finish in {EXEC_TIMEOUT_S:.0f} s") from None
        except OSError as e:
            raise DeliveryError(str(e)) from None
        if done.returncode != 0:
            said = done.stderr.decode(errors="replace").strip().splitlines()
            tail = f": {said[-1][:200]}" if said else ""
            raise DeliveryError(f"exit status {done.returncode}{tail}")


@dataclass
class WebhookNotifier:
    spec: str
    url: str
    style: str
    """``slack``, ``discord`` or ``json``."""

    def payload(self, alert: Alert) -> dict[str, Any]:
        """What the URL expects. What an alert quotes of a run (a log line, a path) is
        text there, never a mention or a link: Slack's control characters escaped, and
        Discord told to parse no mention (a planted ``@everyone`` pings nobody)."""
        if self.style == "slack":
            return {"text": markup_escaped(alert.text(raised=True))}
        if self.style == "discord":
            text = alert.text(raised=True)
            return {"content": text[:2000], "allowed_mentions": {"parse": []}}
        return alert.to_json()

    def send(self, alert: Alert) -> None:
        """A POST; a URL's ``user:password@`` sent as Basic authentication (urllib would
        take it for the host, and say the password in its error)."""
        data = json.dumps(self.payload(alert)).encode()
        parts = urllib.parse.urlsplit(self.url)
        headers = {"Content-Type": "application/json", "User-Agent": "eagle3-tui watch"}
        url = self.url
        if "@" in parts.netloc:
            userinfo, _, hostport = parts.netloc.rpartition("@")
            url = urllib.parse.urlunsplit(parts._replace(netloc=hostport))
            user, _, password = (urllib.parse.unquote(x) for x in userinfo.partition(":"))
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        request = urllib.request.Request(url, data=data, method="POST", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as answer:
                status = answer.status
        except urllib.error.HTTPError as e:
            raise DeliveryError(f"HTTP {e.code} {e.reason}") from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", e)
            raise DeliveryError(scrubbed(f"{reason}", self.url)) from None
        if not 200 <= status < 300:
            raise DeliveryError(f"HTTP {status}")


@dataclass
class DesktopNotifier:
    spec: str = "desktop"

    def send(self, alert: Alert) -> None:
        tool = shutil.which("notify-send")
        urgency = "critical" if alert.kind in ALARMS else "normal"
        if tool is not None and (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
            body = markup_escaped(alert.text()).split("\n", 1)  # its body takes markup
            done = subprocess.run(
                [tool, "-u", urgency, "-a", "eagle3-tui", "--", body[0], *body[1:]],
                capture_output=True,
                timeout=EXEC_TIMEOUT_S,
                check=False,
            )
            if done.returncode == 0:
                return
        # no desktop here: the terminal's bell and the alert on stderr
        try:
            os.write(2, ("\a" + alert.text() + "\n").encode(errors="replace"))
        except OSError as e:
            raise DeliveryError(str(e)) from None


def markup_escaped(text: str) -> str:
    """``&``, ``<``, ``>`` escaped: in Slack's text and a desktop notification's body they
    would make what a run wrote a mention, a link or markup."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def parse_notify(spec: str) -> Notifier:
    """A ``--notify`` spec as a destination; ValueError (one line) when it is none. A URL
    is checked here (a host, a port in range): one that can never be delivered to is
    refused at the start, not retried for 17 minutes. A URL's scheme, as a payload's
    prefix (``slack:``), is case-insensitive (``HTTP://…``)."""
    if spec == "desktop":
        return DesktopNotifier()
    if spec.startswith("exec:"):
        command = spec[len("exec:") :].strip()
        if not command:
            raise ValueError("exec: needs a command (exec:CMD)")
        return ExecNotifier(spec, command)
    style, _, rest = spec.partition(":")
    if style.lower() in ("slack", "discord", "json") and _is_url(rest):
        return WebhookNotifier(spec, checked_url(rest), style.lower())
    if _is_url(spec):
        return WebhookNotifier(spec, checked_url(spec), webhook_style(spec))
    raise ValueError(
        f"{shown(spec)!r}: not a destination (exec:CMD, an http(s):// URL, slack:URL, "
        "discord:URL, json:URL or desktop)"
    )


def _is_url(text: str) -> bool:
    return text.lower().startswith(("http://", "https://"))


def webhook_style(url: str) -> str:
    """The payload a webhook's URL expects: Slack's, Discord's, or the alert's JSON."""
    parts = urllib.parse.urlsplit(url)
    host = (parts.hostname or "").lower()
    if host == "hooks.slack.com":
        return "slack"
    if host.endswith(("discord.com", "discordapp.com")) and "/api/webhooks/" in parts.path:
        return "discord"
    return "json"


def checked_url(url: str) -> str:
    """``url`` where it has a host (a name, an IPv4 or IPv6 address) and a port in range
    (1-65535), and no blank or control character (a request could never carry it);
    ValueError naming it (its password hidden) otherwise."""
    if any(c.isspace() or not c.isprintable() for c in url):
        raise ValueError(f"{shown(url)!r}: a blank or control character in the URL")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as e:
        said = "Port out of range 1-65535" if "out of range" in str(e) else str(e)
        raise ValueError(f"{shown(url)!r}: {said}") from None
    if port == 0:
        raise ValueError(f"{shown(url)!r}: Port out of range 1-65535")
    if not parts.hostname:
        raise ValueError(f"{shown(url)!r}: no host in the URL")
    if not _host_name(parts.hostname):
        raise ValueError(f"{shown(url)!r}: {parts.hostname!r} is not a host name or address")
    return url


def _host_name(host: str) -> bool:
    """Whether ``host`` (a URL's, unbracketed) is an IP address (IPv6 with a zone too) or
    a host name: labels of letters, digits, ``-`` and ``_`` joined by dots."""
    if ":" in host:
        try:
            ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError:
            return False
        return True
    labels = host.rstrip(".").split(".")
    return all(label and all(c.isalnum() or c in "-_" for c in label) for label in labels)


def shown(spec: str) -> str:
    """A spec as it may be printed: a URL's password as ``***`` (``http://user:***@host``)."""
    userinfo = _userinfo(spec)
    if userinfo is None or ":" not in userinfo:
        return spec
    return spec.replace(f"{userinfo}@", f"{userinfo.partition(':')[0]}:***@", 1)


def scrubbed(text: str, spec: str) -> str:
    """``text`` (what a failure said) without ``spec``'s password, as given or unquoted."""
    password = _password(spec)
    if not password:
        return text
    text = text.replace(spec, shown(spec))
    for secret in {password, urllib.parse.unquote(password)}:
        text = text.replace(secret, "***")
    return text


def _password(spec: str) -> str | None:
    """The password in a spec's URL (``scheme://user:password@host``), or None."""
    userinfo = _userinfo(spec)
    return userinfo.partition(":")[2] if userinfo and ":" in userinfo else None


def _userinfo(spec: str) -> str | None:
    _, sep, rest = spec.partition("://")
    netloc = rest.partition("/")[0].partition("?")[0].partition("#")[0]
    userinfo, at, _ = netloc.rpartition("@")
    return userinfo if sep and at else None


@dataclass
class Delivery:
    """One alert to one destination, until it is delivered or given up."""

    alert: Alert
    notifier: str
    """The destination's ``--notify`` spec (kept across restarts by it)."""
    attempts: int = 0
    next_at: float = 0.0
    last_error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "alert": asdict(self.alert),
            "notifier": self.notifier,
            "attempts": self.attempts,
            "next_at": self.next_at,
            "last_error": self.last_error,
        }

    @classmethod
    def of_json(cls, data: dict[str, Any]) -> Delivery:
        return cls(
            Alert(**data["alert"]),
            str(data["notifier"]),
            int(data.get("attempts", 0)),
            float(data.get("next_at", 0.0)),
            data.get("last_error"),
        )


@dataclass
class Outbox:
    """Deliveries waiting or being retried, worked off by one thread per destination:
    each alert's first try to each destination goes at once, whatever the others do (a
    webhook that takes its 10 s to time out holds up no command). ``say`` gets one line
    per failed try, per delivery given up and per delivery after a failure; ``changed``
    is called when the queue changes (the watcher saves its state).

    The queue is in the order alerts were raised (kept so in the state file), and each
    destination gets its alerts in that order: a later one waits while an earlier one
    to the same destination is still being retried (a "stalled" retried last would
    otherwise be the final word on a run that finished since); one given up lets the
    next go."""

    notifiers: list[Notifier]
    say: Callable[[str], None]
    changed: Callable[[], None] = lambda: None
    clock: Callable[[], float] = time.time
    queue: list[Delivery] = field(default_factory=list)
    delivered: int = 0
    failed_tries: int = 0
    given_up: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _wakes: dict[str, threading.Event] = field(default_factory=dict)
    """One a destination (its thread waits on it); set when an alert is posted."""
    _threads: list[threading.Thread] = field(default_factory=list)
    _stop: bool = False

    def post(self, alert: Alert) -> None:
        """The alert to every destination (returns at once)."""
        with self._lock:
            self.queue.extend(Delivery(alert, spec) for spec in self._specs())
        self.changed()
        for wake in list(self._wakes.values()):
            wake.set()

    def _specs(self) -> list[str]:
        """The destinations' specs, each once (one given twice gets an alert once)."""
        return list(dict.fromkeys(n.spec for n in self.notifiers))

    def start(self) -> None:
        """A thread per destination; first, what is kept for a destination no longer
        given is dropped (said)."""
        if self._threads:
            return
        specs = self._specs()
        with self._lock:
            orphans = [d for d in self.queue if d.notifier not in specs]
        for delivery in orphans:
            self.attempt(delivery)
        for i, spec in enumerate(specs):
            wake = self._wakes.setdefault(spec, threading.Event())
            thread = threading.Thread(
                target=self._run, args=(spec, wake), name=f"eagle3-tui-notify-{i}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def stop(self, drain_s: float = 0.0) -> None:
        """Stop the threads; first wait up to ``drain_s`` for what is due now to go out."""
        end = time.monotonic() + drain_s
        while drain_s and time.monotonic() < end and self.due():
            time.sleep(0.05)
        self._stop = True
        for wake in list(self._wakes.values()):
            wake.set()
        end = time.monotonic() + EXEC_TIMEOUT_S + HTTP_TIMEOUT_S  # a try under way ends
        for thread in self._threads:
            thread.join(timeout=max(0.0, end - time.monotonic()))

    def due(self) -> list[Delivery]:
        """The deliveries to try now: each destination's first, when its wait is over."""
        now = self.clock()
        return [d for d in self.heads() if d.next_at <= now]

    def heads(self) -> list[Delivery]:
        """Each destination's first delivery (the others wait for it)."""
        with self._lock:
            firsts: dict[str, Delivery] = {}
            for d in self.queue:
                firsts.setdefault(d.notifier, d)
            return list(firsts.values())

    def try_all(self) -> None:
        """Every delivery tried once now, in order (``watch --once``: cron's next look is
        minutes away), each destination's in a thread of its own (a slow one holds up no
        other): a destination's next only once its earlier one is delivered or given
        up."""
        threads = [
            threading.Thread(target=self._try_in_order, args=(d.notifier,), daemon=True)
            for d in self.heads()
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _try_in_order(self, notifier: str) -> None:
        while True:
            with self._lock:
                first = next((d for d in self.queue if d.notifier == notifier), None)
            if first is None:
                break
            self.attempt(first)
            with self._lock:
                if any(d is first for d in self.queue):
                    break  # still pending: the later ones wait for it

    def pending(self) -> int:
        with self._lock:
            return len(self.queue)

    def _run(self, spec: str, wake: threading.Event) -> None:
        """One destination's deliveries, in order: its first tried when due."""
        while not self._stop:
            wake.clear()  # before the queue is read: a post meanwhile wakes the wait
            with self._lock:
                head = next((d for d in self.queue if d.notifier == spec), None)
            if head is not None and head.next_at <= self.clock():
                self.attempt(head)  # delivered or given up: the next is due at once
                continue
            wait = head.next_at - self.clock() if head is not None else 3600.0
            wake.wait(timeout=max(0.05, min(wait, 3600.0)))

    def attempt(self, delivery: Delivery) -> bool:
        """One try of one delivery; True once it is delivered."""
        notifier = next((n for n in self.notifiers if n.spec == delivery.notifier), None)
        if notifier is None:  # a destination no longer given (--notify): said, dropped
            self._drop(delivery)
            self.say(f"not delivered: {shown(delivery.notifier)} is no longer a destination")
            self.changed()
            return False
        delivery.attempts += 1
        try:
            try:
                notifier.send(delivery.alert)
            except DeliveryError:
                raise
            except Exception as e:  # a destination's own failure: a failed try, said
                raise DeliveryError(f"{type(e).__name__}: {e}") from None
        except DeliveryError as failure:
            why = scrubbed(str(failure), notifier.spec)  # said on stderr: no password
            with self._lock:
                self.failed_tries += 1
            delivery.last_error = why
            label = f"{shown(notifier.spec)}: {delivery.alert.kind} of {delivery.alert.run}"
            if delivery.attempts >= ATTEMPTS:
                with self._lock:
                    self.given_up += 1
                self._drop(delivery)
                self.say(f"not delivered, given up after {delivery.attempts} tries: {label}: {why}")
            else:
                wait = min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** (delivery.attempts - 1))
                delivery.next_at = self.clock() + wait
                self.say(
                    f"not delivered ({why}); try {delivery.attempts + 1} in {wait:.0f} s: {label}"
                )
            self.changed()
            return False
        with self._lock:
            self.delivered += 1
        self._drop(delivery)
        if delivery.attempts > 1:
            self.say(
                f"delivered on try {delivery.attempts}: {shown(notifier.spec)}: "
                f"{delivery.alert.kind} of {delivery.alert.run}"
            )
        self.changed()
        return True

    def _drop(self, delivery: Delivery) -> None:
        with self._lock:  # this one (two of one alert to one spec compare equal)
            for i, d in enumerate(self.queue):
                if d is delivery:
                    del self.queue[i]
                    break
