"""``python -m smg_grpc_servicer.tokenspeed``: runs smg-servicer-tokenspeed's launcher."""

from smg_grpc_servicer._delegate import load

if __name__ == "__main__":
    load("tokenspeed", "__main__").main()
