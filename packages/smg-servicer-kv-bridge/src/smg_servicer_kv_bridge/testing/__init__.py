"""A scriptable engine publisher (PUB + replay ROUTER) for tests and the relay benchmark."""

from smg_servicer_kv_bridge.testing.publisher import ScriptedPublisher, stored_event

__all__ = ["ScriptedPublisher", "stored_event"]
