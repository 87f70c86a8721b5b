#!/usr/bin/env python3
"""The report of scripts/nvfp4_study.sh: one Markdown table and one PNG from the study's runs.

Reads each seed's run directory (scripts/sweep.sh's sweep.csv, made by compare_logs.py --csv, and the
JSON-lines logs it names: pretrain_llama --log-jsonl, read with jsonl_log.py), checks from each run's
"start" event (its precision_plan) that the run used the variant it is filed under, takes the model and
data lines of the report from the first BF16 run's start event (model.name, model.parameters, the data
list's per-split lines) and the loss curves from the "iteration" and "eval" events, and writes
OUT_DOC/nvfp4_study.md and OUT_DOC/nvfp4_study.png. Not meant to be run by hand (the study script passes
everything), but harmless: it only reads the runs.
"""

import csv
import io
import math
import os
import re
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from atomic_output import write_atomically  # noqa: E402
import compare_logs  # noqa: E402  (parse_any, smooth: the same parsing as the table's)
import jsonl_log  # noqa: E402
import script_errors  # noqa: E402

PROG = "study_report.py"

# (recipe label as sweep.sh names the logs, name in the table, what the precision plan must show)
VARIANTS = [
    ("bf16_mixed", "BF16", "bf16"),
    ("bf16_with_fp8_current_scaling_mixed", "FP8 current scaling", "fp8"),
    ("bf16_with_mxfp8_mixed", "MXFP8", "mxfp8"),
    ("bf16_with_nvfp4_mixed", "NVFP4 (playbook recipe)", "nvfp4"),
    ("nvfp4_no_rht", "NVFP4 without RHT", "no_rht"),
    ("nvfp4_no_sr", "NVFP4 without stochastic rounding", "no_sr"),
    ("nvfp4_no_2d", "NVFP4 without 2D weight blocks", "no_2d"),
    ("nvfp4_all_layers", "NVFP4 on every layer (no BF16 layers)", "all_layers"),
]
ABLATIONS = ["nvfp4_no_rht", "nvfp4_no_sr", "nvfp4_no_2d", "nvfp4_all_layers"]

# An entry of the start event's precision_plan (the banner's plan lines without their prefix) and of its
# data list (the banner's data lines, with or without their "data: ").
PLAN_LINE = re.compile(r"^(layers? +[0-9-]+)\s*: linear_qkv linear_proj linear_fc1 linear_fc2 in (.*)$")
DATA_SPLIT = re.compile(r"^(?:data: )?dataset \d+ (train|valid|test): \d+ sequences, (\d+) tokens per epoch")


class Error(script_errors.ScriptError):
    """A run directory, sweep.csv or log the report cannot use: one line, exit 1."""


# The columns of sweep.csv (compare_logs.py --csv's, with the sweep's recipe) the report reads, and how:
# float (blank: unknown, nan) or int.
NUMBER_COLUMNS = {"tail_loss": float, "val_loss": float, "step_ms": float, "nonfinite": int}
TEXT_COLUMNS = ("recipe", "path", "iterations", "tail_iterations")


def start_of(path):
    """The last "start" event of a run's JSON-lines log (the run that wrote its end)."""
    start = jsonl_log.read_run(path, Error).last("start")
    if start is None:
        raise Error(f"{path}: no \"start\" event (not a --log-jsonl log of a run?)")
    return start


def plan_of(path):
    """The precision plan's per-layer lines of a run: [(layers, detail)]."""
    plan = []
    lines = start_of(path).get("precision_plan")
    for line in lines if isinstance(lines, list) else []:
        m = PLAN_LINE.match(str(line).strip())
        if m:
            plan.append((m.group(1), m.group(2)))
    return plan


