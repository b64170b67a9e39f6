"""Engine ZMQ KV-event publishers -> ``SubscribeKvEvents`` (engine-free: pyzmq + msgspec).

- :mod:`.wire` — the publishers' frames and replay replies;
- :mod:`.normalize` — engine events -> ``KvCacheEvent`` protos, drops counted by reason;
- :mod:`.relay` — :class:`KvRelay`: live relay, resume from a cursor, gap repair, failure codes;
  :func:`subscribe`: a servicer's whole ``SubscribeKvEvents``;
- :mod:`.testing` — a scriptable publisher.
"""

from smg_servicer_kv_bridge.relay import KvRelay, KvSource, subscribe, subscription

__all__ = ["KvRelay", "KvSource", "subscribe", "subscription"]
