"""The router's SGLang ZMQ wire, from inside SGLang's scheduler (``smg`` 1.13's
``engine_zmq_client::protocol::sglang``).

The router binds a handshake socket (ROUTER), an input socket (ROUTER) and an output socket
(PULL); the scheduler rank that owns request I/O dials in:

- **handshake** (msgpack maps with named keys): HELLO from a DEALER whose identity is the engine
  index as a little-endian u16; the router's INIT names the data-plane addresses; READY; then the
  scheduler connects a DEALER (same identity) to the input address and registers with its
  :class:`ReadyResponse`, and a PUSH to the output address;
- **requests** (``[type byte, payload, *aux]``): ``0x00`` ADD, SGLang's own positional
  ``TokenizedGenerateReqInput`` (the router sends the prefix through ``stream``; the scheduler's
  own decoder fills the rest with its defaults, token ids a plain integer array); ``0x01`` ABORT,
  a msgpack list of request ids; ``0x02`` CONTROL, ``[call_id, method, args]``;
- **outputs** (positional, tag first): :class:`TokenOutput` (``BatchTokenIDSlimOutput``: the token
  columns, then the scheduler's load, the abort's HTTP status and the top logprobs; the router
  reads a prefix and tolerates more) and :class:`ControlReply` (``ControlReplySlim``);
  :data:`~smg_servicer_core.zmq_lane.ENGINE_CORE_DEAD` alone says the engine is gone.

The router forwards what its client sent without checking it against the model, so the request
source here checks what SGLang's tokenizer manager would have (:meth:`RequestSource.refusal`): a
request it refuses ends at once with an ``abort`` carrying status 400, and the scheduler never
sees it. Everything SGLang-specific is imported lazily: the module loads without SGLang (its unit
tests), the scheduler's structs come from the running release.
"""

from __future__ import annotations

import logging
import struct
import time
from array import array
from collections.abc import Callable, Sequence
from typing import Any, cast

import msgspec
import zmq

from smg_servicer_core import validate
from smg_servicer_core.zmq_lane import ENGINE_CORE_DEAD

logger = logging.getLogger(__name__)

ADD, ABORT, CONTROL = b"\x00", b"\x01", b"\x02"
#: A control call's request id in the scheduler (its reply comes back under it).
CONTROL_RID = "smg-control-"
#: The router may start long after the model loaded: how long the handshake waits for INIT.
INIT_WAIT_S = 600.0
#: How stale the load the outputs carry may be (the snapshot walks the waiting queue).
LOAD_REFRESH_S = 0.05
#: The status of a request this side refuses (the client's error) and of one refused by a drain.
BAD_REQUEST, UNAVAILABLE = 400, 503
SHUTTING_DOWN = "the worker is shutting down: retry on another worker"

_DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}

#: The ``SamplingParams`` field order the router (``smg`` 1.13) encodes: SGLang 0.5.20's and
#: 0.5.21's. 0.5.22 inserted ``watermark`` before ``stop_strs``, so on a release whose order
#: differs the request source re-lays the router's array by name (:func:`sampling_layout`).
ROUTER_SAMPLING_FIELDS = (
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k",
    "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n",
    "beam_width", "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos",
    "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "stream_interval",
    "logit_bias", "sampling_seed", "custom_params", "stop_strs", "stop_regex_strs",
    "stop_str_max_len", "stop_regex_max_len", "is_normalized", "ebnf_full_assistant",
)  # fmt: skip
#: Where the sampling parameters sit in the router's ``TokenizedGenerateReqInput`` array (the
#: tag is element 0; the scheduler's own field order, every release we admit).
SAMPLING_SLOT = 8


class Hello(msgspec.Struct):
    """The scheduler's handshake status (HELLO, then READY)."""

    status: str
    local: bool = True
    headless: bool = True


class ReadyResponse(msgspec.Struct):
    """What the scheduler registers with on the input socket (the router reads the names)."""

    max_model_len: int
    num_gpu_blocks: int
    block_size: int
    dtype: str
    vllm_version: str
    max_num_seqs: int
    max_num_batched_tokens: int
    instance_id: str
    kv_cache_size_tokens: int
    world_size: int = 1
    data_parallel_size: int = 1
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    decode_context_parallel_size: int = 1
    data_parallel_rank: int = 0
    dp_stats_address: str | None = None
    multimodal_encoder_dtype: str | None = None
    kv_cache_max_concurrency: float | None = None
    kv_events_config: dict[str, Any] | None = None


