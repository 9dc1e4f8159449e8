"""PyTorch versions of the examples in this folder, for ``stitchtune import torch`` and its tests.

Each function computes the same thing as the graph.json of the same name (``layernorm.json``,
``rmsnorm.json``, ``softmax.json``, ``bias_gelu.json``, ``colsum_sigmoid_scale.json``). ``SHAPES``
holds the full-size ``--shapes`` argument for each, ``SMALL_SHAPES`` a CPU-sized one. For example::

    stitchtune import torch examples/torch_modules.py:layernorm \\
        --shapes x=16384x1024,gamma=1024,beta=1024 -o layernorm_from_torch.json
    stitchtune import torch examples/torch_modules.py:RMSNormBlock --shapes x=16384x4096 -o rms.json
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def layernorm(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """LayerNorm over the last dim, eps 1e-5 (``layernorm.json``)."""
    return F.layer_norm(x, (x.shape[-1],), gamma, beta, 1e-5)


def rmsnorm(x: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """RMSNorm written out by hand, eps 1e-6 (``rmsnorm.json``)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * gamma


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim (``softmax.json``)."""
    return torch.softmax(x, dim=-1)


def bias_gelu(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Bias add then tanh-approximated GELU (``bias_gelu.json``)."""
    return F.gelu(x + b, approximate="tanh")


def colsum_sigmoid_scale(x: torch.Tensor) -> torch.Tensor:
    """A column reduction consumed element-wise: ``x * sigmoid(sum(x, 0))`` (``colsum_sigmoid_scale.json``)."""
    return x * torch.sigmoid(x.sum(dim=0, keepdim=True))


def log_softmax_manual(x: torch.Tensor) -> torch.Tensor:
    """log-softmax spelled out with max / exp / sum / log, reduction without keepdim + unsqueeze."""
    m = x.amax(-1).unsqueeze(-1)
    s = x - m
    return s - torch.log(torch.exp(s).sum(-1, keepdim=True))


def layernorm_bf16(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """bf16 in and out, statistics in fp32 (``layernorm_bf16.json``'s shape of computation)."""
    y = F.layer_norm(x.float(), (x.shape[-1],), gamma.float(), beta.float(), 1e-5)
    return y.to(torch.bfloat16)


class RMSNormBlock(torch.nn.Module):
    """``nn.RMSNorm`` followed by SiLU: parameters become graph inputs."""

    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.norm = torch.nn.RMSNorm(dim, eps=1e-6)
        torch.nn.init.normal_(self.norm.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(self.norm(x))


class LayerNormGelu(torch.nn.Module):
    """``nn.LayerNorm`` followed by exact GELU."""

    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        torch.nn.init.normal_(self.norm.weight)
        torch.nn.init.normal_(self.norm.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.norm(x))


def unsupported_cumsum(x: torch.Tensor) -> torch.Tensor:
    """Uses an op graph.json does not have (for the error-message test)."""
    return torch.cumsum(x, dim=0) * 2.0


SHAPES: dict[str, str] = {
    "layernorm": "x=16384x1024,gamma=1024,beta=1024",
    "rmsnorm": "x=16384x4096,gamma=4096",
    "softmax": "x=98304x512",
    "bias_gelu": "x=16384x4096,b=4096",
    "colsum_sigmoid_scale": "x=65536x1024",
}

SMALL_SHAPES: dict[str, str] = {
    "layernorm": "x=64x96,gamma=96,beta=96",
    "rmsnorm": "x=64x128,gamma=128",
    "softmax": "x=128x40",
    "bias_gelu": "x=64x128,b=128",
    "colsum_sigmoid_scale": "x=96x48",
    "log_softmax_manual": "x=32x50",
    "layernorm_bf16": "x=32x64,gamma=64,beta=64",
    "RMSNormBlock": "x=16x64",
    "LayerNormGelu": "x=2x8x64",
}
