"""The course's model sizes and their closed-form parameter counts (no torch; ``lmperf.model`` builds them)."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 10_000
    context_length: int = 1024
    d_model: int = 768
    d_ff: int = 3072
    num_layers: int = 12
    num_heads: int = 12
    rope_theta: float = 10_000.0
    attention: str = "plain"

    @property
    def d_head(self) -> int:
        return self.d_model // self.num_heads


# Only the fields that differ from ModelConfig's defaults; parameter counts with vocab 10,000.
SIZES: dict[str, dict] = {
    "small": dict(d_model=768, d_ff=3072, num_layers=12, num_heads=12),  # 128.6M
    "medium": dict(d_model=1024, d_ff=4096, num_layers=24, num_heads=16),  # 423.2M
    "large": dict(d_model=1280, d_ff=5120, num_layers=36, num_heads=20),  # 969.4M
    "xl": dict(d_model=1600, d_ff=6400, num_layers=48, num_heads=25),  # 1998.2M
    "2.7B": dict(d_model=2560, d_ff=10240, num_layers=32, num_heads=32),  # 3406.8M
    # Tiny sizes for the CPU grid and the tests.
    "tiny": dict(d_model=64, d_ff=256, num_layers=2, num_heads=4),  # 1.41M
    "mini": dict(d_model=128, d_ff=512, num_layers=4, num_heads=4),  # 3.61M
}


def config_from_name(name: str, **overrides) -> ModelConfig:
    """The ModelConfig of a registered size, with optional field overrides."""
    if name not in SIZES:
        raise ValueError(f"unknown model size {name!r}; known: {sorted(SIZES)}")
    return replace(ModelConfig(**SIZES[name]), **overrides)


def parameter_count(config: ModelConfig) -> int:
    """Closed-form parameter count (no model built): embeddings, blocks, final norm, head."""
    d, f, L, V = config.d_model, config.d_ff, config.num_layers, config.vocab_size
    per_block = 4 * d * d + 3 * d * f + 2 * d
    return V * d + L * per_block + d + d * V
