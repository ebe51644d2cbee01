def version() -> str: ...
def cuda_compiled() -> bool: ...
def get_num_threads() -> int: ...
def set_num_threads(n: int) -> None: ...
def xent_stats_cpu(
    x: int, n: int, c: int, row_stride: int, dtype: int, target: int, vstart: int, weight: int, want_sum: bool, out: int
) -> None: ...
def xent_grad_cpu(
    x: int, grad: int, n: int, c: int, row_stride: int, dtype: int, target: int, vstart: int, weight: int, coef: int
) -> None: ...
def xent_stats_blockwise_cpu(
    x: int, n: int, c: int, row_stride: int, dtype: int, target: int, vstart: int, weight: int, want_sum: bool, out: int
) -> None: ...
def xent_grad_elementwise_cpu(
    x: int, grad: int, n: int, c: int, row_stride: int, dtype: int, target: int, vstart: int, weight: int, coef: int
) -> None: ...

XENT_CUDA_THREADS: int

def xent_stats_cuda(
    x: int,
    n: int,
    c: int,
    row_stride: int,
    dtype: int,
    target: int,
    vstart: int,
    weight: int,
    want_sum: bool,
    out: int,
    stream: int,
) -> None: ...
def xent_grad_cuda(
    x: int,
    grad: int,
    n: int,
    c: int,
    row_stride: int,
    dtype: int,
    target: int,
    vstart: int,
    weight: int,
    coef: int,
    stream: int,
) -> None: ...
