#!/usr/bin/env python3
"""Draw pretrain_llama's --roofline reports: the hierarchical roofline and the time-based view.

One figure for one or more reports (e.g. a BF16 and an NVFP4 run of the same model), so a reader sees
where a speed-up goes. Only the standard library, numpy and matplotlib (Agg backend, no display needed).
"""

import argparse
import json
import math
import os
import sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # atomic_output.py beside this script
from atomic_output import write_atomically  # noqa: E402
import script_errors  # noqa: E402

PROG = "roofline_plot.py"

HELP_EPILOG = """\
what is drawn:
  left   the log-log roofline (Yang et al., "Hierarchical Roofline Performance Analysis for Deep
         Learning Applications", 2020): one horizontal compute roof per GEMM format of the report's
         measured ceilings, one bandwidth slope per memory level (intensity x GB/s; roofs within 3% of
         each other share one line and one label, e.g. "bf16/fp8 0.206-0.208 TFLOP/s"), one marker per
         op row at (arithmetic intensity, achieved TFLOP/s); its area is the row's share of the step,
         its colour the row's kind, its shape the report. Rows with 0 FLOPs (or 0 bytes, or 0 ms) have
         no place on these axes: they are not drawn, and the legend counts them per report.
  right  the time-based view (Wang et al., "Time-Based Roofline for Deep Learning Performance
         Analysis", 2020): per op group (kind, linear layer, GEMM pass; a report's rows of one group
         summed), the time the group would take at its ceilings (ms_at_ceiling) and the time lost
         (ms_per_iter - ms_at_ceiling), one bar per report side by side, and the step's time outside
         the ops (host work, gaps, waits).
  titles each report's label and recipe, step time, speed-of-light time and % of speed of light.

exit status: 0 the figure was written; 1 matplotlib or numpy is missing (for this python3 and for
/usr/bin/python3: when only this one lacks them, the script re-runs under /usr/bin/python3), or the PNG
cannot be written; 2 bad arguments, or a report that is missing, not a regular file, not JSON, or lacks
a field (one line naming the file and the field); 130 interrupted (Ctrl-C).
"""

# The kinds of the report's schema, each with its colour (matplotlib's tab10, in this order).
KINDS = ["gemm", "attention", "quantize", "norm", "elementwise", "embedding", "cross_entropy", "optimizer",
         "comm", "other"]
MARKERS = ["o", "^", "s", "D", "v", "P"]
HATCHES = ["", "//", "xx", "..", "\\\\", "oo"]


class InputError(script_errors.ScriptError):
    """A report that cannot be used: one line naming the file and the field (exit 2)."""

    status = 2


class EnvError(script_errors.ScriptError):
    """Not the input's fault: a missing module, an unwritable output (exit 1)."""

    status = 1


