#!/usr/bin/env python3
"""An input pipeline with pinned batches: DataLoader(num_workers=8, pin_memory=True) over a synthetic
map-style image data set feeding a ViT/16 classifier (12 blocks of width 1024) on the GPU.

Each sample is made deterministically from its index (a uint8 3x224x224 image from a generator seeded
with the index, then normalised to float32, as ToTensor + Normalize would) by forked worker processes
(multiprocessing_context="fork", named because Python 3.14 made forkserver Linux's default); the main
process's pin-memory thread copies every collated batch into pinned memory (the caching host allocator:
cudaHostAlloc for new blocks, reused blocks after that), and the training loop copies it to the GPU with
non_blocking=True. Two epochs, so the second epoch's workers are forked after pinned memory exists.

    python3 dataloader_pinned.py --out /tmp/a.json
    LD_PRELOAD=libzrtier.so python3 dataloader_pinned.py --out /tmp/b.json
    python3 dataloader_pinned.py --compare /tmp/a.json /tmp/b.json   # exit 0 iff bit-identical

The digest covers every step's loss and the final weights. Speed: samples/s. Peak RSS: the main
process's plus, per epoch, the sum of its workers' (each worker records its own VmHWM in shared memory);
the larger epoch counts. Default: batch 256 of 588 KiB samples (147 MiB a batch, a 256 MiB pinned block),
up to prefetch_factor x workers = 16 batches in flight. The model is sized so that the GPU, not the
workers, is the bottleneck, as in a tuned pipeline: the queue of pinned batches fills, about 4.5 GiB
pinned. data_wait_ms (the steady steps' mean wait for the next batch) says whether it did: near 0, the
GPU was the bottleneck; if not, fewer batches were pinned (raise --workers or the model's size).
"""
import argparse
import ctypes
import multiprocessing
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import suite_util  # noqa: E402  (sets CUBLAS_WORKSPACE_CONFIG before torch is imported)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--prefetch", type=int, default=2, help="DataLoader prefetch_factor (batches per worker)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--patch", type=int, default=16)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=12)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--epochs", type=int, default=2)
    suite_util.add_run_args(ap, steps=300, warmup=10, lr=3e-4, seed=3,
                            steps_help="steps in all (split evenly over the epochs)",
                            warmup_help="first steps left out of the speed")
    args = ap.parse_args()
    if args.small:
        args.workers, args.batch, args.image, args.dim, args.depth, args.heads = 2, 16, 64, 128, 2, 2
        args.classes, args.steps, args.warmup = 10, 8, 2
    return args