class TokenOutput(msgspec.Struct, tag="BatchTokenIDSlimOutput", array_like=True):
    """One scheduler step's outputs, a column per field, a row per request. The field order is
    the router's contract: append only."""

    rids: list[str]
    output_ids: list[list[int]]
    #: "" while generating, else stop | length | abort.
    finished_reasons: list[str]
    finished_messages: list[str | None]
    #: The stop token id or stop string a ``stop`` finish matched.
    finished_matched: list[int | str | None]
    prompt_tokens: list[int]
    completion_tokens: list[int]
    cached_tokens: list[int]
    output_token_logprobs_val: list[list[float]]
    output_token_logprobs_idx: list[list[int]]
    engine_index: int = 0
    num_running: int = 0
    num_waiting: int = 0
    kv_used_tokens: int = 0
    kv_total_tokens: int = 0
    #: The HTTP status of an ``abort`` (the router answers the client with it).
    finished_status: list[int | None] = []
    output_top_logprobs_val: list[list[list[float]]] = []
    output_top_logprobs_idx: list[list[list[int]]] = []


class ControlReply(msgspec.Struct, tag="ControlReplySlim", array_like=True):
    """The answer to a control call, under the router's call id."""

    call_id: int
    success: bool
    message: str | None = None
    engine_index: int = 0


def sglang() -> Any:
    """SGLang's names (:mod:`smg_servicer_sglang._sglang`, the one module that imports SGLang),
    imported on first use: this module loads without SGLang."""
    from smg_servicer_sglang import _sglang  # noqa: PLC0415

    return _sglang


_ENCODE = msgspec.msgpack.Encoder()
_ABORT_IDS = msgspec.msgpack.Decoder(list[str])
_CONTROL = msgspec.msgpack.Decoder(tuple[int, str, list[Any]])


def encode(obj: msgspec.Struct) -> bytes:
    return _ENCODE.encode(obj)


def identity(engine_index: int) -> bytes:
    """The scheduler's ZMQ identity: the engine index as a little-endian u16."""
    if not 0 <= engine_index <= 0xFFFF:
        raise ValueError(f"engine index {engine_index} must be in 0..65535")
    return struct.pack("<H", engine_index)


def wire_dtype(dtype: object) -> str:
    """The router's dtype name for a torch dtype; ``ValueError`` for one it has no name for."""
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise ValueError(f"dtype {dtype} has no name on the router's wire")
    return _DTYPES[name]


def _column(values: Sequence[Any] | None, count: int, default: Any) -> list[Any]:
    out = list(values or [])
    return out + [default] * (count - len(out))


def _rows(values: Sequence[Any] | None, count: int) -> list[list[Any]]:
    return [list(v or []) for v in _column(values, count, None)]


def _finish(reason: dict[str, Any] | None) -> tuple[str, str | None, int | str | None, int | None]:
    """A scheduler finish (``BaseFinishReason.to_json()``) as type, message, matched, status."""
    if not reason:
        return "", None, None, None
    kind = str(reason.get("type") or "")
    matched = reason.get("matched")
    status = reason.get("status_code")
    return (
        kind,
        reason.get("message"),
        matched if isinstance(matched, (int, str)) else None,  # a multi-token stop: unnamed
        int(status) if isinstance(status, int) else None,
    )


