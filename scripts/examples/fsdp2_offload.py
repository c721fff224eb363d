#!/usr/bin/env python3
"""FSDP2 training with CPU offload: torch.distributed.fsdp.fully_shard on every transformer block and on
the root of a ~1.1B-parameter Llama-shaped model, with CPUOffloadPolicy(pin_memory=True) and
MixedPrecisionPolicy(bf16 parameters, fp32 gradient reduction). Each rank keeps its fp32 parameter shard in
pinned host memory (.pin_memory() at fully_shard time), copies it to its GPU for every all-gather (forward,
and again in backward), copies its reduce-scattered gradient shard back into pinned memory
(.to("cpu", non_blocking=True)), and steps AdamW on the CPU over its shard.

Run under torchrun, one GPU per rank (LOCAL_RANK), NCCL:

    torchrun --standalone --nproc-per-node 2 fsdp2_offload.py --out /tmp/a.json
    LD_PRELOAD=libzrtier.so torchrun --standalone --nproc-per-node 2 fsdp2_offload.py --out /tmp/b.json
    python3 fsdp2_offload.py --compare /tmp/a.json /tmp/b.json   # exit 0 iff bit-identical

Rank 0 writes --out: the digest over every rank's step losses and every rank's final parameter shard
(each rank hashes its own, rank 0 hashes the list), each rank's peak RSS and pinned bytes and their sums.
Speed: tokens/s over all ranks. torchrun sets OMP_NUM_THREADS=1, which would starve the CPU optimizer:
each rank uses --threads CPU threads (default: the CPUs it may run on / local ranks).
Default: 18 layers, dim 2048, MLP 5632, vocab 32000 (1.06B parameters); each rank pins its fp32
parameter shard and its fp32 gradient shard, one block per parameter rounded up to a power of two:
about 5.3 GiB per rank (2 x 2.64 GiB; 2 x 1.97 GiB unrounded).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import suite_util  # noqa: E402  (sets CUBLAS_WORKSPACE_CONFIG before torch is imported)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=18)
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=5632)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--batch", type=int, default=4, help="sequences per rank per step")
    ap.add_argument("--seq", type=int, default=2048)
    suite_util.add_run_args(ap, steps=10, warmup=2, lr=1e-4, seed=5,
                            out_help="rank 0 writes the result here (JSON)")
    ap.add_argument("--optim-impl", choices=("default", "foreach", "fused"), default="default",
                    help="torch.optim.AdamW on the CPU shards: default (what AdamW picks for CPU DTensors), "
                         "foreach=True or fused=True")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads per rank (0: CPUs / local ranks)")
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
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    torch.cuda.set_device(local_rank)
    dev = torch.device("cuda", local_rank)
    threads = args.threads or max(1, len(os.sched_getaffinity(0)) // local_world)
    torch.set_num_threads(threads)
    dist.init_process_group("nccl", device_id=dev)

    # The same seed on every rank: every rank builds the same full model before sharding it.
    suite_util.set_deterministic(args.seed)
    D, NH, I, V = args.dim, args.heads, args.intermediate, args.vocab
    HD = D // NH

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(D))

        def forward(self, x):
            return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * self.weight

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = RMSNorm()
            self.qkv = nn.Linear(D, 3 * D, bias=False)
            self.wo = nn.Linear(D, D, bias=False)
            self.ln2 = RMSNorm()
            self.w1 = nn.Linear(D, I, bias=False)
            self.w3 = nn.Linear(D, I, bias=False)
            self.w2 = nn.Linear(I, D, bias=False)

        def forward(self, x):
            B, S, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(B, S, 3, NH, HD).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, S, D)
            x = x + self.wo(a)
            h = self.ln2(x)
            return x + self.w2(F.silu(self.w1(h)) * self.w3(h))

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(V, D)
            self.blocks = nn.ModuleList(Block() for _ in range(args.layers))
            self.norm = RMSNorm()
            self.head = nn.Linear(D, V, bias=False)

        def forward(self, tokens):
            x = self.tok(tokens)
            for b in self.blocks:
                x = b(x)
            return self.head(self.norm(x))

    with torch.device(dev):
        model = LM()
    params = sum(p.numel() for p in model.parameters())
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    offload = CPUOffloadPolicy(pin_memory=True)
    for b in model.blocks:
        fully_shard(b, mp_policy=mp, offload_policy=offload)
    fully_shard(model, mp_policy=mp, offload_policy=offload)
    torch.cuda.empty_cache()  # the unsharded fp32 model built above
    shards = [p.to_local() for p in model.parameters()]
    assert all(s.device.type == "cpu" and s.is_pinned() for s in shards), "parameter shards are not pinned on the CPU"
    shard_bytes = sum(s.numel() * s.element_size() for s in shards)

    impl = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}[args.optim_impl]
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1, **impl)

    # Each rank its own tokens, the same in every run.
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed * 1000 + rank)
    B, S = args.batch, args.seq
    losses = []
    steps = args.warmup + args.steps
    timer = suite_util.StepTimer(args.warmup)
    timer.start()
    for _ in range(steps):
        tokens = torch.randint(0, V, (B, S + 1), generator=gen, device=dev)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, V), tokens[:, 1:].reshape(-1))
        del logits
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(suite_util.loss_hex(loss))
        timer.step()

    digest = suite_util.Digest()
    for s in losses:
        digest.text(s)
    for name, p in model.named_parameters():
        digest.text(name)
        digest.tensor(p.to_local())
    stats = suite_util.pinned_stats()
    pinned, source = suite_util.pinned_bytes(stats, 2 * shard_bytes)
    mine = {"rank": rank, "digest": digest.hexdigest(), "losses": losses, "peak_rss_bytes": suite_util.peak_rss_bytes(),
            "pinned_bytes": pinned, "pinned_bytes_source": source, "shard_bytes": shard_bytes, **stats,
            "speed": timer.rate(world * B * S), "step_ms": [round(m, 3) for m in timer.ms],
            "zrtier": suite_util.zrtier_loaded()}
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    dist.barrier()
    dist.destroy_process_group()
    if rank != 0:
        return 0

    combined = suite_util.Digest()
    for r in everyone:
        combined.text(r["digest"])
    result = {
        "program": "fsdp2_offload",
        "digest": combined.hexdigest(),
        "losses": [s for r in everyone for s in r["losses"]],  # rank 0's steps, then rank 1's, ...
        **timer.fields(world * B * S, "tokens/s"),
        "speed_per_rank": [r["speed"] for r in everyone],
        "peak_rss_bytes": sum(r["peak_rss_bytes"] for r in everyone),
        "peak_rss_per_rank": [r["peak_rss_bytes"] for r in everyone],
        # ZRTIER_MEMORY applies to each process: the basis is the most one rank pinned.
        "pinned_bytes": max(r["pinned_bytes"] for r in everyone),
        "pinned_bytes_total": sum(r["pinned_bytes"] for r in everyone),
        "pinned_bytes_per_rank": [r["pinned_bytes"] for r in everyone],
        "pinned_bytes_source": mine["pinned_bytes_source"],
        "shard_bytes_per_rank": [r["shard_bytes"] for r in everyone],
        "ranks": [{k: v for k, v in r.items() if k not in ("losses", "step_ms")} for r in everyone],
        "config": {"world": world, "layers": args.layers, "dim": D, "intermediate": I, "heads": NH, "vocab": V,
                   "batch_per_rank": B, "seq": S, "steps": args.steps, "warmup": args.warmup, "lr": args.lr,
                   "optim_impl": args.optim_impl, "params": params, "cpu_threads_per_rank": threads,
                   "seed": args.seed, "small": args.small},
        **suite_util.common_fields(),
        "zrtier_all_ranks": all(r["zrtier"] for r in everyone),
    }
    result["zrtier"] = result["zrtier_all_ranks"]
    suite_util.write_result(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
