"""The backend contract (include/ascend_attn_rt/core/backend.h) from Python, walked over every registered
backend (aar.backends()): each has an adapter module tests/python/_contract_<id>.py whose `case()` returns a small
model and a small decode step (see _contract_gqa.py); the checks below are the same for all of them:

- the facts are declared (id, name, dtypes, caches, capturable states, draft lanes);
- build gives counts with one meaning (num_reqs real requests, tokens, split, maxima);
- build_for_graph_capture accepts exactly the states the (builder's) facts declare and refuses the others with
  NotImplementedError naming the state; build_for_drafting exists and takes a draft index;
- forward writes and returns its output; forward without metadata zero-fills (a profiling run); inside a graph
  capture a forward is recorded (the output is left alone) when the facts declare capture, else refused."""

import importlib

import pytest
import torch

import ascend_attn_rt as aar

STATES = ["PrefillNoCache", "PrefillCacheHit", "DecodeOnly", "ChunkedPrefill", "SpecDecoding"]
IDS = [f["id"] for f in aar.backends()]


def _case(backend_id):
    try:
        mod = importlib.import_module(f"_contract_{backend_id}")
    except ModuleNotFoundError:
        pytest.fail(f"backend {backend_id!r} is registered but has no contract adapter (_contract_{backend_id}.py)")
    return mod.case()


def test_registry_lists_every_backend_with_its_facts():
    assert len(IDS) == len(set(IDS)) and {"gqa", "c8", "fa3"} <= set(IDS)
    for f in aar.backends():
        assert f["name"] and f["dtypes"] and f["kv_caches"], f
        assert set(f["capturable"]) <= set(STATES), f
        assert aar.backend_facts(f["id"]) == f
        if f.get("builder"):
            assert f["builder"] in IDS, f
    with pytest.raises(ValueError, match="no backend \"nope\" is registered"):
        aar.backend_facts("nope")


@pytest.mark.parametrize("backend_id", IDS)
def test_build_capture_states_and_drafting(backend_id):
    c = _case(backend_id)
    facts = aar.backend_facts(backend_id)
    builder_facts = aar.backend_facts(facts["builder"]) if facts.get("builder") else facts
    md = c.build()
    qsl, seq = c.query_start_loc.tolist(), c.seq_lens.tolist()
    B = len(seq)
    assert md.num_reqs == B and md.num_kernel_reqs >= B
    assert md.num_actual_tokens == qsl[-1] and md.num_input_tokens >= md.num_actual_tokens
    assert md.num_decodes + md.num_prefills == B and md.num_decodes == B  # a decode-only step
    assert md.num_decode_tokens + md.num_prefill_tokens == md.num_actual_tokens
    assert md.max_query_len == max(b - a for a, b in zip(qsl, qsl[1:])) and md.max_seq_len == max(seq)
    for s in STATES:
        state = getattr(aar.AttentionState, s)
        if s in builder_facts["capturable"]:
            assert c.build_for_graph_capture(state).attn_state == state
        else:
            with pytest.raises(NotImplementedError, match=s):
                c.build_for_graph_capture(state)
    d = c.build_for_drafting(0)
    assert d.num_reqs == B


@pytest.mark.parametrize("backend_id", IDS)
def test_forward_profiling_run_and_capture_policy(backend_id):
    c = _case(backend_id)
    facts = aar.backend_facts(backend_id)
    out = torch.full_like(c.output_like, 7.0)
    assert c.forward(c.build(), out).data_ptr() == out.data_ptr()
    assert not torch.equal(out, torch.full_like(out, 7.0))
    prof = torch.full_like(c.output_like, 7.0)
    c.forward(None, prof)
    assert torch.count_nonzero(prof) == 0
    graph = aar.GraphParams("recording")
    cap = torch.full_like(c.output_like, 7.0)
    md = c.build_for_graph_capture(aar.AttentionState.DecodeOnly) if facts["capturable"] else c.build()
    if facts["capturable"]:
        with graph.capture(c.bucket):
            c.forward(md, cap)
        assert graph.has(c.bucket) and torch.equal(cap, torch.full_like(cap, 7.0))  # recorded, not run
    else:
        with pytest.raises(NotImplementedError):
            with graph.capture(c.bucket):
                c.forward(md, cap)
    with pytest.raises(NotImplementedError):
        with aar.GraphParams("recording").capture(c.bucket):
            c.forward(None, prof)