def token_output(out: Any, engine_index: int, load: dict[str, int]) -> TokenOutput:
    """The router's columns of a scheduler ``BatchTokenIDOutput``."""
    rids = list(out.rids or [])
    n = len(rids)
    finishes = [_finish(r) for r in _column(out.finished_reasons, n, None)]
    return TokenOutput(
        rids=rids,
        output_ids=_rows(out.output_ids, n),
        finished_reasons=[f[0] for f in finishes],
        finished_messages=[f[1] for f in finishes],
        finished_matched=[f[2] for f in finishes],
        prompt_tokens=[int(v or 0) for v in _column(out.prompt_tokens, n, 0)],
        completion_tokens=[int(v or 0) for v in _column(out.completion_tokens, n, 0)],
        cached_tokens=[int(v or 0) for v in _column(out.cached_tokens, n, 0)],
        output_token_logprobs_val=_rows(out.output_token_logprobs_val, n),
        output_token_logprobs_idx=_rows(out.output_token_logprobs_idx, n),
        engine_index=engine_index,
        finished_status=[f[3] for f in finishes],
        output_top_logprobs_val=[
            [list(step) for step in row] for row in _rows(out.output_top_logprobs_val, n)
        ],
        output_top_logprobs_idx=[
            [list(step) for step in row] for row in _rows(out.output_top_logprobs_idx, n)
        ],
        **load,
    )


def abort_output(
    rid: str, message: str, status: int | None, engine_index: int, load: dict[str, int]
) -> TokenOutput:
    """One request's end with no tokens: an ``abort`` with ``message`` and ``status``."""
    return TokenOutput(
        rids=[rid], output_ids=[[]], finished_reasons=["abort"], finished_messages=[message],
        finished_matched=[None], prompt_tokens=[0], completion_tokens=[0], cached_tokens=[0],
        output_token_logprobs_val=[[]], output_token_logprobs_idx=[[]],
        engine_index=engine_index, finished_status=[status],
        output_top_logprobs_val=[[]], output_top_logprobs_idx=[[]], **load,
    )  # fmt: skip


class OutputSender:
    """The scheduler's sender on this lane (``send_output(output, recv_obj)``, the shape of
    SGLang's ``SenderWrapper``), in both of its sender slots. Made before the model loads (the
    scheduler hands it to its components), attached to the PUSH socket at the handshake. It keeps
    the requests in flight (:attr:`live`), which a drain waits for. Runs on the scheduler's loop,
    so it never raises: an output it cannot relay ends its requests with an error instead, and
    the request source aborts them in the scheduler (:attr:`unrelayed`)."""

    def __init__(self) -> None:
        self.socket: zmq.Socket[bytes] | None = None
        self.engine_index = 0
        self.live: set[str] = set()
        #: Requests ended on the router's side whose output could not be relayed: the request
        #: source's next drain aborts them in the scheduler too.
        self.unrelayed: list[str] = []
        self._probe: Callable[[], Any] | None = None
        self._load: tuple[float, dict[str, int]] = (0.0, {})

    def attach(
        self, socket: zmq.Socket[bytes], engine_index: int, probe: Callable[[], Any]
    ) -> None:
        self.socket, self.engine_index, self._probe = socket, engine_index, probe

    def load(self) -> dict[str, int]:
        """The scheduler's load for the output's tail (at most :data:`LOAD_REFRESH_S` old)."""
        now = time.monotonic()
        if self._probe is None or now - self._load[0] < LOAD_REFRESH_S:
            return self._counted(self._load[1])
        try:
            snap = self._probe()
            load = {
                "num_running": int(snap.num_running_reqs),
                "num_waiting": int(snap.num_waiting_reqs),
                "kv_used_tokens": int(snap.num_used_tokens),
                "kv_total_tokens": int(snap.max_total_num_tokens),
            }
        except Exception:  # the load is best effort: never fail an output over it
            logger.warning("the scheduler's load could not be read", exc_info=True)
            load = self._load[1]
        self._load = (now, load)
        return self._counted(load)

    def _counted(self, load: dict[str, int]) -> dict[str, int]:
        """``load`` with its request counts bounded by what is in flight here: the scheduler
        counts a request that finishes in this step as running, and the output that ends it may
        be the last the router gets for a while (an idle scheduler sends nothing)."""
        if not load:
            return load
        waiting = min(load["num_waiting"], len(self.live))
        running = min(load["num_running"], len(self.live) - waiting)
        return {**load, "num_running": running, "num_waiting": waiting}

    def _send(self, obj: msgspec.Struct) -> None:
        if self.socket is None:
            logger.warning("dropped a %s sent before the handshake", type(obj).__name__)
            return
        self.socket.send(encode(obj), copy=False)

    def send_abort(self, rid: str, message: str, status: int | None) -> None:
        """End ``rid`` on the router's side: an ``abort`` with ``message`` and ``status``."""
        self.live.discard(rid)
        self._send(abort_output(rid, message, status, self.engine_index, self.load()))

    def send_control_reply(self, call_id: int, success: bool, message: str | None) -> None:
        self._send(ControlReply(call_id, success, message, self.engine_index))

    def send_output(self, output: Any, recv_obj: object | None = None) -> None:
        try:
            self._relay(output, recv_obj)
        except Exception:
            rids = list(getattr(output, "rids", None) or [getattr(output, "rid", None) or ""])
            logger.exception("a %s could not be relayed to the router", type(output).__name__)
            for rid in filter(None, rids):
                self.unrelayed.append(rid)
                try:
                    self.send_abort(rid, "the engine's output could not be relayed", None)
                except zmq.ZMQError:
                    logger.warning("the router is gone: request %s not told", rid)

    def _relay(self, output: Any, recv_obj: object | None) -> None:
        sg = sglang()
        if isinstance(output, sg.BatchTokenIDOutput):
            for rid, reason in zip(output.rids or [], output.finished_reasons or [], strict=False):
                if reason:
                    self.live.discard(rid)
                    if reason.get("type") == "abort":
                        logger.info("request %s ended by abort: %s", rid, reason.get("message"))
            self._send(token_output(output, self.engine_index, self.load()))
        elif isinstance(output, sg.AbortReq) and output.rid:
            # The scheduler refused or dropped a request: its own message and status.
            _, message, _, status = _finish(output.finished_reason or {"type": "abort"})
            self.send_abort(output.rid, output.abort_message or message or "aborted", status)
        elif isinstance(output, sg.FlushCacheReqOutput):
            rid = str(getattr(recv_obj, "rid", None) or getattr(output, "rid", None) or "")
            if rid.startswith(CONTROL_RID):
                self.send_control_reply(
                    int(rid[len(CONTROL_RID) :]), bool(output.success), output.message or None
                )
        else:
            logger.debug("no consumer on this lane for a %s", type(output).__name__)

    def send_dead(self) -> None:
        """:data:`ENGINE_CORE_DEAD` (best effort: the socket may be gone)."""
        if self.socket is not None:
            try:
                self.socket.send(ENGINE_CORE_DEAD, zmq.NOBLOCK)
            except zmq.ZMQError:
                logger.warning("the dead-engine sentinel could not be sent")


