"""Policies: the file model, the loader (with positions), the CEL evaluator
behind a narrow interface, and the engine that decides."""
