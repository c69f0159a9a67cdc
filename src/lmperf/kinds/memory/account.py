"""The analytic memory account of the course's model: pure Python, no torch.

The memory cells store it in their records and the memory report recomputes it from the cell
(so a correction here reaches the report without re-measuring). What autocast does with the
weights decides the bf16 rows:

- The model computes ``x @ self.weight.T``. ``weight.T`` is a view, not a leaf, and autocast
  caches only casts of leaf tensors that require grad; so no bf16 weight copy is cached. Each
  matmul casts its weight, uses the copy and (in inference) frees it: an inference forward holds
  at most one bf16 weight copy at a time, beside the fp32 parameters.
- In training, autograd saves each matmul's bf16 weight copy for the backward (the gradient of
  the input needs it); those copies stay until the backward has used them. They are saved
  tensors, counted with the saved activations, not a cache.
"""

from __future__ import annotations

from lmperf.core.sizes import ModelConfig, parameter_count
from lmperf.core.units import MIB


def residual_stream_bytes(config: ModelConfig, batch: int, context_length: int, bytes_per_element: int = 4) -> int:
    """One residual-stream activation, shape (batch, context, d_model)."""
    return batch * context_length * config.d_model * bytes_per_element


def matmul_weight_elements(config: ModelConfig) -> int:
    """Weights that enter a matmul (autocast casts these): every block's projections and the head."""
    d, f = config.d_model, config.d_ff
    return config.num_layers * (4 * d * d + 3 * d * f) + config.vocab_size * d


def largest_matmul_weight_elements(config: ModelConfig) -> int:
    """The largest single matmul weight (a feed-forward projection or the LM head)."""
    return max(config.d_model * config.d_ff, config.vocab_size * config.d_model, config.d_model**2)