class SamplingLayout:
    """The running release's ``SamplingParams`` order against the router's: :meth:`relay`
    rewrites the router's array by field name where the two differ (a field the release does not
    have must be unset, else the request is refused; one the router does not send takes the
    release's default)."""

    def __init__(self, fields: Sequence[str], defaults: dict[str, Any]) -> None:
        self.fields = tuple(fields)
        self.defaults = defaults
        self.same = self.fields[: len(ROUTER_SAMPLING_FIELDS)] == ROUTER_SAMPLING_FIELDS

    def relay(self, values: list[Any]) -> list[Any]:
        if self.same:
            return values
        if len(values) > len(ROUTER_SAMPLING_FIELDS):
            raise ValueError(f"{len(values)} sampling parameters: the router sends at most 32")
        named: dict[str, Any] = dict(zip(ROUTER_SAMPLING_FIELDS, values, strict=False))
        for name, value in named.items():
            if name not in self.fields and value:  # set (not None, False or 0)
                raise ValueError(f"sampling parameter {name} is not on this SGLang release")
        return [named.get(name, self.defaults.get(name)) for name in self.fields]


def sampling_layout() -> SamplingLayout:
    """The running release's layout (its ``SamplingParams`` struct)."""
    params: Any = sglang().SamplingParams
    defaults: dict[str, Any] = {}
    for field in msgspec.structs.fields(params):
        if field.default is not msgspec.NODEFAULT:
            defaults[field.name] = field.default
        elif field.default_factory is not msgspec.NODEFAULT:
            defaults[field.name] = field.default_factory()
    return SamplingLayout(params.__struct_fields__, defaults)


