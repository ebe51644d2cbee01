"""deferred_init: exact replay (values, RNG stream, ties, buffers, .item()), materialize APIs."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from distx_fake import deferred_init as di
from distx_fake import fake


class TinyGPT(nn.Module):
    """A transformer with the custom inits found in real code (GPT-2 / BERT style)."""

    def __init__(self, vocab: int = 1000, d: int = 128, layers: int = 2, ctx: int = 64) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Parameter(torch.zeros(ctx, d))
        self.encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(d, 4, dim_feedforward=4 * d, batch_first=True),
            layers,
            enable_nested_tensor=False,
        )
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied
        self.register_buffer("mask", torch.triu(torch.full((ctx, ctx), float("-inf")), diagonal=1))
        self.register_buffer("scale", torch.tensor(1.0 / math.sqrt(d)), persistent=False)
        self.apply(self._init)
        nn.init.trunc_normal_(self.wpe, std=0.02)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("linear2.weight"):
                    p.data.normal_(0.0, 0.02 / math.sqrt(2 * layers))  # .data + in place
            self.wte.weight[0].zero_()  # in place on a view (padding row)
        n = int(self.wte.weight.abs().sum().item() > 0)  # .item() inside __init__
        self.register_buffer("flag", torch.full((2,), n))
        self.extra = nn.Parameter(torch.randn(37) * 0.5 + torch.rand(37))  # factories + temporaries

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            if m.bias is not None:
                nn.init.uniform_(m.bias, -0.01, 0.01)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, 0.02)


def _tensors(m: nn.Module) -> dict[str, torch.Tensor]:
    out = dict(m.named_parameters(remove_duplicate=False))
    out.update(m.named_buffers(remove_duplicate=False))
    return out


def _assert_identical(a: nn.Module, b: nn.Module) -> None:
    ta, tb = _tensors(a), _tensors(b)
    assert ta.keys() == tb.keys()
    for k in ta:
        assert not fake.is_fake(tb[k]), k
        assert ta[k].dtype == tb[k].dtype and ta[k].shape == tb[k].shape, k
        assert torch.equal(ta[k], tb[k]), f"{k} differs"
        assert type(ta[k]) is type(tb[k]) and ta[k].requires_grad == tb[k].requires_grad, k


def test_exact_rng_values_and_stream() -> None:
    torch.manual_seed(1234)
    eager = TinyGPT()
    after_eager = torch.randn(5)
    torch.manual_seed(1234)
    m = di.deferred_init(TinyGPT)
    after_deferred = torch.randn(5)
    # the default generator continues exactly as after eager construction
    assert torch.equal(after_eager, after_deferred)
    assert di.is_deferred(m) and di.is_deferred(m.wte.weight)
    torch.manual_seed(999)  # the generator state at materialization time must not matter
    torch.rand(1000)
    di.materialize_module(m)
    assert not di.is_deferred(m)
    _assert_identical(eager, m)
    assert m.head.weight is m.wte.weight
    assert "scale" not in m.state_dict() and m.flag.tolist() == [1, 1]


def test_order_independence_with_check_fn() -> None:
    torch.manual_seed(7)
    eager = TinyGPT()
    torch.manual_seed(7)
    m = di.deferred_init(TinyGPT)
    # materialize the feed-forward layers first, then the tensors one by one backwards, then the rest
    di.materialize_module(m, check_fn=lambda mod: isinstance(mod, nn.Linear))
    assert di.is_deferred(m) and not di.is_deferred(m.encoder.layers[1].linear2)
    for layer in reversed(m.encoder.layers):
        torch.randn(100)  # disturb the generator between steps
        di.materialize_module(layer)
    di.materialize_module(m, buffers_only=True)
    assert di.is_deferred(m.wte.weight) and not fake.is_fake(m.mask)
    di.materialize_module(m)
    _assert_identical(eager, m)


def test_materialize_tensor_semantics() -> None:
    torch.manual_seed(3)
    m = di.deferred_init(TinyGPT)
    w = m.wte.weight
    real = di.materialize_tensor(w)
    assert isinstance(real, nn.Parameter) and real.requires_grad
    assert di.materialize_tensor(w) is real  # same object every time
    assert di.materialize_tensor(m.head.weight) is real  # tied weight
    r = torch.ones(3)
    assert di.materialize_tensor(r) is r  # a real tensor comes back unchanged
    buf = di.materialize_tensor(m.mask)
    assert not isinstance(buf, nn.Parameter) and torch.isinf(buf[0, 1]) and buf[1, 0] == 0


def test_plain_tensor_attributes_and_memory_release() -> None:
    import gc
    import weakref

    def build() -> nn.Module:
        lin = nn.Linear(4, 4)
        lin.table = torch.randn(6) * 2  # a plain attribute, neither parameter nor buffer
        return lin

    torch.manual_seed(8)
    eager = build()
    torch.manual_seed(8)
    m = di.deferred_init(build)
    di.materialize_module(m)
    gc.collect()
    table = di.materialize_tensor(m.table)  # the graph is still reachable from the attribute
    assert torch.equal(table, eager.table) and torch.equal(m.weight, eager.weight)
    # once materialized and dropped, real data is freed without waiting for the cycle collector
    probe = weakref.ref(table)
    del table, m
    assert probe() is None


def test_item_and_data_dependent_init() -> None:
    def build() -> nn.Module:
        lin = nn.Linear(16, 16)
        k = int((lin.weight > 0).sum().item())  # depends on random values: must be real
        lin.register_buffer("count", torch.tensor([k]))
        with torch.no_grad():
            lin.weight.mul_(1.0 / lin.weight.abs().max().item())
        return lin

    torch.manual_seed(5)
    eager = build()
    torch.manual_seed(5)
    m = di.deferred_init(build)
    di.materialize_module(m)
    _assert_identical(eager, m)


def test_random_ops_outside_the_fast_path() -> None:
    def build() -> nn.Module:
        mod = nn.Module()
        mod.a = nn.Parameter(torch.empty(7).normal_())  # n < 16: scalar path
        mod.b = nn.Parameter(torch.empty(5, 3, dtype=torch.float64).t().uniform_())  # non-contiguous
        mod.register_buffer("c", torch.randperm(50))
        mod.register_buffer("d", torch.randint(0, 10, (33,)))
        mod.register_buffer("e", torch.empty(40).bernoulli_(0.3))
        mod.register_buffer("f", torch.empty(20).exponential_())
        g = torch.Generator().manual_seed(42)
        mod.register_buffer("g", torch.randn(100, generator=g))
        mod.register_buffer("h", torch.randn(300, dtype=torch.bfloat16))
        return mod

    torch.manual_seed(0)
    eager = build()
    s_eager = torch.get_rng_state()
    torch.manual_seed(0)
    m = di.deferred_init(build)
    assert torch.equal(torch.get_rng_state(), s_eager)
    di.materialize_module(m)
    _assert_identical(eager, m)


def test_captured_tensor_modified_after_recording_fails_clearly() -> None:
    table = torch.arange(12.0).reshape(3, 4)

    def build() -> nn.Module:
        lin = nn.Linear(4, 3)
        with torch.no_grad():
            lin.weight.copy_(table)
        return lin

    m = di.deferred_init(build)
    table.add_(1)  # changed in place after recording
    with pytest.raises(
        di.CapturedTensorModifiedError, match=r"shape \(3, 4\).*test_deferred.py:\d+ in build.*modified in place"
    ):
        di.materialize_module(m)
    # unchanged captures are fine
    table2 = table.clone()
    m2 = di.deferred_init(lambda: _copy_into(nn.Linear(4, 3), table2))
    di.materialize_module(m2)
    assert torch.equal(m2.weight, table2)


def _copy_into(lin: nn.Linear, t: torch.Tensor) -> nn.Linear:
    with torch.no_grad():
        lin.weight.copy_(t)
    return lin


# --- modules whose __init__ reads values: the generator must end where eager leaves it ------------
def _reads_item() -> nn.Module:
    lin = nn.Linear(8, 8)
    if lin.weight.sum().item() > 0:  # a Python branch on a value
        nn.init.normal_(lin.weight)
    lin.register_buffer("b", torch.randn(5) * torch.rand(1).item())
    return lin


def _reads_tolist_and_equal() -> nn.Module:
    lin = nn.Linear(8, 8)
    row = lin.weight[0].tolist()
    lin.register_buffer("row", torch.tensor(row) + torch.randn(8))
    if torch.equal(lin.weight, lin.weight) and (lin.bias > 0).any():
        lin.register_buffer("c", torch.randn(20))
    return lin


def _value_dependent_draws() -> nn.Module:
    # the number of draws of these ops depends on their inputs' values
    mod = nn.Module()
    probs = torch.rand(10)
    mod.register_buffer("idx", torch.multinomial(probs, 5))
    mod.register_buffer("counts", torch.poisson(torch.rand(50) * 10))
    mod.register_buffer("noisy", F.rrelu(torch.randn(50), training=True))
    mod.register_buffer("normal", torch.normal(torch.rand(20), 1.0))
    mod.register_buffer("coin", torch.bernoulli(torch.rand(40)))
    w = torch.randn(8, 8)
    w.copy_(F.dropout(w, 0.5, training=True))
    mod.register_buffer("w", w)
    mod.register_buffer("after", torch.randn(17))
    return mod


def _data_dependent_shapes() -> nn.Module:
    lin = nn.Linear(8, 8)
    with torch.no_grad():
        lin.weight[lin.weight < 0] = 0.0  # boolean-mask assignment
    lin.register_buffer("pos", lin.bias[lin.bias > 0].clone())
    lin.register_buffer("nz", torch.nonzero(lin.weight))
    lin.register_buffer("u", torch.unique(torch.randint(0, 5, (20,))))
    k = int((lin.weight > 0).sum())
    lin.register_buffer("perm", torch.randperm(k))
    return lin


@pytest.mark.parametrize(
    "build",
    [_reads_item, _reads_tolist_and_equal, _value_dependent_draws, _data_dependent_shapes],
    ids=lambda f: f.__name__,
)
def test_generator_after_deferred_init_equals_eager_when_init_reads_values(build: object) -> None:
    torch.manual_seed(11)
    eager = build()  # type: ignore[operator]
    state_eager, next_eager = torch.get_rng_state(), torch.randn(7)
    torch.manual_seed(11)
    m = di.deferred_init(build)  # type: ignore[arg-type]
    state_deferred, next_deferred = torch.get_rng_state(), torch.randn(7)
    assert torch.equal(state_deferred, state_eager)
    assert torch.equal(next_deferred, next_eager)
    torch.manual_seed(3)  # the state at materialization time does not matter
    di.materialize_module(m)
    _assert_identical(eager, m)


def test_reads_are_replayed_before_later_writes_in_any_order() -> None:
    def build() -> nn.Module:
        mod = nn.Module()
        p = torch.rand(3)
        mod.register_buffer("twice", p * 2)  # reads p before the in-place write below
        p.mul_(5)
        mod.register_buffer("p", p)
        return mod

    torch.manual_seed(4)
    eager = build()
    for first in ("p", "twice"):
        torch.manual_seed(4)
        m = di.deferred_init(build)
        di.materialize_tensor(getattr(m, first))
        di.materialize_module(m)
        _assert_identical(eager, m)


def test_tolist_and_numpy_of_fake_tensors_outside_deferred_init_still_raise() -> None:
    with fake.fake_mode():
        t = torch.ones(3)
    with pytest.raises(fake.FakeDataError, match=r"\.tolist\(\)"):
        t.tolist()
    with pytest.raises(fake.FakeDataError, match=r"\.numpy\(\)"):
        t.numpy()

    def build() -> nn.Module:
        t.tolist()  # a fake deferred_init did not record
        return nn.Linear(1, 1)

    with pytest.raises(fake.FakeDataError, match="did not record"):
        di.deferred_init(build)


# --- captured real tensors changed in place before materialization -----------------------------
def _capture_copy(t: torch.Tensor) -> nn.Module:
    lin = nn.Linear(4, 3)
    with torch.no_grad():
        lin.weight.copy_(t)
    return lin


def _capture_mul(t: torch.Tensor) -> nn.Module:
    lin = nn.Linear(4, 3)
    with torch.no_grad():
        lin.weight.mul_(t)
    return lin


def _capture_scalar_view(t: torch.Tensor) -> nn.Module:
    lin = nn.Linear(4, 3)
    with torch.no_grad():
        lin.bias.add_(t[0, 0])
    return lin


def _capture_then_item(t: torch.Tensor) -> nn.Module:
    lin = nn.Linear(4, 3)
    with torch.no_grad():
        lin.weight.copy_(t)
    lin.weight.sum().item()  # the copy has already been replayed once during recording
    return lin


def _modify_add(t: torch.Tensor) -> None:
    t.add_(1)


def _modify_detached(t: torch.Tensor) -> None:
    t.detach()[0].mul_(2)


def _modify_data(t: torch.Tensor) -> None:
    t.data.add_(1)  # no version bump


def _modify_numpy(t: torch.Tensor) -> None:
    t.numpy()[0, 0] = 99.0  # no version bump


def _modify_inference_mode(t: torch.Tensor) -> None:
    with torch.inference_mode():
        t.zero_()


_CAPTURE_CASES = [
    (b, m)
    for b in (_capture_copy, _capture_mul, _capture_scalar_view, _capture_then_item)
    for m in (_modify_add, _modify_detached, _modify_data, _modify_numpy, _modify_inference_mode)
    # a value already consumed while recording gave the exact result: only a version bump shows
    if not (b is _capture_then_item and m in (_modify_data, _modify_numpy))
]


@pytest.mark.parametrize(("build", "modify"), _CAPTURE_CASES, ids=lambda f: f.__name__)
def test_every_captured_tensor_modified_in_place_fails_materialization(build: object, modify: object) -> None:
    table = torch.arange(12.0).reshape(3, 4)
    m = di.deferred_init(build, table)  # type: ignore[arg-type]
    modify(table)  # type: ignore[operator]
    with pytest.raises(
        di.CapturedTensorModifiedError, match=r"shape \((3, 4)?\) and dtype torch.float32.*modified in place"
    ):
        di.materialize_module(m)


def test_captured_tensor_changed_inside_module_fn_replays_the_value_it_had() -> None:
    def build() -> nn.Module:
        mod = nn.Module()
        t = torch.tensor([1.0, 2.0, 3.0])
        mod.register_buffer("a", torch.zeros(3))
        mod.a.copy_(t)  # captures t
        t.add_(1)  # a real op inside module_fn: eager copied the old values into `a`
        mod.register_buffer("b", torch.zeros(3))
        mod.b.copy_(t)
        return mod

    eager = build()
    m = di.deferred_init(build)
    di.materialize_module(m)
    _assert_identical(eager, m)
    assert m.a.tolist() == [1.0, 2.0, 3.0] and m.b.tolist() == [2.0, 3.0, 4.0]


def test_materialize_onto_device_and_param_init_fn() -> None:
    torch.manual_seed(2)
    eager = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    torch.manual_seed(2)
    m = di.deferred_init(nn.Sequential, nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    # FSDP calls param_init_fn(module) on each wrapped submodule; materialize_module fits it
    param_init_fn = lambda mod: di.materialize_module(mod, device="cpu")  # noqa: E731
    for sub in m.children():
        param_init_fn(sub)
    _assert_identical(eager, m)
    # device="meta": no storage, only metadata
    mm = di.deferred_init(nn.Linear, 1000, 1000)
    di.materialize_module(mm, device="meta")
    assert mm.weight.device.type == "meta" and isinstance(mm.weight, nn.Parameter)


class _Mixed(nn.Module):
    """Parameters of several kinds, a tied pair, float and integer buffers."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm1d(16)  # running stats (float) + num_batches_tracked (int64)
        self.lin = nn.Linear(16, 50)
        self.lin.weight = self.emb.weight  # tied: Module._apply visits it twice
        self.ln = nn.LayerNorm(16)
        self.register_buffer("idx", torch.arange(5))


