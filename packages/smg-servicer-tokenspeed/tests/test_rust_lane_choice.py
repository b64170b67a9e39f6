"""What the Rust lane cannot serve is refused at start, one line each (the lane itself:
tests/engine/test_rust_lane.py)."""

from __future__ import annotations

import pytest

from smg_servicer_core.config import resolve
from smg_servicer_core.errors import ConfigError
from smg_servicer_tokenspeed import rust_lane
from smg_servicer_tokenspeed.settings import servicer_settings

pytestmark = pytest.mark.unit


def test_request_spans_are_refused_on_the_rust_lane() -> None:
    asked = resolve(
        servicer_settings(), None, {"SMG_TOKENSPEED_SERVICER_OTLP_TRACES_ENDPOINT": "h:4317"}
    )
    with pytest.raises(ConfigError, match=r"^--otlp-traces-endpoint is not served by"):
        rust_lane.refuse_unserved(asked)
    rust_lane.refuse_unserved(resolve(servicer_settings(), None, {}))
