"""Native core of wholemem (segments, row tables, sparse optimizers, CUDA helpers)."""

def version() -> str: ...
def cuda_compiled() -> bool: ...
def cuda_device_count() -> int: ...
def get_num_threads() -> int: ...
def set_num_threads(n: int) -> None: ...
def random_token(nbytes: int = 16) -> str: ...
def check_indices(idx: int, idx64: bool, n: int, nrows: int) -> None: ...
def atomic_add_i64(addr: int, delta: int) -> int: ...
def bytes_as_dlpack(ptr: int, nbytes: int, device_type: int, device_id: int, owner: object) -> object: ...

DLPACK_CPU: int
DLPACK_CUDA: int

class Segment:
    """Owner-only POSIX shared-memory segment (buffer protocol: writable bytes)."""

    @staticmethod
    def create(size: int, prefix: str = "wholemem-") -> Segment: ...
    @staticmethod
    def open(name: str, size: int) -> Segment: ...
    def unlink(self) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def size(self) -> int: ...
    @property
    def address(self) -> int: ...
    @property
    def linked(self) -> bool: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...

class Table:
    """Row table over chunks given by address."""

    def __init__(
        self,
        chunks: list[int],
        rows_per_chunk: int,
        nrows: int,
        ncols: int,
        row_stride: int,
        col_stride: int,
        dtype: int,
        on_device: bool = False,
        device: int = -1,
    ) -> None: ...
    def gather(
        self,
        idx: int,
        idx64: bool,
        n: int,
        out: int,
        stream: int = 0,
        *,
        row0: int = 0,
        nrows: int = -1,
        col0: int = 0,
        ncols: int = -1,
    ) -> None: ...
    def scatter(
        self,
        idx: int,
        idx64: bool,
        n: int,
        values: int,
        stream: int = 0,
        *,
        row0: int = 0,
        nrows: int = -1,
        col0: int = 0,
        ncols: int = -1,
    ) -> None: ...
    def scatter_add(
        self,
        idx: int,
        idx64: bool,
        n: int,
        values: int,
        alpha: float = 1.0,
        stream: int = 0,
        *,
        row0: int = 0,
        nrows: int = -1,
        col0: int = 0,
        ncols: int = -1,
    ) -> None: ...
    @property
    def address(self) -> int: ...
    @property
    def chunks(self) -> list[int]: ...
    @property
    def rows_per_chunk(self) -> int: ...
    @property
    def nrows(self) -> int: ...
    @property
    def ncols(self) -> int: ...
    @property
    def row_stride(self) -> int: ...
    @property
    def col_stride(self) -> int: ...
    @property
    def dtype(self) -> int: ...
    @property
    def on_device(self) -> bool: ...
    @property
    def device(self) -> int: ...

OPTIM_SGD: int
OPTIM_ADAGRAD: int
OPTIM_LAZY_ADAM: int
OPTIM_RMSPROP: int

def optim_num_states(kind: int) -> int: ...
def optim_update(
    kind: int,
    table: Table,
    idx: int,
    n: int,
    grad: int,
    state0: int,
    state1: int,
    row_state: int,
    lr: float,
    weight_decay: float,
    eps: float,
    beta1: float,
    beta2: float,
    alpha: float,
    stream: int = 0,
) -> None: ...
def ipc_get_handle(ptr: int) -> bytes: ...
def ipc_open_handle(handle: bytes, device: int) -> int: ...
def ipc_close_handle(ptr: int, device: int) -> None: ...
def device_alloc(nbytes: int, device: int) -> int: ...
def device_free(ptr: int, device: int) -> None: ...
def device_synchronize(device: int) -> None: ...
def check_indices_device(idx: int, idx64: bool, n: int, nrows: int, device: int, stream: int) -> None: ...
def host_register(addr: int, nbytes: int, device: int) -> int: ...
def host_unregister(addr: int) -> None: ...

# -- graph ops (csrc/graph_bindings.cpp) ------------------------------------------------

class SampleArgs:
    """One CSR sampling call as raw addresses (0 = absent)."""

    row_ptr: int
    num_nodes: int
    num_edges: int
    centers: int
    centers64: bool
    n: int
    starts: int
    ends: int
    col: int
    col64: bool
    weights: int
    weights64: bool
    weight_offsets: int
    k: int
    seed: int
    offsets: int
    dest: int
    center_local: int
    edge_id: int
    keys: int
    def __init__(self) -> None: ...

def csr_sample_offsets(args: SampleArgs) -> int: ...
def csr_sample_fill(args: SampleArgs) -> None: ...
def csr_sample_counts_cuda(args: SampleArgs, device: int, stream: int) -> None: ...
def csr_sample_fill_cuda(args: SampleArgs, device: int, stream: int) -> None: ...
def append_unique(targets: int, nt: int, neighbors: int, nn: int, ids64: bool, out: int, map: int = 0) -> int: ...
def philox4x32_10(counter: list[int], key: list[int]) -> list[int]: ...
