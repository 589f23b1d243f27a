#!/usr/bin/env python3
"""Find, map and rewrite the code's citations of the former external behaviour specs.

Comments (and some docstrings and error messages) in cpp/, include/, python/,
tests/ and benchmarks/ cite sections of four documents that are not part of the
repository: the behaviour specs gqa.md, mla.md, sparse.md and cp.md of the
upstream vllm-ascend attention module ("spec 6.4", "spec sparse.md 6.4",
"(spec gqa 2.1)", "spec mla.md section 5", "cp.md 3.4", "spec 6.5 step 3",
"(spec 3.1 / 3.2)", lists continued over comment lines, ...). The behaviour is
now described in docs/design/. This tool

  * (default) lists the citations it cannot map and exits 1 if there are any;
    -v lists every citation and prose mention with its target;
  * --rewrite replaces them in place ("spec sparse.md 6.4" ->
    "docs/design/dsa.md §3.3"), and lists the lines it made longer than --width;
  * --check exits 1 while any citation, prose mention or residual form remains;
  * --explain shows how each citation without a file got its spec;
  * --self-test runs the tool's own cases.

The map is docs/design/spec_map.tsv, `<spec file>\t<section>\t<page>#§<n>`,
one line per section cited (a qualified key such as "6.5 step 3" may map more
precisely than its section). Every target must be an anchor of its page
(`<a id="s<n>"></a>`), checked on load. Qualifiers that number the external
text's steps ("step 3", "item 8", "legacy") are dropped by --rewrite; row
letters and (a)-(g) step letters, which the design pages use too, are kept.

A citation without a file ("spec 6.4") takes, in order: OVERRIDES (by the text
of its line), FILE_SPEC (by path), the family of its path (FAMILY_BY_PATH), the
spec file named last before it in the same comment block, the only spec file
the file names; otherwise it is unresolved. EXTRA catches section numbers that
only the surrounding prose ties to a spec, IGNORE lines that look like
citations and are not. Prose mentions without a section ("where the spec is
silent") are rewritten by MENTIONS; RESIDUAL is what --check still refuses.

Usage:
  tools/spec_citations.py [--root DIR] [--map FILE] [-v | --explain]
                          [--check | --rewrite [--width N] | --self-test]
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass, field

SCAN_DIRS = ("cpp", "include", "python", "tests", "benchmarks")
SCAN_EXTS = (".h", ".hpp", ".cpp", ".cc", ".c", ".py", ".pyi", ".txt", ".cmake", ".md", ".sh", ".map", ".supp")
SPEC_FILES = ("gqa.md", "mla.md", "sparse.md", "cp.md")

# Files whose bare citations ("spec 3.4") refer to a given spec, where the path
# says no family or says the wrong one (checked by hand).
FILE_SPEC: dict[str, str] = {
    # The GQA path's operators and host planning (no family in their names).
    "cpp/ops/cpu/attention_reference.h": "gqa.md",
    "cpp/ops/cpu/fia_common.cpp": "gqa.md",
    "cpp/ops/cpu/fia_common.h": "gqa.md",
    "cpp/ops/cpu/fused_infer_attention_cpu.cpp": "gqa.md",
    "cpp/ops/cpu/fusion_attention_cpu.cpp": "gqa.md",
    "cpp/ops/cpu/paged_attention_cpu.cpp": "gqa.md",
    "cpp/ops/cpu/scatter_pa_kv_cache_cpu.cpp": "gqa.md",
    "cpp/ops/cpu/attention_update_cpu.cpp": "cp.md",
    "cpp/plan/internal.h": "gqa.md",
    "cpp/gqa/plan/step_plan.cpp": "gqa.md",
    "include/ascend_attn_rt/plan/seq_lens.h": "gqa.md",
    "include/ascend_attn_rt/gqa/plan/step_plan.h": "gqa.md",
    "include/ascend_attn_rt/ops/out_variants.h": "sparse.md",
    "python/ascend_attn_rt/demo.py": "sparse.md",
    "python/ascend_attn_rt/npu_graph.py": "gqa.md",
    "tests/python/test_backend.py": "gqa.md",
    "tests/python/test_hardening.py": "gqa.md",
    "tests/python/test_kv_cache_layouts.py": "gqa.md",
    "tests/cpp/test_plan_seq_lens.cpp": "gqa.md",
    "tests/cpp/test_plan_split.cpp": "gqa.md",
    "tests/cpp/test_plan_step.cpp": "gqa.md",
    "tests/fuzz/fuzz_kv_rules.cpp": "sparse.md",
}

# Bare citations whose spec the rules below get wrong: (path, regex that the
# citation's line matches, section) -> spec file. Keyed by text, not line
# number, so that edits elsewhere in the file do not move them.
# A section of "*" applies to every bare citation of the matching line; the
# first matching entry wins.
OVERRIDES: list[tuple[str, str, str, str]] = [
    ("include/ascend_attn_rt/c_api.h", r"graph_decode_padding", "3.5", "mla.md"),
    ("include/ascend_attn_rt/c_api.h", r"RoPE tables", "6.1", "mla.md"),
    ("include/ascend_attn_rt/mla/plan/mla_plan.h", r"attends everything", "10.8", "cp.md"),
    ("tests/fuzz/fuzz_kv_rules.cpp", r"row by row", "9.6", "gqa.md"),
    # User documentation (--include-docs): prose without a path family.
    ("README.md", r"ResidentLru|cache tuple composed|^KV offload", "*", "sparse.md"),
    ("README.md", r"^\| (SFA|DSA)", "*", "sparse.md"),
    ("README.md", r"^# aar\.DcpMetadataBuilder|^\| (GQA DCP|MLA DCP)", "*", "cp.md"),
    ("README.md", r"^\| graph mode .*MLA: no-KV dummies", "3.5", "mla.md"),  # before the row's "*"
    ("README.md", r"^\| (GQA/MHA|graph mode)", "*", "gqa.md"),
    ("README.md", r"^\| MLA \(", "*", "mla.md"),
    ("docs/python_api.md", r"^Path selection|^C8 path selection", "*", "gqa.md"),
    ("docs/python_api.md", r"^\| `mla\.", "*", "mla.md"),
    ("docs/python_api.md", r"^\| `(sfa|plan)\.", "*", "sparse.md"),
    ("docs/reliability.md", r"^\| fuzz_(sparse_helpers|kv_rules)", "*", "sparse.md"),
]

# The spec of a path family, for files that name no spec file explicitly.
# The first family whose pattern the path matches wins (most specific first).
FAMILY_BY_PATH = (
    (re.compile(r"(^|/|_)(sfa|dsa|sparse)(/|_|\.)"), "sparse.md"),
    (re.compile(r"(^|/|_)(mla|latent)(/|_|\.)"), "mla.md"),
    (re.compile(r"(^|/|_)(dcp|pcp|cp|comm)(/|_|\.)"), "cp.md"),
    (re.compile(r"(^|/|_)(c8|fa3|gqa|graph)(/|_|\.)"), "gqa.md"),
)

# ---------------------------------------------------------------- the grammar
_WS_CONT = r"(?:[ \t]*\n[ \t]*(?://+|#+|\*(?!/))?[ \t]*|[ \t]+)"  # a space or a comment line break
_FILE = r"(?P<file>gqa|mla|sparse|cp)(?P<ext>\.md)?"
_SEC = r"\d+(?:\.\d+)*[AB]?(?![\w.]*\w)"
# What the code appends to a section number; the external text numbers these,
# so they are consumed with the section.
_QUAL = (r"(?:(?:[ \t]+|[ \t]*\n[ \t]*(?://+|#+|\*(?!/))[ \t]*|,[ \t]*\n[ \t]*(?://+|#+)[ \t]*(?=steps?\b))(?:steps?[ \t]+\d+[a-g]?(?!\d)(?!\.\d)(?:[ \t]*(?:-|–)[ \t]*\d+(?!\d)(?!\.\d))?"
         r"(?:[ \t]*\([a-g]\)(?:-\([a-g]\))?)?"
         r"|rows?[ \t]+[A-E](?![\w])(?:[ \t]*(?:,|/|and)[ \t]*[A-E](?![\w]))*"
         r"|items?[ \t]+\d+(?!\d)(?!\.\d)"
         r"|legacy(?![\w])|[a-g](?=\))"
         r"|\([a-g]\)(?:-\([a-g]\))?))")
_ITEM = (r"(?:(?P<ifile>gqa|mla|sparse|cp)(?:\.md)?" + _WS_CONT + r")?(?:sections?" + _WS_CONT + r"|§[ \t]*)?"
         r"(?P<sec>" + _SEC + r")(?P<qual>" + _QUAL + r")?")
_SEP = r"(?:[ \t]*(?:,|/|;|-|–)" + _WS_CONT + r"?|" + _WS_CONT + r"(?:and|or)" + _WS_CONT + r")"
# Words the code puts after a section number inside a list ("3.3 legacy, 3.5",
# "7.1 A5 column / 7.2", "6.2 \"Geometry rule\", 7.1", "6.2 (geometry rule), 6.5"):
# kept as they are, and the list goes on after them.
_TAIL = (r"(?:[ \t]+(?:\"[^\"\n]{1,30}\"|\([a-z][^()\n\d]{0,28}\)"
         r"|(?:base|A5|A2/A3)(?:[ \t]+column)?|last bullet))")

# Anchors: "spec", "specs", "Spec", "upstream" (one form: "upstream 8.5"), or a
# spec file name with ".md" (not a docs/design path).
_ANCHOR = (r"(?:(?<![\w/.])(?P<spec>[Ss]pecs?)" + _WS_CONT + r"(?:" + _FILE + _WS_CONT + r")?"
           r"|(?<![\w/.])(?P<upstream>upstream)[ \t]+(?=\d+\.\d)"
           r"|(?<![\w/.])(?P<mdfile>gqa|mla|sparse|cp)\.md" + _WS_CONT + r"(?:sections?" + _WS_CONT + r")?"
           r"|(?<=[\s(,/])(?P<shortfile>gqa|mla)[ \t]+(?=\d+\.\d))")
ITEM_RE = re.compile(_ITEM)
# In a comment of a file whose spec is known: a section number alone in
# parentheses ("(1.3)", "(6.6, SWA-only layers)", "(6.8 step 3)") or after a
# heading rule ("// ---------- 6.2 caches").
_SEC1 = r"(?:1[0-3]|[1-9])(?:\.(?:1[0-9]|[1-9]))+(?:[AB])?"
PAREN_RE = re.compile(r"(?<=\()(?=" + _SEC1 + r"(?:\)|,|;|:|[ \t]+steps?\b|[ \t]*/[ \t]*\d))")
HEADING_RE = re.compile(r"(?<=-{4} )(?=" + _SEC1 + r"[ \t]+\S)")
SEP_RE = re.compile(_SEP)
TAIL_RE = re.compile(_TAIL)
ANCHOR_RE = re.compile(_ANCHOR)

# Citations the grammar cannot see (a section number that only the surrounding
# prose ties to a spec, e.g. "// ---- prolog (1.6 steps 1-3)" in a file about
# one spec): (path, regex with a group "sec" and an optional group "qual"
# (consumed with it), spec file).
EXTRA: list[tuple[str, str, str]] = [
    ("cpp/dsa/impl.cpp", r"\((?P<sec>1\.6|6\.8)(?P<qual> steps? \d+(?:-\d+)?)\)", "sparse.md"),
    ("cpp/dsa/impl.cpp", r"// (?P<sec>1\.6\.2)(?P<qual> step \d)", "sparse.md"),
    ("cpp/mla/impl.cpp", r"\((?P<sec>5\.1)(?P<qual> step 3):", "mla.md"),
    ("tests/python/_dsa_reference.py", r'"""(?P<sec>1\.6)(?P<qual> steps? \d+(?:-\d+)?)', "sparse.md"),
    ("tests/python/_dsa_reference.py", r"\((?P<sec>1\.6)(?P<qual> steps? \d+(?:-\d+)?)\)", "sparse.md"),
    ("tests/python/_dsa_reference.py", r"(?:RoPE|Hadamard|DSpark) of (?P<sec>1\.1\.1|1\.5|6\.6)\b", "sparse.md"),
    ("include/ascend_attn_rt/ops/dsa_compressor.h", r"\(A5, (?P<sec>1\.6\.2)(?P<qual> step 2), (?=6\.2\))", "sparse.md"),
    ("include/ascend_attn_rt/ops/dsa_compressor.h", r"\(A5, 1\.6\.2 step 2, (?P<sec>6\.2)\)", "sparse.md"),
    ("tests/cpp/test_plan_dsa_step.cpp", r"the (?P<sec>6\.2) geometry", "sparse.md"),
    ("include/ascend_attn_rt/ops/dsa_compressor.h", r"\(A5, (?P<sec>1\.6\.3) last bullet\)", "sparse.md"),
    ("include/ascend_attn_rt/ops/lightning_indexer.h", r"Score as (?P<sec>1\.2\.1)\b", "sparse.md"),
    ("include/ascend_attn_rt/dsa/plan/dsa_kv_plan.h", r"facts of (?P<sec>6\.1) /", "sparse.md"),
    ("include/ascend_attn_rt/dsa/plan/dsa_kv_plan.h", r"facts of 6\.1 /\n// (?P<sec>6\.2) that", "sparse.md"),
    ("include/ascend_attn_rt/dsa/plan/dsa_kv_plan.h", r"non_a5_dtype of (?P<sec>7\.2):", "sparse.md"),
    ("tests/python/test_dsa_plan.py", r"(?:descriptors|cache specs) of (?P<sec>6\.[12])\b", "sparse.md"),
    ("tests/cpp/test_plan_dsa_kv_plan.cpp", r'// (?P<sec>7\.2) (?:base plan|"A5 other")', "sparse.md"),
    ("cpp/dsa/bindings.cpp", r"cache's spec \((?P<sec>6\.2)\)", "sparse.md"),
]

