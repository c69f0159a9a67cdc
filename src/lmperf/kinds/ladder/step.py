"""The parts of a ladder rung's step that are not stock PyTorch: the loss in chunks of tokens, blocks
recomputed in the backward, FP8 linears (torchao) and SDPA pinned to one backend."""

from __future__ import annotations

import contextlib
import importlib.util

import torch
from torch import nn

from lmperf.model import Linear, TransformerLM

SDPA_BACKENDS = {"sdpa_flash": "FLASH_ATTENTION", "sdpa_cudnn": "CUDNN_ATTENTION"}  # the model's `sdpa`, pinned


class ChunkedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of ``h @ weight.T``, ``chunk`` tokens at a time: each chunk's logits become
    their gradients at once and are dropped, so the full (tokens, vocab) logits never exist."""

    @staticmethod
    def forward(ctx, h, weight, targets, chunk: int):
        n = h.shape[0]
        grad_h, grad_w = torch.empty_like(h), torch.zeros_like(weight)
        loss = torch.zeros((), device=h.device, dtype=torch.float32)
        for s in range(0, n, chunk):
            logits = (h[s : s + chunk] @ weight.T).float()  # (c, V); a bf16 matmul under autocast
            t = targets[s : s + chunk]
            lse = torch.logsumexp(logits, dim=-1)
            loss += (lse - logits.gather(1, t[:, None]).squeeze(1)).sum()
            g = (logits - lse[:, None]).exp_()  # softmax; d loss / d logits = (softmax - onehot) / n
            g[torch.arange(len(t), device=g.device), t] -= 1
            g /= n
            grad_h[s : s + chunk] = g @ weight
            grad_w += g.T @ h[s : s + chunk]
        ctx.save_for_backward(grad_h, grad_w)
        return loss / n

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w = ctx.saved_tensors
        return grad_h * grad_out, grad_w * grad_out, None, None


class Checkpointed(nn.Module):
    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, x):
        return torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=False)


def fp8_unsupported(device: torch.device) -> str | None:
    if importlib.util.find_spec("torchao") is None:
        return "torchao is not installed (pip install 'lmperf[fp8]')"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        return f"FP8 tensor cores need compute capability 8.9 or newer; this GPU has {major}.{minor}"
    return None


def to_float8(model: TransformerLM, recipe: str) -> None:
    """torchao float8 training (``recipe``: tensorwise or rowwise scales) for every linear but ``lm_head``
    (torchao swaps ``nn.Linear`` only: our ``Linear`` becomes one first, same weight)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, Linear):
                linear = nn.Linear(child.weight.shape[1], child.weight.shape[0], bias=False, device="meta")
                linear.weight = child.weight
                setattr(parent, name, linear)
    config = Float8LinearConfig.from_recipe_name(recipe)
    convert_to_float8_training(model, config=config, module_filter_fn=lambda _module, fqn: fqn != "lm_head")


def sdpa_context(attention: str):
    if attention not in SDPA_BACKENDS:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(getattr(SDPBackend, SDPA_BACKENDS[attention]))


def loss_of(model: TransformerLM, tokens, targets, chunk: int | None):
    x = model.token_embeddings(tokens)  # (B, T, D)
    for layer in model.layers:
        x = layer(x)
    h = model.ln_final(x)
    if chunk:
        return ChunkedCrossEntropy.apply(h.flatten(0, 1), model.lm_head.weight, targets.flatten(), chunk)
    logits = model.lm_head(h)  # (B, T, V)
    return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
