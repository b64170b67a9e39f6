"""``ModelFacts``: one typed record of what a servicer knows about its model, from which every
wire's ``GetModelInfoResponse`` is built (:meth:`ModelFacts.to_proto`).

Each wire carries a subset of these fields (MLX has no ``tokenizer_path``, only SGLang has
``id2label_json``); :meth:`ModelFacts.to_proto` fills the fields the wire's message has and leaves
the rest out, so an engine package states its facts once and never writes the message by hand.
The same record gives the validators their limits (:attr:`vocab_size`, :attr:`max_context_length`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

_M = TypeVar("_M")


@dataclass(frozen=True)
class ModelFacts:
    model_path: str
    vocab_size: int
    max_context_length: int
    served_model_name: str = ""
    tokenizer_path: str = ""
    is_generation: bool = True
    supports_vision: bool = False
    model_type: str = ""
    architectures: tuple[str, ...] = ()
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int = 0
    bos_token_id: int = 0
    #: The longest prompt the engine admits (0: the context length).
    max_req_input_len: int = 0
    #: Sampling defaults the model ships (generation_config.json), as a mapping.
    default_sampling_params: Mapping[str, Any] = field(default_factory=dict[str, Any])
    preferred_sampling_params: str = ""
    weight_version: str = ""
    id2label: Mapping[str, str] = field(default_factory=dict[str, str])
    num_labels: int = 0

    def values(self) -> dict[str, Any]:
        """The facts as the wire (and the ``smg`` wheel's Rust servers' keywords) name them."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values["served_model_name"] = self.served_model_name or self.model_path
        values["max_req_input_len"] = self.max_req_input_len or self.max_context_length
        values["architectures"] = list(self.architectures)
        values["eos_token_ids"] = list(self.eos_token_ids)
        defaults = values.pop("default_sampling_params")
        values["default_sampling_params_json"] = (
            json.dumps(dict(defaults), separators=(",", ":")) if defaults else ""
        )
        labels = values.pop("id2label")
        values["id2label_json"] = json.dumps(dict(labels)) if labels else ""
        return values

    def to_proto(self, message_type: type[_M]) -> _M:
        """The wire's ``GetModelInfoResponse`` (``message_type``) with every field it has."""
        names = {f.name for f in message_type.DESCRIPTOR.fields}  # type: ignore[attr-defined]
        return message_type(**{k: v for k, v in self.values().items() if k in names})
