"""The pre-execution pipeline: one module per stage, run in order by ``begin``.

Each stage takes the request's ``BeginContext`` and either fills in what it
established (the capability, the actor, the validated input, the decision) or
returns a ``Failure`` carrying its stage.
"""
