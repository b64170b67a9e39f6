"""``smg_grpc_servicer.sglang.zmq_plugin:register``: the ``smg-zmq`` SGLang plugin of the router's
direct ZMQ lane, at the path the implementation we replace registered it under;
smg-servicer-sglang's :mod:`smg_servicer_sglang.zmq_plugin`."""

from smg_grpc_servicer._delegate import load

register = load("sglang", "zmq_plugin").register

__all__ = ["register"]