# Lines that look like citations but are not: (path, regex of the line).
IGNORE: list[tuple[str, str]] = [
    ("tests/python/test_mla_graph.py", r"# spec [01]: "),  # the test's `spec` parameter (speculative tokens)
]

# Prose that refers to the specs without a (resolvable) section: (path or None
# for any file, regex, replacement). A mention wins over a citation it overlaps.
MENTIONS: list[tuple[str | None, str, str]] = [
    (None, r"\b([Ww])here the spec is silent or allows a choice", r"\1here upstream is silent or leaves a choice"),
    (None, r"\b([Ww])here the spec is silent", r"\1here upstream is silent"),
    (None, r"\b([Ww])here spec \d+(?:\.\d+)* is silent", r"\1here upstream is silent"),
    (None, r"\bwhere the spec allows it", "where upstream allows it"),
    (None, r"\bwhich the spec leaves open\b", "which upstream leaves open"),
    (None, r"\bThe spec does not say\b", "Upstream does not say"),
    (None, r"\bSpec example:", "Upstream's example:"),
    (None, r"\bthe spec's examples\b", "upstream's examples"),
    (None, r"\bthe spec's plans\b", "upstream's plans"),
    (None, r"\(the spec's A5 column\)", "(upstream's A5 column)"),
    (None, r"\bThe(\n//\s+)spec's ops file says no schema is published", r"Upstream's\1operator list publishes no schema"),
    (None, r"\bagainst the spec(\n//) formulas", r"against the\1 formulas of docs/design"),
    ("tests/python/test_mla_builder_random.py", r"\bthe spec's formulas\b", "the formulas of docs/design/mla.md"),
    ("tests/python/test_mla_dcp.py", r"\bthe spec's formulas\b", "the formulas of docs/design/cp.md"),
    ("tests/cpp/test_plan_sfa.cpp", r"\bThe spec's formulas\b", "The formulas of docs/design/sfa.md"),
    ("tests/fuzz/fuzz_mla_pad.cpp", r"\bthe spec's rules\b", "the rules of docs/design/mla.md"),
    (None, r"\b([Tt])he spec's formulas\b", r"\1he formulas of docs/design"),
    (None, r"\b([Tt])he spec's rules\b", r"\1he rules of docs/design"),
    (None, r"\b([Tt])he spec's own rules\b", r"\1he documented rules"),
    (None, r"\bevery row of the spec's tables\b", "every row of the tables of docs/design/dsa.md"),
    (None, r"\bthe spec's words\b", "the words of docs/design/cp.md"),
    (None, r"\bThe spec's construction\b", "The construction of docs/design/cp.md"),
]