def as_float(v):
    """A JSON number as a float, nan for anything else: a boolean, and an integer beyond a double's range
    (JSON integers have no size limit; float() of one raises OverflowError)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return math.nan
    try:
        return float(v)
    except OverflowError:
        return math.nan


def field(obj, key, where, path, kind):
    """obj[key] checked against `kind`: 'number' (finite, >= 0), 'str', 'list', 'dict' or 'str?' (str or null)."""
    if not isinstance(obj, dict) or key not in obj:
        raise InputError(f"{path}: missing field {where}{key}")
    v = obj[key]
    if kind == "number":
        x = as_float(v)
        if not math.isfinite(x) or x < 0:
            raise InputError(f"{path}: field {where}{key} is not a finite number >= 0 (got {json.dumps(v)[:40]})")
        return x
    ok = {"str": isinstance(v, str), "str?": v is None or isinstance(v, str), "list": isinstance(v, list),
          "dict": isinstance(v, dict)}[kind]
    if not ok:
        raise InputError(f"{path}: field {where}{key} is not a {kind.rstrip('?')}"
                         f"{' or null' if kind.endswith('?') else ''} (got {json.dumps(v)[:40]})")
    return v


def optional_number(obj, key, where, path):
    return field(obj, key, where, path, "number") if key in obj and obj[key] is not None else None


class Report:
    """One --roofline JSON file: what the figure needs of it, checked."""

    def __init__(self, path, index):
        self.path = path
        self.index = index
        data = script_errors.read_regular_file(path, InputError)  # a FIFO: one line, never a hang
        try:
            doc = json.loads(data.decode("utf-8"))
        except UnicodeDecodeError:
            raise InputError(f"{path}: not JSON (not UTF-8 text)")
        except ValueError as e:
            raise InputError(f"{path}: not JSON: {e}")
        except RecursionError:  # (hostile nesting: json's recursive parser runs out of stack)
            raise InputError(f"{path}: not a --roofline report (JSON nested too deeply)")
        if not isinstance(doc, dict):
            raise InputError(f"{path}: not a --roofline report (the top level is not an object)")
        self.read_summary(doc)
        self.read_ceilings(doc)
        self.rows = [self.read_row(r, i) for i, r in enumerate(field(doc, "rows", "", path, "list"))]
        if self.outside_ms is None:
            self.outside_ms = max(0.0, self.step_ms - sum(r["ms"] for r in self.rows))

    def read_summary(self, doc):
        p = self.path
        machine = field(doc, "machine", "", p, "dict")
        text = lambda key: machine.get(key) if isinstance(machine.get(key), str) else "?"
        self.machine = f"{text('name')} ({text('device')})"
        self.step_ms = field(doc, "step_ms", "", p, "number")
        if self.step_ms <= 0:
            raise InputError(f"{p}: field step_ms must be > 0 (got {self.step_ms})")
        self.sol_ms = field(doc, "sol_ms", "", p, "number")
        pct = optional_number(doc, "pct_of_sol", "", p)
        self.pct_of_sol = pct if pct is not None else 100.0 * self.sol_ms / self.step_ms
        # Time outside the ops: a clock's rounding can make it a hair below 0 (drawn as 0).
        outside = doc.get("outside_ops_ms")
        if outside is not None and not math.isfinite(as_float(outside)):
            raise InputError(f"{p}: field outside_ops_ms is not a finite number (got {json.dumps(outside)[:40]})")
        self.outside_ms = None if outside is None else max(0.0, as_float(outside))
        label = doc.get("label") if isinstance(doc.get("label"), str) and doc.get("label") else None
        self.label = label or os.path.splitext(os.path.basename(p))[0]
        self.recipe = doc.get("recipe") if isinstance(doc.get("recipe"), str) else ""

    def read_ceilings(self, doc):
        p = self.path
        ceilings = field(doc, "ceilings", "", p, "dict")
        self.gemm_roofs = []
        for i, g in enumerate(field(ceilings, "gemm", "ceilings.", p, "list")):
            where = f"ceilings.gemm[{i}]."
            self.gemm_roofs.append((field(g, "format", where, p, "str"), field(g, "tflops", where, p, "number")))
        self.memory_roofs = []
        for i, m in enumerate(field(ceilings, "memory", "ceilings.", p, "list")):
            where = f"ceilings.memory[{i}]."
            self.memory_roofs.append((field(m, "level", where, p, "str"), field(m, "gbps", where, p, "number")))

    def read_row(self, r, i):
        p, where = self.path, f"rows[{i}]."
        kind = field(r, "kind", where, p, "str")
        if kind not in KINDS:
            raise InputError(f"{p}: field {where}kind is '{kind}', not one of {', '.join(KINDS)}")
        row = {"op": field(r, "op", where, p, "str"), "kind": kind,
               "linear": field(r, "linear", where, p, "str?") if "linear" in r else None,
               "pass": field(r, "pass", where, p, "str?") if "pass" in r else None,
               "format": r.get("format") if isinstance(r.get("format"), str) else "",
               "ms": field(r, "ms_per_iter", where, p, "number"),
               "gflop": field(r, "gflop_per_iter", where, p, "number"),
               "gb": field(r, "gb_per_iter", where, p, "number"),
               "ms_at_ceiling": field(r, "ms_at_ceiling", where, p, "number")}
        # Derived as the report defines them when the file leaves them out (GFLOP / ms = TFLOP/s).
        intensity = optional_number(r, "intensity", where, p)
        row["intensity"] = intensity if intensity is not None else (row["gflop"] / row["gb"] if row["gb"] > 0 else 0.0)
        achieved = optional_number(r, "achieved_tflops", where, p)
        row["tflops"] = achieved if achieved is not None else (row["gflop"] / row["ms"] if row["ms"] > 0 else 0.0)
        return row

    def title(self):
        recipe = f" ({self.recipe})" if self.recipe and self.recipe != self.label else ""
        return (f"{self.label}{recipe}: step {self.step_ms:.1f} ms, speed of light {self.sol_ms:.1f} ms "
                f"= {self.pct_of_sol:.1f}% of speed of light")


def group_key(row):
    """The time view's op group: kind, then the linear layer and the GEMM pass where the row has them."""
    return " ".join(x for x in (row["kind"], row["linear"], row["pass"]) if x)


