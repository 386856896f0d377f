"""The fused Triton TDP kernel: CPU dispatch keeps the torch path; GPU checks run where CUDA + triton exist."""

from __future__ import annotations

import importlib
import math
import sys

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dpcl.errors import InvalidParameterError
from dpcl.methods.pecl import tdp_triton
from dpcl.methods.pecl.tdp import TokenDP, torch_perturb_with_sigmas

GPU = tdp_triton.available()
needs_gpu = pytest.mark.skipif(not GPU, reason="needs a CUDA device and triton (CI has neither)")


def _tdp(device="cpu") -> TokenDP:
    return TokenDP(epsilon_lower=1.0, epsilon_upper=10.0, delta=1e-6, clip_norm=1.0, calibration="analytic",
                   releases=1, grid=64, device=device)


def _reference(embeddings, sigmas, clip, generator):
    """eq. 5 written out: e * min(1, C/||e||) + sigma * N(0, I), noise drawn first from the generator."""
    noise = torch.randn(embeddings.shape, generator=generator, dtype=embeddings.dtype)
    norms = torch.sqrt((embeddings.double() ** 2).sum(-1, keepdim=True))
    scale = torch.where(norms > clip, clip / torch.where(norms > 0, norms, 1.0), torch.ones_like(norms))
    return (embeddings.double() * scale + sigmas.double().unsqueeze(-1) * noise.double()).to(embeddings.dtype)


def test_import_without_triton_keeps_torch_path(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton -> ImportError
    monkeypatch.setitem(sys.modules, "triton.language", None)
    module = importlib.reload(tdp_triton)
    try:
        assert module.triton is None
        assert not module.available()
        assert not module.supports(torch.zeros(2, 3))
        tdp = _tdp()
        emb = torch.randn(2, 3, 5)
        sig = tdp.sigmas(torch.rand(2, 3))
        got = tdp.perturb_with_sigmas(emb, sig, torch.Generator().manual_seed(0))
        want = _reference(emb, sig, 1.0, torch.Generator().manual_seed(0))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    finally:
        monkeypatch.undo()
        importlib.reload(tdp_triton)


def test_package_imports_in_a_fresh_interpreter_without_triton():
    import subprocess

    code = ("import sys; sys.modules['triton'] = None; sys.modules['triton.language'] = None; "
            "import dpcl.methods.pecl as p, dpcl.methods.pecl.tdp_triton as t; "
            "assert t.triton is None and not t.available(); print('ok')")
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_cpu_tensors_never_reach_the_kernel(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("kernel called for a CPU tensor")

    monkeypatch.setattr(tdp_triton, "perturb_rows", boom)
    monkeypatch.setattr(tdp_triton, "embed_and_perturb", boom)
    tdp = _tdp()
    assert not tdp_triton.supports(torch.zeros(4, 8))
    emb = torch.randn(3, 4, 8)
    sig = tdp.sigmas(torch.rand(3, 4))
    tdp.perturb_with_sigmas(emb, sig, torch.Generator().manual_seed(1))
    tdp.embed_and_perturb(torch.randn(10, 8), torch.randint(0, 10, (3, 4)), sig, torch.Generator().manual_seed(1))


@given(
    batch=st.integers(1, 4), length=st.integers(1, 6), dim=st.integers(1, 17),
    spread=st.floats(0.0, 5.0), seed=st.integers(0, 2**31 - 1),
)
def test_cpu_dispatch_is_the_torch_mechanism(batch, length, dim, spread, seed):
    """On CPU, perturb_with_sigmas is bit-for-bit the torch path and matches eq. 5 written out."""
    tdp = _tdp()
    gen = torch.Generator().manual_seed(seed)
    emb = torch.randn(batch, length, dim, generator=gen) * spread
    emb[0, 0] = 0.0  # zero row: scale 1
    sig = tdp.sigmas(torch.rand(batch, length, generator=gen))
    got = tdp.perturb_with_sigmas(emb, sig, torch.Generator().manual_seed(seed))
    same = torch_perturb_with_sigmas(emb, sig, 1.0, torch.Generator().manual_seed(seed))
    assert torch.equal(got, same)
    torch.testing.assert_close(got, _reference(emb, sig, 1.0, torch.Generator().manual_seed(seed)),
                               rtol=1e-5, atol=1e-5)


def test_cpu_embed_and_perturb_is_lookup_then_step():
    tdp = _tdp()
    weight = torch.randn(50, 12)
    ids = torch.randint(0, 50, (3, 7))
    sig = tdp.sigmas(torch.rand(3, 7))
    got = tdp.embed_and_perturb(weight, ids, sig, torch.Generator().manual_seed(5))
    want = _reference(weight[ids], sig, 1.0, torch.Generator().manual_seed(5))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_direct_kernel_calls_refuse_what_they_cannot_run():
    with pytest.raises(InvalidParameterError, match="embeddings must be a CUDA tensor"):
        tdp_triton.perturb_rows(torch.zeros(2, 3), torch.zeros(2), 1.0)
    with pytest.raises(InvalidParameterError, match="weight must be a CUDA tensor"):
        tdp_triton.embed_and_perturb(torch.zeros(5, 3), torch.zeros(2, dtype=torch.long), torch.zeros(2), 1.0)
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(InvalidParameterError, match="clip_norm"):
            tdp_triton._check_clip(bad)


def test_stated_tail_bound_is_the_box_muller_radius_of_the_smallest_uniform():
    smallest_u1 = 0.5 * 2.0**-64  # words a = 0, b = 0: u1 = (0 + (0 + 1/2) 2^-32) 2^-32
    assert tdp_triton.MAX_NOISE_STDS == pytest.approx(math.sqrt(-2.0 * math.log(smallest_u1)), rel=1e-12)


# ---- GPU (skipped without CUDA + triton) -------------------------------------------------------


@needs_gpu
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 2**-7), (torch.float16, 2**-10)])
def test_gpu_clip_matches_torch_with_zero_noise(dtype, tol):
    emb = (torch.randn(16, 33, 101, device="cuda") * torch.rand(16, 33, 1, device="cuda") * 0.3).to(dtype)
    emb[0, 0] = 0
    out = tdp_triton.perturb_rows(emb, torch.zeros(16, 33, device="cuda"), 1.0, torch.Generator("cuda").manual_seed(0))
    e = emb.float()
    want = e * torch.clamp(1.0 / torch.linalg.vector_norm(e, dim=-1, keepdim=True).clamp_min(1e-12), max=1.0)
    assert out.dtype == dtype
    assert (out.float() - want).abs().max().item() <= tol


