"""KV-connector hooks from Python (C++: include/ascend_attn_rt/kv_connector.h).

Every layer object (``AttentionImpl``, ``C8AttentionImpl``, ``FA3AttentionImpl``, ``mla.Impl``,
``sfa.Impl``, ``dsa.Impl``) has ``set_kv_connector(connector, layer_name)``; the runtime then
calls, around each eager forward that has metadata:

1. ``connector.wait_for_layer_load(layer_name)`` before any operator of the layer,
2. ``connector.on_kv_cache_written(layer_name, wrote_cache)`` after the cache writes (only when the
   object has that method; ``wrote_cache`` is False for layers that write no cache),
3. ``connector.save_kv_layer(layer_name, kv_layer, attn_metadata)`` last, with ``kv_layer`` the
   tuple of the layer's cache tensors and ``attn_metadata`` the metadata object given to forward
   (DSA: its ``StepMetadata``).

A hook that raises makes forward raise ``RuntimeError`` naming the hook and the layer.

``VllmConnectorAdapter`` wraps a vLLM ``KVConnectorBase_V1`` worker-side connector (duck-typed: any
object with ``wait_for_layer_load`` and ``save_kv_layer``; vLLM is not imported), the way vLLM's
attention layer calls it (``wait_for_kv_layer_from_connector`` /
``maybe_save_kv_layer_to_connector``): ``kv_layer`` goes through as the tuple of cache tensors
(vllm-ascend's per-layer cache is such a tuple), and a connector without ``on_kv_cache_written``
is simply not notified.
"""

from __future__ import annotations

from typing import Any, Mapping


class VllmConnectorAdapter:
    """Adapts a vLLM-style worker connector to the runtime's hooks."""

    def __init__(self, connector: Any):
        for name in ("wait_for_layer_load", "save_kv_layer"):
            if not callable(getattr(connector, name, None)):
                raise TypeError(f"connector must have a callable {name}() (vLLM KVConnectorBase_V1 worker API); "
                                f"{type(connector).__name__} has none")
        self.connector = connector
        self._notify = getattr(connector, "on_kv_cache_written", None)

    def wait_for_layer_load(self, layer_name: str) -> None:
        self.connector.wait_for_layer_load(layer_name)

    def on_kv_cache_written(self, layer_name: str, wrote_cache: bool) -> None:
        if self._notify is not None:
            self._notify(layer_name, wrote_cache)

    def save_kv_layer(self, layer_name: str, kv_layer: tuple, attn_metadata: Any) -> None:
        self.connector.save_kv_layer(layer_name, kv_layer, attn_metadata)


def attach(connector: Any, layers: Mapping[str, Any]) -> VllmConnectorAdapter:
    """Wrap ``connector`` once and set it on every layer of ``layers`` (layer name -> layer object).
    Returns the adapter. ``attach(None, layers)`` is not accepted: use ``detach``."""
    if connector is None:
        raise TypeError("connector is None: use detach(layers) to remove the hooks")
    adapter = connector if isinstance(connector, VllmConnectorAdapter) else VllmConnectorAdapter(connector)
    for name, layer in layers.items():
        layer.set_kv_connector(adapter, name)
    return adapter


def detach(layers: Mapping[str, Any]) -> None:
    for name, layer in layers.items():
        layer.set_kv_connector(None, name)
