#!/usr/bin/env python3
"""Renders a `tightfit ab` comparison (its ab.json) as a self-contained HTML
report: the table, and plots of training loss against step and against wall
time, held-out loss against step, and tracked memory over time (every seed's
run, one colour per variant). Images are embedded, so the file travels alone.

usage: scripts/ab_report.py OUT/ab.json [--html OUT/report.html]
"""
import argparse
import base64
import html
import io
import json
import math
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def figure_png(draw) -> str:
    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=110)
    draw(ax)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def curves(report, x_key, y_key, ax, xlabel, ylabel, scale=1.0):
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, v in enumerate(report["variants"]):
        for k, run in enumerate(r for r in v["runs"] if not r.get("failed")):
            c = run["curve"]
            ys = [y * scale if y is not None else math.nan for y in c[y_key]]
            xs = c[x_key] if x_key else list(range(1, len(ys) + 1))
            ax.plot(xs, ys, color=colours[i % len(colours)], alpha=0.85 if k == 0 else 0.45,
                    label=v["name"] if k == 0 else None, linewidth=1.2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)


def fmt(x, digits=4):
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{digits}f}"


def table(report) -> str:
    mib = 1 << 20
    rows = []
    for v in report["variants"]:
        m = v["mean"]
        p = m["peak_bytes"]
        gap = fmt(m["eval_gap"])
        if m.get("eval_gap_ci95") is not None and math.isfinite(m["eval_gap_ci95"]):
            gap += f" ± {m['eval_gap_ci95']:.4f}"
        # A variant whose every run failed has no figures: "-" in its row.
        def in_mib(x):
            return None if x is None else x / mib
        cells = [html.escape(v["name"]), fmt(in_mib(p.get("total")), 1)] + \
                [fmt(in_mib(p.get(c)), 1) for c in ("weights", "grads", "optimizer", "activations", "adapters")] + \
                [fmt(m["tokens_per_s"], 0), fmt(m["wall_s"], 1), fmt(m["final_eval_loss"]),
                 fmt(m["best_eval_loss"]), gap, fmt(m["divergences"], 0),
                 f"{100 * m['backward_skipped']:.0f}%" if m.get("backward_skipped") is not None else "-"]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    head = ["variant", "peak MiB", "weights", "grads", "optimizer", "activations", "adapters", "tokens/s",
            "wall s", "eval loss", "best eval", "gap to first (95% CI)", "divergences", "backward skipped"]
    return ("<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>" + "".join(rows) + "</table>")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ab_json")
    ap.add_argument("--html")
    args = ap.parse_args()
    path = pathlib.Path(args.ab_json)
    report = json.loads(path.read_text())
    out = pathlib.Path(args.html) if args.html else path.parent / "report.html"
    plots = [
        ("Training loss by step", lambda ax: curves(report, None, "loss", ax, "step", "loss")),
        ("Held-out loss by step", lambda ax: curves(report, "eval_step", "eval_loss", ax, "step", "eval loss")),
        ("Training loss by wall time", lambda ax: curves(report, "elapsed_s", "loss", ax, "seconds", "loss")),
        ("Peak tracked memory over time",
         lambda ax: curves(report, "elapsed_s", "peak_total", ax, "seconds", "MiB", 1 / (1 << 20))),
    ]
    images = "".join(f"<h2>{html.escape(t)}</h2><img src='data:image/png;base64,{figure_png(d)}'>"
                     for t, d in plots)
    names = ", ".join(html.escape(v["name"]) for v in report["variants"])
    out.write_text(f"""<!doctype html><html><head><meta charset="utf-8"><title>tightfit ab</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1100px}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}td:first-child{{text-align:left}}</style></head>
<body><h1>tightfit ab: {names}</h1>
<p>{len(report['seeds'])} seed(s) ({', '.join(map(str, report['seeds']))}), {report['steps']} steps each,
same initial weights and data order per seed; means over seeds; the gap is the held-out loss minus the
first variant's, paired by seed, with its 95% interval (Student's t).</p>
{table(report)}{images}</body></html>""")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
