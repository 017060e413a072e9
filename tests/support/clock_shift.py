"""A wall clock of a process tree's own: `clockshift.c`, preloaded, adds an offset that the test can
change at any moment to what the process reads as the time (CLOCK_REALTIME, gettimeofday, time);
its monotonic clocks are left as they are, as when NTP or an administrator steps a machine's clock.
The machine's own clock, which CI and the other tests share, is never touched."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("clockshift.c")


def unavailable_reason() -> str | None:
    return None if shutil.which("gcc") else "no C compiler (gcc) to build the clock shifter"


class ClockShift:
    """`env` makes a process's wall clock follow `set(seconds)`."""

    def __init__(self, work: Path) -> None:
        work.mkdir(parents=True, exist_ok=True)
        self.library = work / "clockshift.so"
        subprocess.run(
            ["gcc", "-O2", "-shared", "-fPIC", "-o", str(self.library), str(SOURCE), "-ldl"],
            check=True,
            capture_output=True,
        )
        self.file = work / "shift"
        self.set(0.0)

    @property
    def env(self) -> dict[str, str]:
        return {"LD_PRELOAD": str(self.library), "HAI_CLOCK_SHIFT_FILE": str(self.file)}

    def set(self, seconds: float) -> None:
        """From now on the process's wall clock reads `seconds` off the real one (a step)."""
        data = struct.pack("<q", round(seconds * 1e9))
        if not self.file.exists():
            self.file.write_bytes(data)
            return
        with self.file.open("r+b") as f:  # in place: the process reads the same page
            f.write(data)
