"""What every evaluation report shares: the machine it ran on, markdown tables, results.json + results.md, plots."""

from __future__ import annotations

import datetime
import json
import os
import platform
from pathlib import Path

import numpy as np


def machine() -> dict:
    """CPU model, cores, Python, numpy, platform and the UTC time of this run."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "numpy": np.__version__, "platform": platform.platform(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def markdown_table(header: list[str], rows: list[list]) -> str:
    """A markdown table; floats with 6 significant digits (scientific below 1e-3)."""
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.6g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.3e}"
        return str(v)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def write_outputs(out: Path, results: dict, markdown: str) -> None:
    """``out``/results.json and ``out``/results.md (the folder is created)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "results.md").write_text(markdown)


def pyplot():
    """matplotlib.pyplot on the Agg backend (imported on first use)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt
