"""How busy this machine is, and how many CPU threads torch should take because of it.

torch's OpenMP threads spin while they wait for each other. When another process holds one of the cores, a thread
that spins waits for one that is not running, and every operator pays for it: on a 2-core machine with one busy
process, greedy decoding of the default model ran at 60 tokens/s with 2 threads against 250 with 1 (measured
2026-11-30; 181 with ``OMP_WAIT_POLICY=PASSIVE``, which costs a quarter of the speed on a quiet machine). So the
command line takes, by default, only the cores that other processes leave idle, and the commands that time things say
when the machine is busy.

Load is read from ``/proc/stat`` (Linux) over a short interval, minus this process's own CPU time; elsewhere the
one-minute load average stands in.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

SAMPLE_SECONDS = 0.2
# Other processes using at least this many cores make a machine "busy": timings are then unreliable.
BUSY_CORES = 0.5


@dataclass(frozen=True)
class MachineLoad:
    """Cores this process may use and how many of them other processes kept busy while we looked.

    Attributes:
        cores: CPUs this process may run on.
        busy: cores' worth of CPU time used by other processes (0.0 = idle, ``cores`` = saturated).
        source: ``"/proc/stat"`` or ``"loadavg"``.
    """

    cores: int
    busy: float
    source: str

    @property
    def idle_cores(self) -> int:
        """Whole cores other processes leave free (at least 1)."""
        return max(1, min(self.cores, round(self.cores - self.busy)))

    @property
    def is_busy(self) -> bool:
        return self.busy >= BUSY_CORES

    def describe(self) -> str:
        return f"other processes are using {self.busy:.1f} of {self.cores} cores"


def available_cores() -> int:
    """CPUs this process may run on (its affinity mask where the platform has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _proc_stat_busy() -> tuple[float, float] | None:
    """(busy jiffies of the whole machine, this process's jiffies) now, or None without ``/proc``."""
    try:
        with open("/proc/stat") as f:
            fields = [float(v) for v in f.readline().split()[1:]]
        with open("/proc/self/stat") as f:
            own = f.read().rsplit(")", 1)[1].split()
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    # /proc/self/stat after the command name: state is field 3, utime and stime are fields 14 and 15.
    return sum(fields[:8]) - idle, float(own[11]) + float(own[12])


class LoadMeter:
    """Average load of the other processes between ``start()`` and ``stop()``, this process's own CPU time excluded
    (so it can run around the work it measures: ``meter = LoadMeter().start(); ...; meter.stop()``)."""

    def __init__(self) -> None:
        self.cores = available_cores()
        self._before: tuple[float, float] | None = None
        self._started = 0.0

    def start(self) -> LoadMeter:
        self._before = _proc_stat_busy()
        self._started = time.monotonic()
        return self

    def stop(self) -> MachineLoad:
        after = _proc_stat_busy()
        if self._before is None or after is None:
            try:
                load = os.getloadavg()[0]
            except (OSError, AttributeError):
                load = 0.0
            return MachineLoad(self.cores, min(float(self.cores), load), "loadavg")
        elapsed = max(time.monotonic() - self._started, 1e-6)
        ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        others = (after[0] - self._before[0]) - (after[1] - self._before[1])
        return MachineLoad(self.cores, min(float(self.cores), max(0.0, others / ticks / elapsed)), "/proc/stat")


def measure_load(seconds: float = SAMPLE_SECONDS) -> MachineLoad:
    """Sample how busy the other processes keep the machine over ``seconds``."""
    meter = LoadMeter().start()
    time.sleep(seconds)
    return meter.stop()


def set_torch_threads(requested: int | None) -> MachineLoad:
    """Set torch's CPU threads: ``requested`` when given, else only the cores other processes leave idle. Returns
    the load it saw (for a busy note)."""
    import torch

    load = measure_load()
    torch.set_num_threads(choose_threads(requested, load, torch.get_num_threads()))
    return load


def choose_threads(requested: int | None, load: MachineLoad, ceiling: int) -> int:
    """Threads for torch: ``requested`` when given, else ``ceiling`` (torch's default: every core, or
    ``OMP_NUM_THREADS``) cut to the cores other processes leave idle."""
    if requested:
        return requested
    return max(1, min(ceiling, load.idle_cores))


def busy_warning(load: MachineLoad, threads: int, when: str = "") -> str | None:
    """A one-line note when other processes make timings unreliable, else None; ``when`` says over which span the
    load was measured (e.g. "while the benchmark ran")."""
    if not load.is_busy:
        return None
    return (
        f"note: the machine is busy{' ' + when if when else ''} ({load.describe()}); timings are unreliable "
        f"(torch ran {threads} thread{'s' if threads != 1 else ''})."
    )