# What --check also refuses although neither the grammar nor MENTIONS rewrite it:
# prose about "the spec", and a spec file name outside docs/design/ paths. New
# forms found here are either added to MENTIONS / the grammar or reworded.
RESIDUAL = re.compile(r"(?<!OCP )\b[Tt]he spec\b(?![ \t]+(?:decode|tokens?)\b)|(?<!OCP )\bspec's\b"
                      r"|(?<![\w/.])(?:gqa|mla|sparse|cp)\.md\b")
# Text RESIDUAL matches that is about something else: (path, regex of the line).
RESIDUAL_OK: list[tuple[str, str]] = [
    ("include/ascend_attn_rt/dsa/plan/dsa_backend_facts.h", r"The spec of one cache kind"),  # a DSA cache spec
]


@dataclass
class Ref:
    start: int          # span of the section token (and its qualifier) in the text
    end: int
    spec: str | None    # spec file, or None when unresolved
    sec: str
    qual: str
    how: str = ""       # how a bare citation's spec was chosen
    target: str | None = None  # "docs/design/page.md §n"
    why: str = ""       # why it is unresolved


@dataclass
class Citation:
    path: str
    line: int
    start: int          # span of the whole citation
    end: int
    anchor_start: int   # span of the anchor text that --rewrite removes
    anchor_end: int
    text: str
    refs: list[Ref] = field(default_factory=list)


