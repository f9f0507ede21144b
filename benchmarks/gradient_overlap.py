"""Overlap and clustering of the ranks' local top-k sets on real gradients: the digits MLP
(examples/train_digits.py's model and data), P ranks on their own shards, error feedback, steps 10-60.
The figures behind sparsecomm.costmodel.model_sets (docs/scale.md):

    python benchmarks/gradient_overlap.py 4 0.01
"""
import sys, torch, numpy as np
sys.path.insert(0, __import__("os").path.join(__import__("os").path.dirname(__file__), "..", "examples"))
from models import MLP
from train_digits import load
P, density, steps = int(sys.argv[1]), float(sys.argv[2]), 60
torch.manual_seed(0)
xtr, ytr, _, _ = load(0)
model = MLP(64, 256, 10) if False else MLP(64, 256, 10)
params = list(model.parameters())
n = sum(p.numel() for p in params)
k = max(1, int(np.ceil(density * n)))
res = [torch.zeros(n) for _ in range(P)]
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
ov, runs, conc, imb = [], [], [], []
g = torch.Generator().manual_seed(1)
for step in range(steps):
    grads = []
    for r in range(P):
        idx = torch.randint(r * len(xtr) // P, (r + 1) * len(xtr) // P, (32,), generator=g)
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(xtr[idx]), ytr[idx]).backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in params]) + res[r])
    sets = []
    total = torch.zeros(n)
    for r in range(P):
        top = grads[r].abs().topk(k).indices.sort().values
        sets.append(top.numpy())
        sel = torch.zeros(n); sel[top] = grads[r][top]
        res[r] = grads[r] - sel; total += sel
    if step >= 10:
        for a in range(P):
            for b in range(a + 1, P):
                ov.append(len(np.intersect1d(sets[a], sets[b])) / k)
        for s in sets:
            runs.append(len(s) / (1 + np.count_nonzero(np.diff(s) > 1)))
        u = len(np.unique(np.concatenate(sets)))
        for s_ in sets:
            h = np.bincount(s_ * 64 // n, minlength=64); conc.append(np.sort(h)[::-1][:16].sum() / len(s_)); imb.append(h.max() / h.mean())
    off = 0
    for p in params:
        p.grad = (total[off:off + p.numel()] / P).view_as(p); off += p.numel()
    opt.step()
print(f"share of top-k in the densest quarter of 64 ranges {np.mean(conc):.2f}, max/mean range load {np.mean(imb):.1f}; P={P} density={density} N={n} k={k}: pairwise overlap mean {np.mean(ov):.3f} median {np.median(ov):.3f}; mean run length {np.mean(runs):.2f}; last union/k {u/k:.2f}")
