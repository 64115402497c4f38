# SPDX-License-Identifier: MIT
"""The GPT of models/gpt.hpp in Python: token and position embeddings,
pre-norm blocks (causal self-attention, GELU MLP), final LayerNorm, LM head.
Used by the pytest suite and bench/peers.py."""

import math

import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)

    def forward(self, x):  # [batch, time, width] -> same
        b, t, w = x.shape
        hd = w // self.heads
        q, k, v = self.qkv(self.ln1(x)).split(w, 2)
        q = q.view(b, t, self.heads, hd).transpose(1, 2)
        k = k.view(b, t, self.heads, hd).transpose(1, 2)
        v = v.view(b, t, self.heads, hd).transpose(1, 2)
        att = q.matmul(k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        att = torch.softmax(att.masked_fill(mask, -1e9), -1)
        y = att.matmul(v).transpose(1, 2).contiguous().view(b, t, w)
        h = x + self.proj(y)
        return h + self.out(F.gelu(self.fc(self.ln2(h))))


class GPT(nn.Module):
    def __init__(self, vocab=96, layers=4, width=128, heads=4, seq=64):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab)

    def forward(self, idx):  # [batch, time] int64 -> logits [batch, time, vocab]
        positions = torch.arange(idx.size(1), dtype=torch.long, device=idx.device)
        x = self.tok(idx) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln(x))

    def loss(self, idx, targets):
        logits = self(idx)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def make(device, seed=0, **config):
    """A GPT with deterministic weights (CPU generator, then moved)."""
    torch.manual_seed(seed)
    return GPT(**config).to(device)


def batch(device, vocab=96, batch_size=4, seq=64, seed=1):
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, vocab, (batch_size, seq + 1), generator=g)
    return data[:, :-1].to(device), data[:, 1:].to(device)
