"""``smg_grpc_servicer.sglang``: SGLang's ``--smg-grpc-mode`` hook, from smg-servicer-sglang."""
