"""SMG gRPC servicer for MLX: serves ``mlx.grpc.engine.MlxEngine`` over mlx-lm's BatchGenerator.

Importing this package imports no MLX; :mod:`._engine` does, when a server starts.
"""
