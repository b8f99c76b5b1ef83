#!/usr/bin/env python3
# SPDX-License-Identifier: MIT OR Apache-2.0
"""Checks Prometheus text exposition (what `tools/blkdom-stat --prometheus` writes) with
the real parser, `prometheus_client.parser.text_string_to_metric_families`, and the
rules that parser lets pass but Prometheus and node_exporter's textfile collector do
not: every sample line well formed (labels quoted and escaped), every family once, with
HELP and TYPE, valid metric and label names, a counter's samples named *_total and never
negative, no sample twice, no timestamps.

    prom_check.py FILE [--expect 'METRIC{label="value",...} OP NUMBER']...

OP is one of > >= == <= <; an expectation holds when some sample of METRIC whose labels
include the given ones compares so. Exit status 0 when the file and every expectation
pass; each problem on its own line otherwise. The rig (tools/rig/run.sh) checks every
results/xen/<scenario>/*.prom with the expectations in <file>.expect, one a line.
"""

import argparse
import operator
import re
import sys

from prometheus_client.parser import text_string_to_metric_families

# A sample line of the text format. The parser's own checks depend on its version: 0.16
# (Debian bookworm's) reads `domain="m"q"` as domain "m" and `domain=mq` as "", where 0.26
# (PyPI's now) refuses both; this grammar refuses them whatever the version.
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*\s*=\s*"(?:[^"\\\n]|\\[\\"n])*"'
SAMPLE_LINE = re.compile(
    rf"\s*[a-zA-Z_:][a-zA-Z0-9_:]*\s*(?:\{{\s*(?:{_LABEL}\s*(?:,\s*{_LABEL}\s*)*,?\s*)?\}})?"
    r"\s+\S+(?:\s+-?[0-9]+)?\s*\Z")
METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
EXPECT = re.compile(r"\s*([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s*(>=|<=|==|>|<)\s*(\S+)\s*\Z")
LABEL_PAIR = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(?:,|\Z)')
OPS = {">": operator.gt, ">=": operator.ge, "==": operator.eq, "<=": operator.le,
       "<": operator.lt}


def parse(text: str, allow_untyped: bool = False) -> dict:
    """The families of `text` by name; ValueError naming the first problem."""
    helped, typed = set(), {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.startswith("#"):
            if line.strip() and not SAMPLE_LINE.match(line):
                raise ValueError(f"line {number}: not a sample line: {line!r}")
            continue
        words = line.split(None, 3)
        if len(words) >= 3 and words[1] in ("HELP", "TYPE"):
            seen = helped if words[1] == "HELP" else typed
            if words[2] in seen:
                raise ValueError(f"line {number}: a second {words[1]} for {words[2]}")
            if words[1] == "HELP":
                helped.add(words[2])
            else:
                typed[words[2]] = words[3] if len(words) > 3 else ""
    families = {}
    samples = set()
    for family in text_string_to_metric_families(text):
        if family.name in families:
            raise ValueError(f"family {family.name} twice (its samples are not together)")
        families[family.name] = family
        if not METRIC_NAME.match(family.name):
            raise ValueError(f"bad metric name {family.name!r}")
        if family.type == "unknown" and not allow_untyped:
            raise ValueError(f"{family.name}: no TYPE")
        exposed = family.name + ("_total" if family.type == "counter" else "")
        if exposed not in typed or exposed not in helped:
            raise ValueError(f"{exposed}: HELP or TYPE missing")
        if not family.samples:
            raise ValueError(f"{family.name}: no sample")
        for sample in family.samples:
            if not METRIC_NAME.match(sample.name):
                raise ValueError(f"bad sample name {sample.name!r}")
            if family.type == "counter":
                if sample.name != family.name + "_total":
                    raise ValueError(f"counter sample {sample.name} not named *_total")
                if sample.value < 0:
                    raise ValueError(f"{sample.name}{sample.labels}: negative counter")
            for name in sample.labels:
                if not LABEL_NAME.match(name):
                    raise ValueError(f"{sample.name}: bad label name {name!r}")
            if sample.timestamp is not None:
                raise ValueError(f"{sample.name}: a timestamp (the textfile collector "
                                 "refuses them)")
            key = (sample.name, tuple(sorted(sample.labels.items())))
            if key in samples:
                raise ValueError(f"{sample.name}{sample.labels}: twice")
            samples.add(key)
    return families


def unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def check_expectation(families: dict, spec: str) -> str:
    """'' when `spec` holds in `families`, else why not."""
    match = EXPECT.match(spec)
    if not match:
        return f"expectation not understood: {spec!r}"
    name, labels_text, op, number = match.groups()
    wanted = {}
    rest = (labels_text or "{}")[1:-1]
    while rest.strip():
        pair = LABEL_PAIR.match(rest)
        if not pair:
            return f"expectation's labels not understood: {spec!r}"
        wanted[pair.group(1)] = unescape(pair.group(2))
        rest = rest[pair.end():]
    found = [sample for family in families.values() for sample in family.samples
             if sample.name == name
             and all(sample.labels.get(k) == v for k, v in wanted.items())]
    if not found:
        return f"{spec}: no such sample"
    if not any(OPS[op](sample.value, float(number)) for sample in found):
        return f"{spec}: found {', '.join(str(s.value) for s in found)}"
    return ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file")
    parser.add_argument("--expect", action="append", default=[])
    args = parser.parse_args()
    try:
        with open(args.file, encoding="utf-8") as f:
            families = parse(f.read())
    except (OSError, ValueError) as error:
        print(f"{args.file}: {error}")
        return 1
    problems = [p for p in (check_expectation(families, e) for e in args.expect) if p]
    for problem in problems:
        print(f"{args.file}: {problem}")
    samples = sum(len(family.samples) for family in families.values())
    if not problems:
        print(f"{args.file}: {len(families)} metrics, {samples} samples, "
              f"{len(args.expect)} expectation(s) hold")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