def _set_data(t: torch.Tensor, value: torch.Tensor) -> None:
    t.data = value


# every way a module or a tensor changes dtype, layout or device inside module_fn
_CONVERSIONS: dict[str, object] = {
    "double": lambda m: m.double(),
    "half": lambda m: m.half(),
    "bfloat16": lambda m: m.bfloat16(),
    "float_after_double": lambda m: m.double().float(),
    "to_dtype": lambda m: m.to(torch.float64),
    "to_dtype_kw": lambda m: m.to(dtype=torch.float16),
    "to_device_dtype": lambda m: m.to("cpu", torch.float64),
    "to_tensor": lambda m: m.to(torch.zeros(1, dtype=torch.bfloat16)),
    "type": lambda m: m.type(torch.float64),
    "cpu_noop": lambda m: m.cpu(),
    "channels_last": lambda m: (m.conv.to(memory_format=torch.channels_last), m)[1],
    "double_then_init": lambda m: (
        m.double(),
        nn.init.normal_(m.lin.bias),
        m.emb.weight.data.mul_(3),
        m.bn.running_var.add_(m.ln.weight),
        m,
    )[-1],
    "data_assignment": lambda m: (_set_data(m.ln.weight, m.ln.weight.data.double() * 2), m)[1],
    "tensor_to_double_type": lambda m: (
        m.register_buffer("x", m.lin.bias.to(torch.float64) + m.idx.double().sum()),
        m.register_buffer("y", m.conv.bias.type(torch.float16).bfloat16()),
        m.register_buffer("z", m.ln.bias.half().to(torch.float32, copy=True)),
        m,
    )[-1],
}


