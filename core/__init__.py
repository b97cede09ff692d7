"""Interfaces and building blocks: attention, positions, norms, FFNs, stacks, heads, the model."""
