"""Include rules between the layers that the compiler does not enforce (DESIGN: layers, bottom up):
the core (cpp/common and the top-level public headers) and the graph layer know no backend, the core
does not reach up into the graph layer, and the captured calls several backends share
(graph_calls/) know none of those backends. Reads the sources; builds nothing."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BACKENDS = {"gqa", "c8", "fa3", "mla", "sfa", "dsa", "cp"}
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def layer_of(included, source):
    """The layer directory an include names: ascend_attn_rt/<layer>/..., a relative ../<layer>/...,
    or the including file's own directory for a bare name."""
    parts = pathlib.PurePosixPath(included).parts
    if parts[0] == "ascend_attn_rt":
        return parts[1] if len(parts) > 2 else "core"
    if parts[0] == "..":
        return parts[1]
    return source.parent.name


def sources(*dirs, top_level_only=False):
    for d in dirs:
        root = ROOT / d
        files = root.glob("*") if top_level_only else root.rglob("*")
        for f in sorted(files):
            if f.is_file() and f.suffix in (".h", ".cpp"):
                yield f


def violations(files, forbidden):
    out = []
    for f in files:
        for inc in INCLUDE.findall(f.read_text()):
            if layer_of(inc, f) in forbidden:
                out.append(f"{f.relative_to(ROOT)} includes {inc}")
    return out


@pytest.mark.parametrize(
    "name, files, forbidden",
    [
        ("graph", lambda: sources("cpp/graph", "include/ascend_attn_rt/graph"), BACKENDS | {"graph_calls"}),
        (
            "core",
            lambda: [*sources("cpp/common"), *sources("include/ascend_attn_rt", top_level_only=True)],
            BACKENDS | {"graph", "graph_calls"},
        ),
        ("graph_calls", lambda: sources("cpp/graph_calls", "include/ascend_attn_rt/graph_calls"), BACKENDS),
    ],
    ids=["graph", "core", "graph_calls"],
)
def test_layer_includes_no_higher_layer(name, files, forbidden):
    found = list(files())
    assert found, f"no sources found for the {name} layer"
    assert violations(found, forbidden) == []
