"""The benchmark harness: configs x seeds -> rows, and one report writer.

Every benchmark script runs a function over named settings and seeds with :func:`run_grid` and
writes what it measured with :func:`write_report`. A row records the setting that produced its
numbers (``config``, ``seed``, ``setting``), the wall and CPU seconds of the call and the
machine's load average before and after it; the report records the machine (CPU count, platform,
Python) and the git commit the numbers came from. A report is two files,
``benchmarks/results/<name>.json`` (the rows; the only place a number lives) and
``benchmarks/results/<name>.md`` (the same rows as one markdown table).

Run the scripts from the repository root as modules: ``python -m benchmarks.<script> --smoke``.
``python -m benchmarks.harness`` lists the reports under ``benchmarks/results`` with their commit
and row count.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
FORMAT = 1  # the report format's version, written into every report
SMOKE_ENV = "HYBRIDFL_BENCH_SMOKE"  # set by --smoke; inherited by the subprocesses a script starts


def commit() -> str:
    """The repository's HEAD commit (40 hex digits), with ``+dirty`` when tracked files other than
    the results under ``benchmarks/results`` differ from it (a results file an earlier run of the
    same benchmark wrote does not change the code measured); ``unknown`` outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "-uno", "--", ".", ":!benchmarks/results"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def machine() -> dict:
    """The machine a report was measured on: CPU count, platform, processor, Python version."""
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
    }


def load() -> float:
    """The one-minute load average (the cores are shared: every row records it)."""
    return round(os.getloadavg()[0], 2)


def run_grid(
    fn: Callable[[dict, int], Mapping],
    configs: Mapping[str, dict],
    seeds: Iterable[int] = (0,),
    *,
    echo: bool = True,
) -> list[dict]:
    """Call ``fn(setting, seed)`` for every named setting of ``configs`` and every seed.

    Returns one row per call: ``config`` (the setting's name), ``seed``, ``setting`` (the dict
    itself), what ``fn`` returned (a mapping of measured values, merged in), ``wall_s`` and
    ``cpu_s`` (this process's CPU seconds) of the call, and ``load_before`` / ``load_after``.
    With ``echo`` each row's plain values are printed as it finishes (one line).
    """
    rows = []
    for name, setting in configs.items():
        for seed in seeds:
            before, t0, c0 = load(), time.perf_counter(), time.process_time()
            measured = dict(fn(dict(setting), seed))
            row = {"config": name, "seed": seed, "setting": dict(setting), **measured}
            row.update(
                wall_s=round(time.perf_counter() - t0, 4),
                cpu_s=round(time.process_time() - c0, 4),
                load_before=before,
                load_after=load(),
            )
            rows.append(row)
            if echo:
                shown = {k: v for k, v in row.items() if not isinstance(v, dict | list)}
                print(" ".join(f"{k}={_cell(v)}" for k, v in shown.items()), flush=True)
    return rows


def _cell(value) -> str:
    """One table cell: floats to 4 significant digits, ``-`` for missing values."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, str) and re.fullmatch(r"[0-9a-f]{40}(\+dirty)?", value):
        return value[:10] + ("+dirty" if value.endswith("+dirty") else "")  # a commit
    if isinstance(value, dict | list | tuple):
        return json.dumps(value, default=str).replace("|", "/")
    return str(value).replace("|", "/")


Columns = Sequence[str | tuple[str, str]]


def markdown_table(rows: Sequence[Mapping], columns: Columns | None = None) -> str:
    """``rows`` as a markdown table over ``columns``: keys, or ``(key, header)`` pairs (default:
    every key of the first row but ``setting``); a missing value is ``-``."""
    if not rows:
        return "(no rows)\n"
    cols = [c if isinstance(c, tuple) else (c, c) for c in (columns or [k for k in rows[0] if k != "setting"])]
    lines = ["| " + " | ".join(h for _, h in cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_cell(r.get(k)) for k, _ in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_report(
    name: str,
    rows: Sequence[Mapping],
    *,
    title: str,
    command: str,
    columns: Columns | None = None,
    notes: Sequence[str] = (),
    out: Path = RESULTS,
    extra: Mapping | None = None,
) -> tuple[Path, Path]:
    """Write ``<out>/<name>.json`` (format, title, command, commit, machine, rows, notes and the
    ``extra`` mapping) and ``<out>/<name>.md`` (the title, the command, one table of ``rows``
    over ``columns`` as :func:`markdown_table` takes them, the notes as sentences). Returns the two paths.

    Raises ``ValueError`` for a name that is not a plain file stem (letters, digits, ``_ - .``).
    """
    if not name or not all(c.isalnum() or c in "_-." for c in name) or name.startswith("."):
        raise ValueError(f"report name {name!r} is not a plain file stem.")
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "format": FORMAT,
        "name": name,
        "title": title,
        "command": command,
        "commit": commit(),
        "machine": machine(),
        "rows": list(rows),
        "columns": [list(c) if isinstance(c, tuple) else c for c in columns] if columns else None,
        "notes": list(notes),
        **(extra or {}),
    }
    json_path, md_path = out / f"{name}.json", out / f"{name}.md"
    json_path.write_text(json.dumps(report, indent=1, default=float) + "\n")
    md_path.write_text(render(report))
    return json_path, md_path


def _columns(report: Mapping) -> Columns | None:
    """The report's columns as :func:`markdown_table` takes them (JSON stores pairs as lists)."""
    cols = report.get("columns")
    return [tuple(c) if isinstance(c, list) else c for c in cols] if cols else None


