"""``smg_grpc_servicer.mlx``: ``python -m smg_grpc_servicer.mlx --model M --host H --port P``."""
