#!/usr/bin/env python3
# SPDX-License-Identifier: MIT OR Apache-2.0
"""Instructions per request of each engine pass, from cg_annotate's file:function table
on stdin (a cg_diff of two BENCH_PROFILE runs; tools/engine-passes.sh).

Each function symbol (what is left out of line: the passes, with the `profile-passes`
feature, and whatever the compiler kept out of line) goes to one pass by its name;
code inlined into a symbol counts for that symbol's pass. Usage:
engine_passes.py CONFIG REQUESTS < cg_annotate output.
"""
import re
import sys

# (pattern over the function symbol, pass), first match wins.
RULES = [
    # The profile loop: the frontend's side, inlined into `main` when it is.
    (r"PlainRig.*::front|FrontRing|encode_|bench_engine::main$", "frontend (not the engine)"),
    (r"XenGrants|GrantTable|[Mm]utex|futex|pthread", "grant ops (fake Xen)"),
    (r"take_request|read_bytes|read_words", "copy"),
    (r"parse_request", "parse"),
    (r"check_data_access|check_range", "check"),
    (r"::stage$|acquire", "stage"),
    (r"flush_staged|resolve|submit_or_defer|try_submit|map_batch|issue_batch"
     r"|NullDisk.*submit|BlockDevice>::submit", "submit"),
    (r"reap_completions|poll_completions|CompletionQueue", "reap"),
    (r"respond|release|put_response|publish_responses|flush_unmaps"
     r"|notify_wanted|push_newest|write_bytes|write_words", "respond"),
    (r"consume|start_direct|stage_checked|claim_data_slot|count_request"
     r"|PlainRig.*::poll|Engine.*::poll|SlotTable", "dispatch"),
]
ORDER = ["copy", "parse", "dispatch", "check", "stage", "submit", "reap", "respond",
         "other", "grant ops (fake Xen)", "frontend (not the engine)"]
LINE = re.compile(r"^\s*(-?[\d,]+)\s+(?:\([^)]*\)\s+)?([^:\s][^:]*):(.+?)\s*$")


def classify(symbol):
    for pattern, name in RULES:
        if re.search(pattern, symbol):
            return name
    return "other"


def main():
    config, requests = sys.argv[1], int(sys.argv[2])
    totals = {name: 0 for name in ORDER}
    others = {}
    in_table = False
    for line in sys.stdin:
        if "file:function" in line:
            in_table = True
            continue
        if not in_table:
            continue
        match = LINE.match(line)
        if not match:
            continue
        count = int(match.group(1).replace(",", ""))
        symbol = match.group(3)
        name = classify(symbol)
        totals[name] += count
        if name == "other":
            others[symbol] = others.get(symbol, 0) + count
    engine = sum(v for k, v in totals.items() if k in ORDER[:9])
    cells = " ".join(f"{k.split(' ')[0]} {totals[k] / requests:.1f}" for k in ORDER)
    print(f"{config}: engine {engine / requests:.1f} instructions/request = {cells}")
    for symbol, count in sorted(others.items(), key=lambda kv: -kv[1])[:5]:
        if count / requests >= 1.0:
            print(f"    other: {count / requests:.1f} {symbol}")


if __name__ == "__main__":
    main()
