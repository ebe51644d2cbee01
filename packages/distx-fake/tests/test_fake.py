"""fake_mode / is_fake / meta_like: torchdistX's behaviours and printing."""

from __future__ import annotations

import sys

import pytest
import torch

from distx_fake import fake


def test_printing_matches_torchdistx() -> None:
    with fake.fake_mode(fake_cuda=True):
        a = torch.ones([10])
        b = torch.ones([20], device="cuda")
        c = torch.zeros(2, 3, dtype=torch.float16, requires_grad=True)
        lin = torch.nn.Linear(10, 20)
    assert repr(a) == "tensor(..., size=(10,), fake=True)"
    assert repr(b) == "tensor(..., size=(20,), device=cuda, fake=True)"
    assert repr(c) == "tensor(..., size=(2, 3), dtype=torch.float16, requires_grad=True, fake=True)"
    assert repr(lin.weight) == "Parameter containing:\ntensor(..., size=(20, 10), requires_grad=True, fake=True)"
    assert isinstance(lin.weight, torch.nn.Parameter)


def test_fake_cuda_flag_is_scoped_and_nestable() -> None:
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    with fake.fake_mode():
        with pytest.raises(RuntimeError, match="fake_cuda=True"):
            torch.ones(3, device="cuda")
        with fake.fake_mode(fake_cuda=True):
            x = torch.ones(3, device="cuda")
            y = x * 2 + 1
            with fake.fake_mode(), pytest.raises(RuntimeError, match="CUDA is not available"):
                torch.empty(2, device="cuda")  # inner block without the flag
            z = torch.zeros(1, device="cuda:1")
        with pytest.raises(RuntimeError, match="fake_cuda=True"):
            torch.ones(3, device="cuda")  # undone on exit
    assert y.device == torch.device("cuda", 0) and fake.is_fake(y)
    assert z.device == torch.device("cuda", 1)
    assert repr(z) == "tensor(..., size=(1,), device=cuda:1, fake=True)"


def test_to_cuda_under_fake_cuda_without_gpu() -> None:
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    cuda0 = torch.device("cuda", 0)
    real = torch.ones(10)
    with fake.fake_mode(fake_cuda=True):
        a = torch.ones(10)
        moved = [a.to("cuda"), a.cuda(), a.cuda(0), a.to(torch.device("cuda")), a.to(device="cuda"), real.to("cuda")]
        half = a.to("cuda", torch.float16)
        made = [torch.empty(2, 3, device="cuda"), torch.tensor([1.0, 2.0], device="cuda")]
        made.append(torch.as_tensor([1, 2], device="cuda"))
        lin = torch.nn.Linear(4, 5).to("cuda")
        emb = torch.nn.Embedding(7, 4).cuda()
        back = moved[0].cpu()
        x = torch.randn(2, 3, 4, device="cuda", requires_grad=True)
        # ops on fake CUDA tensors that require grad (autograd without a CUDA runtime aborted
        # the process before), indexing, .contiguous(), copy_
        y = lin(x).relu().sum(-1)
        z = emb(torch.tensor([[1, 2]], device="cuda")).transpose(0, 1).contiguous()
        w = x[0, :, None, 1:3]
        x2 = torch.zeros(2, 3, 4, device="cuda")
        x2[0] = 1.0
        x2.copy_(x.detach())
        with torch.no_grad():
            lin.weight.normal_()
        # a Python-level torch function indexing / making contiguous inside its body
        enc = torch.nn.TransformerEncoderLayer(8, 2, dim_feedforward=16).cuda()
        h = enc(torch.randn(5, 3, 8, device="cuda"))
    for t in moved:
        assert fake.is_fake(t) and t.device == cuda0 and t.shape == (10,)
        assert repr(t) == "tensor(..., size=(10,), device=cuda, fake=True)"
    assert repr(half) == "tensor(..., size=(10,), dtype=torch.float16, device=cuda, fake=True)"
    assert repr(made[0]) == "tensor(..., size=(2, 3), device=cuda, fake=True)"
    assert made[1].shape == (2,) and made[1].device == cuda0 and made[2].dtype == torch.int64
    assert all(fake.is_fake(t) for t in made)
    for mod in (lin, emb):
        for p in mod.parameters():
            assert fake.is_fake(p) and p.device == cuda0 and isinstance(p, torch.nn.Parameter) and p.requires_grad
    assert (
        repr(lin.weight)
        == "Parameter containing:\ntensor(..., size=(5, 4), device=cuda, requires_grad=True, fake=True)"
    )
    assert fake.is_fake(back) and back.device == torch.device("cpu")
    assert y.shape == (2, 3) and y.device == cuda0 and y.requires_grad and fake.is_fake(y)
    assert z.shape == (2, 1, 4) and z.is_contiguous() and z.device == cuda0
    assert w.shape == (3, 1, 2) and w.requires_grad
    assert h.shape == (5, 3, 8) and h.device == cuda0 and h.requires_grad and fake.is_fake(h)
    assert not x.detach().requires_grad and not torch.zeros_like(x).requires_grad
    # the flag is undone on exit: torch refuses CUDA again with its own error, and a fake block
    # without the flag with a hint (not the CUDA backend's NotImplementedError, a RuntimeError)
    with pytest.raises((AssertionError, RuntimeError)) as err:
        torch.ones(2).to("cuda")
    assert not isinstance(err.value, NotImplementedError), err.value
    with fake.fake_mode(), pytest.raises(RuntimeError, match="fake_cuda=True"):
        torch.ones(2).to("cuda:0")