def saved_activation_bytes(
    config: ModelConfig, batch: int, context_length: int, precision: str, autocast_device: str = "cuda"
) -> int:
    """Bytes autograd saves for backward in one forward of the course's model (plain attention),
    excluding parameters, inputs and the saved bf16 weight copies (``saved_weight_copy_bytes``).

    Counted tensor by tensor from the model's code (RMSNorm in fp32, RoPE, unfused softmax,
    SwiGLU, cross-entropy's log-softmax); tests check it against ``saved_tensors_hooks`` on
    CPU. Units per layer: BTd = B·T·d_model, BTf = B·T·d_ff, BHT² (scores), BHT, BT.
    fp32: 10 BTd + 4 BTf + 3 BHT² + 2 BHT + 2 BT elements of 4 bytes, the causal mask (T² bytes)
    and RoPE's cos/sin gathers (4 · T·d_head/2). bf16 autocast keeps the residual-side tensors
    (RMSNorm in fp32) at 4 bytes and the matmul side at 2; on CUDA, ``exp`` and ``sum`` are on
    autocast's fp32 list, so the softmax's exp and its row sums are fp32 there (not on CPU).
    The three T×T tensors per layer are the scaled scores (our softmax's input, which its max's
    backward saves), exp's output and the probabilities (see ``lmperf.kinds.attention.memory_model``).
    """
    B, T, d, f, H, L, V = (
        batch,
        context_length,
        config.d_model,
        config.d_ff,
        config.num_heads,
        config.num_layers,
        config.vocab_size,
    )
    btd, btf, bht2, bht, bt = B * T * d, B * T * f, B * H * T * T, B * H * T, B * T
    rope = 4 * T * (config.d_head // 2)
    mask = T * T
    if precision == "fp32":
        per_layer = 4 * (10 * btd + 4 * btf + 3 * bht2 + 2 * bht + 2 * bt + rope) + mask
        head = 4 * (3 * btd + bt + bt * V) + 4
    elif precision in ("bf16", "fp16"):
        exp_fp32 = autocast_device == "cuda"
        per_layer = (
            4 * (2 * bt + 4 * btd)
            + 2 * (4 * btf + 9 * btd + 2 * bht + 3 * bht2 + rope)
            + mask
            + (2 * bht2 + 2 * bht if exp_fp32 else 0)
        )
        head = 4 * (2 * btd + bt + bt * V) + 2 * btd + 4
    else:
        raise ValueError(f"unknown precision {precision!r}")
    return L * per_layer + head


def saved_weight_copy_bytes(config: ModelConfig, precision: str) -> int:
    """Training under autocast: the bf16 copies of the matmul weights that autograd saves for backward."""
    return 0 if precision == "fp32" else 2 * matmul_weight_elements(config)


# The name the memory cells used before the account was corrected (the bytes are the same; they
# are autograd's saved copies in training, and no cache exists in inference).
autocast_weight_copy_bytes = saved_weight_copy_bytes


def transient_weight_copy_bytes(config: ModelConfig, precision: str) -> int:
    """Inference under autocast: the one bf16 weight copy alive at a time (not cached, see above)."""
    return 0 if precision == "fp32" else 2 * largest_matmul_weight_elements(config)


def inference_transient_bytes(config: ModelConfig, batch: int, context_length: int, precision: str) -> int:
    """A rough upper estimate of the largest short-lived working set of one inference forward:
    the unfused softmax holds four score-sized tensors at once (scores, masked, shifted, exp or
    output; fp32 under CUDA autocast too, where ``exp`` is an fp32 op), beside a handful (6) of
    residual-sized tensors; or the logits and their softmax at the head, whichever is larger."""
    B, T, H = batch, context_length, config.num_heads
    attention = 4 * 4 * B * H * T * T + 6 * 4 * B * T * config.d_model
    head = 2 * 4 * B * T * config.vocab_size
    return max(attention, head)


def analytic_account(
    config: ModelConfig, batch: int, context_length: int, precision: str, mode: str, autocast_device: str = "cuda"
) -> dict:
    """Predicted memory by component (MiB) and the predicted peak with the phase it falls in.

    Training (AdamW, foreach implementation): the peak is either the end of the forward
    (parameters, optimizer state, saved activations, autograd's saved bf16 weight copies) or the
    optimizer step (parameters, gradients, two AdamW moments and the step's temporary ``sqrt(v)``,
    one parameter-sized list), whichever is larger. Inference: parameters, the largest transient
    working set (an estimate) and, under autocast, the one bf16 weight copy alive at a time.
    """
    P = parameter_count(config)
    params = 4 * P
    out = {"parameter_count": P, "parameters_mib": params / MIB}
    if mode == "inference":
        transient = inference_transient_bytes(config, batch, context_length, precision)
        copy = transient_weight_copy_bytes(config, precision)
        out.update(
            activations_mib=transient / MIB,
            activations_kind="largest transient working set (estimate)",
            weight_copies_mib=copy / MIB,
            weight_copies_kind="one bf16 weight copy at a time (autocast caches none for weight.T)",
            predicted_peak_mib=(params + copy + transient) / MIB,
            predicted_peak_phase="forward",
        )
        return out
    if mode != "training":
        raise ValueError(f"unknown mode {mode!r}")
    copies = saved_weight_copy_bytes(config, precision)
    grads, moments, step_temp = 4 * P, 8 * P, 4 * P
    saved = saved_activation_bytes(config, batch, context_length, precision, autocast_device)
    end_of_forward = params + moments + saved + copies
    optimizer_step = params + grads + moments + step_temp
    out.update(
        gradients_mib=grads / MIB,
        optimizer_state_mib=moments / MIB,
        optimizer_temporaries_mib=step_temp / MIB,
        activations_mib=saved / MIB,
        activations_kind="saved for backward (closed form)",
        weight_copies_mib=copies / MIB,
        weight_copies_kind="bf16 weight copies autograd saves for backward",
        end_of_forward_mib=end_of_forward / MIB,
        optimizer_step_mib=optimizer_step / MIB,
        predicted_peak_mib=max(end_of_forward, optimizer_step) / MIB,
        predicted_peak_phase="backward" if end_of_forward >= optimizer_step else "optimizer_step",
    )
    return out


def vocab_from_parameter_count(config: ModelConfig, parameters: int) -> int:
    """The vocabulary size that gives a recorded parameter count (records older than the vocab field)."""
    d, f, L = config.d_model, config.d_ff, config.num_layers
    rest = L * (4 * d * d + 3 * d * f + 2 * d) + d
    vocab, remainder = divmod(parameters - rest, 2 * d)
    if remainder or vocab <= 0:
        raise ValueError(f"{parameters} parameters fit no vocabulary for {config}")
    return vocab
