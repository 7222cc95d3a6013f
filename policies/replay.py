from __future__ import annotations

from policies.base import CommitPolicy


class Replay(CommitPolicy):
    """ReplaySSM: one older state + cached inputs of accepted tokens, flushed every m steps."""

    name = "replay"

    @property
    def flush_interval(self) -> int:
        return self.cfg.flush_interval

    def cached_input_bytes_per_token_per_layer(self) -> int:
        g = self.model.gdn
        # k (bf16, per q/k head), v (bf16, per v head), g and beta (float32, per v head).
        return 2 * (g.num_k_heads * g.head_k_dim + g.num_v_heads * g.head_v_dim) + 2 * 4 * g.num_v_heads

    def max_cached_tokens(self) -> int:
        # At most depth + 1 tokens (bonus included) are accepted per step.
        return self.flush_interval * (self.tree.depth + 1)

    def cache_bytes_per_seq_per_gpu(self) -> int:
        per_layer = self.cached_input_bytes_per_token_per_layer() // self.model.tensor_parallel
        return self.model.gdn_layers * self.max_cached_tokens() * per_layer

    def verify_cache_positions(self) -> int:
        """Cache slots the verify kernel runs over every step, however many hold tokens: the
        kernels' shapes are fixed for CUDA graphs (policies.kernels.replay: (m - 1) paths of at
        most depth + 1 tokens before the flush; none when every commit flushes)."""
        return (self.flush_interval - 1) * (self.tree.depth + 1)

    def replay_tokens(self, steps_since_flush: int, accepted_since_flush: int) -> int:
        return accepted_since_flush

    def flushes(self, steps_since_flush: int) -> bool:
        return steps_since_flush + 1 >= self.flush_interval