@pytest.fixture(params=["set_data", "swap_tensors", "overwrite"])
def conversion_mode(request: pytest.FixtureRequest) -> object:
    """Module._apply's three ways of installing a converted parameter (torch.__future__ flags)."""
    swap = torch.__future__.get_swap_module_params_on_conversion()
    overwrite = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(request.param == "swap_tensors")
    torch.__future__.set_overwrite_module_params_on_conversion(request.param == "overwrite")
    yield request.param
    torch.__future__.set_swap_module_params_on_conversion(swap)
    torch.__future__.set_overwrite_module_params_on_conversion(overwrite)


@pytest.mark.parametrize("conversion", list(_CONVERSIONS))
def test_dtype_and_layout_conversions_inside_deferred_init_match_eager(conversion: str, conversion_mode: str) -> None:
    convert = _CONVERSIONS[conversion]

    def build() -> nn.Module:
        return convert(_Mixed())  # type: ignore[operator]

    torch.manual_seed(8)
    eager = build()
    after_eager = torch.randn(4)
    torch.manual_seed(8)
    m = di.deferred_init(build)
    after_deferred = torch.randn(4)
    for name, t in _tensors(eager).items():  # the fakes already report the converted metadata
        f = _tensors(m)[name]
        assert (f.dtype, f.shape, f.stride()) == (t.dtype, t.shape, t.stride()), name
    torch.manual_seed(99)
    di.materialize_module(m)
    _assert_identical(eager, m)  # dtype, shape, bits, Parameter-ness, requires_grad
    for name, t in _tensors(eager).items():
        assert _tensors(m)[name].stride() == t.stride(), name
    # ties as eager has them (the `overwrite` mode gives each module its own converted copy)
    assert (m.lin.weight is m.emb.weight) == (eager.lin.weight is eager.emb.weight)
    assert torch.equal(after_eager, after_deferred)


