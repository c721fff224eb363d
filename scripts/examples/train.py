#!/usr/bin/env python3
"""Training with activations offloaded to pinned host memory: 20 steps of a small transformer under
torch.autograd.graph.save_on_cpu(pin_memory=True). Every saved activation is a cudaHostAlloc'd tensor
filled by a D2H copy in the forward pass and copied back (H2D) in the backward pass. Prints the loss
of every step (exact, as float hex) so two runs can be compared bit for bit.

    python3 train.py --out /tmp/a.json
    LD_PRELOAD=libzrtier.so python3 train.py --out /tmp/b.json
    python3 train.py --compare /tmp/a.json /tmp/b.json     # exit 0 iff bit-identical

Also checks that the offloaded activations are pinned (is_pinned) and that emptying the host
allocator's cache (cudaFreeHost of every cached block) works.
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import suite_util  # noqa: E402  (the suite's JSON keys: speed, peak RSS, pinned bytes, digest)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"))
    args = ap.parse_args()

    if args.compare:
        a, b = (json.load(open(p)) for p in args.compare)
        same = a["losses"] == b["losses"]
        if "digest" in a and "digest" in b:  # losses and final weights (files from before it: losses only)
            same = same and a["digest"] == b["digest"]
        print(json.dumps({"bit_identical": same, "steps": len(a["losses"])}))
        return 0 if same else 1

    import torch
    import torch.nn as nn

    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(args.seed)
    dev = torch.device("cuda")

    layer = lambda: nn.TransformerEncoderLayer(args.dim, nhead=16, dim_feedforward=4 * args.dim,
                                               dropout=0.0, batch_first=True)
    model = nn.Sequential(*[layer() for _ in range(args.layers)], nn.Linear(args.dim, 256)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed)

    losses = []
    step_ends = []
    t0 = time.perf_counter()
    for step in range(args.steps):
        x = torch.randn(args.batch, args.seq, args.dim, generator=gen, device=dev)
        y = torch.randint(0, 256, (args.batch, args.seq), generator=gen, device=dev)
        with torch.autograd.graph.save_on_cpu(pin_memory=True):
            out = model(x)
            loss = nn.functional.cross_entropy(out.reshape(-1, 256), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.item()).hex())
        step_ends.append(time.perf_counter())
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0

    # A pinned tensor of activation size, as save_on_cpu makes them, must report is_pinned().
    probe = torch.empty(args.batch, args.seq, args.dim, pin_memory=True)
    assert probe.is_pinned(), "pinned tensor does not report is_pinned()"
    probe.copy_(torch.arange(probe.numel(), device=dev, dtype=torch.float32).view_as(probe))
    back = probe.to(dev)
    assert torch.equal(back, torch.arange(probe.numel(), device=dev, dtype=torch.float32).view_as(probe))
    del probe, back
    torch._C._host_emptyCache()  # cudaFreeHost of every cached pinned block

    result = {"losses": losses, "steps_per_s": args.steps / elapsed,
              "zrtier": "libzrtier" in os.environ.get("LD_PRELOAD", "")}
    # The suite's keys (scripts/examples/suite_util.py): steady speed after 2 warm-up steps, every step's
    # milliseconds, peak RSS, the pinned bytes, a digest over the losses and the final weights.
    step_ms = [(b - a) * 1e3 for a, b in zip([t0] + step_ends, step_ends)]
    steady = step_ms[2:] or step_ms
    digest = suite_util.Digest()
    for s in losses:
        digest.text(s)
    for name, p in model.named_parameters():
        digest.text(name)
        digest.tensor(p)
    stats = suite_util.pinned_stats()
    pinned, source = suite_util.pinned_bytes(stats, 0)
    result.update({"program": "train", "digest": digest.hexdigest(), "speed": 1e3 * len(steady) / sum(steady),
                   "speed_unit": "steps/s", "warmup_steps": 2, "step_ms": [round(m, 3) for m in step_ms],
                   "peak_rss_bytes": suite_util.peak_rss_bytes(), "pinned_bytes": pinned,
                   "pinned_bytes_source": source, **stats,
                   "config": {"steps": args.steps, "layers": args.layers, "dim": args.dim, "batch": args.batch,
                              "seq": args.seq, "seed": args.seed},
                   "zrtier_loaded": suite_util.zrtier_loaded(), "zrtier_env": suite_util.zrtier_env()})
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
