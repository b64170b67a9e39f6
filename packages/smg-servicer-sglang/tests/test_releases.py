"""Requests are built for the installed SGLang release's structs (``_sglang._struct``): a field
a later release added is left out while unset, and refused when the request needs it."""

from __future__ import annotations

import pytest

from smg_servicer_core.errors import Unsupported
from smg_servicer_sglang import _sglang as sg

pytestmark = pytest.mark.unit


def test_an_unset_field_the_release_lacks_is_left_out() -> None:
    req = sg._struct(sg.AbortReq, rid="r1", field_of_a_later_release=None)  # pyright: ignore[reportPrivateUsage]
    assert req.rid == "r1"
    assert "field_of_a_later_release" not in sg.AbortReq.__struct_fields__


def test_a_value_for_a_field_the_release_lacks_is_refused_not_dropped() -> None:
    with pytest.raises(Unsupported, match="field_of_a_later_release"):
        sg._struct(sg.AbortReq, rid="r1", field_of_a_later_release="x")  # pyright: ignore[reportPrivateUsage]


def test_the_health_probe_is_built_from_the_release_structs() -> None:
    gen = sg.build_probe("p1", True, None)
    assert isinstance(gen, sg.TokenizedGenerateReqInput)
    assert list(gen.input_ids) == [0]
    assert gen.sampling_params.max_new_tokens == 1
    emb = sg.build_probe("p2", False, None)
    assert isinstance(emb, sg.TokenizedEmbeddingReqInput)
    assert emb.sampling_params.max_new_tokens == 0
