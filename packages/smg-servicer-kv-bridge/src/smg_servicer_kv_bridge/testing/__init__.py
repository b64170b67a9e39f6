"""A scriptable engine publisher (PUB + replay ROUTER) for tests and the relay benchmark, and the
KV-event faults every engine's servicer is put through (:mod:`.faults`)."""

from smg_servicer_kv_bridge.testing.faults import EXPECTED, kv_fault_outcomes
from smg_servicer_kv_bridge.testing.publisher import ScriptedPublisher, stored_event

__all__ = ["EXPECTED", "ScriptedPublisher", "kv_fault_outcomes", "stored_event"]