def test_conversion_of_fake_cuda_modules_materializes_on_cpu_as_eager() -> None:
    cases = [
        (lambda: nn.Linear(4, 3).cuda(), lambda: nn.Linear(4, 3)),
        (lambda: nn.Linear(4, 3).to("cuda", torch.float64), lambda: nn.Linear(4, 3).double()),
        (lambda: nn.Linear(4, 3).double().cuda().half(), lambda: nn.Linear(4, 3).double().half()),
    ]
    for build, reference in cases:
        torch.manual_seed(3)
        eager = reference()
        torch.manual_seed(3)
        with fake.fake_mode(fake_cuda=True):
            m = di.deferred_init(build)
        assert m.weight.device.type == "cuda" and m.weight.dtype == eager.weight.dtype
        di.materialize_module(m, device="cpu")
        _assert_identical(eager, m)


def test_conversions_under_fake_mode_keep_meta_and_metadata_in_step() -> None:
    real = torch.zeros(3, 4, dtype=torch.float64)
    with fake.fake_mode():
        lin = nn.Linear(4, 3).double()
        y = lin(torch.ones(2, 4, dtype=torch.float64))
        assert y.dtype == torch.float64 and fake.is_fake(y)
        conv = nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last).half()
        assert conv.weight.dtype == torch.float16 and conv.weight.stride() == (27, 1, 9, 3)
        assert fake.meta_like(conv.weight).stride() == (27, 1, 9, 3)
        with pytest.raises(TypeError, match="cannot assign a real Tensor"):
            lin.weight.data = real