@dataclass
class Mention:
    path: str
    line: int
    start: int
    end: int
    text: str
    replacement: str


def load_map(path: str, design_dir: str | None = None) -> dict[tuple[str, str], str]:
    """The map; with design_dir, every target must be an anchor of its page there."""
    m: dict[tuple[str, str], str] = {}
    pages: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for n, raw in enumerate(f, 1):
            line = raw.rstrip("\n")
            if not line.strip() or line.startswith("#"):
                continue
            parts = line.split("\t")
            if len(parts) != 3:
                raise SystemExit(f"{path}:{n}: expected 3 tab-separated fields, got {len(parts)}")
            spec, sec, target = parts
            if spec not in SPEC_FILES:
                raise SystemExit(f"{path}:{n}: unknown spec file {spec!r}")
            page, _, anchor = target.partition("#")
            if not page.endswith(".md") or not anchor.startswith("§"):
                raise SystemExit(f"{path}:{n}: target must be <page>.md#§<n>, got {target!r}")
            if design_dir is not None:
                if page not in pages:
                    pp = os.path.join(design_dir, page)
                    if not os.path.exists(pp):
                        raise SystemExit(f"{path}:{n}: no design page {pp}")
                    with open(pp, encoding="utf-8") as g:
                        pages[page] = g.read()
                if f'<a id="s{anchor[1:]}"></a>' not in pages[page]:
                    raise SystemExit(f"{path}:{n}: {page} has no section {anchor} (anchor s{anchor[1:]})")
            key = (spec, sec)
            if key in m:
                raise SystemExit(f"{path}:{n}: duplicate entry {spec} {sec}")
            m[key] = f"docs/design/{page} {anchor}"
    return m


def norm_qual(q: str | None) -> str:
    """A qualifier as a map key: comment leaders and line breaks removed, spaces collapsed."""
    q = re.sub(r"\s+", " ", re.sub(r"\n\s*(?://+|#+|\*)?", " ", q or "")).strip()
    return q.lstrip(", ")


