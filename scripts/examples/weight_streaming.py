#!/usr/bin/env python3
"""Training with the weights streamed from pinned host memory, the RamTorch / ZeRO-Offload pattern.

Each transformer layer's weights live on the host in pinned memory: an fp32 master copy (the CPU
optimizer's parameter) and a bf16 compute copy, one flat buffer each per layer, made with
.pin_memory(). A step streams layer i's bf16 weights to the GPU with non_blocking copies on a side
stream, double-buffered with events (layer i+1 is copied while layer i computes); the forward keeps only
each layer's input on the GPU; the backward streams the weights again in reverse, recomputes the layer and
takes its gradients (activation checkpointing, as offloaders do), converts them to fp32 and copies them
back into pinned fp32 gradient buffers with non_blocking copies on a second side stream. Then
torch.optim.AdamW (fused, on the CPU) updates the pinned fp32 masters, and each layer's bf16 copy is
refreshed from its master on the CPU. The token embedding and the LM head stay on the GPU, frozen.

    python3 weight_streaming.py --out /tmp/a.json
    LD_PRELOAD=libzrtier.so python3 weight_streaming.py --out /tmp/b.json
    python3 weight_streaming.py --compare /tmp/a.json /tmp/b.json   # exit 0 iff bit-identical

The digest covers every step's loss and the final fp32 master weights. Speed: tokens/s; `phase_ms`: the
steady steps' mean wall time in the GPU phase (forward, backward, gradients copied back), the CPU
optimizer step and the bf16 refresh.
Default: 12 layers of a Llama-shaped 0.6B model (dim 2048, MLP 5632); pins 7.5 GiB (masters 3 GiB,
bf16 copies 1.5 GiB, gradients 3 GiB, each flat buffer rounded up to a power of two by PyTorch).
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import suite_util  # noqa: E402  (sets CUBLAS_WORKSPACE_CONFIG before torch is imported)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=5632)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    suite_util.add_run_args(ap, steps=20, warmup=3, lr=1e-4, seed=11)
    ap.add_argument("--optim-impl", choices=("fused", "foreach", "for-loop"), default="fused",
                    help="torch.optim.AdamW implementation on the CPU (fused falls back to for-loop "
                         "where this PyTorch has no fused CPU AdamW)")
    args = ap.parse_args()
    if args.small:
        args.layers, args.dim, args.intermediate, args.heads, args.vocab = 2, 512, 1408, 4, 4096
        args.batch, args.seq, args.steps, args.warmup = 2, 256, 3, 1
    return args


def main():
    args = parse_args()
    if args.compare:
        return suite_util.compare(args.compare)

    import torch
    import torch.nn.functional as F

    suite_util.set_deterministic(args.seed)
    dev = torch.device("cuda")
    torch.cuda.init()
    bf16, fp32 = torch.bfloat16, torch.float32
    L, D, I, NH, V = args.layers, args.dim, args.intermediate, args.heads, args.vocab
    HD = D // NH
    B, S = args.batch, args.seq

    # One layer's weights, in the order of its flat buffers.
    shapes = {"ln1": (D,), "wqkv": (3 * D, D), "wo": (D, D), "ln2": (D,), "w1": (I, D), "w3": (I, D),
              "w2": (D, I)}
    offsets, n = {}, 0
    for name, shape in shapes.items():
        numel = 1
        for s in shape:
            numel *= s
        offsets[name] = (n, numel, shape)
        n += numel
    layer_numel = n

    def views(flat):
        return {name: flat[o:o + k].view(shape) for name, (o, k, shape) in offsets.items()}

    # Host state: pinned fp32 masters (the optimizer's parameters), pinned bf16 compute copies and pinned
    # fp32 gradient buffers, one flat tensor each per layer. The values are drawn on the GPU (fast,
    # deterministic) and brought over as a model loaded on the CPU would be: .cpu(), then .pin_memory().
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed)
    masters, compute, grads = [], [], []
    pinned_tensor_bytes = 0
    for _ in range(L):
        w = torch.empty(layer_numel, dtype=fp32, device=dev)
        for name, (o, k, shape) in offsets.items():
            if name.startswith("ln"):
                w[o:o + k].fill_(1.0)
            else:
                w[o:o + k].normal_(0.0, 0.02, generator=gen)
        master = torch.nn.Parameter(w.cpu().pin_memory())
        del w
        bf = master.detach().to(bf16).pin_memory()
        grad = torch.zeros(layer_numel, dtype=fp32).pin_memory()
        master.grad = grad  # the D2H copies write into it in place; never set to None
        masters.append(master)
        compute.append(bf)
        grads.append(grad)
        pinned_tensor_bytes += layer_numel * (4 + 2 + 4)
    assert all(t.is_pinned() for t in masters + compute + grads), "host weights are not pinned"

    embed = (torch.randn((V, D), generator=gen, device=dev) * 0.02).to(bf16)
    head = (torch.randn((V, D), generator=gen, device=dev) * 0.02).to(bf16)
    head_norm = torch.ones(D, device=dev, dtype=bf16)

    impl = {"fused": {"fused": True}, "foreach": {"foreach": True}, "for-loop": {"foreach": False}}
    optim_impl = args.optim_impl
    try:
        opt = torch.optim.AdamW(masters, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1, **impl[optim_impl])
    except (RuntimeError, ValueError) as e:
        print(f"weight_streaming: AdamW({optim_impl}) unavailable on the CPU ({e}); using for-loop", file=sys.stderr)
        optim_impl = "for-loop"
        opt = torch.optim.AdamW(masters, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1, foreach=False)

    # GPU side: two weight slots (H2D double buffer) and two fp32 gradient staging buffers (D2H).
    compute_stream = torch.cuda.current_stream()
    h2d = torch.cuda.Stream()
    d2h = torch.cuda.Stream()
    slots = [torch.empty(layer_numel, dtype=bf16, device=dev) for _ in range(2)]
    ready = [torch.cuda.Event() for _ in range(2)]
    free = [torch.cuda.Event() for _ in range(2)]
    gstage = [torch.empty(layer_numel, dtype=fp32, device=dev) for _ in range(2)]
    gready = [torch.cuda.Event() for _ in range(2)]
    gfree = [torch.cuda.Event() for _ in range(2)]

    def fetch(layer, slot):
        """Queue layer's bf16 weights into slot on the H2D stream once the slot's last user is done."""
        with torch.cuda.stream(h2d):
            h2d.wait_event(free[slot])
            slots[slot].copy_(compute[layer], non_blocking=True)
            ready[slot].record(h2d)

    def rms(x, w):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w

    def block(x, w):
        h = rms(x, w["ln1"])
        q, k, v = F.linear(h, w["wqkv"]).view(B, S, 3, NH, HD).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, S, D)
        x = x + F.linear(a, w["wo"])
        h = rms(x, w["ln2"])
        return x + F.linear(F.silu(F.linear(h, w["w1"])) * F.linear(h, w["w3"]), w["w2"])

    tokgen = torch.Generator(device=dev)
    tokgen.manual_seed(args.seed + 1)

    def train_step():
        tokens = torch.randint(0, V, (B, S + 1), generator=tokgen, device=dev)
        x = embed[tokens[:, :-1]]
        for e in free + gfree:
            e.record(compute_stream)

        # Forward: stream layer by layer; keep each layer's input (the checkpoint).
        inputs = []
        k = 0  # fetches this step; fetch k uses slot k % 2
        fetch(0, 0)
        with torch.no_grad():
            for i in range(L):
                slot = k % 2
                compute_stream.wait_event(ready[slot])
                if i + 1 < L:
                    fetch(i + 1, (k + 1) % 2)
                inputs.append(x)
                x = block(x, views(slots[slot]))
                free[slot].record(compute_stream)
                k += 1

        # Loss through the (frozen, GPU-resident) head; its input gradient starts the backward.
        xl = x.detach().requires_grad_(True)
        logits = F.linear(rms(xl, head_norm), head)
        loss = F.cross_entropy(logits.float().reshape(-1, V), tokens[:, 1:].reshape(-1))
        loss.backward()
        gy = xl.grad
        del logits, xl

        # Backward: stream the weights again in reverse, recompute, take the gradients, send them home.
        fetch(L - 1, k % 2)
        for j, i in enumerate(reversed(range(L))):
            slot = k % 2
            compute_stream.wait_event(ready[slot])
            if i > 0:
                fetch(i - 1, (k + 1) % 2)
            x_in = inputs[i].detach().requires_grad_(True)
            ws = {name: t.detach().requires_grad_(True) for name, t in views(slots[slot]).items()}
            with torch.enable_grad():
                y = block(x_in, ws)
            torch.autograd.backward(y, gy)
            gy = x_in.grad
            gs = j % 2
            compute_stream.wait_event(gfree[gs])  # its previous D2H copy has finished
            for name, (o, n_, _) in offsets.items():
                gstage[gs][o:o + n_].copy_(ws[name].grad.reshape(-1))  # bf16 -> fp32 on the GPU
            free[slot].record(compute_stream)
            gready[gs].record(compute_stream)
            with torch.cuda.stream(d2h):
                d2h.wait_event(gready[gs])
                grads[i].copy_(gstage[gs], non_blocking=True)
                gfree[gs].record(d2h)
            del y, ws, x_in
            inputs[i] = None
            k += 1
        d2h.synchronize()  # every gradient is in its pinned buffer
        t_gpu = time.perf_counter()

        # CPU optimizer on the pinned masters, then the bf16 compute copies from them.
        opt.step()
        t_opt = time.perf_counter()
        with torch.no_grad():
            for m, c in zip(masters, compute):
                c.copy_(m)
        # The three phases' wall times (each ends at a point the step waits for anyway).
        phases.append((t_gpu, t_opt, time.perf_counter()))
        return loss

    losses = []
    phases = []  # per step: (GPU work and gradients in, optimizer done, bf16 copies refreshed)
    starts = []
    steps = args.warmup + args.steps
    timer = suite_util.StepTimer(args.warmup)
    timer.start()
    for _ in range(steps):
        starts.append(time.perf_counter())
        loss = train_step()
        losses.append(suite_util.loss_hex(loss))
        timer.step()
    steady = list(zip(starts, phases))[args.warmup:]
    phase_ms = {name: round(sum((p[k] - (p[k - 1] if k else s)) for s, p in steady) * 1e3 / len(steady), 3)
                for k, name in enumerate(("gpu", "optimizer", "refresh"))} if steady else {}

    digest = suite_util.Digest()
    for s in losses:
        digest.text(s)
    for m in masters:
        digest.tensor(m)
    stats = suite_util.pinned_stats()
    pinned, source = suite_util.pinned_bytes(stats, pinned_tensor_bytes)
    result = {
        "program": "weight_streaming",
        "digest": digest.hexdigest(),
        "losses": losses,
        **timer.fields(B * S, "tokens/s"),
        "phase_ms": phase_ms,
        "peak_rss_bytes": suite_util.peak_rss_bytes(),
        "pinned_bytes": pinned,
        "pinned_bytes_source": source,
        "pinned_tensor_bytes": pinned_tensor_bytes,
        **stats,
        "config": {"layers": L, "dim": D, "intermediate": I, "heads": NH, "vocab": V, "batch": B, "seq": S,
                   "steps": args.steps, "warmup": args.warmup, "lr": args.lr, "optim_impl": optim_impl,
                   "streamed_params": layer_numel * L, "cpu_threads": torch.get_num_threads(),
                   "seed": args.seed, "small": args.small},
        **suite_util.common_fields(),
    }
    suite_util.write_result(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