def test_conversion_after_deferred_init_returns_is_refused_not_silently_lost() -> None:
    torch.manual_seed(5)
    eager = nn.Linear(4, 3)
    torch.manual_seed(5)
    m = di.deferred_init(nn.Linear, 4, 3)
    with pytest.raises(RuntimeError, match=r"outside deferred_init .*convert inside module_fn"):
        m.double()
    assert m.weight.dtype == torch.float32  # nothing was changed
    di.materialize_module(m)
    _assert_identical(eager, m)
    m.double()  # after materialization: an ordinary module
    assert m.weight.dtype == torch.float64 and torch.equal(m.weight, eager.weight.double())


def test_fake_cuda_module_materializes_on_cpu_with_eager_values() -> None:
    torch.manual_seed(4)
    eager = nn.Linear(16, 8)
    torch.manual_seed(4)
    m = di.deferred_init(nn.Linear, 16, 8, device="cuda")
    assert m.weight.device.type == "cuda" and fake.is_fake(m.weight)
    di.materialize_module(m, device="cpu")
    # random ops on fake CUDA tensors have no snapshottable generator without a GPU: only the shapes are checked
    assert m.weight.shape == eager.weight.shape and m.weight.device.type == "cpu"


def test_fake_mode_inside_module_fn_is_still_recorded() -> None:
    def build() -> nn.Module:
        with fake.fake_mode():  # nested in deferred_init's own fake mode
            return nn.Linear(5, 3)

    torch.manual_seed(6)
    eager = nn.Linear(5, 3)
    torch.manual_seed(6)
    m = di.deferred_init(build)
    di.materialize_module(m)
    _assert_identical(eager, m)


