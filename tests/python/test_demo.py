"""The demo as a test: a short continuous-batching run per attention backend must match dense attention."""

import re

import pytest

from ascend_attn_rt import demo


@pytest.mark.parametrize("attention", ["gqa", "mla", "sfa", "dsa"])
def test_demo_matches_dense(attention, capsys):
    # DSA: 3 layers (SWA, C4, C128) and prompts long enough for a C128 row (position 127)
    layers, max_prompt = ("3", "140") if attention == "dsa" else ("2", "90")
    rc = demo.main(["--attention", attention, "--layers", layers, "--requests", "4", "--max-prompt", max_prompt,
                    "--max-new-tokens", "6", "--token-budget", "32", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert re.search(r"greedy tokens match dense\s+yes", out), out
    if attention == "mla":
        chunks = int(out.split("MLA context chunks gathered")[1].split()[0])
        assert chunks > 0  # chunked prefills gathered cached context
    if attention == "sfa":
        m = re.search(r"top-k rows equal to reference\s+(\d+)/(\d+)", out)
        assert m and m.group(1) == m.group(2) and int(m.group(2)) > 0, out  # every indexer selection checked
        assert "top-k reused" in out  # odd layers read the shared top-k buffer
    if attention == "dsa":
        m = re.search(r"top-k rows equal to reference\s+(\d+)/(\d+)", out)
        assert m and m.group(1) == m.group(2) and int(m.group(2)) > 0, out  # every C4 selection checked
        for kind in ("SWA", "C4 (indexer top-k)", "C128"):
            assert kind in out
