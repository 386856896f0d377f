"""Fused Triton kernel for PeCL's token-level DP step on CUDA: clip + per-token Gaussian noise in one pass.

The mechanism is eq. 5 of ``000_*`` / eq. 7 of ``002_*`` exactly as
:meth:`dpcl.methods.pecl.tdp.TokenDP.perturb_with_sigmas` computes it on CPU:
``out_i = e_i * min(1, C / ||e_i||_2) + N(0, sigma_i^2 I)`` for every token row
``e_i`` (norm accumulated in float32; ``||e_i|| = 0`` gives scale 1). Each row is
read once and written once; :func:`embed_and_perturb` also fuses the embedding
gather ``weight[token_id]``, so lookup + TDP costs one read of the looked-up
rows and one write.

Why a hand-written kernel: the torch path launches a norm, a clamp, a
``randn`` and two in-place updates (five passes over the tensor), and
``torch.compile`` cannot fuse a ``torch.Generator`` argument into its kernel.
No library ships a fused clip-and-noise kernel that takes the step's generator.

Noise (the privacy-relevant part):

* Fresh and secret: a noise stream draws a 62-bit Philox key and a 62-bit
  counter offset from the ``torch.Generator`` the step receives (seeded per task
  from OS entropy, or from the configured seed under ``reproducible_noise``),
  and numbers its calls 0, 1, 2, ...; call ``n`` uses the counter offset
  ``offset + n`` and, inside the call, the counter words (column pair, row), so
  no two elements of a call, and no two calls of a stream, share a Philox input,
  and two streams share one only if the generator repeats 124 random bits. A
  CUDA generator keeps its stream while nothing else draws from it or re-seeds
  it (its seed and Philox offset are where the key draw left them); otherwise
  the next call draws a new key, so the noise stays a function of the
  generator's state (same seed, same calls: same noise). Drawing the key once
  per stream rather than once per call saves a device RNG launch per call (see
  :func:`_noise_call`); the other generators (CPU ones, ``None``) draw per call.
* Gaussian: Box-Muller on Philox-4x32-10 outputs, both branches used (one
  Philox call gives the normals of columns ``j`` and ``j + ceil(d/2)``). It
  does not use ``tl.randn``: that clamps its uniform at 1e-7, so its noise is
  truncated at ``sqrt(-2 ln 1e-7) = 5.68`` standard deviations, and a shift of
  the mean by the sensitivity ``2C`` then moves output mass outside the
  neighbour's support (an event of unbounded privacy loss with probability
  ``P(Z > 5.68 - 2C/sigma)``, which is far above typical deltas when
  ``sigma ~ C``). Here the radius uniform is built from two 32-bit words,
  ``u1 = (a + (b + 1/2) 2^-32) 2^-32`` in ``(2^-65, 1]``, so the noise reaches
  ``sqrt(130 ln 2) = 9.49`` standard deviations (``torch.randn`` on CUDA:
  6.76); :data:`MAX_NOISE_STDS` states the bound.

Importing this module never fails: without triton (or without CUDA)
:func:`available` is False and :mod:`dpcl.methods.pecl.tdp` keeps its torch path.
"""

from __future__ import annotations

import math

import torch

from dpcl.errors import InvalidParameterError

try:  # triton ships with CUDA builds of torch only; CPU installs keep the torch path
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the install
    triton = None
    tl = None

#: Largest |noise| / sigma this sampler can produce: sqrt(-2 ln 2^-65).
MAX_NOISE_STDS = math.sqrt(130.0 * math.log(2.0))

#: Dtypes the kernel reads and writes (norm and noise are computed in float32).
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

_BLOCK_M = 4  # token rows per program
_BLOCK_P = 128  # column pairs per tile (width 768: three tiles, no masked lanes)
_NUM_WARPS = 4


def available() -> bool:
    """True when triton imports and a CUDA device is present."""
    return triton is not None and torch.cuda.is_available()


def supports(embeddings: torch.Tensor) -> bool:
    """True when the fused kernel can run on ``embeddings``.

    CUDA, float32/16/bf16, triton present, and no autograd graph wanted (the
    kernel has no backward; the noise step runs under ``torch.no_grad`` in training).
    """
    return (
        available()
        and embeddings.is_cuda
        and embeddings.dtype in SUPPORTED_DTYPES
        and embeddings.dim() >= 1
        and not (embeddings.requires_grad and torch.is_grad_enabled())
    )


