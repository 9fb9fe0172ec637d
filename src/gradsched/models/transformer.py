"""Transformer models in plain torch: the base encoder-decoder and BERT-large.

Attention is split into leaf modules (projections, :class:`AttentionCore`) so the
profiler can attribute every matrix multiply to a layer.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class AttentionCore(nn.Module):
    """softmax(q k^T / sqrt(d)) v over ``heads`` heads; no parameters."""

    def __init__(self, heads: int) -> None:
        super().__init__()
        self.heads = heads

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:  # (B, T, D) each
        b, tq, d = q.shape
        h = self.heads
        q = q.view(b, tq, h, d // h).transpose(1, 2)  # (B, h, Tq, d/h)
        k = k.view(b, k.shape[1], h, d // h).transpose(1, 2)
        v = v.view(b, v.shape[1], h, d // h).transpose(1, 2)
        scores = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // h), dim=-1)  # (B, h, Tq, Tk)
        return (scores @ v).transpose(1, 2).reshape(b, tq, d)


class MultiHeadAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.query = nn.Linear(dim, dim)
        self.key = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim)
        self.core = AttentionCore(heads)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: Tensor, memory: Tensor | None = None) -> Tensor:
        kv = x if memory is None else memory
        return self.out(self.core(self.query(x), self.key(kv), self.value(kv)))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int, activation: nn.Module) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = activation
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


class EncoderLayer(nn.Module):
    """Post-norm: x = norm(x + attn(x)); x = norm(x + ffn(x))."""

    def __init__(self, dim: int, heads: int, hidden: int, activation: type[nn.Module] = nn.ReLU) -> None:
        super().__init__()
        self.attention = MultiHeadAttention(dim, heads)
        self.norm1 = nn.LayerNorm(dim)
        self.ffn = FeedForward(dim, hidden, activation())
        self.norm2 = nn.LayerNorm(dim)

    def forward(self, x: Tensor) -> Tensor:
        x = self.norm1(x + self.attention(x))
        return self.norm2(x + self.ffn(x))


class DecoderLayer(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.self_attention = MultiHeadAttention(dim, heads)
        self.norm1 = nn.LayerNorm(dim)
        self.cross_attention = MultiHeadAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.ffn = FeedForward(dim, hidden, nn.ReLU())
        self.norm3 = nn.LayerNorm(dim)

    def forward(self, x: Tensor, memory: Tensor) -> Tensor:
        x = self.norm1(x + self.self_attention(x))
        x = self.norm2(x + self.cross_attention(x, memory))
        return self.norm3(x + self.ffn(x))


def sinusoidal_positions(length: int, dim: int, device: torch.device) -> Tensor:
    pos = torch.arange(length, device=device, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim, device=device)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)
    return table


class TransformerBase(nn.Module):
    """Encoder-decoder Transformer, base size (d=512, 8 heads, FFN 2048, 6+6 layers).

    One embedding matrix is shared by the source and target embeddings and the output
    projection, over a joint vocabulary of 37000 tokens.
    """

    def __init__(self, vocab: int = 37000, dim: int = 512, heads: int = 8, hidden: int = 2048, layers: int = 6):
        super().__init__()
        self.dim = dim
        self.embed = nn.Embedding(vocab, dim)
        self.encoder = nn.ModuleList(EncoderLayer(dim, heads, hidden) for _ in range(layers))
        self.target_embed = nn.Embedding(vocab, dim)
        self.target_embed.weight = self.embed.weight
        self.decoder = nn.ModuleList(DecoderLayer(dim, heads, hidden) for _ in range(layers))
        self.generator = nn.Linear(dim, vocab, bias=False)
        self.generator.weight = self.embed.weight

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:  # (B, T) token ids each
        scale = math.sqrt(self.dim)
        x = self.embed(src) * scale + sinusoidal_positions(src.shape[1], self.dim, src.device)
        for layer in self.encoder:
            x = layer(x)
        y = self.target_embed(tgt) * scale + sinusoidal_positions(tgt.shape[1], self.dim, tgt.device)
        for layer in self.decoder:
            y = layer(y, x)
        return self.generator(y)  # (B, T, vocab)


class BertEmbeddings(nn.Module):
    def __init__(self, vocab: int, dim: int, positions: int, types: int) -> None:
        super().__init__()
        self.word = nn.Embedding(vocab, dim)
        self.position = nn.Embedding(positions, dim)
        self.token_type = nn.Embedding(types, dim)
        self.norm = nn.LayerNorm(dim, eps=1e-12)

    def forward(self, ids: Tensor) -> Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)[None, :]
        types = torch.zeros_like(ids)
        return self.norm(self.word(ids) + self.position(positions) + self.token_type(types))


class Bert(nn.Module):
    """BERT encoder with pooler (BERT-large: 24 layers, d=1024, 16 heads, FFN 4096)."""

    def __init__(self, layers: int = 24, dim: int = 1024, heads: int = 16, hidden: int = 4096, vocab: int = 30522):
        super().__init__()
        self.embeddings = BertEmbeddings(vocab, dim, 512, 2)
        self.encoder = nn.ModuleList(EncoderLayer(dim, heads, hidden, nn.GELU) for _ in range(layers))
        self.pooler = nn.Linear(dim, dim)
        self.pool_act = nn.Tanh()

    def forward(self, ids: Tensor) -> Tensor:  # (B, T) token ids
        x = self.embeddings(ids)
        for layer in self.encoder:
            x = layer(x)
        return self.pool_act(self.pooler(x[:, 0]))
