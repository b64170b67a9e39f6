"""``python -m smg_grpc_servicer.mlx``: runs smg-servicer-mlx's launcher."""

from smg_grpc_servicer._delegate import load

if __name__ == "__main__":
    load("mlx", "__main__").main()
