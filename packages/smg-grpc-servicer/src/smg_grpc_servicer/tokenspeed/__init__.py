"""``smg_grpc_servicer.tokenspeed``: ``python -m smg_grpc_servicer.tokenspeed ...``."""
