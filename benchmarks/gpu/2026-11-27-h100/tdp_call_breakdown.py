"""Where does the fused TDP call's per-call time go? Variants timed like scripts/check_tdp_triton.py."""
import json, math, time
import numpy as np
import torch
from dpcl.methods.pecl import tdp_triton as tt

dev = "cuda"
B, L, D, V, C = 64, 128, 768, 50257, 1.0
emb_mod = torch.nn.Embedding(V, D).to(dev)
weight = emb_mod.weight.detach()
ids = torch.randint(0, V, (B, L), device=dev)
flat = ids.reshape(-1).contiguous()
sig = torch.rand(B, L, device=dev) + 1.0
sig_rows = sig.reshape(-1).contiguous()
gen = torch.Generator(device=dev).manual_seed(1)
out = torch.empty((B * L, D), device=dev)
key = torch.randint(0, 2**62, (2,), device=dev, dtype=torch.int64)
half = (D + 1) // 2
grid = (triton_cdiv := (B * L + tt._BLOCK_M - 1) // tt._BLOCK_M,)
BP = min(tt._BLOCK_P, 1 << (half - 1).bit_length())

def median_ms(fn, reps=400, warmup=50):
    for _ in range(warmup): fn()
    torch.cuda.synchronize()
    s = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    e = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for a, b in zip(s, e):
        a.record(); fn(); b.record()
    torch.cuda.synchronize()
    return float(np.median([a.elapsed_time(b) for a, b in zip(s, e)]))

def wall_us(fn, reps=2000):
    for _ in range(50): fn()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(reps): fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps * 1e6

def launch_fixed():
    tt._tdp_kernel[grid](weight, flat, sig_rows, out, key, B * L, V, D, half, weight.stride(0), out.stride(0), C,
                         math.nan, GATHER=True, BLOCK_M=tt._BLOCK_M, BLOCK_P=BP, num_warps=tt._NUM_WARPS)

def key_only():
    tt._noise_key(gen, torch.device(dev))

R = {}
with torch.no_grad():
    cases = {
        "embedding": lambda: emb_mod(ids),
        "current_launch": lambda: tt._launch(weight, flat, sig, B * L, D, C, gen, weight.dtype),
        "kernel_fixed_key_prealloc": launch_fixed,
        "noise_key_draw_only": key_only,
        "empty_only": lambda: torch.empty((B * L, D), device=dev),
    }
    for name, fn in cases.items():
        try:
            R[name] = {"event_median_ms": median_ms(fn), "wall_us": wall_us(fn)}
        except Exception as exc:
            R[name] = repr(exc)[:400]
    # CUDA graph of the whole current call, the generator registered with the graph
    try:
        g = torch.cuda.CUDAGraph()
        gen2 = torch.Generator(device=dev).manual_seed(2)
        has_reg = hasattr(g, "register_generator_state")
        if has_reg:
            g.register_generator_state(gen2)
        s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                tt._launch(weight, flat, sig, B * L, D, C, gen2, weight.dtype)
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            gout = tt._launch(weight, flat, sig, B * L, D, C, gen2, weight.dtype)
        g.replay(); a = gout.clone(); g.replay(); b = gout.clone()
        R["graph"] = {"register_generator_state": has_reg, "fresh_noise_per_replay": not torch.equal(a, b),
                      "event_median_ms": median_ms(g.replay), "wall_us": wall_us(g.replay)}
        z = (a.reshape(B, L, D) - tt.perturb_rows(emb_mod(ids), torch.zeros_like(sig), C, gen)) / sig.unsqueeze(-1)
        R["graph"]["noise_var"] = float((z.double() ** 2).mean())
    except Exception as exc:
        R["graph"] = repr(exc)[:600]
    try:
        g2 = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3): emb_mod(ids)
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g2):
            eo = emb_mod(ids)
        R["embedding_graph"] = {"event_median_ms": median_ms(g2.replay), "wall_us": wall_us(g2.replay)}
    except Exception as exc:
        R["embedding_graph"] = repr(exc)[:400]
print(json.dumps(R, indent=1))