def kept_qual(q: str) -> str:
    """The part of a qualifier that --rewrite keeps: row letters and (a)-(g) step letters, which
    the design pages use too; step and item numbers of the external text are dropped."""
    kept = []
    m = re.search(r"\brows?\s+[A-E](?:\s*(?:,|/|and)\s*[A-E]\b)*", q)
    if m:
        kept.append(m.group(0))
    m = re.search(r"\([a-g]\)(?:-\([a-g]\))?", q)
    if m:
        kept.append(m.group(0))
    return " ".join(kept)


def norm_file(name: str | None) -> str | None:
    if not name:
        return None
    return name if name.endswith(".md") else name + ".md"


def explicit_specs(text: str) -> list[str]:
    found = []
    for m in re.finditer(r"(?<![\w/.])(?:[Ss]pecs?" + _WS_CONT + r")?(gqa|mla|sparse|cp)(\.md)?" + _WS_CONT + r"(?:sections?" + _WS_CONT + r")?\d", text):
        whole = m.group(0)
        if m.group(2) or re.match(r"[Ss]pec", whole):
            f = m.group(1) + ".md"
            if f not in found:
                found.append(f)
    return found


def file_spec(rel: str, text: str) -> tuple[str | None, str]:
    """The spec a bare citation of this file refers to when its comment block names none."""
    if rel in FILE_SPEC:
        return FILE_SPEC[rel], "FILE_SPEC"
    for rx, spec in FAMILY_BY_PATH:
        if rx.search(rel):
            return spec, "path family"
    ex = explicit_specs(text)
    if len(ex) == 1:
        return ex[0], "the only spec file it names"
    if ex:
        return None, "ambiguous: names " + ", ".join(ex)
    return None, "no spec file named and no path family"


_LEADER = re.compile(r"^\s*(//|#|\*|/\*)|\S.*\s(//|#)\s")


def comment_blocks(text: str) -> list[tuple[int, int]]:
    """Spans of runs of consecutive comment lines (a trailing comment counts)."""
    blocks, start, pos = [], None, 0
    for line in text.split("\n"):
        end = pos + len(line)
        if _LEADER.search(line):
            if start is None:
                start = pos
            last = end
        elif start is not None:
            blocks.append((start, last))
            start = None
        pos = end + 1
    if start is not None:
        blocks.append((start, last))
    return blocks


def override(rel: str, text: str, pos: int, sec: str) -> str | None:
    b = text.rfind("\n", 0, pos) + 1
    e = text.find("\n", pos)
    line = text[b:e if e >= 0 else len(text)]
    for path, rx, s, spec in OVERRIDES:
        if path == rel and s in (sec, "*") and re.search(rx, line):
            return spec
    return None


def in_comment(text: str, pos: int) -> bool:
    """pos is inside a // or # comment, or a Python triple-quoted string (approximately)."""
    b = text.rfind("\n", 0, pos) + 1
    pre = text[b:pos]
    if "//" in pre or re.search(r"(^|\s)#", pre) or pre.lstrip().startswith(("*", "/*")):
        return True
    return text.count('"""', 0, pos) % 2 == 1


