"""A new user's first hour, timed: the README's two first commands and the quick look, on a fresh clone of this
repository, each under `/usr/bin/time -v`, on an idle machine (or saying it was not).

    python benchmarks/first_hour.py --dry-run          # the plan: the commands as the README gives them, the load
    python benchmarks/first_hour.py --smoke            # the machinery on three trivial commands, table to stdout
    python benchmarks/first_hour.py                    # the real thing: about 20 minutes on 2 idle cores

The commands are read from the README (its first ```bash block, and the quick look's `t2r eval ... --limit 8`
command), so the table times what the README says. It waits up to `--wait` seconds for the 1-minute load average
to fall below `--idle` (0.3), then clones this checkout (`git clone` of HEAD: committed files only) into a
temporary directory, makes a virtual environment there and runs, in order: the README's first line (install,
generated data, `t2r run` of the main job), its second (ruff and the tests), and the quick look of the main job's
model. Each row: wall time, user and system CPU seconds, peak memory (the largest process's RSS), exit code, and
the load average before and after. The table goes to `benchmarks/results/first_hour_<machine>.md` (`--out`),
where the README's first screen quotes it from. A command that fails is a row with its exit code (the rest run).
Caches are the machine's (pip's, `$T2R_CACHE` with SmolLM2, the hub's): on a machine that has none, the first
command's downloads count in its time. PYTHONPATH, VIRTUAL_ENV and OMP_NUM_THREADS are not passed on.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIME = "/usr/bin/time"


def readme_commands(readme: Path) -> list[tuple[str, str]]:
    """(name, command) of the README's first two command lines and its quick look, as a user would paste them."""
    text = readme.read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    if block is None:
        raise SystemExit(f"{readme}: no ```bash block to take the first commands from")
    lines = [line.strip() for line in block.group(1).splitlines() if line.strip()]
    if len(lines) < 2:
        raise SystemExit(f"{readme}: its first ```bash block has {len(lines)} command line(s), not 2")
    quick = re.search(r"\*\*A quick look\*\*.*?`(t2r eval [^`]*--limit \d+[^`]*)`", text, re.S)
    if quick is None:
        raise SystemExit(f"{readme}: no quick look command (`t2r eval ... --limit N ...`) after **A quick look**")
    return [("main job (README line 1)", lines[0]), ("tests (README line 2)", lines[1]),
            ("quick look", " ".join(quick.group(1).split()))]


def machine_name() -> str:
    """`<cores>cpu-<processor model>`, in characters a file name takes."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1]
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return re.sub(r"[^A-Za-z0-9]+", "-", f"{cores}cpu-{model}").strip("-").lower()[:60]


def wait_for_idle(idle: float, wait: float, poll: float = 10.0) -> tuple[float, float]:
    """(load average when it stopped waiting, seconds waited): below `idle`, or whatever it was after `wait`."""
    start = time.monotonic()
    while True:
        load = os.getloadavg()[0]
        waited = time.monotonic() - start
        if load < idle or waited >= wait:
            return load, waited
        print(f"load average {load:.2f} >= {idle}: waiting ({waited:.0f} of {wait:.0f} s)", flush=True)
        time.sleep(poll)


def parse_time_v(text: str) -> dict:
    """Wall, user, system seconds and peak RSS (MiB) from `/usr/bin/time -v`'s report."""
    def field(label):
        match = re.search(rf"^\s*{re.escape(label)}: (.+)$", text, re.M)
        return match.group(1).strip() if match else None

    wall = field("Elapsed (wall clock) time (h:mm:ss or m:ss)")
    seconds = None
    if wall is not None:
        seconds = 0.0
        for part in wall.split(":"):
            seconds = seconds * 60 + float(part)
    rss = field("Maximum resident set size (kbytes)")
    return {"wall": seconds, "user": float(field("User time (seconds)") or "nan"),
            "system": float(field("System time (seconds)") or "nan"),
            "rss_mib": int(rss) / 1024 if rss is not None else None}


def timed(command: str, cwd: Path, env: dict, log: Path) -> dict:
    """Run `command` with bash under `/usr/bin/time -v` in `cwd`; its output goes to `log`."""
    report = log.with_suffix(".time")
    load_before = os.getloadavg()[0]
    with open(log, "w") as out:
        done = subprocess.run([TIME, "-v", "-o", str(report), "bash", "-c", command], cwd=cwd, env=env,
                              stdout=out, stderr=subprocess.STDOUT)
    row = parse_time_v(report.read_text() if report.is_file() else "")
    return {**row, "rc": done.returncode, "load_before": load_before, "load_after": os.getloadavg()[0]}


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    minutes, seconds = divmod(round(seconds), 60)
    return f"{minutes} min {seconds:02d} s" if minutes else f"{seconds} s"


