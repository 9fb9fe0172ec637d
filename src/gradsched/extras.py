"""Optional dependencies. ``pip install gradsched`` needs only torch; the rest are extras:

========== ===================================== ==========================================
extra      packages                              for
========== ===================================== ==========================================
plot       matplotlib                            ``--plot`` of ``simulate`` and ``bench``
tune       optuna, scipy, tqdm                   ``gradsched tune``, ``wrap(autotune=True)``
bench      psutil, tqdm                          ``gradsched bench`` (host CPU load)
progress   tqdm                                  progress bars (plain lines without it)
lightning  lightning                             ``gradsched.integrations.lightning``
accelerate accelerate, transformers              ``gradsched.integrations.accelerate``
all        every one above
========== ===================================== ==========================================
"""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, extra: str) -> ModuleType:
    """Import ``module``, or raise ImportError naming the ``pip install`` that provides it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"{module} is not installed: pip install 'gradsched[{extra}]'") from None


def optional(module: str) -> ModuleType | None:
    """Import ``module`` if it is installed, else None."""
    try:
        return importlib.import_module(module)
    except ImportError:
        return None
