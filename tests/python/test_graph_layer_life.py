"""A captured layer dropped while its bucket lives (docs/design/graph.md §4.6): update and replay refuse the
bucket by name instead of calling the destroyed layer (before, a replay crashed the process)."""
import gc

import pytest
import torch

import ascend_attn_rt as aar
from test_dsa import Run, dims
from test_dsa_graph import Bucket


def test_dropped_dsa_layer_refuses_update_and_replay_then_release_and_recapture():
    run = Run(dims(1), torch.float32, nreq=3, k=0)
    run.step([0, 1, 2], [5, 7, 3])
    bk = Bucket(run, B=4, q=1)
    bk.capture([0, 1, 2])
    bk.replay([0, 1])
    out_before = bk.outs[0].clone()
    snap = [t.clone() for t in (run.swa,)]
    layer = run.impl
    run.impl, bk.impls = None, None
    del layer
    gc.collect()
    st, md, _, _ = bk.build([0, 1])
    with pytest.raises(ValueError, match=r"update of bucket 4: the bucket recorded calls of dsa\.Impl.*destroyed"):
        aar.dsa.graph_update(bk.g, bk.n, st, md["swa"])
    with pytest.raises(ValueError, match=r"replay of bucket 4: .*dsa\.Impl.*destroyed"):
        bk.g.replay(bk.n)
    assert torch.equal(bk.outs[0], out_before)  # nothing ran
    assert torch.equal(run.swa, snap[0])        # nothing written
    # Releasing the bucket and capturing it again with a new layer works.
    bk.g.release(bk.n)
    assert not bk.g.has(bk.n)
    fresh = Run(dims(1), torch.float32, nreq=3, k=0)
    fresh.step([0, 1, 2], [5, 7, 3])
    bk2 = Bucket(fresh, B=4, q=1)
    bk2.capture([0, 1, 2])
    bk2.replay([0, 1])
    assert torch.isfinite(bk2.outs[0]).all()
