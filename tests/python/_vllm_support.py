"""Helpers shared by the vLLM adapter tests."""

import sys
import types


def kv_cache_utils():
    """vLLM's vllm.v1.core.kv_cache_utils (the KV-cache grouping and config code of its engine). It imports
    vllm.v1.request, which imports the structured-output backends, whose module bodies name llguidance and
    xgrammar types in class annotations; neither package is installed here (vLLM is installed without its
    dependencies), so while the module is imported a stand-in module answers those names. Nothing of them is
    called; the stand-ins leave sys.modules afterwards."""
    import importlib.util

    missing = [n for n in ("llguidance", "xgrammar") if n not in sys.modules and importlib.util.find_spec(n) is None]

    def stub(name):
        m = types.ModuleType(name)

        def attr(a):
            if a.startswith("__"):
                raise AttributeError(a)
            return type(a, (), {})

        m.__getattr__ = attr
        return m

    try:
        for n in missing:
            sys.modules[n] = stub(n)
        from vllm.v1.core import kv_cache_utils
    finally:
        for n in missing:
            sys.modules.pop(n, None)
    return kv_cache_utils
