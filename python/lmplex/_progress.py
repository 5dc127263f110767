"""A minimal byte-count progress bar for long downloads, written to stderr.

Invariants: it only writes when enabled; on a TTY it redraws one line in place (``\\r``, at most about
ten times a second) and ends it with a newline in :meth:`Progress.finish`; elsewhere (logs, CI) it prints
one full line per ~10% so output stays readable. It never raises on a zero or unknown total.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    """A one-line progress bar on stderr: percent, MB done/total (MB = 10^6 bytes), MB/s.

    The rate counts only the time between :meth:`resume` and the updates that follow it, so pauses (a
    download that runs between two copies) do not drag it down.
    """

    def __init__(self, total: int, label: str, *, enabled: bool, stream: TextIO | None = None) -> None:
        self.total = max(total, 1)
        self.label = label
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.done = 0
        self.active_s = 0.0
        self.last_tick = time.monotonic()
        self.last_draw = 0.0
        self.last_decile = -1

    def resume(self) -> None:
        """Start counting time again after a pause."""
        self.last_tick = time.monotonic()

    def update(self, n: int) -> None:
        """Count ``n`` more bytes, and redraw when due."""
        now = time.monotonic()
        self.active_s += now - self.last_tick
        self.last_tick = now
        self.done += n
        if not self.enabled:
            return
        if self.tty:
            if now - self.last_draw >= 0.1:
                self.last_draw = now
                self.stream.write("\r" + self._line())
                self.stream.flush()
        else:
            decile = min(10, self.done * 10 // self.total)
            if decile > self.last_decile:
                self.last_decile = decile
                self.stream.write(self._line() + "\n")
                self.stream.flush()

    def finish(self) -> None:
        """Draw the final state and end the line."""
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\r" + self._line() + "\n")
        elif self.last_decile < 10:
            self.stream.write(self._line() + "\n")
        self.stream.flush()

    def _line(self) -> str:
        mb = 1e6
        rate = self.done / mb / max(self.active_s, 1e-6)
        percent = 100.0 * self.done / self.total
        return (
            f"{self.label}: {percent:5.1f}% {self.done / mb:7.1f}/{self.total / mb:.1f} MB {rate:7.1f} MB/s"
        )
