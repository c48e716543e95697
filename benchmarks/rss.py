"""Peak resident memory of processes during a benchmark, for the scripts beside this one.

    with PeakRSS({"driver": psutil.Process()}, interval=0.05) as peak:
        ...
    peak.peak["driver"] - peak.base["driver"]   # bytes above the start
"""

from __future__ import annotations

import threading

import psutil


class PeakRSS:
    """The peak resident set size of ``processes`` (name: ``psutil.Process``), each and
    summed at one instant, sampled every ``interval`` seconds on a thread while in a
    ``with`` block (and once on entering and leaving it); ``base`` holds each one's size on
    entering."""

    def __init__(self, processes: dict[str, psutil.Process], interval: float = 0.2) -> None:
        self.processes = processes
        self.interval = interval
        self.base = {name: p.memory_info().rss for name, p in processes.items()}
        self.peak = dict(self.base)
        self.peak_total = sum(self.base.values())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        rss = {name: p.memory_info().rss for name, p in self.processes.items()}
        for name, value in rss.items():
            self.peak[name] = max(self.peak[name], value)
        self.peak_total = max(self.peak_total, sum(rss.values()))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def report(self) -> dict:
        """The peaks in GiB: each process's and the largest sum."""
        gib = 2.0**30
        return {"peak_gib": {name: v / gib for name, v in self.peak.items()},
                "peak_total_gib": self.peak_total / gib}
