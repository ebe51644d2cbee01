"""export_safetensors(argv[1], argv[2]) in 1 MB shards, SIGKILLed at the argv[3]-th rename of a shard.

The rename counted is any ``os.rename`` / ``os.replace`` whose target ends in ``.safetensors``
(how a finished shard gets its final name, in this code and in the code before it), so the kill
falls between two such renames. For test_crash's regression test.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from distx_fake import checkpoint as cp


def main(src: str, dst: str, nth: int) -> None:
    seen = [0]

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "os.rename" and os.fsdecode(args[1]).endswith(".safetensors"):
            seen[0] += 1
            if seen[0] == nth:
                os.kill(os.getpid(), signal.SIGKILL)

    sys.addaudithook(hook)
    cp.export_safetensors(src, dst, max_shard_size="1MB")
    print("not killed", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
