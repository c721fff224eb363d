#!/usr/bin/env python3
"""Training with every saved activation offloaded to pinned host memory: the forward pass runs under
torch.autograd.graph.save_on_cpu(pin_memory=True), so each tensor autograd saves for the backward (layer
inputs, attention q/k/v and output, MLP activations, the bf16 casts of the weights) is copied into a pinned
host tensor (torch.empty(pin_memory=True) + a D2H copy) and copied back to the GPU (H2D, non_blocking) when
the backward needs it. The bigger, timed sibling of train.py: a GPT-style transformer (pre-LayerNorm,
GELU MLP) with fp32 parameters under bf16 autocast, AdamW on the GPU, several GiB of saved activations
per step, which PyTorch's caching host allocator keeps and reuses from step to step.

    python3 save_on_cpu_train.py --out /tmp/a.json
    LD_PRELOAD=libzrtier.so python3 save_on_cpu_train.py --out /tmp/b.json
    python3 save_on_cpu_train.py --compare /tmp/a.json /tmp/b.json   # exit 0 iff bit-identical

The digest covers every step's loss and the final weights. Speed: steps/s (tokens/s beside it).
Default: 8 layers, dim 2048, batch 4 x 2048 tokens: about 5.7 GiB of activations saved per step (most
of them exact powers of two, so the caching host allocator adds little rounding).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import suite_util  # noqa: E402  (sets CUBLAS_WORKSPACE_CONFIG before torch is imported)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--classes", type=int, default=1024, help="output classes of the head")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    suite_util.add_run_args(ap, steps=40, warmup=3, lr=1e-4, seed=7)
    args = ap.parse_args()
    if args.small:
        args.layers, args.dim, args.heads, args.classes = 2, 512, 4, 256
        args.batch, args.seq, args.steps, args.warmup = 2, 256, 3, 1
    return args


def main():
    args = parse_args()
    if args.compare:
        return suite_util.compare(args.compare)

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    suite_util.set_deterministic(args.seed)
    dev = torch.device("cuda")
    D, NH = args.dim, args.heads

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(D)
            self.qkv = nn.Linear(D, 3 * D)
            self.proj = nn.Linear(D, D)
            self.ln2 = nn.LayerNorm(D)
            self.fc1 = nn.Linear(D, 4 * D)
            self.fc2 = nn.Linear(4 * D, D)

        def forward(self, x):
            B, S, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(B, S, 3, NH, D // NH).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, S, D)
            x = x + self.proj(a)
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    with torch.device(dev):
        model = nn.Sequential(*[Block() for _ in range(args.layers)], nn.LayerNorm(D), nn.Linear(D, args.classes))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, foreach=True)
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed)

    losses = []
    steps = args.warmup + args.steps
    timer = suite_util.StepTimer(args.warmup)
    timer.start()
    for _ in range(steps):
        x = torch.randn(args.batch, args.seq, D, generator=gen, device=dev)
        y = torch.randint(0, args.classes, (args.batch, args.seq), generator=gen, device=dev)
        with torch.autograd.graph.save_on_cpu(pin_memory=True):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(x)
            loss = F.cross_entropy(out.float().reshape(-1, args.classes), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(suite_util.loss_hex(loss))
        timer.step()

    # The activations went through pinned tensors that must report is_pinned() (cudaPointerGetAttributes).
    probe = torch.empty(args.batch, args.seq, D, pin_memory=True)
    assert probe.is_pinned(), "a pinned tensor does not report is_pinned()"
    del probe

    digest = suite_util.Digest()
    for s in losses:
        digest.text(s)
    for name, p in model.named_parameters():
        digest.text(name)
        digest.tensor(p)
    stats = suite_util.pinned_stats()
    pinned, source = suite_util.pinned_bytes(stats, 0)
    result = {
        "program": "save_on_cpu_train",
        "digest": digest.hexdigest(),
        "losses": losses,
        **timer.fields(1, "steps/s"),
        "tokens_per_s": timer.rate(args.batch * args.seq),
        "peak_rss_bytes": suite_util.peak_rss_bytes(),
        "pinned_bytes": pinned,
        "pinned_bytes_source": source,
        **stats,
        "config": {"layers": args.layers, "dim": D, "heads": NH, "classes": args.classes, "batch": args.batch,
                   "seq": args.seq, "steps": args.steps, "warmup": args.warmup, "lr": args.lr,
                   "params": sum(p.numel() for p in model.parameters()), "seed": args.seed, "small": args.small},
        **suite_util.common_fields(),
    }
    suite_util.write_result(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