def line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def scan_text(rel: str, text: str) -> tuple[list[Citation], list[Mention], str]:
    default, why = file_spec(rel, text)
    blocks = comment_blocks(text)
    named = [(m.start(), m.group(1) + ".md") for m in re.finditer(
        r"(?<![\w/.])(?:(?:[Ss]pecs?" + _WS_CONT + r")(gqa|mla|sparse|cp)(?:\.md)?|(gqa|mla|sparse|cp)\.md)"
        + _WS_CONT + r"(?:sections?" + _WS_CONT + r")?\d", text) if m.group(1)]
    named += [(m.start(), m.group(2) + ".md") for m in re.finditer(
        r"(?<![\w/.])(?:(?:[Ss]pecs?" + _WS_CONT + r")(gqa|mla|sparse|cp)(?:\.md)?|(gqa|mla|sparse|cp)\.md)"
        + _WS_CONT + r"(?:sections?" + _WS_CONT + r")?\d", text) if m.group(2)]
    named.sort()

    def block_default(pos: int) -> tuple[str | None, str]:
        if default is not None and why in ("FILE_SPEC", "path family"):
            return default, why
        for b0, b1 in blocks:
            if b0 <= pos <= b1:
                near = [f for p, f in named if b0 <= p < pos]
                if near:
                    return near[-1], "named earlier in its comment block"
                break
        return default, why

    cits: list[Citation] = []
    pos = 0
    anchors = []
    for m in ANCHOR_RE.finditer(text):
        anchors.append(m)
    if default is not None:
        for rx in (PAREN_RE, HEADING_RE):
            for m in rx.finditer(text):
                if in_comment(text, m.start()):
                    anchors.append(m)
    anchors.sort(key=lambda m: m.start())
    k = 0
    while True:
        while k < len(anchors) and anchors[k].start() < pos:
            k += 1
        if k >= len(anchors):
            break
        a = anchors[k]
        k += 1
        g = a.groupdict()
        anchor_file = norm_file(g.get("file") or g.get("mdfile") or g.get("shortfile"))
        i = a.end()
        it = ITEM_RE.match(text, i)
        if not it or (it.group("ifile") and not anchor_file and g.get("spec") is None and g.get("upstream") is None):
            pos = a.start() + 1
            continue
        lb = text.rfind("\n", 0, a.start()) + 1
        le = text.find("\n", a.start())
        if any(p == rel and re.search(rx, text[lb:le if le >= 0 else len(text)]) for p, rx in IGNORE):
            pos = a.end()
            continue
        c = Citation(rel, line_of(text, a.start()), a.start(), 0, a.start(), a.end(), "")
        cur_file = anchor_file
        prev_sec = None
        range_next = False
        while True:
            f = norm_file(it.group("ifile")) or cur_file
            cur_file = f
            ov = override(rel, text, it.start("sec"), it.group("sec"))
            if ov and not f:
                spec, how = ov, "OVERRIDES"
            elif f:
                spec, how = f, ""
            else:
                spec, how = block_default(a.start())
            sec = it.group("sec")
            if range_next and prev_sec and "." in prev_sec and "." not in sec and not it.group("ifile"):
                sec = prev_sec.rsplit(".", 1)[0] + "." + sec  # "12.9-10" is 12.9 to 12.10
            c.refs.append(Ref(it.start(), it.end(),
                              spec, sec, norm_qual(it.group("qual")), how=how,
                              why="" if spec else why))
            prev_sec = sec
            j = it.end()
            t = TAIL_RE.match(text, j)
            if t:
                j = t.end()
            s = SEP_RE.match(text, j)
            if not s:
                break
            range_next = s.group(0).strip() in ("-", "–")
            nxt = ITEM_RE.match(text, s.end())
            if not nxt:
                break
            it = nxt
        c.end = c.refs[-1].end
        c.text = text[c.start:c.end]
        cits.append(c)
        pos = c.end
    for path, rx, spec in EXTRA:
        if path != rel:
            continue
        for m in re.finditer(rx, text):
            q = m.groupdict().get("qual") or ""
            end = m.end("qual") if q else m.end("sec")
            if any(c.start <= m.start("sec") < c.end for c in cits):
                continue
            c = Citation(rel, line_of(text, m.start("sec")), m.start("sec"), end,
                         m.start("sec"), m.start("sec"), text[m.start("sec"):end])
            c.refs.append(Ref(m.start("sec"), end, spec, m.group("sec"), norm_qual(q), how="EXTRA"))
            cits.append(c)
    cits.sort(key=lambda c: c.start)
    mentions = []
    for path, rx, repl in MENTIONS:
        if path is not None and path != rel:
            continue
        for m in re.finditer(rx, text):
            mentions.append(Mention(rel, line_of(text, m.start()), m.start(), m.end(), m.group(0),
                                    m.expand(repl)))
    kept: list[Mention] = []
    for m in mentions:  # MENTIONS order: the first entry matching a span wins
        if not any(k.start < m.end and m.start < k.end for k in kept):
            kept.append(m)
    mentions = sorted(kept, key=lambda m: m.start)
    cits = [c for c in cits if not any(m.start < c.end and c.start < m.end for m in mentions)]
    return cits, mentions, why


def resolve(cits: list[Citation], mapping: dict[tuple[str, str], str]) -> None:
    for c in cits:
        for r in c.refs:
            if r.spec is None:
                continue
            quals = [r.qual, re.sub(r"\s*\([a-g]\).*$", "", r.qual)] if r.qual else []
            hit = next(((r.spec, f"{r.sec} {q}") for q in quals if q and (r.spec, f"{r.sec} {q}") in mapping), None)
            if hit:
                r.target = mapping[hit]
            elif (r.spec, r.sec) in mapping:
                r.target = mapping[(r.spec, r.sec)]
            else:
                r.why = f"no map entry for {r.spec} {r.sec}"


