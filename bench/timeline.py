#!/usr/bin/env python3
"""Line up one benchmark round's creates/s with what the nodes logged.

Usage: bench/timeline.py OUT RUNLOG SIZE ROUND [STREAM]

OUT is a bench/scaling.sh output directory of a run with
--brain-flags "--log-level info ..." (node logs OUT/brain-SIZE-nN.log),
RUNLOG the script's own output (what it printed), SIZE the cluster size
and ROUND the --repeat round. With --together 1 two create runs print
their per-second lines into RUNLOG at once; they are told apart by their
running totals, and the script lists each one's mean over the measured
window (after the first 45 s): STREAM picks the one to print (0 first).

It prints the chosen run's mean rate per 10 s of the create run, and
under each 10 s the node log lines of that time that explain a change of
rate: automatic splits, replica moves, sent snapshots, step-downs and
warnings.
"""
import datetime
import glob
import json
import re
import sys

EVENTS = ("automatic split", "sent snapshot", "rebalancing", "stepped down")


def main():
    out, runlog, size, rnd = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    which = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    lines = open(runlog).read().split("\n")
    starts = [i for i, l in enumerate(lines)
              if re.match(r"== (\S+) brain, %d node\(s\), hot: creates for" % size, l)]
    if len(starts) < rnd:
        sys.exit("round %d of the %d-node cluster not found in %s" % (rnd, size, runlog))
    i0 = starts[rnd - 1]
    date = re.search(r"(\d{4}-\d\d-\d\d)", open(glob.glob(out + "/brain-%d-n1.log" % size)[0]).readline())
    base = datetime.datetime.strptime(date[1] + " " + lines[i0].split()[1], "%Y-%m-%d %H:%M:%S")
    # Each stream: [running total, [(second, ops)], last second].
    streams = []
    for l in lines[i0 + 1:]:
        if l.startswith("create: measured"):
            break
        m = re.match(r"\[create\]\s+([\d.]+)s\s+done (\d+)\s+(\d+) ops/s", l)
        if not m:
            continue
        t, done, ops = float(m[1]), int(m[2]), int(m[3])
        for s in streams:
            if s[0] + ops == done and s[2] != t:
                s[0], s[2] = done, t
                s[1].append((t, ops))
                break
        else:
            streams.append([done, [(t, ops)], t])
    streams = [s for s in streams if len(s[1]) > 50]
    for k, s in enumerate(streams):
        measured = [o for t, o in s[1] if t > 45]
        print("stream %d: %d seconds, %.0f creates/s after the first 45 s" % (k, len(s[1]), sum(measured) / max(1, len(measured))))
    events = []
    for f in glob.glob(out + "/brain-%d-n*.log" % size):
        node = f.rsplit("-n", 1)[1].split(".")[0]
        for l in open(f):
            try:
                j = json.loads(l)
            except ValueError:
                continue
            msg = j.get("msg", "")
            if not any(e in msg for e in EVENTS) and j.get("level") not in ("WARN", "ERROR"):
                continue
            at = (datetime.datetime.strptime(j["time"][:19], "%Y-%m-%dT%H:%M:%S") - base).total_seconds()
            if 0 <= at <= 290:
                attrs = {k: v for k, v in j.items() if k not in ("time", "msg", "level")}
                events.append((at, node, msg, attrs))
    events.sort(key=lambda e: e[0])
    series = streams[which][1]
    last = int(series[-1][0]) + 1
    for b in range(0, last, 10):
        r = [o for t, o in series if b < t <= b + 10]
        print("%3d-%3d s %5.0f creates/s" % (b, b + 10, sum(r) / max(1, len(r))))
        for at, node, msg, attrs in events:
            if b <= at < b + 10:
                print("      %5.1f n%s %s %s" % (at, node, msg[:40], json.dumps(attrs)[:200]))


if __name__ == "__main__":
    main()