def render(report: Mapping) -> str:
    """The markdown of a report (as :func:`write_report` writes it)."""
    m = report.get("machine", {})
    where = f"{m.get('cpus', '?')} CPUs ({m.get('processor', '?')})" + (
        f", Python {m['python']}" if "python" in m else ""
    )
    head = [
        f"# {report['title']}",
        "",
        f"`{report['command']}` at commit `{str(report.get('commit'))[:12]}`, {where}.",
        "",
    ]
    notes = [line for note in report.get("notes", []) for line in ("", note)]
    return (
        "\n".join(head)
        + "\n"
        + markdown_table(report["rows"], _columns(report))
        + "\n".join(notes)
        + ("\n" if notes else "")
    )


def read_report(name: str, out: Path = RESULTS) -> dict:
    """The report ``<out>/<name>.json`` as written by :func:`write_report`."""
    return json.loads((out / f"{name}.json").read_text())


def parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with the options every script shares: ``--seeds``, ``--smoke`` (the
    smallest setting that exercises the whole script, written under ``--out``) and ``--out``."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds to run every setting with")
    p.add_argument("--smoke", action="store_true", help="tiny setting: checks the script runs, numbers mean nothing")
    p.add_argument("--out", type=Path, default=RESULTS, help="where the report goes (default benchmarks/results)")
    return p


def smoke() -> bool:
    """Whether this process runs a ``--smoke`` setting (see :func:`dispatch`)."""
    return os.environ.get(SMOKE_ENV) == "1"


def shrink(split, train: int = 600, test: int = 300):
    """In a smoke run, ``split`` (a :class:`hybridfl.data.DatasetSplit`) cut to ``train`` and
    ``test`` random rows (seed 0, order kept); otherwise ``split`` itself."""
    if not smoke():
        return split
    import dataclasses

    import numpy as np

    def cut(part, n):
        rows = np.sort(np.random.default_rng(0).permutation(len(part.y))[:n])
        return part.take(rows)

    return dataclasses.replace(split, train=cut(split.train, train), test=cut(split.test, test))


def redirect_results(namespace: dict) -> Path:
    """Point every ``Path`` global of ``namespace`` that lies under ``benchmarks/results`` at the
    same place under a fresh temporary folder (a smoke run must not touch the committed results);
    returns that folder."""
    tmp = Path(tempfile.mkdtemp(prefix="hybridfl-smoke-"))
    for key, value in list(namespace.items()):
        if isinstance(value, Path) and value.resolve().is_relative_to(RESULTS):
            namespace[key] = tmp / value.resolve().relative_to(RESULTS)
    return tmp


def dispatch(module: str, parts: Mapping[str, tuple[Callable[[], None], Sequence[str]]], namespace: dict) -> None:
    """The command line of a benchmark script: ``python -m benchmarks.<module> [PART] [options]``.

    ``parts`` maps a part's name (``""`` for a script without parts) to its ``main`` (which reads
    ``sys.argv``) and its smoke arguments. ``--smoke`` runs the part with those arguments instead
    of the given ones, with the script's results redirected to a temporary folder
    (:func:`redirect_results` on ``namespace``, the script's globals) and the data sets cut to a
    few hundred rows where the script loads them through :func:`shrink`: it checks that the part
    runs end to end; its numbers mean nothing. An unknown part is one sentence and exit code 2.
    """
    args = sys.argv[1:]
    if "" in parts:
        name = ""
    elif args and args[0] in parts:
        name = args.pop(0)
    else:
        sys.exit(f"usage: python -m benchmarks.{module} {{{','.join(parts)}}} [options] [--smoke]")
    fn, smoke = parts[name]
    if "--smoke" in args:
        args = list(smoke)
        os.environ[SMOKE_ENV] = "1"
        print(f"smoke run of {module} {name}: results under {redirect_results(namespace)}", flush=True)
    sys.argv = [f"benchmarks.{module}" + (f" {name}" if name else ""), *args]
    fn()


BLOCK = re.compile(r"(<!-- report: ([\w.-]+) -->\n).*?(<!-- /report -->)", re.S)


def fill_docs(text: str, out: Path = RESULTS) -> str:
    """``text`` with every block ``<!-- report: NAME -->`` ... ``<!-- /report -->`` replaced by
    the table of the report ``NAME`` (its rows, from ``<out>/NAME.json``) and a link to the file:
    the numbers of docs/results.md are generated from the committed results, not typed."""

    def table(m: re.Match) -> str:
        rep = read_report(m.group(2), out)
        link = f"From [`benchmarks/results/{m.group(2)}.json`](../benchmarks/results/{m.group(2)}.json) "
        link += f"(`{rep['command']}`, commit `{str(rep.get('commit'))[:10]}`).\n\n"
        return m.group(1) + link + markdown_table(rep["rows"], _columns(rep)) + m.group(3)

    return BLOCK.sub(table, text)


def main() -> None:
    """``python -m benchmarks.harness``: list the reports under ``benchmarks/results`` (name,
    commit, rows, title); ``--docs`` regenerates the report tables of docs/results.md."""
    if sys.argv[1:] == ["--docs"]:
        doc = ROOT / "docs" / "results.md"
        doc.write_text(fill_docs(doc.read_text()))
        print(f"regenerated the report tables of {doc}")
        return
    for path in sorted(RESULTS.glob("*.json")):
        rep = json.loads(path.read_text())
        if isinstance(rep, dict) and rep.get("format") == FORMAT:
            print(f"{path.stem:48s} {str(rep.get('commit'))[:10]:10s} {len(rep['rows']):4d}  {rep['title']}")


if __name__ == "__main__":
    main()
