"""WholeMemory-style multi-process shared and partitioned tensors for PyTorch.

``import wholemem as wg``; see the package README for the API.
"""

from __future__ import annotations

from . import _wholemem
from ._comm import (
    UniqueId,
    WholeMemoryCommunicator,
    communicator_from_mpi4py,
    communicator_from_process_group,
    create_communicator,
    get_unique_id,
)
from ._compat import (
    barrier,
    destroy_communicator,
    get_rank,
    get_size,
    get_sub_chunked_tensor,
    get_sub_nccl_tensor,
    get_wm_communicator,
    get_wm_tensor_type,
)
from ._create import create_wm_tensor
from ._embedding import SGD, Adagrad, Embedding, LazyAdam, RMSProp
from ._graph import GraphStructure
from ._graph_ops import unweighted_sample_without_replacement, weighted_sample_without_replacement
from ._graph_sample import append_unique
from ._groups import (
    create_group_communicator,
    get_global_communicator,
    get_local_device_communicator,
    get_local_node_communicator,
    split_communicator,
)
from ._io import create_wm_tensor_from_file, load_from_files, stat_filelist_element_count, store_to_files
from ._lib import finalize_lib, init_lib
from ._ops import gather, get_local_tensor, get_partition_plan, get_sub_tensor, get_tensor_view, scatter
from ._tensor import ChunkedTensor, NCCLTensor, WmTensorType
from ._version import __version__

DISTRIBUTED = WmTensorType.DISTRIBUTED

__all__ = [
    "DISTRIBUTED",
    "SGD",
    "Adagrad",
    "Embedding",
    "GraphStructure",
    "LazyAdam",
    "RMSProp",
    "ChunkedTensor",
    "WholeMemoryCommunicator",
    "NCCLTensor",
    "UniqueId",
    "WmTensorType",
    "__version__",
    "_wholemem",
    "append_unique",
    "barrier",
    "communicator_from_mpi4py",
    "communicator_from_process_group",
    "create_communicator",
    "create_group_communicator",
    "create_wm_tensor",
    "create_wm_tensor_from_file",
    "destroy_communicator",
    "finalize_lib",
    "gather",
    "get_global_communicator",
    "get_local_device_communicator",
    "get_local_node_communicator",
    "get_local_tensor",
    "get_partition_plan",
    "get_rank",
    "get_size",
    "get_sub_chunked_tensor",
    "get_sub_nccl_tensor",
    "get_sub_tensor",
    "get_tensor_view",
    "get_unique_id",
    "get_wm_communicator",
    "get_wm_tensor_type",
    "init_lib",
    "load_from_files",
    "scatter",
    "split_communicator",
    "stat_filelist_element_count",
    "store_to_files",
    "unweighted_sample_without_replacement",
    "weighted_sample_without_replacement",
]
