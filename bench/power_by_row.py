#!/usr/bin/env python3
"""The GPU's regime during each bench command of a GPU run (scripts/gpu_suite.sh).

The suite samples nvidia-smi every 200 ms into power.csv (timestamp, SM clock, power, throttle
reasons, temperature) and time-stamps each `sparse-attention bench` command in bench.log
("## <date time> <arguments>" before it, "##> <date time> rc N" after it; runs before session
30's review wrote "## HH:MM:SS.mmm" only, and a command then ends where the next one starts).
This prints, per command, the mean and lowest SM clock, the mean and highest power, and the share
of samples with the software power cap active (reason 0x4), over the command's busy samples
(idle ones, reason 0x1, left out; the window still holds the tool's start-up, input creation and
the CPU reference check of checked rows). A row timed alone and back to back can run at the cap,
~10% slower than the same row alternating with a slower variant (bench/notes-archive, session 30).

    python3 bench/power_by_row.py LOG_DIR [--grep TEXT]
"""
import argparse
import csv
import datetime
import re
import sys
from pathlib import Path


STAMP_FORMAT = "%Y/%m/%d %H:%M:%S.%f"  # nvidia-smi's timestamp, and the suite's stamps


def read_samples(path: Path):
    samples = []
    with path.open() as f:
        for row in csv.reader(f):
            try:
                stamp = datetime.datetime.strptime(row[0].strip(), STAMP_FORMAT)
                clock = int(row[1].split()[0])
                power = float(row[2].split()[0])
                reasons = int(row[3].strip(), 16)
            except (ValueError, IndexError):
                continue  # a header, an error line, or "[N/A]"
            samples.append((stamp, clock, power, reasons))
    return samples


def read_commands(path: Path, day: datetime.date):
    """[start, end or None, arguments] per command; `day` dates stamps of time of day only."""
    commands = []
    with path.open() as f:
        for line in f:
            m = re.match(r"(##>?) (\d{4}/\d\d/\d\d )?(\d+:\d+:\d+\.\d+) ?(.*)", line)
            if not m:
                continue
            text = (m.group(2) or day.strftime("%Y/%m/%d ")) + m.group(3)
            when = datetime.datetime.strptime(text, STAMP_FORMAT)
            if m.group(1) == "##":
                commands.append([when, None, m.group(4).strip()])
            elif commands:
                commands[-1][1] = when
    return commands


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log_dir", type=Path, help="a GPU run's logs (power.csv and bench.log)")
    ap.add_argument("--grep", default="", help="only commands containing this text")
    args = ap.parse_args()
    samples = read_samples(args.log_dir / "power.csv")
    if not samples:
        print("no samples in", args.log_dir / "power.csv", file=sys.stderr)
        return 1
    commands = read_commands(args.log_dir / "bench.log", samples[0][0].date())
    if not commands:
        print("no time-stamped commands in", args.log_dir / "bench.log", file=sys.stderr)
        return 1
    print(f"{'clock MHz':>9} {'min':>5} {'power W':>8} {'max':>5} {'cap':>5} {'n':>4}  command")
    for i, (start, end, command) in enumerate(commands):
        if args.grep not in command:
            continue
        if end is None:
            end = commands[i + 1][0] if i + 1 < len(commands) else samples[-1][0]
        rows = [s for s in samples if start <= s[0] < end and not s[3] & 0x1]
        if not rows:
            continue
        clock = sum(s[1] for s in rows) / len(rows)
        power = sum(s[2] for s in rows) / len(rows)
        cap = sum(1 for s in rows if s[3] & 0x4) / len(rows)
        print(f"{clock:9.0f} {min(s[1] for s in rows):5d} {power:8.0f} "
              f"{max(s[2] for s in rows):5.0f} {100 * cap:4.0f}% {len(rows):4d}  {command}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
