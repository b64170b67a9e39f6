"""``python -m smg_grpc_servicer.mlx.server`` (the path upstream's harness used)."""

from smg_grpc_servicer._delegate import load

if __name__ == "__main__":
    load("mlx", "__main__").main()
