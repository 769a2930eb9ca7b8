#!/usr/bin/env python3
"""The GPU's regime during each bench command of a GPU run (scripts/gpu_suite.sh).

The suite samples nvidia-smi every 200 ms into power.csv (timestamp, SM clock, power, throttle
reasons, temperature) and time-stamps each `sparse-attention bench` command in bench.log
("## HH:MM:SS.mmm <arguments>"). This prints, per command, the mean and lowest SM clock, the mean
and highest power, and the share of samples with the software power cap active (reason 0x4):
a row timed alone and back to back can run at the cap, ~10% slower than the same row alternating
with a slower variant (bench/NOTES.md, session 30).

    python3 bench/power_by_row.py LOG_DIR [--grep TEXT]
"""
import argparse
import csv
import datetime
import re
import sys
from pathlib import Path


def seconds_of_day(hms: str) -> float:
    h, m, s = hms.split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


def read_samples(path: Path):
    samples = []
    with path.open() as f:
        for row in csv.reader(f):
            if len(row) < 4:
                continue
            try:
                stamp = datetime.datetime.strptime(row[0].strip(), "%Y/%m/%d %H:%M:%S.%f")
                clock = int(row[1].split()[0])
                power = float(row[2].split()[0])
                reasons = int(row[3].strip(), 16)
            except ValueError:
                continue  # a header, or "[N/A]"
            t = stamp.hour * 3600 + stamp.minute * 60 + stamp.second + stamp.microsecond / 1e6
            samples.append((t, clock, power, reasons))
    return samples


def read_commands(path: Path):
    commands = []
    with path.open() as f:
        for line in f:
            m = re.match(r"## (\d+:\d+:\d+\.\d+) (.*)", line)
            if m:
                commands.append((seconds_of_day(m.group(1)), m.group(2).strip()))
    return commands


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log_dir", type=Path, help="a GPU run's logs (power.csv and bench.log)")
    ap.add_argument("--grep", default="", help="only commands containing this text")
    args = ap.parse_args()
    samples = read_samples(args.log_dir / "power.csv")
    commands = read_commands(args.log_dir / "bench.log")
    if not samples or not commands:
        print("no samples or no time-stamped commands in", args.log_dir, file=sys.stderr)
        return 1
    print(f"{'clock MHz':>9} {'min':>5} {'power W':>8} {'max':>5} {'cap':>5}  command")
    for i, (start, command) in enumerate(commands):
        if args.grep not in command:
            continue
        end = commands[i + 1][0] if i + 1 < len(commands) else samples[-1][0]
        rows = [s for s in samples if start <= s[0] < end]
        if not rows:
            continue
        clock = sum(s[1] for s in rows) / len(rows)
        power = sum(s[2] for s in rows) / len(rows)
        cap = sum(1 for s in rows if s[3] & 0x4) / len(rows)
        print(f"{clock:9.0f} {min(s[1] for s in rows):5d} {power:8.0f} "
              f"{max(s[2] for s in rows):5.0f} {100 * cap:4.0f}%  {command}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
