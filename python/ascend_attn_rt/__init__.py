"""ascend_attn_rt: a C++ attention runtime for Ascend NPUs with a thin Python facade.

The classes here are the C++ ones (``include/ascend_attn_rt/``) bound one to one.
Import torch first: the extension shares libtorch with it.
"""

import torch  # noqa: F401  (loads libtorch before the extension)

from ._C import (  # noqa: F401
    AttentionImpl,
    AttentionState,
    Backend,
    Metadata,
    MetadataBuilder,
    get_provider,
    op_schemas,
    plan,
    set_provider,
)

__all__ = [
    "AttentionImpl",
    "AttentionState",
    "Backend",
    "Metadata",
    "MetadataBuilder",
    "get_provider",
    "op_schemas",
    "plan",
    "set_provider",
]
__version__ = "0.1.0"
