"""Running a step: the ModelRunner and its contract (step_io), the forward batch, sampling, logprobs, pooling rows,
tensor parallelism, the fused decode path, deterministic mode."""
