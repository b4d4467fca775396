"""Verdicts over time, scored against what a scenario says is true at each moment.

A scenario states, as it goes, which labels are right (``expect``) and when a fault
is injected (``fault``: from then on its label is the one to reach). The timeline
records every change of verdict and counts:

* a *false alarm*: an alarm label (SILENT, STALLED, DEAD, DIVERGED, UNREADABLE)
  shown while no fault makes it right;
* a *wrong label*: any other label that is not right at that moment (FINISHED
  where STOPPED is true...);
* the *detection time* of each fault: from its injection to its label's first
  appearance.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ALARMS = frozenset({"SILENT", "STALLED", "DEAD", "DIVERGED", "UNREADABLE"})


@dataclass
class Fault:
    what: str
    at: float
    label: str
    detected_at: float | None = None

    @property
    def detection_s(self) -> float | None:
        return None if self.detected_at is None else self.detected_at - self.at


@dataclass
class Timeline:
    """One scenario's verdicts: ``record`` them, ``expect`` and ``fault`` as it goes."""

    name: str
    changes: list[tuple[float, str, str]] = field(default_factory=list)
    """(t, label, reason) at each change of label."""
    faults: list[Fault] = field(default_factory=list)
    right: set[str] = field(default_factory=lambda: {"WAITING", "RUNNING"})
    """The labels that are right now (besides the pending fault's)."""
    false_alarms: list[tuple[float, str, str]] = field(default_factory=list)
    wrong_labels: list[tuple[float, str, str]] = field(default_factory=list)
    samples: int = 0
    notes: list[str] = field(default_factory=list)
    expected_final: str | None = None

    def expect(self, *labels: str) -> None:
        """From now on these labels are right (a fault's label stays right once reached)."""
        self.right = set(labels)

    def fault(self, what: str, at: float, label: str) -> None:
        """A fault injected at ``at`` (scenario seconds): it should show as ``label``."""
        self.faults.append(Fault(what, at, label))

    def record(self, t: float, label: str, reason: str) -> None:
        self.samples += 1
        for f in self.faults:
            if f.detected_at is None and label == f.label and t >= f.at:
                f.detected_at = t
        pending = {f.label for f in self.faults if f.at <= t}
        ok = label in self.right or label in pending
        if not ok:
            bad = (t, label, reason)
            (self.false_alarms if label in ALARMS else self.wrong_labels).append(bad)
        if not self.changes or self.changes[-1][1] != label:
            self.changes.append((t, label, reason))

    @property
    def final(self) -> str | None:
        return self.changes[-1][1] if self.changes else None

    @property
    def passed(self) -> bool:
        return (
            not self.false_alarms
            and not self.wrong_labels
            and all(f.detected_at is not None for f in self.faults)
            and (self.expected_final is None or self.final == self.expected_final)
        )

    def report(self) -> str:
        lines = [f"== {self.name}"]
        marks = sorted(
            (f.at, f"   {f.at:7.1f}  >> {f.what} (expect {f.label})") for f in self.faults
        )
        rows = [
            (t, f"   {t:7.1f}  {label:<10} {reason[:150]}") for t, label, reason in self.changes
        ]
        lines += [row for _, row in sorted(marks + rows, key=lambda r: r[0])]
        detect = ", ".join(
            f"{f.what}: {'not detected' if f.detection_s is None else f'{f.detection_s:.1f} s'}"
            for f in self.faults
        )
        lines.append(
            f"   {self.samples} verdicts | false alarms {len(self.false_alarms)} | wrong labels "
            f"{len(self.wrong_labels)} | final {self.final} (expected {self.expected_final})"
            + (f" | detection: {detect}" if detect else "")
            + ("   OK" if self.passed else "   FAILED")
        )
        for t, label, reason in (self.false_alarms + self.wrong_labels)[:5]:
            lines.append(f"   !! {t:7.1f}  {label}: {reason[:160]}")
        lines += [f"   note: {n}" for n in self.notes]
        return "\n".join(lines)
