"""Model-facing adapters: the code that speaks to a model.

``warden.adapters.openai`` serves function calling (OpenAI-style tools);
``warden.adapters.mcp`` is an MCP server (it needs ``pip install 'warden[mcp]'``).
Both offer a model what discovery shows its actor, invoke through the
``Runtime``, and translate every envelope the same way (``docs/reference/adapters.md``):
a model sees an output without its model-hidden fields, or one of the two
error shapes, and never a cause or a stack (SI-9, SI-10).
"""