@needs_gpu
def test_gpu_fused_gather_matches_lookup_and_checks_ids():
    weight = torch.randn(300, 64, device="cuda")
    ids = torch.randint(0, 300, (8, 9), device="cuda")
    zero = torch.zeros(8, 9, device="cuda")
    out = tdp_triton.embed_and_perturb(weight, ids, zero, 2.0, torch.Generator("cuda").manual_seed(0))
    e = weight[ids]
    want = e * torch.clamp(2.0 / torch.linalg.vector_norm(e, dim=-1, keepdim=True), max=1.0)
    torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)
    with pytest.raises(InvalidParameterError, match="token_ids must lie in"):
        tdp_triton.embed_and_perturb(weight, ids + 300, zero, 2.0)
    with pytest.raises(InvalidParameterError, match="sigmas must have the shape"):
        tdp_triton.embed_and_perturb(weight, ids, zero[:, :3], 2.0)


@needs_gpu
def test_gpu_noise_is_gaussian_per_token_fresh_and_seeded():
    from scipy import stats

    tdp = _tdp("cuda")
    emb = torch.randn(32, 64, 512, device="cuda")
    sig = tdp.sigmas(torch.rand(32, 64, device="cuda"))
    gen = torch.Generator("cuda").manual_seed(3)
    clipped = tdp_triton.perturb_rows(emb, torch.zeros_like(sig), 1.0, gen)
    out = tdp.perturb_with_sigmas(emb, sig, gen)
    z = ((out - clipped) / sig.unsqueeze(-1)).double()
    n = z.numel()  # 1,048,576
    assert abs(z.mean().item()) * math.sqrt(n) < 5
    assert abs(((z * z).sum().item() - n) / math.sqrt(2 * n)) < 5
    assert stats.kstest(z.flatten().cpu().numpy(), "norm").pvalue > 1e-4
    assert z.abs().max().item() <= tdp_triton.MAX_NOISE_STDS
    again = ((tdp.perturb_with_sigmas(emb, sig, gen) - clipped) / sig.unsqueeze(-1)).double()
    assert abs(np.corrcoef(z.flatten().cpu(), again.flatten().cpu())[0, 1]) < 5 / math.sqrt(n)
    first = tdp.perturb_with_sigmas(emb, sig, torch.Generator("cuda").manual_seed(9))
    assert torch.equal(first, tdp.perturb_with_sigmas(emb, sig, torch.Generator("cuda").manual_seed(9)))