def check_plan(path, kind):
    """Raises Error unless the run's precision plan is the variant's (the ablation really took effect)."""
    plan = plan_of(path)
    if not plan:
        raise Error(f"{path}: no per-layer lines in the start event's precision_plan")
    details = [d for _, d in plan]
    quant = [d for d in details if d != "bf16"]
    nv = [d for d in quant if d.startswith("nvfp4")]

    def need(cond, what):
        if not cond:
            raise Error(f"{path}: the precision plan ({'; '.join(details)}) is not {what}")

    if kind == "bf16":
        need(not quant, "BF16 on every layer")
    elif kind == "fp8":
        need(quant and all(d.startswith("fp8 current scaling") for d in quant), "FP8 current scaling")
    elif kind == "mxfp8":
        need(quant and all(d.startswith("mxfp8") for d in quant), "MXFP8")
    else:
        need(nv and len(nv) == len(quant), "NVFP4")
        rht = "off" if kind == "no_rht" else "on"
        sr = "off" if kind == "no_sr" else "on"
        blocks = "1x16" if kind == "no_2d" else "16x16"
        need(all(f"per {blocks} weight" in d and f"RHT on wgrad {rht}" in d and f"stochastic rounding of gradients {sr}" in d
                 for d in nv), f"NVFP4 with {blocks} weight blocks, RHT {rht}, stochastic rounding {sr}")
        if kind == "all_layers":
            need("bf16" not in details, "NVFP4 on every layer")
        else:
            need("bf16" in details, "NVFP4 with BF16 edge layers (the playbook's)")


def csv_rows(path):
    """The rows of a CSV file as dicts, each with the columns the report reads (numbers converted)."""
    try:
        rows = list(csv.DictReader(io.StringIO(script_errors.read_regular_file(path, Error).decode("utf-8"),
                                               newline="")))
    except UnicodeDecodeError:
        raise Error(f"{path}: not a CSV file (not UTF-8 text)")
    except csv.Error as e:
        raise Error(f"{path}: not a CSV file ({e})")
    for line, r in enumerate(rows, 2):  # (line 1: the header)
        missing = [c for c in TEXT_COLUMNS + tuple(NUMBER_COLUMNS) if r.get(c) is None]
        if missing:
            raise Error(f"{path}:{line}: no {', '.join(missing)} column (not compare_logs.py --csv's sweep.csv?)")
        for column, kind in NUMBER_COLUMNS.items():
            r[column] = cell_number(r[column], kind, f"{path}:{line}: {column}")
    return rows


def cell_number(text, kind, where):
    """A CSV cell as `kind` (float: blank is nan, as csv_num writes an unknown value)."""
    if kind is float and text == "":
        return math.nan
    try:
        return kind(text)
    except ValueError:
        raise Error(f"{where}: not {'an integer' if kind is int else 'a number'}: '{text[:40]}'")


def read_runs(run_dir):
    """{recipe label: CSV row} of one seed's sweep.csv."""
    path = os.path.join(run_dir, "sweep.csv")
    runs = {}
    for r in csv_rows(path):
        log = r["path"] if os.path.isabs(r["path"]) else os.path.join(run_dir, os.path.basename(r["path"]))
        r["log_path"] = log
        runs[r["recipe"]] = r
    missing = [label for label, _, _ in VARIANTS if label not in runs]
    if missing:
        raise Error(f"{path}: no run of {', '.join(missing)}")
    return runs


def gap_pct(x, ref):
    """100 (x - ref) / ref; nan when ref is 0 or not finite (no gap to a reference of 0)."""
    return 100 * (x - ref) / ref if math.isfinite(ref) and ref != 0 else math.nan


def mean(xs):
    xs = [x for x in xs if math.isfinite(x)]
    return sum(xs) / len(xs) if xs else math.nan


def std_error(xs):
    """The standard error of the mean of xs (sample standard deviation / sqrt(n)); nan with fewer than two
    finite values. With two seeds it is half their difference."""
    xs = [x for x in xs if math.isfinite(x)]
    if len(xs) < 2:
        return math.nan
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs))


def beyond_noise(xs):
    """Whether the mean of the paired per-seed differences xs is more than two standard errors from zero
    (False without a standard error: fewer than two finite values)."""
    se = std_error(xs)
    return math.isfinite(se) and abs(mean(xs)) > 2 * se


def spread(xs):
    """(max - min) / mean, in percent; nan with fewer than two finite values."""
    xs = [x for x in xs if math.isfinite(x)]
    return 100.0 * (max(xs) - min(xs)) / mean(xs) if len(xs) >= 2 and mean(xs) != 0 else math.nan


def pct(x, sign=True):
    if not math.isfinite(x):
        return "n/a"
    return f"{x:+.2f}%" if sign else f"{x:.2f}%"