def _request_decoder() -> msgspec.msgpack.Decoder[Any]:
    """SGLang's own request decoder (its structs, its hooks), widened to take the router's token
    ids as a plain integer array where SGLang's tokenizer manager sends an ``array('q')``."""
    sg = sglang()

    def widened(tp: type, obj: object) -> object:
        if tp is array and isinstance(obj, list):
            return array("q", cast("list[int]", obj))
        return sg.msgpack_dec_hook(tp, obj)

    return msgspec.msgpack.Decoder(
        sg.TokenizedGenerateReqInput | sg.TokenizedEmbeddingReqInput,
        dec_hook=widened,
        ext_hook=sg.msgpack_ext_hook,
    )


def _readable_rid(payload: bytes) -> str | None:
    """The request id of an ADD SGLang could not decode (element 1 of the array), if any."""
    try:
        loose = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError:
        return None
    items = cast("list[Any]", loose) if isinstance(loose, list) else []
    return items[1] if len(items) > 1 and isinstance(items[1], str) else None


#: Why an adapter is refused on the Rust and ZMQ lanes.
LORA_ON_PYTHON_LANE = (
    "LoRA adapters are served on the Python gRPC lane only (it resolves and counts them; this "
    "lane cannot)"
)


#: Images on the router's ZMQ lane reach the scheduler unchecked (counts the forward pass fails
#: on): the lane refuses them; the Python lane checks and serves them (issue #45).
IMAGES_ON_PYTHON_LANE = (
    "images are not served on the ZMQ lane: serve this model on the Python lane (gRPC) to send them"
)


def _python_lane_only(req: Any) -> str | None:
    """Why ``req`` needs the Python lane, or None."""
    if getattr(req, "mm_inputs", None) is not None:
        return IMAGES_ON_PYTHON_LANE
    if getattr(req, "lora_id", None):
        # The scheduler takes a registered adapter id only (it asserts on another and dies);
        # names, loads and in-use counts live in the tokenizer manager's role.
        return f"lora_id {str(req.lora_id)[:128]!r}: {LORA_ON_PYTHON_LANE}"
    return None


class RequestSource:
    """The scheduler's request source on this lane: :meth:`drain` is what SGLang's request
    receiver calls each loop (every message waiting, never blocking, never raising). A request
    it refuses is answered through the sender, so no stream waits for it."""

    def __init__(
        self,
        socket: zmq.Socket[bytes],
        sender: OutputSender,
        vocab_size: int,
        tokenizer: Any = None,
        *,
        context_length: int,
    ) -> None:
        self.socket = socket
        self.sender = sender
        self.vocab_size = vocab_size
        self.context_length = context_length
        self.tokenizer = tokenizer
        #: Set by a drain: new requests are refused, those in flight finish.
        self.draining = False
        self._decoder = _request_decoder()
        self._layout = sampling_layout()

    def refusal(self, req: Any) -> str | None:
        """Why the scheduler must not see ``req`` (what SGLang's front end would refuse)."""
        if not isinstance(req, sglang().TokenizedGenerateReqInput):
            return "only generation requests are served on this lane"
        if why := validate.prompt_refusal(req.input_ids, self.vocab_size, self.context_length):
            return why  # the one prompt rule of every lane (SGLang's own bound may be lower)
        params = req.sampling_params
        try:
            params.normalize(self.tokenizer)
            params.verify(self.vocab_size)
        except Exception as exc:  # SGLang's own validation: its message is for the client
            return str(exc) or type(exc).__name__
        if params.n != 1:
            return f"n={params.n}: the router fans out n > 1 itself"
        return _python_lane_only(req)

    def drain(self, limit: int) -> list[Any]:
        """Every request waiting (at most ``limit``; <0: no limit) as the scheduler's structs."""
        received: list[Any] = []
        if self.sender.unrelayed:
            received.extend(sglang().AbortReq(rid=rid) for rid in self.sender.unrelayed)
            self.sender.unrelayed.clear()
        while limit < 0 or len(received) < limit:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError:
                break
            try:
                received.extend(self._decode(frames))
            except Exception:  # a message the scheduler cannot take: never its loop's problem
                logger.warning("dropped an unreadable message (%d frames)", len(frames))
        return received

    def _decode(self, frames: list[bytes]) -> list[Any]:
        sg = sglang()
        kind, payload = frames[0], frames[1] if len(frames) > 1 else b""
        if kind == ABORT:
            rids = _ABORT_IDS.decode(payload)
            logger.info("the router aborts %s", ", ".join(rids))
            return [sg.AbortReq(rid=rid) for rid in rids]
        if kind == CONTROL:
            return self._control(payload)
        if kind != ADD:
            raise ValueError(f"unknown request type {kind!r}")
        try:
            req = self._decoder.decode(self._relaid(payload))
        except (msgspec.DecodeError, ValueError) as exc:
            rid = _readable_rid(payload)
            if rid is None:
                raise
            self.sender.send_abort(rid, f"the engine cannot read the request: {exc}", BAD_REQUEST)
            return []
        why = SHUTTING_DOWN if self.draining else self.refusal(req)
        if why is not None:
            logger.info("refused request %s: %s", req.rid, why)
            self.sender.send_abort(req.rid, why, UNAVAILABLE if self.draining else BAD_REQUEST)
            return []
        self.sender.live.add(req.rid)
        return [req]

    def _relaid(self, payload: bytes) -> bytes:
        """``payload`` with its sampling parameters in the running release's order."""
        if self._layout.same:
            return payload
        loose: Any = msgspec.msgpack.decode(payload)
        items = cast("list[Any]", loose) if isinstance(loose, list) else []
        if len(items) > SAMPLING_SLOT and isinstance(items[SAMPLING_SLOT], list):
            items[SAMPLING_SLOT] = self._layout.relay(cast("list[Any]", items[SAMPLING_SLOT]))
        return _ENCODE.encode(loose)

    def _control(self, payload: bytes) -> list[Any]:
        call_id, method, args = _CONTROL.decode(payload)
        if method == "flush_cache":
            timeout = float(args[0]) if args and args[0] is not None else None
            return [sglang().FlushCacheReqInput(rid=f"{CONTROL_RID}{call_id}", timeout_s=timeout)]
        self.sender.send_control_reply(call_id, False, f"{method} is not served on this lane")
        return []