def table(rows: list[tuple[str, str, dict]], heading: str) -> str:
    lines = [heading, "", "| step | wall | user CPU | system CPU | peak RSS | rc | load before -> after |",
             "|---|---|---|---|---|---|---|"]
    for name, _, r in rows:
        rss = f"{r['rss_mib'] / 1024:.1f} GiB" if r["rss_mib"] is not None else "?"
        lines.append(f"| {name} | {duration(r['wall'])} | {r['user']:.0f} s | {r['system']:.0f} s | {rss} | "
                     f"{r['rc']} | {r['load_before']:.2f} -> {r['load_after']:.2f} |")
    lines += ["", "Commands, in a fresh clone with its own virtual environment:", ""]
    lines += [f"- {name}: `{command}`" for name, command, _ in rows]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print the plan and the load; run nothing")
    parser.add_argument("--smoke", action="store_true",
                        help="time three trivial commands through the same machinery; print the table, write none")
    parser.add_argument("--idle", type=float, default=0.3, help="the load average below which the machine is idle")
    parser.add_argument("--wait", type=float, default=3600.0, help="seconds to wait for an idle machine")
    parser.add_argument("--machine", default=None, help="the machine's name in the file name (default: cores + CPU)")
    parser.add_argument("--out", type=Path, default=None,
                        help="the table (default benchmarks/results/first_hour_<machine>.md)")
    parser.add_argument("--keep", action="store_true", help="keep the clone (its runs/, eval/ and logs)")
    args = parser.parse_args()
    machine = args.machine or machine_name()
    out = args.out or ROOT / "benchmarks" / "results" / f"first_hour_{machine}.md"
    commands = readme_commands(ROOT / "README.md")
    if args.smoke:
        commands = [(name, f"python -c 'sum(range(10**6))'  # stands for: {command[:40]}")
                    for name, command in commands]
    load = os.getloadavg()[0]
    if args.dry_run:
        print(f"machine {machine}; load average now {load:.2f} ({'idle' if load < args.idle else 'busy'}: "
              f"idle means below {args.idle}; would wait up to {args.wait:.0f} s)")
        print(f"would clone {ROOT} (HEAD) into a temporary directory, make .venv there, then time:")
        for name, command in commands:
            print(f"  {name}: {TIME} -v bash -c {shlex.quote(command)}")
        print(f"and write {out}")
        return 0
    if not Path(TIME).is_file():
        raise SystemExit(f"{TIME} is missing: install GNU time (apt-get install time)")
    load, waited = wait_for_idle(args.idle, 0 if args.smoke else args.wait)
    idle = load < args.idle
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    work = Path(tempfile.mkdtemp(prefix="t2r-first-hour-"))
    clone = work / "t2r"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True, text=True,
                            check=True).stdout.strip()
    subprocess.run([sys.executable, "-m", "venv", str(clone / ".venv")], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "OMP_NUM_THREADS")}
    env.update(VIRTUAL_ENV=str(clone / ".venv"), PATH=f"{clone / '.venv' / 'bin'}:{env.get('PATH', '')}")
    rows = []
    for i, (name, command) in enumerate(commands, 1):
        print(f"[{i}/{len(commands)}] {name}: {command}", flush=True)
        row = timed(command, clone, env, work / f"step{i}.log")
        print(f"  {duration(row['wall'])}, rc {row['rc']} (log {work / f'step{i}.log'})", flush=True)
        rows.append((name, command, row))
    heading = (f"# A new user's first hour on {machine}\n\n`python benchmarks/first_hour.py` on {started}, commit "
               f"{commit}, {len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()} "
               f"CPUs; the machine was " + (f"idle (load average {load:.2f} < {args.idle})" if idle else
                                            f"NOT idle: load average {load:.2f} after waiting {waited:.0f} s "
                                            f"(idle means below {args.idle}); these times are not the idle ones"))
    text = table(rows, heading)
    if args.smoke:
        print(text, end="")
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"wrote {out}")
    if not args.keep:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(r["rc"] == 0 for _, _, r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
