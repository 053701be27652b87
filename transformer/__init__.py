"""A JAX + Flax Linen codebase for the Transformer family."""
