# SPDX-License-Identifier: MIT
"""Draws offload-demo's --plot: device memory over one training step.

usage: plot_memory.py CSV PNG TITLE CAP_MIB

CSV has the columns run,event,t_ms,mib (event "sample" or the name of a
mark such as "forward done"); CAP_MIB 0 means no cap. offload-demo writes
the CSV and runs this script; exit status 3 when matplotlib is missing.
"""

import csv
import sys

try:
    import matplotlib
except ImportError:
    sys.stderr.write(f"offload-demo: --plot: matplotlib is not installed for {sys.executable}\n")
    sys.exit(3)
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

csv_path, png_path, title, cap = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
runs, marks, order = {}, {}, []
with open(csv_path, newline="") as f:
    for row in csv.DictReader(f):
        run = row["run"]
        if run not in runs:
            runs[run], marks[run] = ([], []), []
            order.append(run)
        if row["event"] == "sample":
            runs[run][0].append(float(row["t_ms"]))
            runs[run][1].append(float(row["mib"]))
        else:
            marks[run].append((row["event"], float(row["t_ms"])))
colors = ["tab:red", "tab:blue", "tab:green"]
fig, ax = plt.subplots(figsize=(10, 5.2), dpi=110)
ymax = max([max(v[1]) for v in runs.values() if v[1]] + [cap, 1.0])
for i, run in enumerate(order):
    ts, ys = runs[run]
    c = colors[i % len(colors)]
    if ts:
        ax.step(ts, ys, where="post", color=c, lw=1.6, label=run)
        ax.fill_between(ts, ys, step="post", color=c, alpha=0.08)
    for event, t in marks[run]:
        ax.axvline(t, color=c, ls=":", lw=1.1)
        # each run's labels at its own height, so close lines of two runs stay readable
        ax.annotate(
            event,
            xy=(t, ymax * (1.1 - 0.2 * i)),
            xytext=(-2, 0),
            textcoords="offset points",
            rotation=90,
            color=c,
            fontsize=8,
            ha="right",
            va="top",
        )
if cap > 0:
    ax.axhline(cap, color="black", ls="--", lw=1.2, label=f"device memory cap ({cap:.0f} MiB)")
ax.set_ylim(0, ymax * 1.12)
ax.set_xlim(left=0)
ax.set_xlabel("time since the start of the training step (ms)")
ax.set_ylabel("device memory in use (MiB)")
ax.set_title(title, fontsize=10)
ax.grid(alpha=0.3)
ax.legend(loc="lower right", fontsize=9)
fig.tight_layout()
fig.savefig(png_path)
