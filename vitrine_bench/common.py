"""Shared benchmark plumbing: reports (markdown + JSON + plots), a served Vitrine, percentiles."""

from __future__ import annotations

import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vitrine.client import ApiError, Client, RetryPolicy, Unreachable


def machine() -> dict[str, Any]:
    import torch

    return {
        "cpu_count": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
        "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
    }


def pct(values: list[float] | np.ndarray, q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else float("nan")


def summary_ms(lat_s: list[float]) -> dict[str, float]:
    ms = [x * 1000 for x in lat_s]
    return {"p50_ms": pct(ms, 50), "p95_ms": pct(ms, 95), "p99_ms": pct(ms, 99), "mean_ms": float(np.mean(ms))
            if ms else float("nan"), "n": len(ms)}


class Report:
    """Collects results; writes ``<out>/<name>.md``, ``.json`` and any plots."""

    def __init__(self, name: str, out: Path, title: str) -> None:
        self.name, self.out, self.title = name, Path(out), title
        self.out.mkdir(parents=True, exist_ok=True)
        self.data: dict[str, Any] = {"benchmark": name, "machine": machine(), "started": time.time()}
        self.sections: list[str] = []
        self.plots: list[str] = []

    def add(self, key: str, value: Any) -> None:
        self.data[key] = value

    def text(self, md: str) -> None:
        self.sections.append(md)

    def table(self, rows: list[dict[str, Any]], cols: list[str], heading: str | None = None) -> None:
        lines = [f"### {heading}", ""] if heading else []
        lines.append("| " + " | ".join(cols) + " |")
        lines.append("|" + "---|" * len(cols))
        for r in rows:
            cells = []
            for c in cols:
                v = r.get(c, "")
                cells.append(f"{v:.3f}" if isinstance(v, float) and abs(v) < 10 else
                             f"{v:.1f}" if isinstance(v, float) else str(v))
            lines.append("| " + " | ".join(cells) + " |")
        self.sections.append("\n".join(lines))

    def plot(self, filename: str, draw) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.2))
        draw(ax)
        fig.tight_layout()
        fig.savefig(self.out / filename, dpi=110)
        plt.close(fig)
        self.plots.append(filename)

    def write(self) -> Path:
        self.data["finished"] = time.time()
        (self.out / f"{self.name}.json").write_text(json.dumps(self.data, indent=2, default=str) + "\n")
        m = self.data["machine"]
        md = [f"# {self.title}", "",
              f"Machine: {m['cpu_count']} CPU cores, {m['platform']}, Python {m['python']}, torch {m['torch']} "
              f"(cuda: {m['cuda']}). Raw numbers: `{self.name}.json`.", ""]
        md += [s + "\n" for s in self.sections]
        md += [f"![{p}]({p})\n" for p in self.plots]
        path = self.out / f"{self.name}.md"
        path.write_text("\n".join(md))
        return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    proc: subprocess.Popen
    url: str

    def pids(self) -> list[int]:
        """The server process and its descendants (``serve --workers N`` runs N worker processes)."""
        out, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            out.append(pid)
            for task in Path(f"/proc/{pid}/task").glob("*/children"):
                try:
                    todo.extend(int(c) for c in task.read_text().split())
                except OSError:
                    pass
        return out

    def rss_mb(self) -> float:
        """Resident memory of the server's processes together (MB)."""
        total = 0
        for pid in self.pids():
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
            except OSError:
                pass
        return total / 1024 if total else float("nan")

    def cpu_s(self) -> float:
        """CPU seconds (user + system, all threads) the server's live processes have used so far."""
        total = 0
        for pid in self.pids():
            try:  # /proc/PID/stat fields 14 and 15: utime and stime in clock ticks (after the "(comm)")
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])
            except (OSError, ValueError, IndexError):
                pass
        return total / os.sysconf("SC_CLK_TCK") if total else float("nan")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def start_server(data_dir: Path, env: dict[str, str] | None = None, timeout: float = 300) -> Server:
    """``vitrine serve`` in its own process; returns once /health answers."""
    port = free_port()
    cmd = [sys.executable, "-m", "vitrine.cli.__main__", "serve", "--data", str(data_dir), "--port", str(port)]
    proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]  # started with stderr=PIPE
        try:
            with Client(url, timeout=2, retry=RetryPolicy(attempts=1)) as c:
                c.health()
            return Server(proc, url)
        except (ApiError, Unreachable):
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("server did not become healthy in time")
