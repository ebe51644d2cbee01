"""The shared native library and small Python helpers of distkit (distkit-common).

The wheel carries the C++/CUDA headers (``include/distkit``), an exported CMake
package (``cmake/``, found by sibling packages through the ``cmake.root`` entry
point) and these Python helpers:

- :mod:`distkit_common.dtypes` - torch / numpy dtypes <-> distkit dtype codes.
- :mod:`distkit_common.validate` - argument checks used at every public boundary.
- :mod:`distkit_common.collective` - one rank's failure raised on every rank (JSON, no pickle).
- :mod:`distkit_common.fsio` - atomic directory commits and stale-temporary cleanup.
- :mod:`distkit_common.launch` - rank / size / local rank / node from mpiexec, torchrun or srun.
- :mod:`distkit_common.node` - which ranks share a node (one decision for every package).
- :mod:`distkit_common.heartbeat` - name a lost peer of a torch.distributed job within seconds.
- :mod:`distkit_common.rates` - link rates in tc's syntax (``"1gbit"``) <-> bits per second.
- :mod:`distkit_common.rows` - the native row gather / scatter / scatter-add (CPU and CUDA) on raw addresses.

The test harness (run a body on N processes or across simulated hosts, the
simulated cluster, the pytest plugin) is the subpackage :mod:`distkit_common.testing`;
no runtime module imports it.
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