def main(argv=None):
    ap = script_errors.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("run_dirs", nargs="+", help="one directory per seed, in the order of --seeds")
    ap.add_argument("--seeds", required=True)
    ap.add_argument("--out-doc", required=True)
    ap.add_argument("--command", required=True, help="the study's command line")
    ap.add_argument("--run-command", required=True, help="one run's pretrain_llama command (RECIPE for the recipe)")
    ap.add_argument("--commit", required=True)
    ap.add_argument("--machine", required=True)
    ap.add_argument("--device", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True, help="the study's work directory (OUT in --run-command)")
    ap.add_argument("--date", help="default: now, UTC")
    args = ap.parse_args(argv)
    # Run by a python3 without them (a venv's, first on PATH): re-run under Debian's, which has them.
    np, matplotlib = script_errors.import_or_rerun(__file__, argv, "numpy", "matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    seeds = args.seeds.split(",")
    if len(seeds) != len(args.run_dirs):
        raise Error(f"--seeds: {len(seeds)} seeds but {len(args.run_dirs)} run directories")
    runs = [read_runs(d) for d in args.run_dirs]  # per seed: {label: row}
    for per_seed in runs:
        for label, _, kind in VARIANTS:
            check_plan(per_seed[label]["log_path"], kind)
    return report(args, seeds, runs, np, plt)


def report(args, seeds, runs, np, plt):
    import datetime
    date = args.date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    k = len(seeds)
    stats = {}
    for label, _, _ in VARIANTS:
        tr = [r[label]["tail_loss"] for r in runs]
        va = [r[label]["val_loss"] for r in runs]
        tr_gap = [gap_pct(t, r["bf16_mixed"]["tail_loss"]) for t, r in zip(tr, runs)]
        va_gap = [gap_pct(v, r["bf16_mixed"]["val_loss"]) for v, r in zip(va, runs)]
        stats[label] = dict(
            train=mean(tr), train_spread=spread(tr), train_gap=mean(tr_gap), train_gaps=tr_gap,
            val=mean(va), val_spread=spread(va), val_gap=mean(va_gap), val_gaps=va_gap, val_gap_se=std_error(va_gap),
            nonfinite=sum(r[label]["nonfinite"] for r in runs),
            step_ms=mean([r[label]["step_ms"] for r in runs]),
            iterations=runs[0][label]["iterations"], tail=runs[0][label]["tail_iterations"])
    noise_train = stats["bf16_mixed"]["train_spread"]
    noise_val = stats["bf16_mixed"]["val_spread"]

    # Model and data, from the first BF16 run's start event (the banner's words: 3 decimals of M parameters).
    start = start_of(runs[0]["bf16_mixed"]["log_path"])
    model = start.get("model") if isinstance(start.get("model"), dict) else {}
    params = jsonl_log.number(model.get("parameters"))
    model_line = f"`{model.get('name', '?')}` ({params / 1e6:.3f} M parameters)"
    data_lines = []
    for line in start.get("data") if isinstance(start.get("data"), list) else []:
        d = DATA_SPLIT.match(str(line).strip())
        if d:
            data_lines.append(f"{d.group(1)} {int(d.group(2)):,} tokens")

    md = []
    md.append("# NVFP4 accuracy study: what each part of the recipe does to the loss\n")
    md.append(f"Made by `scripts/nvfp4_study.sh` on {date}, commit `{args.commit}`, on {args.machine} "
              f"(device {args.device}):\n")
    md.append(f"```\n{args.command}\n```\n")
    md.append(f"{len(VARIANTS)} variants x {k} seed(s) ({', '.join(seeds)}: the seed of the initialisation and of the "
              f"data shuffle; within a seed every variant starts from the same weights and sees the same batches), "
              f"{stats['bf16_mixed']['iterations']} iterations each. Model: `{args.model}`'s shape with the byte "
              f"vocabulary, {model_line}. Data: the `fortunes` package's texts and /usr/share/common-licenses, byte "
              f"tokenizer, split 949,50,1 ({', '.join(data_lines)} per epoch). Each run:\n")
    md.append(f"```\n{args.run_command}\n```\n(OUT = the study's work directory, RECIPE the variant's recipe, SEED the seed.)\n")
    plan = plan_of(runs[0]["bf16_with_nvfp4_mixed"]["log_path"])
    md.append("The playbook's NVFP4 recipe keeps its last 4 layers in BF16 (of Llama 3 8B's 32); on this model its "
              "precision plan is: " + "; ".join(f"{where.replace('  ', ' ')}: {detail.split(' (')[0]}"
                                                for where, detail in plan) + ".\n")
    md.append("| variant | recipe | train loss | train gap vs BF16 | val loss | val gap vs BF16 | val gap per seed | "
              "s.e. of val gap | seed spread train / val | gap beyond noise | non-finite | step ms |")
    md.append("|---|---|---:|---:|---:|---:|---:|---:|---:|:---:|---:|---:|")
    for label, name, _ in VARIANTS:
        s = stats[label]
        is_ref = label == "bf16_mixed"
        if k < 2:
            beyond = "n/a (one seed)"
        elif is_ref:
            beyond = ""
        else:
            beyond = "yes" if beyond_noise(s["val_gaps"]) else "no"
        md.append(f"| {name} | `{label}` | {s['train']:.4f} | {'' if is_ref else pct(s['train_gap'])} | {s['val']:.4f} | "
                  f"{'' if is_ref else pct(s['val_gap'])} | "
                  f"{'' if is_ref else ', '.join(pct(g) for g in s['val_gaps'])} | "
                  f"{'' if is_ref or k < 2 else pct(s['val_gap_se'], sign=False)} | "
                  f"{pct(s['train_spread'], sign=False) + ' / ' + pct(s['val_spread'], sign=False) if k >= 2 else 'n/a'} | "
                  f"{beyond} | {s['nonfinite']} | "
                  f"{s['step_ms']:.0f} |")
    md.append("")
    md.append(f"* **train loss**: each run's mean lm loss over its last {stats['bf16_mixed']['tail']} iteration(s) (the last "
              "10%), averaged over the seeds; **val loss**: the after-training loss on the validation split (8 batches), "
              "averaged over the seeds.")
    md.append("* **gap vs BF16**: (variant - BF16) / BF16 of the same seed, averaged over the seeds; **val gap per seed**: "
              "each seed's.")
    md.append("* **run-to-run noise**, two measures. **seed spread**: (max - min) / mean of the variant's train / val loss "
              f"over the seeds; BF16's is {pct(noise_val, sign=False)} on the val loss, {pct(noise_train, sign=False)} on the "
              "train loss (it includes the different validation batches each seed's shuffle picks). **s.e. of val gap**: "
              "the standard error of the mean gap from its seed-to-seed scatter (sample standard deviation of the "
              "per-seed gaps / sqrt(seeds); with two seeds, half their difference): the noise of a paired comparison. "
              "**gap beyond noise**: |mean val gap| > 2 s.e. With few seeds the s.e. is itself rough; read the per-seed "
              "gaps too."
              if k >= 2 else "* **seed spread**: needs two or more seeds (`--seeds 2`); with one seed there is no noise "
              "estimate and no gap can be called beyond noise.")
    md.append("* **step ms**: mean step time over the summary window; on a CPU every quantized GEMM is emulated "
              "(slower than BF16), so it says nothing about GPU speed.")
    md.append("")

    # The ablations against the full recipe (the NVFP4 paper: each ablation raises the loss).
    md.append("## The ablations against the full NVFP4 recipe\n")
    md.append("The NVFP4 paper's ablations find each part of the recipe matters: without RHT, without stochastic "
              "rounding, without 2D weight blocks or without BF16 layers the loss is higher than with the full "
              "recipe. Here (val gap of the ablation minus the full recipe's, paired by seed; mean +- its standard "
              "error; judged beyond noise when the mean is more than 2 s.e. from zero):\n")
    full = stats["bf16_with_nvfp4_mixed"]
    for label in ABLATIONS:
        s = stats[label]
        diffs = [a - b for a, b in zip(s["val_gaps"], full["val_gaps"])]
        d, se = mean(diffs), std_error(diffs)
        name = dict((lb, nm) for lb, nm, _ in VARIANTS)[label]
        if k < 2:
            verdict = "one seed: no noise estimate, not judged"
        elif not beyond_noise(diffs):
            verdict = "within the run-to-run noise (2 s.e.): not separated from the full recipe"
        elif d > 0:
            verdict = "worse than the full recipe, as in the paper"
        else:
            verdict = "**better than the full recipe: differs from the paper**"
        se_text = f" +- {pct(se, sign=False)}" if k >= 2 else ""
        md.append(f"* {name}: {pct(d)}{se_text} ({', '.join(pct(x) for x in diffs)} per seed): {verdict}.")
    order = sorted((lb for lb, _, _ in VARIANTS if lb != "bf16_mixed"), key=lambda lb: stats[lb]["val_gap"])
    names = dict((lb, nm) for lb, nm, _ in VARIANTS)
    md.append("")
    md.append("Ordering by val gap, smallest first: " + ", ".join(f"{names[lb]} ({pct(stats[lb]['val_gap'])})"
                                                                for lb in order) + ".\n")
    md.append("![loss gap vs BF16 per variant](nvfp4_study.png)\n")
    md.append("The figure: top, the training loss gap vs BF16 over the iterations (each seed's gap against its own "
              "BF16 run, smoothed, averaged over the seeds; markers: the validation gaps); bottom, the final val gap "
              "per variant (bar: the mean; error bar: +-2 standard errors; dots: the seeds).\n")

    # The figure.
    fig, (ax_curve, ax_bar) = plt.subplots(2, 1, figsize=(11, 10))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    logs = [{label: compare_logs.parse_any(r[label]["log_path"], "jsonl") for label, _, _ in VARIANTS} for r in runs]
    for i, (label, name, _) in enumerate(VARIANTS[1:]):
        c = colors[i % len(colors)]
        curves, vpoints = [], {}
        for per_seed in logs:
            ref, log = per_seed["bf16_mixed"], per_seed[label]
            n = min(len(ref.iters), len(log.iters))
            r = np.array(ref.loss[:n], dtype=float)
            x = np.array(log.loss[:n], dtype=float)
            span = max(3, n // 10)
            curves.append(100 * (compare_logs.smooth(np, x, span) - compare_logs.smooth(np, r, span)) /
                          compare_logs.smooth(np, r, span))
            for it, v in log.valid.items():
                if it in ref.valid and ref.valid[it]:
                    vpoints.setdefault(it, []).append(100 * (v - ref.valid[it]) / ref.valid[it])
        n = min(len(cv) for cv in curves)
        its = logs[0][label].iters[:n]
        ax_curve.plot(its, np.nanmean(np.array([cv[:n] for cv in curves]), axis=0), color=c, linewidth=1.4, label=name)
        if vpoints:
            vi = sorted(vpoints)
            ax_curve.plot(vi, [mean(vpoints[v]) for v in vi], "o", color=c, markersize=4)
        s = stats[label]
        ax_bar.bar(i, s["val_gap"], color=c, alpha=0.6,
                   yerr=2 * s["val_gap_se"] if math.isfinite(s["val_gap_se"]) else None, capsize=4)
        ax_bar.plot([i] * len(s["val_gaps"]), s["val_gaps"], "o", color="black", markersize=4)
    ax_curve.axhline(0.0, color="black", linewidth=0.8)
    ax_curve.set_xlabel("iteration")
    ax_curve.set_ylabel("train loss gap vs BF16 (%)\n(smoothed; dots: validation)")
    ax_curve.grid(True, alpha=0.3)
    ax_curve.legend(fontsize=8)
    ax_bar.axhline(0.0, color="black", linewidth=0.8)
    ax_bar.set_xticks(range(len(VARIANTS) - 1))
    ax_bar.set_xticklabels([textwrap.fill(nm, 16) for _, nm, _ in VARIANTS[1:]], fontsize=8)
    ax_bar.set_ylabel(f"final val loss gap vs BF16 (%)\n(bar: mean of {k} seed(s) +-2 s.e.; dots: seeds)")
    ax_bar.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"NVFP4 study: {args.model} (byte vocab), {stats['bf16_mixed']['iterations']} iterations, "
                 f"{k} seed(s), {args.device}", fontsize=11)
    fig.tight_layout()
    os.makedirs(args.out_doc, exist_ok=True)
    try:
        write_atomically(os.path.join(args.out_doc, "nvfp4_study.png"), ".png", Error,
                         lambda fh: fig.savefig(fh, format="png", dpi=80))
    finally:
        plt.close(fig)
    write_atomically(os.path.join(args.out_doc, "nvfp4_study.md"), ".md", Error,
                     lambda fh: fh.write(("\n".join(md) + "\n").encode("utf-8", "backslashreplace")))
    print(f"{PROG}: wrote {os.path.join(args.out_doc, 'nvfp4_study.md')} and nvfp4_study.png")
    print("\n".join(l for l in md if l.startswith("|")))
    return 0


if __name__ == "__main__":
    script_errors.run_main(PROG, main, 1)
