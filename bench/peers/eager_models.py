"""GPT-2 and LLaMA written in plain PyTorch, the way a user writes them
without a framework (after nanoGPT): the eager peers bench/throughput.py
times tightfit against. Same shapes, initialisation scheme and attention
(scaled_dot_product_attention, causal) as tightfit's plugins."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Gpt2Block(nn.Module):
    def __init__(self, d: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt2(nn.Module):
    def __init__(self, vocab: int, n_positions: int, d: int, n_layer: int, n_head: int):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(n_positions, d)
        self.h = nn.ModuleList(Gpt2Block(d, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied head
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


class RmsNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class LlamaBlock(nn.Module):
    def __init__(self, d: int, n_head: int, n_kv: int, ffn: int):
        super().__init__()
        self.n_head, self.n_kv, self.hd = n_head, n_kv, d // n_head
        self.input_layernorm = RmsNorm(d)
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, n_kv * self.hd, bias=False)
        self.v = nn.Linear(d, n_kv * self.hd, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.post_attention_layernorm = RmsNorm(d)
        self.gate = nn.Linear(d, ffn, bias=False)
        self.up = nn.Linear(d, ffn, bias=False)
        self.down = nn.Linear(ffn, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        h = self.input_layernorm(x)
        q = rope(self.q(h).view(B, T, self.n_head, self.hd).transpose(1, 2), cos, sin)
        k = rope(self.k(h).view(B, T, self.n_kv, self.hd).transpose(1, 2), cos, sin)
        v = self.v(h).view(B, T, self.n_kv, self.hd).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(y.transpose(1, 2).reshape(B, T, C))
        h = self.post_attention_layernorm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, vocab: int, d: int, n_layer: int, n_head: int, n_kv: int, ffn: int,
                 theta: float = 10000.0, tie: bool = False):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(LlamaBlock(d, n_head, n_kv, ffn) for _ in range(n_layer))
        self.norm = RmsNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        hd = d // n_head
        self.inv_freq = 1.0 / theta ** (torch.arange(0, hd, 2).float() / hd)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)
        if tie:  # the head reads the token table (Llama-3.2-1B)
            self.lm_head.weight = self.embed.weight

    def forward(self, idx, targets):
        T = idx.shape[1]
        ang = torch.outer(torch.arange(T).float(), self.inv_freq)
        ang = torch.cat((ang, ang), dim=-1)
        cos, sin = ang.cos(), ang.sin()
        x = self.embed(idx)
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))
