"""Worker: what a rank sees of its own start and end, for tests/distributed/test_launch.py.

    python -m workers.probe EXIT_CODE_OF_RANK_1

Prints its ``__name__``, ``sys.argv``, RANK, the intra-op threads and whether torch's
distributed debug level follows the environment; a non-daemon thread and an atexit handler
print after the main code ends, as they would in any interpreter; rank 1 then exits with the
code given (``raise`` raises instead)."""

import atexit
import json
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

print(json.dumps({"name": __name__, "argv": sys.argv[1:], "rank": os.environ["RANK"],
                  "threads": torch.get_num_threads(), "debug": str(dist.get_debug_level())}), flush=True)
atexit.register(lambda: print("atexit ran", flush=True))
threading.Thread(target=lambda: (time.sleep(0.2), print("thread joined", flush=True))).start()
if os.environ["RANK"] == "1":
    if sys.argv[1] == "raise":
        raise RuntimeError("rank 1 raised")
    sys.exit(int(sys.argv[1]))