def test_no_storage_for_huge_tensors_and_ops() -> None:
    before = _rss()
    with fake.fake_mode():
        big = torch.empty(1 << 40, dtype=torch.float32)  # 4 TiB
        m = torch.empty(1 << 20, 1 << 20)  # 4 TiB
        p = m @ m
        q = torch.nn.functional.gelu(p).sum(dim=0)
        v = m[::2].t()
    assert _rss() - before < 50 << 20
    assert big.numel() == 1 << 40 and p.shape == (1 << 20, 1 << 20) and q.shape == (1 << 20,)
    assert v.shape == (1 << 20, 1 << 19) and v.stride() == (1, 1 << 21)
    assert fake.is_fake(big) and fake.is_fake(q)
    # ops on fake tensors keep working outside the block
    r = (big[:10] + 1).to(torch.float64)
    assert fake.is_fake(r) and r.dtype == torch.float64 and r.shape == (10,)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_reading_values_raises_clearly() -> None:
    with fake.fake_mode():
        a = torch.ones(4)
    for read in (lambda: a.sum().item(), a.tolist, a.numpy, lambda: bool(a[0]), lambda: float(a[0])):
        with pytest.raises(fake.FakeDataError, match="fake tensors have no storage"):
            read()


def test_meta_like_and_is_fake() -> None:
    with fake.fake_mode():
        a = torch.empty(4, 6, dtype=torch.bfloat16).t()
        p = torch.nn.Parameter(torch.empty(3))
    m = fake.meta_like(a)
    assert m.device.type == "meta" and m.shape == (6, 4) and m.stride() == (1, 6) and m.dtype == torch.bfloat16
    # torchdistX: "same Autograd behavior as detach()"
    assert p.requires_grad and not fake.meta_like(p).requires_grad
    assert fake.is_fake(a) and not fake.is_fake(torch.ones(1)) and not fake.is_fake(3)
    with pytest.raises(ValueError, match="`fake` was expected to be a fake tensor"):
        fake.meta_like(torch.ones(2))
    with pytest.raises(ValueError, match="expected to be a fake tensor"):
        fake.meta_like(torch.ones(2, device="meta"))


