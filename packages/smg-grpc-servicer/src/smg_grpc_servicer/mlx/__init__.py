"""``smg_grpc_servicer.mlx``: ``python -m smg_grpc_servicer.mlx --model ... --host ... --port ...``."""
