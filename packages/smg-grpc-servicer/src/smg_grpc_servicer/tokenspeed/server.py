"""``smg_grpc_servicer.tokenspeed.server``: the module ``ts serve`` checks for before it spawns
``python -m smg_grpc_servicer.tokenspeed``; ``run(server_args, settings=None)`` is
smg-servicer-tokenspeed's lifecycle (``python -m smg_grpc_servicer.tokenspeed.server`` runs the
launcher too)."""

from smg_grpc_servicer._delegate import load

_impl = load("tokenspeed", "server")
run = _impl.run

__all__ = ["run"]

if __name__ == "__main__":
    load("tokenspeed", "__main__").main()