@needs_gpu
def test_gpu_grad_mode_falls_back_to_torch():
    weight = torch.randn(20, 8, device="cuda", requires_grad=True)
    assert not tdp_triton.supports(weight)
    with torch.no_grad():
        assert tdp_triton.supports(weight)


class _FakeCudaGenerator:
    """What _noise_call reads of a CUDA generator: its device, seed and Philox offset (a CPU machine has none)."""

    device = torch.device("cuda")

    def __init__(self, seed: int) -> None:
        self.seed, self.offset = seed, 0

    def initial_seed(self) -> int:
        return self.seed

    def get_offset(self) -> int:
        return self.offset


def test_a_cuda_generator_keeps_one_noise_stream_until_it_is_reseeded_or_drawn_from(monkeypatch):
    """Calls on an untouched generator share one key and get the call numbers 0, 1, 2, ... (fresh Philox inputs
    without a device RNG launch per call); a re-seed or any other draw from the generator starts a new stream."""
    keys = []

    def draw(generator, device):  # the key draw advances the generator, as torch.randint does
        generator.offset += 4
        keys.append(torch.tensor([generator.seed, generator.offset], dtype=torch.int64))
        return keys[-1]

    monkeypatch.setattr(tdp_triton, "_noise_key", draw)
    gen = _FakeCudaGenerator(5)
    calls = [tdp_triton._noise_call(gen, torch.device("cuda")) for _ in range(3)]
    assert len(keys) == 1 and all(c[0] is keys[0] for c in calls)
    assert [(lo, hi) for _, lo, hi in calls] == [(0, 0), (1, 0), (2, 0)]
    gen.offset += 8  # something else drew from the generator: a new key, numbered from 0
    key, lo, hi = tdp_triton._noise_call(gen, torch.device("cuda"))
    assert len(keys) == 2 and key is keys[1] and (lo, hi) == (0, 0)
    gen.seed, gen.offset = 5, 0  # re-seeded: the first stream's key again (the noise is the generator's state's)
    key, lo, hi = tdp_triton._noise_call(gen, torch.device("cuda"))
    assert torch.equal(key, keys[0]) and (lo, hi) == (0, 0)
    tdp_triton._STREAMS[id(gen)][1].calls = 2**40 + 2**31 + 3  # a long stream: the call number in two 31-bit words
    _, lo, hi = tdp_triton._noise_call(gen, torch.device("cuda"))
    assert (hi << 31) | lo == 2**40 + 2**31 + 3 and 0 <= lo < 2**31 and 0 <= hi < 2**31
    tdp_triton._STREAMS[id(gen)][1].calls = tdp_triton._MAX_STREAM_CALLS  # exhausted: a new key rather than a repeat
    _, lo, hi = tdp_triton._noise_call(gen, torch.device("cuda"))
    assert len(keys) == 4 and (lo, hi) == (0, 0)


def test_cpu_generators_and_the_default_one_draw_a_key_per_call(monkeypatch):
    drawn = []
    monkeypatch.setattr(tdp_triton, "_noise_key", lambda g, d: drawn.append(g) or torch.zeros(2, dtype=torch.int64))
    cpu = torch.Generator().manual_seed(1)
    for generator in (cpu, cpu, None):
        assert tdp_triton._noise_call(generator, torch.device("cpu"))[1:] == (0, 0)
    assert drawn == [cpu, cpu, None]


def test_noise_streams_are_bounded_and_an_evicted_generator_draws_a_new_key(monkeypatch):
    monkeypatch.setattr(tdp_triton, "_STREAMS", {})
    drawn = []

    def draw(generator, device):
        generator.offset += 4
        drawn.append(generator)
        return torch.zeros(2, dtype=torch.int64)

    monkeypatch.setattr(tdp_triton, "_noise_key", draw)
    gens = [_FakeCudaGenerator(i) for i in range(tdp_triton._MAX_STREAMS + 5)]
    for gen in gens:
        tdp_triton._noise_call(gen, torch.device("cuda"))
    assert len(tdp_triton._STREAMS) == tdp_triton._MAX_STREAMS and len(drawn) == len(gens)
    assert tdp_triton._noise_call(gens[0], torch.device("cuda"))[1:] == (0, 0) and drawn[-1] is gens[0]  # evicted
    assert tdp_triton._noise_call(gens[-1], torch.device("cuda"))[1:] == (1, 0)  # kept: its second call