def test_bad_input() -> None:
    with pytest.raises(TypeError, match="module_fn must be callable"):
        di.deferred_init(3)  # type: ignore[arg-type]
    # torchdistX raised ValueError; the exception is also a TypeError
    with pytest.raises(ValueError, match="must be of type `Tensor` or `Module`"):
        di.is_deferred("x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be of type `Tensor` or `Module`"):
        di.is_deferred(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="expects a tensor"):
        di.materialize_tensor([1])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="expects an nn.Module"):
        di.materialize_module(torch.ones(1))  # type: ignore[arg-type]
    m = di.deferred_init(nn.Linear, 2, 2)
    with pytest.raises(TypeError, match="check_fn must be callable"):
        di.materialize_module(m, check_fn=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="invalid device"):
        di.materialize_module(m, device="nonsense")
    with fake.fake_mode():
        t = torch.ones(3)
    # a fake tensor from fake_mode cannot be materialized: returned as is (torchdistX)
    assert di.materialize_tensor(t) is t
    assert not di.is_deferred(t) and not di.is_deferred(torch.ones(1))


def test_torchdistx_original_behaviours() -> None:
    # tests/python/test_deferred_init.py: materialize_tensor is a no-op for real tensors
    a = torch.ones([10])
    assert di.materialize_tensor(a) is a
    # README: repr of a deferred Linear, materialize_module returns None, values as eager
    torch.manual_seed(0)
    eager = nn.Linear(10, 20)
    torch.manual_seed(0)
    m = di.deferred_init(nn.Linear, 10, 20)
    assert repr(m.weight) == "Parameter containing:\ntensor(..., size=(20, 10), requires_grad=True, fake=True)"
    assert di.is_deferred(m) and di.is_deferred(m.weight) and di.is_deferred(m.bias)
    assert di.materialize_module(m) is None  # type: ignore[func-returns-value]
    assert not di.is_deferred(m) and not fake.is_fake(m.weight)
    assert isinstance(m.weight, nn.Parameter) and m.weight.requires_grad
    assert torch.equal(m.weight, eager.weight) and torch.equal(m.bias, eager.bias)
    # materializing twice is a no-op keeping the same objects
    w = m.weight
    di.materialize_module(m)
    assert m.weight is w
    # a module built eagerly (no deferred tensors) is not deferred; materialize_module leaves it alone
    plain = nn.Linear(2, 2)
    pw = plain.weight
    assert not di.is_deferred(plain)
    di.materialize_module(plain)
    assert plain.weight is pw
    # a module without any tensor is not deferred either
    assert not di.is_deferred(di.deferred_init(nn.ReLU))


