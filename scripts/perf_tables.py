#!/usr/bin/env python3
"""Regenerates docs/performance.md's tables from `attn bench --json` outputs, one run per machine.

  scripts/perf_tables.py BENCH.json docs/performance.md README.md --name zen5 \\
      --machine "2-core AMD EPYC ..." --command "OMP_WAIT_POLICY=passive build/release/attn bench --json --seconds 0.5" \\
      [--save docs/performance-zen5.json]
      rewrites each page between `<!-- perf_tables: begin NAME -->` and `<!-- perf_tables: end NAME -->`
      (every case) and between `<!-- perf_tables: summary begin NAME -->` and `... summary end NAME -->`
      (a few cases: SUMMARY), NAME the run's; --save keeps the run (its JSON with the name, the
      machine and the command)
  scripts/perf_tables.py --check docs/performance-zen5.json docs/performance.md README.md
      exits 1, printing the difference, when a page's tables of that run are not those of the saved
      run (the docs.perf_tables test, once per saved run)

BENCH.json is either `attn bench --json`'s output (then --name, --machine and --command say which
run it is, where and how it ran) or a saved run: {"name": ..., "machine": ..., "command": ...,
"bench": <attn bench --json output>}. Each page must hold the run's tables or its summary.
"""
import argparse
import difflib
import json
import pathlib
import sys



def markers(name):
    """The four markers of run `name`: the tables' begin and end, the summary's begin and end."""
    return (f"<!-- perf_tables: begin {name} -->", f"<!-- perf_tables: end {name} -->",
            f"<!-- perf_tables: summary begin {name} -->", f"<!-- perf_tables: summary end {name} -->")

# The cases of the summary (README.md's "Speed"), those the run has.
SUMMARY = ("sdpa forward (1,4096,4096,128)", "sdpa forward+backward (4,1024,1024,64)", "sdpa decode (32,1,8192,128)",
           "sdpa forward bf16 (1,4096,4096,128)", "sdpa forward+backward bf16 (4,1024,1024,64)",
           "sdpa forward int8 (1,4096,4096,128)",
           "sdpa decode int8 (32,1,8192,128)", "multi-head forward+backward (4,512,512,8)",
           "additive forward (2,512,512,128)")

# The rate of each kind of case: JSON key, unit as printed.
RATES = (("gflops", "GFLOP/s"), ("gbs", "GB/s"), ("gtanhs", "G tanh/s"), ("gpairs", "G pairs/s"))


def figure(x):
    """Three significant digits, no exponent for the magnitudes the tables hold."""
    if x == 0:
        return "0"
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    if abs(x) >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def time_text(seconds):
    return f"{figure(seconds * 1e3)} ms" if seconds < 10 else f"{figure(seconds)} s"


def rate_text(case):
    for key, unit in RATES:
        if key in case:
            return f"{figure(case[key])} {unit}"
    return "-"


def limit_text(case):
    return f"{case['fraction_of_limit'] * 100:.0f}%" if case.get("fraction_of_limit") else "-"


def tables(run):
    bench = run["bench"]
    lines = [
        f"Machine: {run['machine']}. Command: `{run['command']}`.",
        "",
        "| threads | SIMD target asked | kernels ran | FMA peak | read bandwidth |",
        "|---|---|---|---|---|",
        f"| {bench['threads']} | {bench['simd_target']} | {bench['simd_ran']} | "
        f"{figure(bench['fma_peak_gflops'])} GFLOP/s | {figure(bench['read_bandwidth_gbs'])} GB/s |",
        "",
        "| case | median | rate | of limit | extra MiB | baseline median | speed-up | counted |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case in bench["cases"]:
        unfused = time_text(case["unfused_median_s"]) if case.get("unfused_median_s") else "-"
        speedup = f"{figure(case['speedup'])}x" if case.get("speedup") else "-"
        lines.append(f"| {case['name']} | {time_text(case['median_s'])} | {rate_text(case)} | {limit_text(case)} | "
                     f"{figure(case.get('extra_mib', 0))} | {unfused} | {speedup} | {case.get('counted', '')} |")
    return "\n".join(lines)


def summary(run):
    bench = run["bench"]
    lines = [f"{run['machine']}, target {bench['simd_ran']}, {bench['threads']} threads (`{run['command']}`):",
             "",
             "| case | median | rate | of limit | against its baseline |",
             "|---|---|---|---|---|"]
    for case in bench["cases"]:
        if case["name"] in SUMMARY:
            speedup = f"{figure(case['speedup'])}x faster" if case.get("speedup") else "-"
            lines.append(f"| {case['name']} | {time_text(case['median_s'])} | {rate_text(case)} | {limit_text(case)} | "
                         f"{speedup} |")
    return "\n".join(lines)


def replace(text, begin, end, body):
    if text.count(begin) != 1 or text.count(end) != 1:
        raise SystemExit(f"the page must hold one {begin} and one {end}")
    head, rest = text.split(begin)
    _, tail = rest.split(end)
    return f"{head}{begin}\n{body}\n{end}{tail}"


def render(page_text, run, page_name):
    """The page with the run's tables (begin .. end) and summary (summary begin .. end) redone; the
    page must hold one of the two, each with its end."""
    begin, end, summary_begin, summary_end = markers(run["name"])
    for first, last in ((begin, end), (summary_begin, summary_end)):
        if (first in page_text) != (last in page_text):
            raise SystemExit(f"{page_name}: holds one of {first} and {last} without the other")
    if begin not in page_text and summary_begin not in page_text:
        raise SystemExit(f"{page_name}: holds neither {begin} nor {summary_begin}")
    if begin in page_text:
        page_text = replace(page_text, begin, end, tables(run))
    if summary_begin in page_text:
        page_text = replace(page_text, summary_begin, summary_end, summary(run))
    return page_text


def load(path, name, machine, command):
    data = json.loads(pathlib.Path(path).read_text())
    if "bench" in data:
        if not data.get("name"):
            raise SystemExit(f"{path}: a saved run needs its name (\"name\": the name of its pages' markers)")
        if name and name != data["name"]:
            raise SystemExit(f"{path} is run {data['name']!r}, not {name!r}")
        return data
    if not name or not machine or not command:
        raise SystemExit("a raw `attn bench --json` output needs --name, --machine and --command")
    return {"name": name, "machine": machine, "command": command, "bench": data}


def main(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("json")
    p.add_argument("pages", nargs="+", help="docs/performance.md, README.md, ...")
    p.add_argument("--name", help="the run's name in the pages' markers (a machine's short name: zen5)")
    p.add_argument("--machine")
    p.add_argument("--command")
    p.add_argument("--save", help="write the run, with its machine and command, to this JSON file")
    p.add_argument("--check", action="store_true", help="compare, do not write")
    a = p.parse_args(argv)
    run = load(a.json, a.name, a.machine, a.command)
    failed = 0
    for name in a.pages:
        page = pathlib.Path(name)
        old = page.read_text()
        new = render(old, run, name)
        if not a.check:
            page.write_text(new)
        elif new != old:
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True), name,
                                                       f"{name} from {a.json}"))
            print(f"{name}: its tables are not those of {a.json}; run scripts/perf_tables.py to regenerate them")
            failed += 1
        else:
            print(f"{name}: the tables of {a.json} ({len(run['bench']['cases'])} cases)")
    if a.save and not a.check:
        pathlib.Path(a.save).write_text(json.dumps(run, indent=1) + "\n")
    return 1 if failed else 0

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
