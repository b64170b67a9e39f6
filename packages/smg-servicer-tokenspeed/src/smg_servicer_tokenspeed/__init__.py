"""SMG servicer for TokenSpeed: serves ``tokenspeed.grpc.scheduler.TokenSpeedScheduler`` over
TokenSpeed's own in-process ``AsyncLLM`` front end and scheduler ranks.

Importing this package does not import TokenSpeed; :mod:`._tokenspeed` is the only module that
does (:mod:`.server`, :mod:`.servicer` and the launcher reach it).
"""