if triton is not None:

    @triton.jit(do_not_specialize=["call_lo", "call_hi"])
    def _tdp_kernel(
        src_ptr, ids_ptr, sigma_ptr, out_ptr, key_ptr, call_lo, call_hi,
        n_rows, n_src_rows, dim, half, src_stride, out_stride, clip_norm, poison,
        GATHER: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr,
    ):
        # BLOCK_M token rows per program; a row is walked in tiles of BLOCK_P column pairs (j, j + half),
        # twice: once for the norm, once for clip + noise (the second read hits cache).
        pid = tl.program_id(0)
        rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < n_rows
        if GATHER:
            src_rows = tl.load(ids_ptr + rows, mask=row_ok, other=0).to(tl.int64)
            # Never read outside the table; embed_and_perturb has validated the ids already.
            row_ok_src = row_ok & (src_rows >= 0) & (src_rows < n_src_rows)
        else:
            src_rows = rows.to(tl.int64)
            row_ok_src = row_ok
        src = src_ptr + src_rows[:, None] * src_stride
        dst = out_ptr + rows.to(tl.int64)[:, None] * out_stride
        jp = tl.arange(0, BLOCK_P)

        sumsq = tl.zeros([BLOCK_M], dtype=tl.float32)
        for p0 in range(0, half, BLOCK_P):
            cols_a = p0 + jp
            cols_b = cols_a + half
            xa = tl.load(src + cols_a[None, :], mask=row_ok_src[:, None] & (cols_a < half)[None, :], other=0.0)
            xb = tl.load(src + cols_b[None, :], mask=row_ok_src[:, None] & (cols_b < dim)[None, :], other=0.0)
            xa = xa.to(tl.float32)
            xb = xb.to(tl.float32)
            sumsq += tl.sum(xa * xa, axis=1) + tl.sum(xb * xb, axis=1)
        norm = tl.sqrt(sumsq)
        scale = tl.where(norm > clip_norm, clip_norm / norm, 1.0)  # min(1, C/||x||), 1 at ||x|| = 0
        sigma = tl.load(sigma_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
        if GATHER:
            bad = row_ok & ~row_ok_src  # unreachable after validation; poison rather than emit a wrong row

        key = tl.load(key_ptr)
        # the stream's counter offset (< 2^62) plus the call's number (< 2^62, two 31-bit words): < 2^63
        call = tl.load(key_ptr + 1) + ((call_hi.to(tl.int64) << 31) | call_lo.to(tl.int64))
        zeros = tl.zeros([BLOCK_M, BLOCK_P], dtype=tl.uint32)
        c1 = zeros + rows.to(tl.uint32)[:, None]
        c2 = zeros + (call & 0xFFFFFFFF).to(tl.uint32)
        c3 = zeros + ((call >> 32) & 0xFFFFFFFF).to(tl.uint32)
        for p0 in range(0, half, BLOCK_P):
            cols_a = p0 + jp
            cols_b = cols_a + half
            mask_a = row_ok[:, None] & (cols_a < half)[None, :]
            mask_b = row_ok[:, None] & (cols_b < dim)[None, :]
            xa = tl.load(src + cols_a[None, :], mask=row_ok_src[:, None] & (cols_a < half)[None, :], other=0.0)
            xb = tl.load(src + cols_b[None, :], mask=row_ok_src[:, None] & (cols_b < dim)[None, :], other=0.0)
            c0 = zeros + cols_a.to(tl.uint32)[None, :]
            r0, r1, r2, _r3 = tl.philox(key, c0, c1, c2, c3)
            # u1 in (2^-65, 1]: Box-Muller's radius uniform, never log(0); 2^-32, 2^-64 are exact in float32.
            u1 = r0.to(tl.float32) * 2.3283064365386963e-10 + (r1.to(tl.float32) + 0.5) * 5.421010862427522e-20
            u1 = tl.minimum(u1, 1.0)
            radius = tl.sqrt(-2.0 * tl.log(u1))
            theta = r2.to(tl.float32) * (6.283185307179586 * 2.3283064365386963e-10)
            out_a = xa.to(tl.float32) * scale[:, None] + sigma[:, None] * (radius * tl.cos(theta))
            out_b = xb.to(tl.float32) * scale[:, None] + sigma[:, None] * (radius * tl.sin(theta))
            if GATHER:
                out_a = tl.where(bad[:, None], poison, out_a)
                out_b = tl.where(bad[:, None], poison, out_b)
            tl.store(dst + cols_a[None, :], out_a.to(out_ptr.dtype.element_ty), mask=mask_a)
            tl.store(dst + cols_b[None, :], out_b.to(out_ptr.dtype.element_ty), mask=mask_b)


def _noise_key(generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """Two fresh 62-bit words (Philox key, counter offset) from the step's generator, on ``device``.

    Stays on the device (no host sync): the kernel loads the words itself.
    """
    gen_device = generator.device if generator is not None else device
    words = torch.randint(0, 2**62, (2,), generator=generator, device=gen_device, dtype=torch.int64)
    return words.to(device, non_blocking=True)


class _NoiseStream:
    """A Philox key and counter offset drawn once from a CUDA generator, and the number of calls made on it."""

    __slots__ = ("key", "device", "calls", "state")

    def __init__(self, key: torch.Tensor, device: torch.device, state: tuple[int, int]) -> None:
        self.key, self.device, self.calls, self.state = key, device, 0, state


#: The noise streams of the CUDA generators last used, by ``id`` (each entry holds its generator, so the id is
#: not reused while the entry exists; torch.Generator takes no weak references before torch 2.13). At most
#: :data:`_MAX_STREAMS`, the oldest dropped first (its generator then draws a new key at its next call).
_STREAMS: "dict[int, tuple[torch.Generator, _NoiseStream]]" = {}
_MAX_STREAMS = 64
#: Calls a stream takes before it draws a new key (the call number must fit in 62 bits).
_MAX_STREAM_CALLS = 2**62


def _generator_state(generator: torch.Generator) -> tuple[int, int]:
    return int(generator.initial_seed()), int(generator.get_offset())


def _noise_call(generator: torch.Generator | None, device: torch.device) -> tuple[torch.Tensor, int, int]:
    """The key words (on ``device``) and the call number (two 31-bit words) of the next fused TDP call.

    A CUDA generator's key is drawn once and reused with a fresh call number while the
    generator is left as the key draw left it (same seed, same Philox offset): no
    device RNG launch per call. Anything else draws a new key (call number 0).
    """
    if generator is None or generator.device.type != "cuda":
        return _noise_key(generator, device), 0, 0
    held = _STREAMS.get(id(generator))
    stream = held[1] if held is not None and held[0] is generator else None
    if stream is None or stream.state != _generator_state(generator) or stream.calls >= _MAX_STREAM_CALLS \
            or stream.device != device:
        key = _noise_key(generator, device)
        stream = _NoiseStream(key, device, _generator_state(generator))  # read after the draw: what it stays at
        _STREAMS.pop(id(generator), None)
        while len(_STREAMS) >= _MAX_STREAMS:
            _STREAMS.pop(next(iter(_STREAMS)))
        _STREAMS[id(generator)] = (generator, stream)
    number = stream.calls
    stream.calls += 1
    return stream.key, number & 0x7FFFFFFF, number >> 31


def _check_clip(clip_norm: float) -> float:
    clip = float(clip_norm)
    if not (math.isfinite(clip) and clip > 0):
        raise InvalidParameterError(f"clip_norm must be a finite number > 0, got {clip_norm!r}")
    return clip


def _launch(src: torch.Tensor, ids: torch.Tensor | None, sigmas: torch.Tensor, n_rows: int, dim: int,
            clip: float, generator: torch.Generator | None, dtype: torch.dtype) -> torch.Tensor:
    if n_rows >= 2**31:
        raise InvalidParameterError(f"the fused TDP kernel takes fewer than 2^31 token rows, got {n_rows}")
    device = src.device
    sigma_rows = sigmas.reshape(-1).to(device=device, dtype=torch.float32).contiguous()
    out = torch.empty((n_rows, dim), dtype=dtype, device=device)
    if n_rows == 0 or dim == 0:
        return out
    half = (dim + 1) // 2
    key, call_lo, call_hi = _noise_call(generator, device)
    grid = (triton.cdiv(n_rows, _BLOCK_M),)
    _tdp_kernel[grid](
        src, ids if ids is not None else sigma_rows, sigma_rows, out, key, call_lo, call_hi,
        n_rows, src.shape[0], dim, half, src.stride(0), out.stride(0), clip, math.nan,
        GATHER=ids is not None, BLOCK_M=_BLOCK_M, BLOCK_P=min(_BLOCK_P, triton.next_power_of_2(half)),
        num_warps=_NUM_WARPS,
    )
    return out


def _require(tensor: torch.Tensor, name: str) -> None:
    if not supports(tensor):
        raise InvalidParameterError(
            f"{name} must be a CUDA tensor of dtype float32, float16 or bfloat16, with triton installed and "
            f"no autograd graph requested (got device={tensor.device}, dtype={tensor.dtype}, "
            f"requires_grad={tensor.requires_grad}, triton={'yes' if triton else 'no'})"
        )


def perturb_rows(embeddings: torch.Tensor, sigmas: torch.Tensor, clip_norm: float,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """``clip(e, C) + N(0, sigma^2 I)`` for every row of ``embeddings [..., d]`` with ``sigmas [...]``, fused.

    Same result distribution as the torch path of ``TokenDP.perturb_with_sigmas``.
    """
    _require(embeddings, "embeddings")
    clip = _check_clip(clip_norm)
    if tuple(sigmas.shape) != tuple(embeddings.shape[:-1]):
        raise InvalidParameterError(
            f"sigmas must have the shape of embeddings without its last axis, {tuple(embeddings.shape[:-1])}; "
            f"got {tuple(sigmas.shape)}"
        )
    dim = embeddings.shape[-1]
    rows = embeddings.reshape(-1, dim)
    if dim and rows.stride(1) != 1:
        rows = rows.contiguous()
    out = _launch(rows, None, sigmas, rows.shape[0], dim, clip, generator, embeddings.dtype)
    return out.reshape(embeddings.shape)


def embed_and_perturb(weight: torch.Tensor, token_ids: torch.Tensor, sigmas: torch.Tensor, clip_norm: float,
                      generator: torch.Generator | None = None, *, ids_checked: bool = False) -> torch.Tensor:
    """``clip(weight[token_ids], C) + N(0, sigma^2 I)``: the embedding gather fused with the TDP step.

    ``weight [V, d]``, ``token_ids [...]`` (integers in ``[0, V)``, checked here
    with one host sync unless the caller already checked them and says so with
    ``ids_checked=True``, e.g. once per task), ``sigmas`` of the shape of
    ``token_ids``; returns ``[..., d]``.
    """
    _require(weight, "weight")
    clip = _check_clip(clip_norm)
    if weight.dim() != 2:
        raise InvalidParameterError(f"weight must be a [vocab, dim] matrix, got shape {tuple(weight.shape)}")
    if token_ids.dtype not in (torch.int64, torch.int32) or token_ids.device != weight.device:
        raise InvalidParameterError(
            f"token_ids must be int64/int32 on {weight.device}, got {token_ids.dtype} on {token_ids.device}"
        )
    if tuple(sigmas.shape) != tuple(token_ids.shape):
        raise InvalidParameterError(
            f"sigmas must have the shape of token_ids {tuple(token_ids.shape)}, got {tuple(sigmas.shape)}"
        )
    ids = token_ids.reshape(-1).contiguous()
    vocab, dim = weight.shape
    if ids.numel() and not ids_checked:
        low, high = (int(v) for v in torch.aminmax(ids))
        if low < 0 or high >= vocab:
            raise InvalidParameterError(f"token_ids must lie in [0, {vocab}), got values in [{low}, {high}]")
    table = weight if (dim == 0 or weight.stride(1) == 1) else weight.contiguous()
    out = _launch(table, ids, sigmas, ids.numel(), dim, clip, generator, weight.dtype)
    return out.reshape(*token_ids.shape, dim)
