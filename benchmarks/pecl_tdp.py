"""Benchmark: PeCL's TDP step vs the non-private forward of the embedding layer (issue quality bar: <= 2x).

``python benchmarks/pecl_tdp.py [--device cuda]`` times, for a batch of 64 x 128
tokens, (a) the token-embedding lookup alone and (b) lookup + TDP (sigma lookup
from the calibrated table, clipping, per-token Gaussian noise) as torch ops;
on CUDA with triton also (c) lookup + the fused Triton TDP kernel (what
``TokenDP.perturb_with_sigmas`` dispatches to there) and (d) the "Triton
fused" step, gather and TDP in one kernel (``TokenDP.embed_and_perturb``), with the
id check (one host sync) and without it (``ids_checked=True``, as training calls
it: the ids are checked once per task), its GPU time with the host's launch
overhead hidden, and a batched launch (one fused call over 8 batches against 8
lookups). Scores are
given and their sigmas looked up once, as training does once per task
(computing scores needs a forward pass of the LM, which is not part of the
noise step). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from dpcl.methods.pecl import tdp_triton
from dpcl.methods.pecl.tdp import TokenDP, torch_perturb_with_sigmas


def _time(fn, device: str, repeats: int) -> float:
    for _ in range(5):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def _gpu_time(fn, repeats: int) -> float:
    """Seconds of GPU time per call, the host's launch overhead hidden: the calls queue behind a GPU sleep."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int(1e8))
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1000 / repeats


#: Batches per fused call in the batched-launch timing.
BATCHED = 8


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--dim", type=int, default=768, help="embedding width (GPT-2 small: 768)")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--compile", action="store_true", help="also time a torch.compile-fused TDP step")
    args = parser.parse_args()
    device = args.device
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(50257, args.dim).to(device)
    ids = torch.randint(0, 50257, (64, 128), device=device)
    scores = torch.rand(64, 128, device=device)
    tdp = TokenDP(epsilon_lower=1.0, epsilon_upper=10.0, delta=1e-6, clip_norm=1.0, calibration="analytic",
                  releases=1, device=device)
    generator = torch.Generator(device=device).manual_seed(1)

    @torch.no_grad()
    def forward() -> torch.Tensor:
        return embedding(ids)

    token_sigmas = tdp.sigmas(scores)  # looked up once per task in training (scores are fixed for a task)

    @torch.no_grad()
    def private() -> torch.Tensor:
        return torch_perturb_with_sigmas(embedding(ids), token_sigmas, tdp.clip_norm, generator)

    plain = _time(forward, device, args.repeats)
    noisy = _time(private, device, args.repeats)
    result = {"device": device, "batch": [64, 128], "dim": args.dim, "embedding_forward_s": plain,
              "embedding_plus_tdp_s": noisy, "ratio": noisy / plain}
    if tdp_triton.supports(embedding.weight.detach()):
        with torch.no_grad():
            kernel = _time(lambda: tdp.perturb_with_sigmas(embedding(ids), token_sigmas, generator), device,
                           args.repeats)
            fused = _time(lambda: tdp.embed_and_perturb(embedding.weight, ids, token_sigmas, generator), device,
                          args.repeats)
            # what training calls: the ids are checked once per task, so no host sync per call
            checked = _time(lambda: tdp.embed_and_perturb(embedding.weight, ids, token_sigmas, generator,
                                                          ids_checked=True), device, args.repeats)
            # batched launches: one fused call over BATCHED batches against BATCHED lookups (training perturbs a
            # task's sequences in chunks of 256, once per epoch: dpcl.methods.pecl.learner)
            many_ids, many_sigmas = ids.repeat(BATCHED, 1), token_sigmas.repeat(BATCHED, 1)
            lookups = _time(lambda: [embedding(ids) for _ in range(BATCHED)], device, args.repeats) / BATCHED
            batched = _time(lambda: tdp.embed_and_perturb(embedding.weight, many_ids, many_sigmas, generator,
                                                          ids_checked=True), device, args.repeats) / BATCHED
            gpu_plain = _gpu_time(forward, args.repeats)
            gpu_fused = _gpu_time(lambda: tdp.embed_and_perturb(embedding.weight, ids, token_sigmas, generator,
                                                                ids_checked=True), args.repeats)
        result.update({"embedding_plus_tdp_triton_s": kernel, "ratio_triton": kernel / plain,
                       "triton_fused_gather_tdp_s": fused, "ratio_triton_fused": fused / plain,
                       "triton_fused_ids_checked_s": checked, "ratio_triton_fused_ids_checked": checked / plain,
                       "batched_calls": BATCHED, "embedding_per_batch_in_loop_s": lookups,
                       "triton_fused_batched_per_batch_s": batched, "ratio_batched": batched / lookups,
                       "gpu_embedding_s": gpu_plain, "gpu_triton_fused_ids_checked_s": gpu_fused,
                       "ratio_gpu": gpu_fused / gpu_plain})
    if args.compile:
        # The same arithmetic fused by torch.compile (global RNG: inductor does not take a Generator argument).
        table, grid, clip = tdp.sigma_table, tdp.grid, tdp.clip_norm

        def step(ids_, scores_):
            emb = embedding(ids_)
            index = torch.ceil(scores_.clamp(0.0, 1.0) * grid).long().clamp(0, grid)
            sigma = table[index].unsqueeze(-1)
            scale = torch.clamp(clip / torch.linalg.vector_norm(emb, dim=-1, keepdim=True).clamp_min(1e-12), max=1.0)
            return emb * scale + torch.randn_like(emb) * sigma

        fused = torch.compile(step)
        with torch.no_grad():
            result["embedding_plus_tdp_compiled_s"] = _time(lambda: fused(ids, scores), device, args.repeats)
        result["ratio_compiled"] = result["embedding_plus_tdp_compiled_s"] / plain
    print(json.dumps(result))


if __name__ == "__main__":
    main()
