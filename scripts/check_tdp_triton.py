"""GPU check of the fused Triton TDP kernel (dpcl.methods.pecl.tdp_triton): clip, noise statistics, timing.

``python scripts/check_tdp_triton.py`` on a CUDA machine with triton. Batch
64 x 128 tokens, width 768 (GPT-2 small). Prints one JSON object and exits 1
when a check fails:

1. clip: with sigma = 0 the kernel's output equals the torch path's
   ``e * min(1, C / ||e||)`` (rows with norm above, below and at zero), for the
   row kernel and the fused gather, in float32 (and bf16/fp16 within their rounding);
2. noise: ``z = (out - clip(e)) / sigma_i`` over 64 x 128 x 768 = 6.3e6 samples
   with per-token sigmas: mean ~ 0, variance ~ 1 (chi-square of the sum of
   squares against its chi2(n) law), per-token variance vs sigma_i (worst of
   8192 tokens against chi2(768)), Kolmogorov-Smirnov against N(0, 1), max |z|
   within the sampler's bound, correlation ~ 0 between two calls and between
   the two Box-Muller branches, and same generator seed -> same noise;
3. timing with CUDA events, twice: per call (median of many repetitions after
   warm-up; includes the host's launch overhead whenever the GPU waits for it)
   and GPU-only (calls queued behind a GPU sleep, so they run back to back):
   embedding lookup; lookup + TDP via torch; lookup + TDP via the kernel
   (the path ``TokenDP.perturb_with_sigmas`` dispatches to); the fused
   gather + TDP (``TokenDP.embed_and_perturb``, with and without its id check).
"""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import torch
from scipy import stats

from dpcl.methods.pecl import tdp_triton
from dpcl.methods.pecl.tdp import TokenDP, torch_perturb_with_sigmas


def _torch_clip(e: torch.Tensor, clip: float) -> torch.Tensor:
    e = e.float()
    return e * torch.clamp(clip / torch.linalg.vector_norm(e, dim=-1, keepdim=True).clamp_min(1e-12), max=1.0)


def _median_ms(fn, reps: int = 300, warmup: int = 30) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return float(np.median([s.elapsed_time(e) for s, e in zip(starts, ends)]))