def test_torchdistx_docs_examples() -> None:
    # docs/src/fake_tensor.rst and the README of torchdistX
    a = torch.ones([10], device="meta")
    assert a.device == torch.device("meta") and not fake.is_fake(a)
    with fake.fake_mode(fake_cuda=True):
        b = torch.ones([10])
        c = torch.ones([20], device="cuda")
    assert b.device == torch.device("cpu") and fake.is_fake(b)
    assert repr(b) == "tensor(..., size=(10,), fake=True)"
    assert repr(c) == "tensor(..., size=(20,), device=cuda, fake=True)"
    # torchdistX does not patch torch.cuda.is_available(): fake_cuda only lets CUDA tensors be faked
    if not torch.cuda.is_available():
        with fake.fake_mode(fake_cuda=True):
            assert torch.cuda.is_available() is False


def test_ops_on_real_tensors_run_for_real_inside_fake_mode() -> None:
    # torchdistX's Fake handler fakes factories and ops touching a fake tensor; an op whose
    # tensor arguments are all real (and without a device argument) runs on the real backend
    r = torch.ones(3)
    with fake.fake_mode():
        s = r * 2
        r.add_(1)  # really updates r
        f = torch.zeros(3)  # factory: fake
        g = f + r  # touches a fake: fake
        h = torch.empty_like(r)  # has a device argument: fake
    assert not fake.is_fake(s) and s.tolist() == [2.0, 2.0, 2.0]
    assert r.tolist() == [2.0, 2.0, 2.0]
    assert fake.is_fake(f) and fake.is_fake(g) and fake.is_fake(h)


def test_mixing_real_tensors_and_views() -> None:
    real = torch.arange(6.0).reshape(2, 3)
    with fake.fake_mode():
        f = torch.ones(2, 3)
        g = f + real
        f.add_(real)  # in place returns the same object
        h = f.view(3, 2)
    assert fake.is_fake(g) and g.shape == (2, 3)
    assert h.untyped_storage()._cdata == f.untyped_storage()._cdata


def test_bad_input() -> None:
    with pytest.raises(TypeError, match="fake_cuda must be a bool"), fake.fake_mode(fake_cuda="yes"):  # type: ignore[arg-type]
        pass


def test_does_not_import_dynamo() -> None:
    # the light fake mode keeps torch._dynamo (and its ~70 MB) out of the process
    import subprocess

    code = (
        "import sys, torch\n"
        "from distx_fake import fake\n"
        "with fake.fake_mode():\n"
        "    m = torch.nn.TransformerEncoderLayer(64, 4)\n"
        "    t = torch.tril(torch.ones(8, 8))\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "False"


def test_cuda_lazy_init_state_restored_after_fake_cuda_block() -> None:
    # torchdistX reset torch's "CUDA initialised" flag on exit; before the fix a CUDA factory
    # after one fake_cuda block raised NotImplementedError (CUDA backend) instead of torch's error
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    import subprocess

    code = (
        "import torch\n"
        "from distx_fake import fake\n"
        "def err():\n"
        "    try:\n"
        "        torch.ones(10, device='cuda')\n"
        "    except Exception as e:\n"
        "        return f'{type(e).__name__}: {e}'\n"
        "    return 'no error'\n"
        "before = err()\n"
        "with fake.fake_mode(fake_cuda=True):\n"
        "    with fake.fake_mode(fake_cuda=True):\n"
        "        a = torch.ones(10, device='cuda')\n"
        "    b = torch.zeros(3, device='cuda:1')\n"
        "print(repr(before))\n"
        "print(repr(err()))\n"
        "with fake.fake_mode(fake_cuda=True):\n"
        "    c = torch.empty(2, device='cuda')\n"
        "print(repr(err()))\n"
        "print(fake.is_fake(a), fake.is_fake(b), fake.is_fake(c), a.device, c.device)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    before, after, again, last = out.stdout.strip().splitlines()
    # torch's own error (on a CPU build "AssertionError: Torch not compiled with CUDA enabled")
    assert before.startswith(("'AssertionError", "'RuntimeError")), before
    assert after == before and again == before
    assert last == "True True True cuda:0 cuda:0"