def handshake(
    ctx: zmq.Context[Any],
    address: str,
    *,
    engine_index: int,
    ready: ReadyResponse,
    sender: OutputSender,
    probe: Callable[[], Any],
    vocab_size: int,
    tokenizer: Any = None,
    wait_s: float = INIT_WAIT_S,
) -> RequestSource:
    """HELLO, INIT, READY on ``address``; register on the input socket; attach the output
    socket to ``sender``. ``TimeoutError`` when no INIT came within ``wait_s``."""
    me = identity(engine_index)
    dial = ctx.socket(zmq.DEALER)
    dial.setsockopt(zmq.IDENTITY, me)
    dial.setsockopt(zmq.LINGER, 0)
    dial.connect(address)
    try:
        dial.send(encode(Hello("HELLO")))
        deadline = time.monotonic() + wait_s
        while not dial.poll(1000):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the router at {address} sent no INIT in {wait_s:.0f}s")
        init: Any = msgspec.msgpack.decode(dial.recv_multipart()[-1])
        dial.send(encode(Hello("READY")))
    finally:
        dial.close()
    table = cast("dict[str, Any]", init) if isinstance(init, dict) else {}
    found: Any = table.get("addresses")
    addresses = cast("dict[str, Any]", found) if isinstance(found, dict) else {}
    inputs = [str(a) for a in cast("list[Any]", addresses.get("inputs") or [])]
    outputs = [str(a) for a in cast("list[Any]", addresses.get("outputs") or [])]
    if not inputs or not outputs:
        raise ValueError(f"the router's INIT names no data-plane addresses: {addresses!r}")
    source = ctx.socket(zmq.DEALER)
    source.setsockopt(zmq.IDENTITY, me)
    source.setsockopt(zmq.LINGER, 0)
    source.connect(inputs[0])
    source.send(encode(ready))
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 1000)  # the sentinel at exit gets a moment to leave
    push.connect(outputs[0])
    sender.attach(push, engine_index, probe)
    logger.info("registered with the router as engine %d (%s)", engine_index, inputs[0])
    return RequestSource(source, sender, vocab_size, tokenizer, context_length=ready.max_model_len)