def import_plotting(argv):
    """numpy and pyplot; missing here, the script re-runs under /usr/bin/python3 when that one has them."""
    np, matplotlib = script_errors.import_or_rerun(__file__, argv, "numpy", "matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return np, plt


# Roofs within 3% of each other are drawn as one line with one label: on one machine that is the probe's
# trial-to-trial spread (the CPU's emulated formats all run the same FP32 GEMM), not a different ceiling, and
# separate labels would print on top of each other.
MERGE_RATIO = 1.03
LABEL_FONTSIZE = 7
LABEL_HEIGHT_PT = LABEL_FONTSIZE * 1.6  # one line of text in its background box, with a hair of room
LABEL_PAD_PT = 1.5  # between a label and its own line


def merge_roofs(entries):
    """entries: (name, value, report index) in the reports' order. Returns the drawn roofs, highest first: dicts
    with names (in the reports' order, each once), lo and hi (the values merged) and solid (report 0 has one)."""
    first_seen = {}
    for name, _, _ in entries:
        first_seen.setdefault(name, len(first_seen))
    groups = []
    for name, value, index in sorted((e for e in entries if e[1] > 0), key=lambda e: -e[1]):
        if not groups or value * MERGE_RATIO < groups[-1]["hi"]:
            groups.append({"names": [], "hi": value, "lo": value, "solid": False})
        group = groups[-1]
        group["lo"] = value
        group["solid"] |= index == 0
        if name not in group["names"]:
            group["names"].append(name)
    for group in groups:
        group["names"].sort(key=first_seen.get)
    return groups


def roof_label(group, unit):
    lo, hi = f"{group['lo']:.3g}", f"{group['hi']:.3g}"
    return f"{'/'.join(group['names'])} {hi if lo == hi else lo + '-' + hi} {unit}"


def stack_labels(anchors_pt):
    """Vertical offsets (points, of each label's bottom from its anchor) for labels beside lines through the
    anchors (display points): above its own line where the next line and label up leave room, else below it,
    else pushed down as far as they need. Labels never overlap each other."""
    offsets = [0.0] * len(anchors_pt)
    limit = math.inf  # the lowest line or label bottom placed so far: nothing may reach above it
    for i in sorted(range(len(anchors_pt)), key=lambda k: -anchors_pt[k]):
        y = anchors_pt[i]
        above, below = y + LABEL_PAD_PT, y - LABEL_PAD_PT - LABEL_HEIGHT_PT
        if above + LABEL_HEIGHT_PT <= limit:
            bottom = above
        elif below + LABEL_HEIGHT_PT <= limit:
            bottom = below
        else:
            bottom = limit - LABEL_HEIGHT_PT
        offsets[i] = bottom - y
        limit = min(bottom, y - LABEL_PAD_PT)
    return offsets


def draw_roofs(ax, reports, np, x_range, y_lo):
    """The compute roofs and bandwidth slopes, once per distinct value (reports of one machine share them).
    Returns the labels to place once the layout is final: (text, anchor (x, y), 'left' or 'right', colour)."""
    lo, hi = x_range
    compute = merge_roofs([(f, t, rep.index) for rep in reports for f, t in rep.gemm_roofs])
    memory = merge_roofs([(lvl, g, rep.index) for rep in reports for lvl, g in rep.memory_roofs])
    top = compute[0]["hi"] if compute else 0.0
    labels = []
    for group in compute:
        ax.hlines(group["hi"], lo, hi, colors="black", linestyles="-" if group["solid"] else "--", linewidth=1.0)
        labels.append((roof_label(group, "TFLOP/s"), (hi, group["hi"]), "right", "black"))
    for group in memory:
        gbps = group["hi"]
        # intensity (FLOP/byte) x GB/s = GFLOP/s; from where the slope enters the axes (the left edge, or
        # the bottom edge for a slow level) up to the highest compute roof (the ridge point).
        start = max(lo, y_lo * 1000.0 / gbps)
        ridge = min(hi, top * 1000.0 / gbps if top > 0 else hi)
        if start >= ridge:
            continue
        x = np.geomspace(start, ridge, 32)
        ax.plot(x, x * gbps / 1000.0, color="grey", linestyle="-" if group["solid"] else "--", linewidth=1.0)
        labels.append((roof_label(group, "GB/s"), (start, start * gbps / 1000.0), "left", "dimgrey"))
    return labels


def place_roof_labels(ax, labels, dpi):
    """Draws the roof labels, stacked so none covers another; needs the figure's final layout (drawn once)."""
    for side in ("left", "right"):
        mine = [lab for lab in labels if lab[2] == side]
        anchors_pt = [ax.transData.transform(anchor)[1] * 72.0 / dpi for _, anchor, _, _ in mine]
        for (text, anchor, _, color), dy in zip(mine, stack_labels(anchors_pt)):
            # A label pushed off its own line (roofs too close for all labels beside them) gets a leader to it.
            beside = min(abs(dy - LABEL_PAD_PT), abs(dy + LABEL_PAD_PT + LABEL_HEIGHT_PT)) < 0.01
            leader = None if beside else dict(arrowstyle="-", color=color, linewidth=0.5, shrinkA=0, shrinkB=0)
            ann = ax.annotate(text, anchor, xytext=(4 if side == "left" else -4, dy), textcoords="offset points",
                              ha=side, va="bottom", fontsize=LABEL_FONTSIZE, color=color, annotation_clip=False,
                              arrowprops=leader,
                              bbox=dict(boxstyle="square,pad=0.1", facecolor="white", edgecolor="none", alpha=0.8))
            ann.set_in_layout(False)  # the layout is final: a label must not move the axes it was placed on


def draw_roofline(ax, reports, np):
    """Left panel; returns the roof labels to place after the layout (place_roof_labels). Axes span every
    drawn row and roof, starting about a decade below the lowest marker."""
    kind_color = {k: f"C{i}" for i, k in enumerate(KINDS)}
    xs, ys, handles = [], [], []
    for rep in reports:
        marker = MARKERS[rep.index % len(MARKERS)]
        # (a report's own intensity or achieved_tflops of 0 has no place on log axes either)
        on_axes = lambda r: min(r["gflop"], r["gb"], r["ms"], r["intensity"], r["tflops"]) > 0
        placed = [r for r in rep.rows if on_axes(r)]
        skipped = [r for r in rep.rows if not on_axes(r)]
        for r in placed:
            share = min(r["ms"] / rep.step_ms, 1.0)  # (a row longer than its step: the largest marker, not inf)
            ax.scatter(r["intensity"], r["tflops"], s=15 + 900 * share, marker=marker, color=kind_color[r["kind"]],
                       alpha=0.7, edgecolors="black", linewidths=0.4)
            xs.append(r["intensity"])
            ys.append(r["tflops"])
        note = (f"; {len(skipped)} rows with 0 FLOPs (or bytes, ms) not drawn, {sum(r['ms'] for r in skipped):.2f} ms"
                if skipped else "")
        handles.append(ax.scatter([], [], marker=marker, color="white", edgecolors="black",
                                  label=f"{rep.label}: {len(placed)} rows{note}"))
    for k in KINDS:
        if any(r["kind"] == k and r["gflop"] > 0 for rep in reports for r in rep.rows):
            handles.append(ax.scatter([], [], marker="o", color=kind_color[k], label=k))
    roof_tops = [t for rep in reports for _, t in rep.gemm_roofs if t > 0]
    lo = min(xs + [1.0]) / 4
    hi = max(xs + [1000.0]) * 4
    y_hi = max(ys + roof_tops + [1e-3]) * 3
    # The decade at or below half the lowest marker: room under the markers for the legend, no empty decades.
    y_lo = 10.0 ** math.floor(math.log10(max(min(ys) / 2 if ys else y_hi / 1e3, 1e-300)))
    if not all(math.isfinite(v) and v > 0 for v in (lo, hi, y_lo, y_hi)):
        # (finite numbers whose axes are not: 1e308 TFLOP/s x 3 is inf, and matplotlib refuses inf limits)
        raise InputError(f"{', '.join(rep.path for rep in reports)}: intensities or TFLOP/s beyond what a log "
                         f"axis can show (axes {lo:.3g}-{hi:.3g} FLOP/byte, {y_lo:.3g}-{y_hi:.3g} TFLOP/s)")
    labels = draw_roofs(ax, reports, np, (lo, hi), y_lo)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(y_lo, y_hi)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(handles=handles, fontsize=7, loc="lower right")
    ax.set_title("roofline: ops against the measured ceilings", fontsize=9)
    return labels


def draw_time_view(ax, reports, np):
    """Right panel: per op group and report, the time at its ceiling and the time lost."""
    groups = {}
    for rep in reports:
        for r in rep.rows:
            at, total = groups.setdefault(group_key(r), {}).get(rep.index, (0.0, 0.0))
            groups[group_key(r)][rep.index] = (at + r["ms_at_ceiling"], total + r["ms"])
    if not all(math.isfinite(x) for g in groups.values() for pair in g.values() for x in pair):
        # (each time is finite, but a group's sum of times near 1e308 is not: no bar can be that long)
        raise InputError(f"{', '.join(rep.path for rep in reports)}: op times whose sum per group is not finite")
    order = sorted(groups, key=lambda g: -max(t for _, t in groups[g].values()))
    order.append("outside the ops")
    groups["outside the ops"] = {rep.index: (0.0, rep.outside_ms) for rep in reports}
    n = len(reports)
    height = 0.8 / n
    y = np.arange(len(order))
    for rep in reports:
        at = np.array([groups[g].get(rep.index, (0.0, 0.0))[0] for g in order])
        total = np.array([groups[g].get(rep.index, (0.0, 0.0))[1] for g in order])
        lost = np.maximum(total - at, 0.0)
        pos = y - 0.4 + height * (rep.index + 0.5)
        color = f"C{rep.index}"
        hatch = HATCHES[rep.index % len(HATCHES)]
        ax.barh(pos, at, height=height, color=color, hatch=hatch, edgecolor="black", linewidth=0.3,
                label=f"{rep.label}: at the ceiling")
        ax.barh(pos, lost, height=height, left=at, color=color, alpha=0.3, hatch=hatch, edgecolor="black",
                linewidth=0.3, label=f"{rep.label}: lost")
    ax.set_yticks(y)
    ax.set_yticklabels(order, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ms per iteration")
    ax.grid(True, axis="x", alpha=0.25)
    # Beside the axes, not in them: whichever corner, a long group (the time outside the ops is the last row)
    # could run under it.
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    ax.set_title("time: at the ceiling vs lost, per op group", fontsize=9)
    return len(order)


def write_png(path, reports, np, plt):
    groups = len({group_key(r) for rep in reports for r in rep.rows}) + 1
    # Constrained layout reserves the figure title's lines above the panels' titles and the tick labels'
    # and legend's width beside them (tight_layout() left the title's lines over the panels' titles).
    fig, (ax_roof, ax_time) = plt.subplots(1, 2, figsize=(16, max(7.0, 2.0 + 0.22 * groups * len(reports))),
                                           constrained_layout=True)
    labels = draw_roofline(ax_roof, reports, np)
    draw_time_view(ax_time, reports, np)
    machines = sorted({rep.machine for rep in reports})
    fig.suptitle("\n".join([" / ".join(machines)] + [rep.title() for rep in reports]), fontsize=10)
    fig.canvas.draw()  # the final layout, so the roof labels can be stacked in display points
    place_roof_labels(ax_roof, labels, fig.dpi)
    try:
        write_atomically(path, ".png", EnvError, lambda fh: fig.savefig(fh, format="png", dpi=100))
    finally:
        plt.close(fig)


def main(argv=None):
    ap = script_errors.ArgumentParser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter, epilog=HELP_EPILOG,
        description="Draw one or more pretrain_llama --roofline JSON reports on one figure: the log-log "
                    "roofline beside the time-based view.")
    ap.add_argument("reports", nargs="+", metavar="FILE", help="a --roofline JSON report")
    ap.add_argument("--png", metavar="OUT", required=True, help="write the figure to OUT")
    args = ap.parse_args(argv)
    reports = [Report(p, i) for i, p in enumerate(args.reports)]
    np, plt = import_plotting(argv)
    write_png(args.png, reports, np, plt)
    for rep in reports:
        print(f"{PROG}: {rep.path}: {rep.title()}")
    print(f"{PROG}: wrote {args.png}")
    return 0


if __name__ == "__main__":
    script_errors.run_main(PROG, main, 1)  # (InputError: 2, EnvError and a missing module: 1)
