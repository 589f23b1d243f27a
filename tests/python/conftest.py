"""Shared fixtures for the ascend_attn_rt Python tests.

Run from the repository root, after a build: .venv/bin/python -m pytest -q
(pyproject.toml's pytest `pythonpath` puts python/ and tests/python/ on sys.path).
"""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

from _reference import DTYPES, make_batch  # noqa: E402


@pytest.fixture
def gen():
    g = torch.Generator()
    g.manual_seed(1234)
    return g


@pytest.fixture
def paged_cache():
    """Factory: paged_cache(num_blocks, block_size, Nkv, D, dtype=fp32, fill=None)
    -> (key_cache, value_cache), each (num_blocks, block_size, Nkv, D); random
    garbage unless `fill` is given."""

    def make(num_blocks, block_size, num_kv_heads, head_size, dtype=torch.float32, fill=None, seed=7):
        g = torch.Generator()
        g.manual_seed(seed)
        shape = (num_blocks, block_size, num_kv_heads, head_size)
        if fill is not None:
            return torch.full(shape, fill, dtype=dtype), torch.full(shape, fill, dtype=dtype)
        return (torch.randn(*shape, generator=g).to(dtype), torch.randn(*shape, generator=g).to(dtype))

    return make


@pytest.fixture
def batch_factory(gen):
    """make_batch with the test's seeded generator."""

    def make(seq_lens, q_lens, **kw):
        kw.setdefault("dtype", torch.float32)
        if isinstance(kw["dtype"], str):
            kw["dtype"] = DTYPES[kw["dtype"]]
        return make_batch(seq_lens, q_lens, gen=gen, **kw)

    return make


def pytest_configure(config):
    # Keep runs reproducible and bounded on small CI machines.
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _default_dtype_unchanged(request):
    """A test that changes torch's default dtype and leaves it changed breaks later tests far from the cause
    (vLLM's set_default_torch_dtype does not restore it when its body raises); name the test instead."""
    before = torch.get_default_dtype()
    yield
    after = torch.get_default_dtype()
    if after != before:
        torch.set_default_dtype(before)
        pytest.fail(f"{request.node.nodeid} left torch's default dtype {after} (was {before})")
