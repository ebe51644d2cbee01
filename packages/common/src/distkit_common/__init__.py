"""distkit-common: the shared native library and small Python helpers of distkit.

The wheel carries the C++/CUDA headers (``include/distkit``), an exported CMake
package (``cmake/``, found by sibling packages through the ``cmake.root`` entry
point) and these Python helpers:

- :mod:`distkit_common.dtypes` - torch / numpy dtypes <-> distkit dtype codes.
- :mod:`distkit_common.validate` - argument checks used at every public boundary.
- :mod:`distkit_common.collective` - one rank's failure raised on every rank (JSON, no pickle).
- :mod:`distkit_common.fsio` - atomic directory commits and stale-temporary cleanup.
- :mod:`distkit_common.launch` - rank / size / local rank / node from mpiexec, torchrun or srun.
- :mod:`distkit_common.testing` - run a script on N processes (or simulated hosts) with a timeout.
"""

from __future__ import annotations

from ._paths import cmake_dir, include_dir
from ._version import __version__
from .launch import LaunchInfo, launch_info, local_rank, local_size, rank, world_size

__all__ = [
    "LaunchInfo",
    "__version__",
    "cmake_dir",
    "include_dir",
    "launch_info",
    "local_rank",
    "local_size",
    "rank",
    "world_size",
]
