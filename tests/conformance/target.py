"""The ``DistributedDataParallel`` that the ported copy of PyTorch's DDP tests exercises.

``GRADSCHED_CONFORMANCE_TARGET=torch`` runs PyTorch's own class (the reference: what the tests
expect of DDP on this machine); anything else, gradsched's drop-in under the policy named by
``GRADSCHED_POLICY``.
"""

import os

if os.environ.get("GRADSCHED_CONFORMANCE_TARGET", "gradsched") == "torch":
    from torch.nn.parallel import DistributedDataParallel
else:
    from gradsched import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