def main():
    args = parse_args()
    if args.compare:
        return suite_util.compare(args.compare)

    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, Dataset, get_worker_info

    suite_util.set_deterministic(args.seed)
    dev = torch.device("cuda")
    torch.cuda.init()
    steps_per_epoch = args.steps // args.epochs
    C, H = 3, args.image
    # Each worker's VmHWM, per epoch (index epoch * workers + worker id), in memory shared by the fork.
    worker_rss = multiprocessing.RawArray(ctypes.c_int64, max(1, args.workers) * args.epochs)

    class SyntheticImages(Dataset):
        """Sample i: a uint8 image and a label drawn from a generator seeded with i, normalised to float32."""

        def __init__(self):
            self.n = steps_per_epoch * args.batch
            self.mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
            self.std = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
            self.epoch = 0

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            g = torch.Generator()
            g.manual_seed(args.seed * 1_000_003 + i)
            img = torch.randint(0, 256, (C, H, H), dtype=torch.uint8, generator=g)
            label = int(torch.randint(0, args.classes, (), generator=g))
            x = img.float().div_(255.0).sub_(self.mean).div_(self.std)
            info = get_worker_info()
            if info is not None:
                slot = self.epoch * info.num_workers + info.id
                worker_rss[slot] = max(worker_rss[slot], suite_util.peak_rss_bytes())
            return x, label

    D, NH, P = args.dim, args.heads, args.patch

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
            a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, S, D)
            x = x + self.proj(a)
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class ViT(nn.Module):
        def __init__(self):
            super().__init__()
            n = (H // P) ** 2
            self.embed = nn.Linear(C * P * P, D)  # the 16x16 patch projection, as a matmul
            self.pos = nn.Parameter(torch.randn(1, n, D) * 0.02)
            self.blocks = nn.ModuleList(Block() for _ in range(args.depth))
            self.norm = nn.LayerNorm(D)
            self.head = nn.Linear(D, args.classes)

        def forward(self, x):
            B = x.shape[0]
            x = x.reshape(B, C, H // P, P, H // P, P).permute(0, 2, 4, 1, 3, 5).reshape(B, -1, C * P * P)
            x = self.embed(x) + self.pos
            for b in self.blocks:
                x = b(x)
            return self.head(self.norm(x).mean(1))

    with torch.device(dev):
        model = ViT()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05, foreach=True)

    dataset = SyntheticImages()
    loader_kw = {"batch_size": args.batch, "shuffle": True, "drop_last": True, "pin_memory": True,
                 "num_workers": args.workers, "generator": torch.Generator().manual_seed(args.seed)}
    if args.workers > 0:
        loader_kw.update(prefetch_factor=args.prefetch, multiprocessing_context="fork", persistent_workers=False)
    loader = DataLoader(dataset, **loader_kw)

    losses = []
    data_wait_ms = []
    timer = suite_util.StepTimer(args.warmup)
    epoch_worker_rss = []
    checked_pinned = False
    timer.start()
    for epoch in range(args.epochs):
        dataset.epoch = epoch  # read by the workers forked for this epoch
        it = iter(loader)
        for _ in range(steps_per_epoch):
            t_wait = time.perf_counter()
            x, y = next(it)
            data_wait_ms.append((time.perf_counter() - t_wait) * 1e3)
            if not checked_pinned:
                assert x.is_pinned() and y.is_pinned(), "DataLoader batches are not pinned"
                checked_pinned = True
            x = x.to(dev, non_blocking=True)
            y = y.to(dev, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(x)
            loss = F.cross_entropy(out.float(), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(suite_util.loss_hex(loss))
            timer.step()
        del it  # the workers exit
        w = max(1, args.workers)
        epoch_worker_rss.append(list(worker_rss[epoch * w:(epoch + 1) * w]))

    digest = suite_util.Digest()
    for s in losses:
        digest.text(s)
    for name, p in model.named_parameters():
        digest.text(name)
        digest.tensor(p)
    stats = suite_util.pinned_stats()
    batch_bytes = args.batch * C * H * H * 4
    pinned, source = suite_util.pinned_bytes(stats, 0)
    main_rss = suite_util.peak_rss_bytes()
    workers_rss = max(epoch_worker_rss, key=sum) if args.workers > 0 else []
    result = {
        "program": "dataloader_pinned",
        "digest": digest.hexdigest(),
        "losses": losses,
        **timer.fields(args.batch, "samples/s"),
        "data_wait_ms": round(sum(data_wait_ms[args.warmup:]) / max(1, len(data_wait_ms[args.warmup:])), 3),
        "peak_rss_bytes": main_rss + sum(workers_rss),
        "peak_rss_main_bytes": main_rss,
        "peak_rss_workers_bytes": workers_rss,
        "peak_rss_workers_per_epoch": epoch_worker_rss,
        "pinned_bytes": pinned,
        "pinned_bytes_source": source,
        "batch_bytes": batch_bytes,
        **stats,
        "config": {"workers": args.workers, "prefetch_factor": args.prefetch, "batch": args.batch, "image": H,
                   "patch": P, "dim": D, "depth": args.depth, "heads": NH, "classes": args.classes,
                   "epochs": args.epochs, "steps": steps_per_epoch * args.epochs, "warmup": args.warmup,
                   "lr": args.lr, "params": sum(p.numel() for p in model.parameters()), "seed": args.seed,
                   "small": args.small},
        **suite_util.common_fields(),
    }
    suite_util.write_result(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
