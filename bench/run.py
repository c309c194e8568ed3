"""Run every benchmark and write bench/results.json plus bench/results.md.

Each ``bench/bench_<area>.py`` provides ``run() -> list[dict]``. A result row is a dict with at least
``name``, ``value`` and ``unit``; rows that compare two things measured side by side in the same run carry
``baseline`` (the other value), ``ratio`` (value / baseline, or as the row's ``ratio_note`` says), and
``target`` (a string such as ">= 3x") with ``met`` (bool). Throughput rows are "higher is better" unless
``lower_is_better`` is set.

Usage: python bench/run.py [AREA ...]   (default: every bench_*.py; naming areas re-runs those and keeps the
other areas' rows from results.json, each area's run recorded under "runs")
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent


def machine() -> dict:
    """The machine facts of `somatile.eval.report.machine` (one reader of /proc/cpuinfo), plus the commit."""
    from somatile.eval.report import machine as host_facts

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=HERE).stdout.strip()
    except OSError:
        commit = ""
    return host_facts() | {"commit": commit}


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)


def markdown(results: dict) -> str:
    m = results["machine"]
    lines = [f"# Benchmarks", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}, {m['platform']}; "
             f"{m['date']}, commit {m['commit']}.", "",
             "| area | benchmark | value | unit | baseline | ratio | target | met |",
             "|---|---|---|---|---|---|---|---|"]
    for area, rows in results["areas"].items():
        if isinstance(rows, dict) and "error" in rows:
            lines.append(f"| {area} | FAILED: {rows['error'].splitlines()[-1]} | | | | | | |")
            continue
        for r in rows:
            met = "" if "met" not in r else ("yes" if r["met"] else "**no**")
            lines.append(f"| {area} | {r['name']} | {_fmt(r['value'])} | {r['unit']} | "
                         f"{_fmt(r.get('baseline'))} | {_fmt(r.get('ratio'))} | {r.get('target', '')} | {met} |")
    notes = [(area, r["name"], r["notes"]) for area, rows in results["areas"].items() if isinstance(rows, list)
             for r in rows if r.get("notes")]
    if notes:
        lines += ["", "Notes:", ""] + [f"- {a} / {n}: {t}" for a, n, t in notes]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    wanted = set(argv)
    files = sorted(HERE.glob("bench_*.py"))
    results = {"machine": machine(), "areas": {}}
    previous = HERE / "results.json"
    if wanted and previous.exists():
        # A run of some areas keeps the others' rows (and says which run measured each area).
        old = json.loads(previous.read_text())
        results["areas"] = old.get("areas", {})
        results["runs"] = old.get("runs", {area: old.get("machine", {}) for area in results["areas"]})
    failed = False
    for path in files:
        area = path.stem.removeprefix("bench_")
        if wanted and area not in wanted:
            continue
        print(f"== bench {area}", flush=True)
        spec = importlib.util.spec_from_file_location(f"bench_{area}", path)
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
            results["areas"][area] = module.run()
            results.setdefault("runs", {})[area] = results["machine"]
        except Exception:
            failed = True
            results["areas"][area] = {"error": traceback.format_exc()}
            traceback.print_exc()
    (HERE / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    table = markdown(results)
    (HERE / "results.md").write_text(table)
    print(table)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
