"""SMG servicer for SGLang: ``serve_grpc`` takes the tokenizer manager's role and serves
``sglang.grpc.scheduler.SglangScheduler`` over SGLang's own scheduler processes.

Importing this package does not import SGLang; :mod:`.server` and :mod:`.servicer` do.
"""