def _gpu_ms(fn, reps: int = 100) -> float:
    """Mean GPU time per call with the host out of the way: the calls queue behind a ~50 ms GPU sleep,
    so the device runs them back to back (launch overhead on the host is hidden, not counted)."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int(1e8))
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main() -> int:
    assert tdp_triton.available(), "needs CUDA and triton"
    dev = "cuda"
    torch.manual_seed(0)
    B, L, D, V, C = 64, 128, 768, 50257, 1.0
    failures: list[str] = []
    report: dict = {"device": torch.cuda.get_device_name(), "batch": [B, L], "dim": D}

    embedding = torch.nn.Embedding(V, D).to(dev)
    weight = embedding.weight.detach()
    weight[:10] *= 0.01  # rows under the clip norm (N(0,1) rows of width 768 have norm ~27.7)
    weight[10] = 0.0  # zero row: scale 1, no division by zero
    ids = torch.randint(0, V, (B, L), device=dev)
    ids[0, :11] = torch.arange(11, device=dev)
    scores = torch.rand(B, L, device=dev)
    tdp = TokenDP(epsilon_lower=1.0, epsilon_upper=10.0, delta=1e-6, clip_norm=C, calibration="analytic",
                  releases=1, device=dev)
    sigmas = tdp.sigmas(scores)
    gen = torch.Generator(device=dev).manual_seed(1)
    emb = embedding(ids).detach()

    # 1. clip (sigma = 0)
    zero = torch.zeros_like(sigmas)
    clip_ref = _torch_clip(emb, C)
    errs = {
        "rows_fp32": (tdp_triton.perturb_rows(emb, zero, C, gen) - clip_ref).abs().max().item(),
        "gather_fp32": (tdp_triton.embed_and_perturb(weight, ids, zero, C, gen) - clip_ref).abs().max().item(),
        "rows_bf16": (tdp_triton.perturb_rows(emb.bfloat16(), zero, C, gen).float()
                      - _torch_clip(emb.bfloat16(), C)).abs().max().item(),
        "rows_fp16": (tdp_triton.perturb_rows(emb.half(), zero, C, gen).float()
                      - _torch_clip(emb.half(), C)).abs().max().item(),
    }
    report["clip_max_abs_error"] = errs
    tol = {"rows_fp32": 1e-6, "gather_fp32": 1e-6, "rows_bf16": 2 ** -7, "rows_fp16": 2 ** -10}
    failures += [f"clip {k} error {v}" for k, v in errs.items() if not v <= tol[k]]
    small_rows = tdp_triton.perturb_rows(emb, zero, C, gen)[0, :11]
    if not torch.equal(small_rows, emb[0, :11]):
        failures.append("rows with norm <= C (and the zero row) are not passed through unchanged")

    # 2. noise statistics
    out = tdp.perturb_with_sigmas(emb, sigmas, gen)  # dispatches to the kernel on CUDA
    z = ((out - clip_ref) / sigmas.unsqueeze(-1)).double()
    n = z.numel()
    mean = z.mean().item()
    sumsq = (z * z).sum().item()
    chi_total = (sumsq - n) / math.sqrt(2 * n)  # chi2(n) standardised
    per_token = (z * z).sum(-1).flatten().cpu().numpy()  # each ~ chi2(D)
    p_tok = stats.chi2.sf(per_token, D)
    p_tok_low = stats.chi2.cdf(per_token, D)
    worst_token_p = float(min(p_tok.min(), p_tok_low.min()) * 2 * per_token.size)  # Bonferroni, two-sided
    # per-token variance vs sigma_i: the ratios' spread across sigma levels
    sig_flat = sigmas.flatten().cpu().numpy()
    slope = float(np.polyfit(sig_flat, per_token / D, 1)[0])
    zs = z.flatten()
    sample = zs[torch.randperm(n, device=dev)[:1_000_000]].cpu().numpy()
    ks = stats.kstest(sample, "norm")
    max_abs = zs.abs().max().item()
    out2 = tdp.perturb_with_sigmas(emb, sigmas, gen)
    z2 = ((out2 - clip_ref) / sigmas.unsqueeze(-1)).double().flatten()
    corr_calls = torch.corrcoef(torch.stack([zs, z2]))[0, 1].item()
    half = (D + 1) // 2
    za, zb = z[..., :half].flatten(), z[..., half:].flatten()
    corr_branches = torch.corrcoef(torch.stack([za, zb]))[0, 1].item()
    g1 = torch.Generator(device=dev).manual_seed(7)
    g2 = torch.Generator(device=dev).manual_seed(7)
    same_seed = torch.equal(tdp.perturb_with_sigmas(emb, sigmas, g1), tdp.perturb_with_sigmas(emb, sigmas, g2))
    # a generator's noise stream: re-seeding it restarts the stream (the same noise again), drawing from it in
    # between starts a new one (other noise), and calls on the untouched generator never repeat a noise
    g3 = torch.Generator(device=dev).manual_seed(11)
    first = [tdp.perturb_with_sigmas(emb, sigmas, g3) for _ in range(3)]
    g3.manual_seed(11)
    again = [tdp.perturb_with_sigmas(emb, sigmas, g3) for _ in range(3)]
    torch.randint(0, 2, (1,), generator=g3, device=dev)
    after_draw = tdp.perturb_with_sigmas(emb, sigmas, g3)
    stream_ok = {
        "reseed_repeats_the_calls": all(torch.equal(a, b) for a, b in zip(first, again)),
        "calls_differ": not any(torch.equal(first[i], first[j]) for i in range(3) for j in range(i + 1, 3)),
        "other_draw_gives_new_noise": not any(torch.equal(after_draw, a) for a in first + again),
    }
    report["noise"] = {
        "samples": n, "mean": mean, "mean_z_score": mean * math.sqrt(n), "variance": sumsq / n,
        "chi2_total_z_score": chi_total, "worst_token_chi2_p_bonferroni": worst_token_p,
        "per_token_variance_vs_sigma_slope": slope, "ks_statistic_1e6": float(ks.statistic),
        "ks_p_1e6": float(ks.pvalue), "max_abs_z": max_abs, "bound": tdp_triton.MAX_NOISE_STDS,
        "corr_between_calls": corr_calls, "corr_between_box_muller_branches": corr_branches,
        "same_seed_same_noise": same_seed, "noise_stream": stream_ok, "sigma_range": [float(sig_flat.min()), float(sig_flat.max())],
    }
    five_se = 5 / math.sqrt(n)
    if abs(mean * math.sqrt(n)) > 5:
        failures.append(f"noise mean {mean}")
    if abs(chi_total) > 5:
        failures.append(f"total variance chi-square z = {chi_total}")
    if worst_token_p < 1e-3:
        failures.append(f"a token's variance is off (Bonferroni p = {worst_token_p})")
    if abs(slope) > 0.05:
        failures.append(f"per-token variance depends on sigma (slope {slope})")
    if ks.pvalue < 1e-4:
        failures.append(f"KS p = {ks.pvalue}")
    if max_abs > tdp_triton.MAX_NOISE_STDS:
        failures.append(f"|z| = {max_abs} beyond the sampler bound")
    if abs(corr_calls) > five_se or abs(corr_branches) > 5 / math.sqrt(za.numel()):
        failures.append(f"noise correlated: calls {corr_calls}, branches {corr_branches}")
    failures += [f"noise stream: {k} is false" for k, v in stream_ok.items() if not v]
    if not same_seed:
        failures.append("same generator seed gave different noise")
    if torch.equal(out, out2):
        failures.append("two calls returned the same noise")

    # 3. timing (CUDA events, median)
    with torch.no_grad():
        timing = {
            "embedding_forward_ms": _median_ms(lambda: embedding(ids)),
            "lookup_plus_tdp_torch_ms": _median_ms(lambda: torch_perturb_with_sigmas(embedding(ids), sigmas, C, gen)),
            "lookup_plus_tdp_kernel_ms": _median_ms(lambda: tdp.perturb_with_sigmas(embedding(ids), sigmas, gen)),
            "fused_gather_tdp_ms": _median_ms(lambda: tdp.embed_and_perturb(embedding.weight, ids, sigmas, gen)),
            "fused_gather_tdp_without_id_check_ms": _median_ms(
                lambda: tdp_triton._launch(weight, ids.reshape(-1), sigmas, B * L, D, C, gen, weight.dtype)),
        }
        launch = lambda: tdp_triton._launch(weight, ids.reshape(-1), sigmas, B * L, D, C, gen, weight.dtype)
        timing["gpu_only"] = {
            "embedding_forward_ms": _gpu_ms(lambda: embedding(ids)),
            "lookup_plus_tdp_torch_ms": _gpu_ms(lambda: torch_perturb_with_sigmas(embedding(ids), sigmas, C, gen)),
            "lookup_plus_tdp_kernel_ms": _gpu_ms(lambda: tdp.perturb_with_sigmas(embedding(ids), sigmas, gen)),
            "fused_gather_tdp_without_id_check_ms": _gpu_ms(launch),
        }
        sweep = {}
        default = (tdp_triton._BLOCK_M, tdp_triton._BLOCK_P, tdp_triton._NUM_WARPS)
        for bm, bp, nw in ((1, 128, 1), (1, 128, 2), (2, 128, 2), (2, 128, 4), (4, 128, 4), (4, 64, 2),
                           (8, 128, 8), (4, 256, 4), (1, 256, 4)):
            tdp_triton._BLOCK_M, tdp_triton._BLOCK_P, tdp_triton._NUM_WARPS = bm, bp, nw
            name = f"bm{bm}_bp{bp}_w{nw}"
            try:
                clip_err = (tdp_triton._launch(weight, ids.reshape(-1), zero, B * L, D, C, gen, weight.dtype)
                            .reshape(B, L, D) - clip_ref).abs().max().item()
                zc = (launch().reshape(B, L, D) - clip_ref) / sigmas.unsqueeze(-1)
                sweep[name] = {"gpu_ms": _gpu_ms(launch), "event_median_ms": _median_ms(launch, reps=100),
                               "clip_err": clip_err, "noise_var": (zc.double() ** 2).mean().item()}
                if clip_err > 1e-6 or abs(sweep[name]["noise_var"] - 1) > 5 * math.sqrt(2 / zc.numel()):
                    failures.append(f"config {name}: clip error {clip_err}, noise variance {sweep[name]['noise_var']}")
            except Exception as exc:  # noqa: BLE001 - a configuration that does not compile is reported, not fatal
                sweep[name] = repr(exc)[:300]
        tdp_triton._BLOCK_M, tdp_triton._BLOCK_P, tdp_triton._NUM_WARPS = default
        timing["fused_kernel_config_sweep"] = sweep
    base = timing["embedding_forward_ms"]
    for key in ("lookup_plus_tdp_torch_ms", "lookup_plus_tdp_kernel_ms", "fused_gather_tdp_ms",
                "fused_gather_tdp_without_id_check_ms"):
        timing["ratio_" + key.removesuffix("_ms")] = timing[key] / base
    gpu = timing["gpu_only"]
    for key in list(gpu):
        gpu["ratio_" + key.removesuffix("_ms")] = gpu[key] / gpu["embedding_forward_ms"]
    report["timing"] = timing
    report["failures"] = failures
    print(json.dumps(report, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