def test_torchdistx_design_note_examples() -> None:
    # docs/src/fake_tensor_and_deferred_init.rst: zeros_like must materialize on the real device,
    # and a later in-place op on the base changes an earlier view
    class MyModule(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.buf1 = torch.ones([3], device="cpu")
            self.buf2 = torch.zeros_like(self.buf1)
            a = torch.ones([2, 2])
            self.b = a.view(-1)
            a.add_(2)
            self.c = torch.ones([3], device="cpu")
            self.d = self.c if self.c.is_cuda else self.c + 1

    mod = di.deferred_init(MyModule)
    buf1 = di.materialize_tensor(mod.buf1)
    buf2 = di.materialize_tensor(mod.buf2)
    assert buf1.device.type == "cpu" and buf1.tolist() == [1.0, 1.0, 1.0]
    assert buf2.device.type == "cpu" and buf2.tolist() == [0.0, 0.0, 0.0]
    assert di.materialize_tensor(mod.b).tolist() == [3.0, 3.0, 3.0, 3.0]
    assert di.materialize_tensor(mod.d).tolist() == [2.0, 2.0, 2.0]
    # plain attributes are materialized by materialize_tensor, not by materialize_module
    assert di.materialize_tensor(mod.buf1) is buf1


def test_materialize_tensor_aliases_and_requires_grad() -> None:
    def build() -> nn.Module:
        mod = nn.Module()
        mod.w = nn.Parameter(torch.ones(4, 2))
        mod.frozen = nn.Parameter(torch.full((3,), 2.0), requires_grad=False)
        mod.register_buffer("buf", torch.arange(6.0).requires_grad_(True))
        mod.shared = mod.w  # same Parameter under two names
        return mod

    m = di.deferred_init(build)
    w = di.materialize_tensor(m.w)
    assert di.materialize_tensor(m.shared) is w and isinstance(w, nn.Parameter) and w.requires_grad
    frozen = di.materialize_tensor(m.frozen)
    assert isinstance(frozen, nn.Parameter) and not frozen.requires_grad and frozen.tolist() == [2.0] * 3
    buf = di.materialize_tensor(m.buf)
    assert type(buf) is torch.Tensor and buf.requires_grad and buf.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    di.materialize_module(m)
    assert m.w is w and m.shared is w and m.frozen is frozen and m.buf is buf
    assert list(dict(m.named_parameters()).keys()) == ["w", "frozen"]


def test_buffers_only_and_check_fn_semantics() -> None:
    m = di.deferred_init(lambda: nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3), nn.Sequential(nn.Linear(3, 1))))
    di.materialize_module(m, buffers_only=True)
    assert not fake.is_fake(m[1].running_mean) and m[1].running_mean.tolist() == [0.0, 0.0, 0.0]
    assert m[1].num_batches_tracked.item() == 0
    assert fake.is_fake(m[0].weight) and fake.is_fake(m[1].weight) and di.is_deferred(m)
    # check_fn is asked about every module (children first); a rejected parent does not stop its children
    seen: list[str] = []

    def only_inner(mod: nn.Module) -> bool:
        seen.append(type(mod).__name__)
        return mod is m[2][0]

    di.materialize_module(m, check_fn=only_inner)
    assert seen == ["Linear", "BatchNorm1d", "Linear", "Sequential", "Sequential"]
    assert not fake.is_fake(m[2][0].weight) and fake.is_fake(m[0].weight) and fake.is_fake(m[1].weight)
    di.materialize_module(m)
    assert not di.is_deferred(m) and m[1].weight.tolist() == [1.0, 1.0, 1.0]


def test_nested_deferred_init() -> None:
    def outer() -> nn.Module:
        s = nn.Module()
        s.a = di.deferred_init(nn.Linear, 3, 2)  # nested: recorded once by the outer call
        s.b = nn.Linear(2, 2)
        return s

    torch.manual_seed(1)
    ea, eb = nn.Linear(3, 2), nn.Linear(2, 2)
    after = torch.rand(3)
    torch.manual_seed(1)
    m = di.deferred_init(outer)
    assert torch.equal(torch.rand(3), after)
    assert di.is_deferred(m.a) and di.is_deferred(m.b)
    di.materialize_module(m)
    assert torch.equal(m.a.weight, ea.weight) and torch.equal(m.a.bias, ea.bias)
    assert torch.equal(m.b.weight, eb.weight) and torch.equal(m.b.bias, eb.bias)
