"""ascend_attn_rt: a C++ attention runtime for Ascend NPUs with a thin Python facade.

The classes here are the C++ ones (``include/ascend_attn_rt/``) bound one to one:
every public name of the ``_C`` extension is re-exported (each backend registers its
own bindings, so new backends appear here without edits). Import torch first: the
extension shares libtorch with it.
"""

import torch  # noqa: F401  (loads libtorch before the extension)

from . import _C

__all__ = sorted(name for name in dir(_C) if not name.startswith("_"))
globals().update({name: getattr(_C, name) for name in __all__})

__version__ = "0.1.0"