def _sec_key(sec: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", sec)]


def _line_breaks(s: str) -> str:
    """The line break and comment leader inside s (kept when s is removed), or ""."""
    m = re.search(r"\n[ \t]*(?://+|#+|\*(?!/))?[ \t]*", s)
    return m.group(0) if m else ""


def rewrite_text(text: str, cits: list[Citation], mentions: list[Mention]) -> str:
    edits: list[tuple[int, int, str]] = []
    for c in cits:
        if any(r.target is None for r in c.refs):
            continue
        anchor = text[c.anchor_start:c.anchor_end]
        # "upstream 8.5" keeps saying whose section it was: "upstream's, docs/design/...".
        rep = "upstream's, " if anchor.startswith("upstream") else ""
        brk = _line_breaks(anchor)
        a0 = c.anchor_start
        if brk and a0 > 0 and text[a0 - 1] == "(":
            # "forms (spec\n// sparse.md 6.8)" -> "forms\n// (docs/design/dsa.md §5.2)": the
            # parenthesis moves down with the citation instead of ending the line.
            a0 -= 1
            while a0 > 0 and text[a0 - 1] in " \t":
                a0 -= 1
            edits.append((a0, c.anchor_end, brk + "(" + rep))
        else:
            edits.append((a0, c.anchor_end, rep + brk))
        emitted: list[str] = []
        prev: Ref | None = None  # the last emitted reference
        last_end = c.anchor_end  # the end of the last reference seen (emitted or dropped)
        for r in c.refs:
            page, _, sec = r.target.partition(" ")
            k = kept_qual(r.qual)
            between = text[last_end:r.start]
            if r.target in emitted and not k and SEP_RE.fullmatch(between):
                # the same section again ("3.1, 3.2" both in one place): drop it with its separator
                edits.append((last_end, r.end, _line_breaks(text[last_end:r.end])))
                last_end = r.end
                continue
            if prev is not None and between.strip() in ("-", "–"):
                ppage, _, psec = prev.target.partition(" ")
                pk, sk = _sec_key(psec), _sec_key(sec)
                if ppage != page or pk[:1] != sk[:1] or pk >= sk:
                    # a range whose ends landed in different chapters: list them instead
                    edits.append((last_end, r.start, ", " + _line_breaks(between)))
            same_page = prev is not None and page == prev.target.partition(" ")[0]
            brk = _line_breaks(text[r.start:r.end])  # a qualifier on the next line: keep the break
            edits.append((r.start, r.end, (sec if same_page else r.target) + (brk or " " if k else brk) + k))
            emitted.append(r.target)
            prev = r
            last_end = r.end
    for m in mentions:
        edits.append((m.start, m.end, m.replacement))
    edits.sort(key=lambda e: (e[0], e[1]))
    out, last = [], 0
    for s0, e0, rep in edits:
        if s0 < last:
            continue  # overlapping edits do not occur (mentions drop the citations they overlap)
        out.append(text[last:s0])
        out.append(rep)
        last = e0
    out.append(text[last:])
    return "".join(out)


def iter_files(root: str, include_docs: bool = False):
    if include_docs:
        # The user documentation outside the code (README.md, docs/*.md but the design
        # pages): mostly prose without a family, so bare citations there are often
        # unresolved and need a hand (or OVERRIDES).
        for p in [os.path.join(root, "README.md")] + sorted(
                os.path.join(root, "docs", f) for f in os.listdir(os.path.join(root, "docs")) if f.endswith(".md")):
            if os.path.isfile(p):
                yield os.path.relpath(p, root), p
    for d in SCAN_DIRS:
        base = os.path.join(root, d)
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = [x for x in dirnames if x not in ("__pycache__", "results", ".pytest_cache")]
            for fn in sorted(filenames):
                if fn.endswith(SCAN_EXTS):
                    p = os.path.join(dirpath, fn)
                    yield os.path.relpath(p, root), p


SELF_TEST_MAP = {
    ("gqa.md", "4.2"): "docs/design/gqa.md §2.2", ("gqa.md", "4.7"): "docs/design/gqa.md §2.5",
    ("gqa.md", "8.5"): "docs/design/gqa.md §5.4", ("mla.md", "5.3"): "docs/design/mla.md §5.3",
    ("sparse.md", "6.5"): "docs/design/dsa.md §3.1", ("sparse.md", "6.5 step 3"): "docs/design/dsa.md §3.2",
    ("sparse.md", "6.6"): "docs/design/dsa.md §3.4", ("sparse.md", "6.8"): "docs/design/dsa.md §5.1",
    ("sparse.md", "5"): "docs/design/sfa.md §6", ("sparse.md", "5 step 3"): "docs/design/sfa.md §6.3",
    ("cp.md", "3.1"): "docs/design/cp.md §3.1", ("cp.md", "3.2"): "docs/design/cp.md §3.2",
    ("cp.md", "7.2"): "docs/design/graph.md §1.1", ("cp.md", "7.4"): "docs/design/graph.md §4.1",
}
SELF_TEST_CASES = [  # (path, text, expected rewrite)
    ("cpp/gqa/x.cpp", "// split (spec 4.2 step 5).\n", "// split (docs/design/gqa.md §2.2).\n"),
    ("cpp/plan/x.cpp", "// (spec gqa.md 4.2, 4.7)\n", "// (docs/design/gqa.md §2.2, §2.5)\n"),
    ("cpp/dsa/x.cpp", "// rows (spec 6.5 step 3, 6.6): x\n", "// rows (docs/design/dsa.md §3.2, §3.4): x\n"),
    ("cpp/dsa/x.cpp", "// see (spec sparse.md 6.5, 6.5 step 1)\n", "// see (docs/design/dsa.md §3.1)\n"),
    ("cpp/mla/x.cpp", "// layout (spec 5.3 rows A, D, E).\n", "// layout (docs/design/mla.md §5.3 rows A, D, E).\n"),
    ("cpp/sfa/x.h", "// forms (spec\n// sparse.md 5 step 3 (a)-(g)), then\n",
     "// forms\n// (docs/design/sfa.md §6.3 (a)-(g)), then\n"),
    ("cpp/cp/x.h", "// order (spec cp.md 3.1 / 3.2)\n", "// order (docs/design/cp.md §3.1 / §3.2)\n"),
    ("cpp/cp/x.h", "// graph (spec cp.md 7.2-7.4)\n", "// graph (docs/design/graph.md §1.1, §4.1)\n"),
    ("cpp/c8/x.h", "// Decision table (upstream 8.5, with\n", "// Decision table (upstream's, docs/design/gqa.md §5.4, with\n"),
    ("cpp/cp/x.h", "// Decisions where the spec is silent:\n", "// Decisions where upstream is silent:\n"),
    ("tests/python/test_mla_graph.py", "    # spec 0: BNSD_NBSD decode\n", "    # spec 0: BNSD_NBSD decode\n"),
    ("cpp/gqa/x.cpp", "  int spec = 2;  // 1 + spec tokens\n", "  int spec = 2;  // 1 + spec tokens\n"),
]


def self_test() -> int:
    bad = 0
    for path, text, want in SELF_TEST_CASES:
        cits, mentions, _ = scan_text(path, text)
        resolve(cits, SELF_TEST_MAP)
        got = rewrite_text(text, cits, mentions)
        if got != want:
            bad += 1
            print(f"FAIL {path}: {text!r}\n  got  {got!r}\n  want {want!r}")
    print(f"self-test: {len(SELF_TEST_CASES) - bad}/{len(SELF_TEST_CASES)} passed")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--map", default=None, help="default: <root>/docs/design/spec_map.tsv")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 if any external citation or mention remains")
    mode.add_argument("--rewrite", action="store_true", help="rewrite the citations in place")
    mode.add_argument("--self-test", action="store_true", help="run the tool's own cases and exit")
    ap.add_argument("-v", "--verbose", action="store_true", help="list every citation with its target")
    ap.add_argument("--include-docs", action="store_true",
                    help="also scan README.md and docs/*.md (not docs/design/): user docs, outside the code sweep")
    ap.add_argument("--width", type=int, default=120, help="--rewrite lists the lines it made longer than this")
    ap.add_argument("--explain", action="store_true", help="list every bare citation and how its spec was chosen")
    args = ap.parse_args(argv)
    if args.self_test:
        return self_test()
    design_dir = os.path.join(args.root, "docs", "design")
    mapping = load_map(args.map or os.path.join(design_dir, "spec_map.tsv"),
                       design_dir if os.path.isdir(design_dir) else None)

    n_cit = n_ref = n_unres = n_ment = n_files = n_long = n_resid = 0
    for rel, path in iter_files(args.root, args.include_docs):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        cits, mentions, _ = scan_text(rel, text)
        if args.check:
            spans = [(c.start, c.end) for c in cits] + [(m.start, m.end) for m in mentions]
            for m in RESIDUAL.finditer(text):
                lb = text.rfind("\n", 0, m.start()) + 1
                le = text.find("\n", m.start())
                line = text[lb:le if le >= 0 else len(text)]
                if any(a < m.end() and m.start() < b for a, b in spans):
                    continue
                if any(p == rel and re.search(rx, line) for p, rx in RESIDUAL_OK):
                    continue
                n_resid += 1
                print(f"{rel}:{line_of(text, m.start())}: residual {m.group(0)!r}: reword it or teach the tool")
        if not cits and not mentions:
            continue
        resolve(cits, mapping)
        if args.explain:
            for c in cits:
                for r in c.refs:
                    if r.how:
                        ln = text.count("\n", 0, r.start) + 1
                        src = text.split("\n")[ln - 1].strip()
                        print(f"{rel}:{ln}: {r.spec} {r.sec} [{r.how}] | {src}")
            continue
        for c in cits:
            n_cit += 1
            for r in c.refs:
                n_ref += 1
                if r.target is None:
                    n_unres += 1
            bad = [r for r in c.refs if r.target is None]
            if bad or args.verbose or args.check:
                tgt = "; ".join(f"{r.spec} {r.sec}{(' ' + r.qual) if r.qual else ''} -> "
                                + (r.target or f"UNRESOLVED ({r.why})") for r in c.refs)
                print(f"{rel}:{c.line}: {c.text!r}: {tgt}")
        for m in mentions:
            n_ment += 1
            if args.verbose or args.check:
                print(f"{rel}:{m.line}: mention {m.text!r} -> {m.replacement!r}")
        if args.rewrite:
            new = rewrite_text(text, cits, mentions)
            if new != text:
                n_files += 1
                with open(path, "w", encoding="utf-8") as f:
                    f.write(new)
                old_lines = set(text.split("\n"))
                for i, line in enumerate(new.split("\n"), 1):
                    if len(line) > args.width and line not in old_lines:
                        n_long += 1
                        print(f"{rel}:{i}: now {len(line)} columns (> {args.width}): rewrap it")
    print(f"citations: {n_cit} ({n_ref} section references, {n_unres} unresolved); prose mentions: {n_ment}"
          + (f"; files rewritten: {n_files}; lines now over {args.width} columns: {n_long}" if args.rewrite else ""),
          file=sys.stderr)
    if args.check:
        print(f"residual mentions: {n_resid}", file=sys.stderr)
        return 1 if (n_cit or n_ment or n_resid) else 0
    if args.rewrite:
        return 1 if n_unres else 0
    return 1 if n_unres else 0


if __name__ == "__main__":
    sys.exit(main())
