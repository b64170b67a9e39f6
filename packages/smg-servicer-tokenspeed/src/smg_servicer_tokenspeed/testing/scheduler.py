"""A CPU stand-in for TokenSpeed's GPU scheduler process, speaking TokenSpeed's own wire.

TokenSpeed 0.1.1's scheduler needs CUDA; its front end (``AsyncLLM``, the request path, the
load-snapshot store, the communicators) runs on a CPU. :func:`run` takes the scheduler's place
(``SMG_TOKENSPEED_SCHEDULER=smg_servicer_tokenspeed.testing.scheduler:run``, see
:mod:`smg_servicer_tokenspeed._tokenspeed`): it is started by TokenSpeed's own
``_launch_subprocesses`` exactly as ``run_event_loop`` is, connects to the front end's real
sockets and answers with TokenSpeed's ``io_struct`` messages:

- the ready dict on the start-up pipe (``max_model_len`` from the model's ``config.json``);
- ``TokenizedGenerateReqInput``: one token per running request per step (``step_ms``), batched
  into one ``BatchTokenIDOut`` per step; tokens are a deterministic function of the request's
  seed, prompt and position (:func:`token_at`; greedy requests, ``top_k`` 1, use seed 0),
  never an EOS id; ``stop_token_ids`` finish with ``{"type": "stop", "matched": id}``,
  ``max_new_tokens`` with ``{"type": "length"}``; logprob columns when asked;
- ``AbortReq`` drops the request; ``FlushCacheReqInput`` succeeds only with nothing running;
  ``ProfileReq`` start/stop (a second start or a stop without start fails, as the real one does);
  ``IsSchedulerPausedReqInput``;
- a ``LoadSnapshot`` on the metrics socket on every change and every second;
- KV events through TokenSpeed's own publisher (``--kv-events-config``, ZMQ with replay): a
  ``BlockStored`` chain of ``BLOCK``-token blocks for every new prompt block (a prefix cache that
  never evicts), ``BlockRemoved`` of every stored block when a cache flush succeeds;
- an injected crash: a request whose id starts with ``crash_prefix`` ends the process (exit 17);
- injected refusals: a request whose id starts with a key of ``refuse`` (``{prefix: status}``)
  finishes at once with ``{"type": "abort", "status_code": status, "message": ...}``, as the real
  scheduler refuses a request it cannot serve.

With ``--disaggregation-mode encode`` the process runs TokenSpeed's own encode loop
(``run_encode_loop``) with its vision tower stood in, each ``EncodeRequest`` recorded (its
bootstrap and items); with the option ``epd_transfer`` a prefill receives the embeddings with
TokenSpeed's own admission, and with ``handoff_dir`` the decode continues from its prefill
(:mod:`.epd`: what runs and what is stood in).

Under ``--zmq-msgpack`` (what ``ts serve --headless`` and our headless launcher set, the router's
direct ZMQ lane) it dials the router through TokenSpeed's own ``zmq_msgpack.connect_msgpack_engine``
before it reports ready, as the real loop does, takes the router's requests from that socket (a
request TokenSpeed's wire marked invalid ends at once with an abort, as the real scheduler admits it
pre-finished), puts its load on every output batch (``set_load_snapshot``), and on SIGTERM stops and
sends the dead-engine sentinel, as the real loop does.

Every message it receives is appended as one JSON line to ``record`` (when set), which is how
tests see that an abort reached the scheduler. Options come from ``SMG_TS_STANDIN`` (a JSON object:
``step_ms``, ``record``, ``crash_prefix``, ``refuse``, ``epd_transfer``, ``handoff_dir``).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import signal
import time
import uuid
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import zmq

from smg_servicer_core.config import Setting, setting_value
from smg_servicer_tokenspeed._tokenspeed import TOKENSPEED_VERSION, io, kv, zmq_msgpack

logger = logging.getLogger(__name__)

STANDIN = Setting(
    "standin", json.loads, {}, "options of the scheduler stand-in (JSON)", env="SMG_TS_STANDIN"
)
ENTRY = "smg_servicer_tokenspeed.testing.scheduler:run"
CRASH_EXIT = 17
KV_TOKENS = 65536
MAX_NUM_SEQS = 8
HEARTBEAT_S = 1.0
#: Ids below this are never produced (specials of small vocabularies live there).
FIRST_TOKEN = 3
#: Tokens per KV block of the stand-in's prefix cache.
BLOCK = 16


def block_hash(parent: int | None, tokens: Sequence[int]) -> int:
    """The stand-in's block hash: a chain over the block's tokens (63 bits)."""
    return zlib.crc32(f"{parent}:{list(tokens)}".encode()) | (len(tokens) << 40)


def token_at(seed: int, prompt: Sequence[int], position: int, vocab: int, avoid: set[int]) -> int:
    """The stand-in's token at ``position`` of a request (deterministic, never in ``avoid``)."""
    base = zlib.crc32(f"{seed}:{sum(prompt)}:{len(prompt)}:{position}".encode())
    token = FIRST_TOKEN + base % (vocab - FIRST_TOKEN)
    while token in avoid:
        token = FIRST_TOKEN + (token + 1 - FIRST_TOKEN) % (vocab - FIRST_TOKEN)
    return token


def logprob_at(position: int, token: int) -> float:
    """A distinct, negative logprob per position (so merged frames stay tellable apart)."""
    return -round(0.01 * (position + 1) + (token % 7) * 0.1, 6)


@dataclass
class _Req:
    rid: str
    prompt: list[int]
    max_new: int
    seed: int
    stop_ids: set[int]
    return_logprob: bool
    produced: list[int] = field(default_factory=list[int])


def _model_config(model: str) -> dict[str, Any]:
    try:
        value = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}  # pyright: ignore[reportUnknownVariableType]


class StandIn:
    def __init__(self, server_args: Any, port_args: Any, options: dict[str, Any]) -> None:
        self.io = io
        self.zmq = zmq
        config = _model_config(str(server_args.model))
        self.vocab = int(config.get("vocab_size") or 32000)
        eos: Any = config.get("eos_token_id")
        eos_ids: list[Any] = cast(list[Any], eos) if isinstance(eos, list) else [eos]
        self.eos: set[int] = {int(t) for t in eos_ids if t is not None}
        self.context = int(
            getattr(server_args, "max_model_len", None)
            or config.get("max_position_embeddings")
            or 2048
        )
        self.step_s = float(options.get("step_ms", 2)) / 1000
        self.crash_prefix = str(options.get("crash_prefix") or "")
        self.refuse: dict[str, int] = {
            str(k): int(v) for k, v in dict(options.get("refuse") or {}).items()
        }
        record = options.get("record")
        self.record_path = Path(record) if record else None
        self.ctx = zmq.Context()
        self.msgpack = bool(getattr(server_args, "zmq_msgpack", False))
        self.stopping = False
        self.encoder = io.MsgpackEncoder()
        if self.msgpack:
            self.receiver, self.sender = self._dial(server_args)
            self.pull = self.receiver._socket  # pyright: ignore[reportPrivateUsage]
            signal.signal(signal.SIGTERM, self._stop)
        else:
            self.pull = self.ctx.socket(zmq.PULL)
            self.pull.connect(port_args.scheduler_input_ipc_name)
            self.push = self.ctx.socket(zmq.PUSH)
            self.push.connect(port_args.tokenizer_ipc_name)
            self.loads = self.ctx.socket(zmq.PUSH)
            self.loads.connect(port_args.metrics_ipc_name)
            self.receiver = io.IpcReceiver(self.pull)
            self.sender = io.IpcSender(self.push)
        self.running: dict[str, _Req] = {}
        #: TokenSpeed's pause (``PauseSchedulerReqInput``): None, or the mode it was paused in;
        #: what arrives meanwhile waits in ``held`` for the resume.
        self.paused: str | None = None
        self.held: list[Any] = []
        self.pause_reply_due = False
        self.profiling = False
        self.epoch = uuid.uuid4().hex
        self.sequence = 0
        self.last_load: tuple[int, int] | None = None
        self.last_load_at = 0.0
        self.kv_publisher = kv.EventPublisherFactory.create(server_args.kv_events_config, 0)
        self.cached: set[int] = set()

    def _dial(self, server_args: Any) -> tuple[Any, Any]:
        """The router's handshake, as the real loop's ``connect_msgpack_engine_for_loop``."""
        wire = zmq_msgpack.zmq_wire
        ready = wire.WireEngineCoreReadyResponse(
            max_model_len=self.context,
            num_gpu_blocks=KV_TOKENS // BLOCK,
            prefix_granularity=BLOCK,
            dtype="float32",
            vllm_version=f"tokenspeed-{TOKENSPEED_VERSION}",
            max_num_seqs=MAX_NUM_SEQS,
            max_num_batched_tokens=self.context,
            instance_id=server_args.served_model_name or server_args.model,
            kv_cache_size_tokens=KV_TOKENS,
        )
        return zmq_msgpack.connect_msgpack_engine(
            self.ctx,
            server_args.zmq_handshake_endpoint(),
            int(server_args.zmq_engine_index),
            ready,
            self.vocab,
            enable_output_logprobs=bool(server_args.enable_output_logprobs),
            supports_prompt_logprobs=False,
        )

    def _stop(self, signum: int, frame: object) -> None:
        self.stopping = True

    def ready(self) -> dict[str, Any]:
        return {
            "status": "ready",
            "max_total_num_tokens": KV_TOKENS,
            "max_req_input_len": self.context - 1,
            "max_single_request_tokens": self.context,
            "max_num_seqs": MAX_NUM_SEQS,
            "chunked_prefill_size": self.context,
            "max_model_len": self.context,
            "multimodal_encoder_dtype": "",
            "cache_storage": None,
            "supports_prompt_logprobs": False,
        }

    def _record(self, entry: dict[str, Any]) -> None:
        append_entry(self.record_path, entry)

    # -- the loop ----------------------------------------------------------------------------

    def serve(self) -> None:
        poller = self.zmq.Poller()
        poller.register(self.pull, self.zmq.POLLIN)
        while not self.stopping:
            busy = self.running or self.holding()
            timeout_ms = int((self.step_s if busy else HEARTBEAT_S) * 1000) or 1
            if poller.poll(timeout_ms):
                self.receive()
            self.tick()
            if self.running and self.paused in (None, "wait"):
                self.step()
            if self.pause_reply_due and not self.running:
                self.pause_reply_due = False  # "wait": answered once the running ones finished
                self.sender.send_pyobj(self.io.PauseSchedulerReqOutput(success=True))
            self.publish_load()
        logger.info("stand-in scheduler: stopping (%d request(s) running)", len(self.running))
        if self.msgpack:
            self.sender.send_engine_dead()

    def receive(self) -> None:
        if not self.msgpack:
            while self.pull.poll(0):
                self.handle(self.receiver.recv_pyobj())
            return
        while True:  # the msgpack socket buffers what one frame decodes to
            try:
                obj = self.receiver.recv_pyobj(self.zmq.NOBLOCK)
            except self.zmq.Again:
                return
            self.handle(obj)

    def handle(self, obj: Any) -> None:
        io = self.io
        if isinstance(obj, io.TokenizedGenerateReqInput):
            if self.paused is not None:
                self.held.append(obj)
            else:
                self.generate(obj)
        elif isinstance(obj, io.AbortReq):
            self._record({"type": "abort", "rid": obj.rid})
            self.running.pop(str(obj.rid), None)
        elif isinstance(obj, io.FlushCacheReqInput):
            self._record({"type": "flush", "running": len(self.running)})
            flushed = not self.running
            if flushed and self.cached:
                self.publish_kv([kv.BlockRemoved(block_hashes=sorted(self.cached))])
                self.cached.clear()
            self.sender.send_pyobj(io.FlushCacheReqOutput(success=flushed))
        elif isinstance(obj, io.ProfileReq):
            start = obj.type == io.ProfileReqType.START_PROFILE
            self._record({"type": "profile", "start": start, "output_dir": obj.output_dir})
            if start == self.profiling:
                message = "profiling is already running" if start else "profiling is not running"
                self.sender.send_pyobj(io.ProfileReqOutput(success=False, message=message))
            else:
                self.profiling = start
                message = "profiling started" if start else "profiling stopped"
                self.sender.send_pyobj(io.ProfileReqOutput(success=True, message=message))
        elif isinstance(
            obj,
            (io.PauseSchedulerReqInput, io.ResumeSchedulerReqInput, io.IsSchedulerPausedReqInput),
        ):
            self.pause_control(obj)
        else:
            self._record({"type": type(obj).__name__})
            logger.info("stand-in scheduler ignores %s", type(obj).__name__)

    def pause_control(self, obj: Any) -> None:
        """TokenSpeed's pause, its resume and the question whether it is paused."""
        io = self.io
        if isinstance(obj, io.PauseSchedulerReqInput):
            self.pause(str(obj.mode))
        elif isinstance(obj, io.ResumeSchedulerReqInput):
            self._record({"type": "resume", "held": len(self.held)})
            self.paused = None
            held, self.held = self.held, []
            for request in held:
                self.generate(request)
            self.sender.send_pyobj(io.ResumeSchedulerReqOutput(success=True))
        else:
            paused = self.paused is not None
            self.sender.send_pyobj(io.IsSchedulerPausedReqOutput(is_paused=paused))

    def pause(self, mode: str) -> None:
        """TokenSpeed's pause: "wait" lets the running requests finish before it answers,
        "keep" freezes them where they are; both hold new requests until the resume. "abort"
        (which ends them) is not stood in: refused, so no test takes it for TokenSpeed's."""
        self._record({"type": "pause", "mode": mode, "running": len(self.running)})
        if mode not in ("wait", "keep"):
            message = f"the stand-in scheduler does not pause in {mode!r} mode"
            self.sender.send_pyobj(self.io.PauseSchedulerReqOutput(success=False, message=message))
            return
        self.paused = mode
        if mode == "wait" and self.running:
            self.pause_reply_due = True
        else:
            self.sender.send_pyobj(self.io.PauseSchedulerReqOutput(success=True))

    def holding(self) -> bool:
        """Whether requests wait outside ``running`` (a subclass's; none here)."""
        return False

    def tick(self) -> None:
        """Once a loop pass: a subclass admits what it holds."""

    def generate_salted(self, obj: Any, salt: int) -> None:
        """``generate``, its tokens salted (what a request received changes its answer)."""
        StandIn.generate(self, obj)  # not a subclass's: this request is admitted
        req = self.running.get(str(obj.rid))
        if req is not None:
            req.seed ^= salt

    def refuse_now(self, obj: Any, message: str) -> None:
        """End a request at once, as the scheduler aborts one it cannot run."""
        rid = str(obj.rid)
        aborted = {"type": "abort", "status_code": 503, "message": message}
        self.emit([(_Req(rid, list(obj.input_ids or []), 0, 0, set(), False), [], aborted)])

    def generate(self, obj: Any) -> None:
        rid = str(obj.rid)
        params = obj.sampling_params
        max_new = params.max_new_tokens if params.max_new_tokens is not None else 16
        self._record(
            {
                "type": "generate",
                "rid": rid,
                "input_len": len(obj.input_ids or []),
                "max_new_tokens": max_new,
                "seed": params.seed,
                "stream": bool(obj.stream),
                "return_logprob": bool(obj.return_logprob),
                "data_parallel_rank": obj.data_parallel_rank,
                "bootstrap_room": obj.bootstrap_room,
                "multimodal": obj.multimodal_inputs is not None,
                "json_schema": params.json_schema,
                "regex": params.regex,
                "structural_tag": params.structural_tag,
                "validation_error": getattr(obj, "validation_error", None),
            }
        )
        if self.crash_prefix and rid.startswith(self.crash_prefix):
            logger.error("stand-in scheduler: injected crash on %s", rid)
            os._exit(CRASH_EXIT)
        invalid = getattr(obj, "validation_error", None)
        if invalid:  # the real scheduler admits it pre-finished (FINISH_ABORT)
            aborted = {"type": "abort", "message": f"Invalid request: {invalid}"}
            self.emit([(_Req(rid, list(obj.input_ids or []), 0, 0, set(), False), [], aborted)])
            return
        status = next((v for k, v in self.refuse.items() if rid.startswith(k)), None)
        if status is not None:
            message = f"the stand-in scheduler refused the request ({status})"
            refused = {"type": "abort", "status_code": status, "message": message}
            self.emit([(_Req(rid, list(obj.input_ids or []), 0, 0, set(), False), [], refused)])
            return
        prompt = list(obj.input_ids or [])
        req = _Req(
            rid=rid,
            prompt=prompt,
            # Clamped to what the context leaves, as TokenSpeed's engine does
            # (tokenspeed.runtime.engine.request_handler: max_req_len - prompt - 1): an
            # unbounded ask ends at the context, not never (the lane fuzz found it running on).
            max_new=min(int(max_new), max(self.context - len(prompt) - 1, 0)),
            # Greedy (top_k 1, what temperature 0 becomes) does not depend on the seed, which
            # TokenSpeed's msgpack wire derives from the request id when none was given.
            seed=0 if params.top_k == 1 else int(params.seed or 0),
            stop_ids=set(params.stop_token_ids or ()),
            return_logprob=bool(obj.return_logprob),
        )
        self.store_prompt(req.prompt)
        if req.max_new <= 0:  # a prefix warm-up: prefill only
            self.emit([(req, [], {"type": "length", "length": 0})])
            return
        self.running[rid] = req

    def publish_kv(self, events: list[Any]) -> None:
        self.kv_publisher.publish(kv.KVEventBatch(ts=time.time(), events=events))

    def store_prompt(self, prompt: list[int]) -> None:
        """Prefix-cache the prompt's full blocks; publish the new ones as one stored chain."""
        parent: int | None = None
        new: list[tuple[int, list[int]]] = []
        new_parent: int | None = None
        for start in range(0, len(prompt) - BLOCK + 1, BLOCK):
            tokens = prompt[start : start + BLOCK]
            digest = block_hash(parent, tokens)
            if digest not in self.cached:
                if not new:
                    new_parent = parent
                new.append((digest, tokens))
                self.cached.add(digest)
            parent = digest
        if new:
            stored = kv.BlockStored(
                block_hashes=[d for d, _ in new],
                parent_block_hash=new_parent,
                token_ids=[t for _, tokens in new for t in tokens],
                block_size=BLOCK,
            )
            self.publish_kv([stored])

    def step(self) -> None:
        out: list[tuple[_Req, list[int], dict[str, Any] | None]] = []
        for req in list(self.running.values()):
            token = token_at(req.seed, req.prompt, len(req.produced), self.vocab, self.eos)
            req.produced.append(token)
            finish: dict[str, Any] | None = None
            if token in req.stop_ids:
                finish = {"type": "stop", "matched": token}
            elif len(req.produced) >= req.max_new:
                finish = {"type": "length", "length": req.max_new}
            if finish is not None:
                del self.running[req.rid]
            out.append((req, [token], finish))
        if out:
            self.publish_load()  # on the msgpack wire the load rides on this batch
            self.emit(out)

    def emit(self, rows: list[tuple[_Req, list[int], dict[str, Any] | None]]) -> None:
        """One ``BatchTokenIDOut`` for every request that got a token this step."""
        reqs = [req for req, _, _ in rows]
        new_ids = [list(ids) for _, ids, _ in rows]
        logprobs: list[list[float]] = []
        logprob_ids: list[list[int]] = []
        for req, ids in zip(reqs, new_ids, strict=True):
            first = len(req.produced) - len(ids)
            wanted = req.return_logprob
            logprobs.append([logprob_at(first + i, t) for i, t in enumerate(ids)] if wanted else [])
            logprob_ids.append(list(ids) if wanted else [])
        empty: list[list[Any]] = [[] for _ in rows]
        self.sender.send_pyobj(
            self.io.BatchTokenIDOut(
                rids=[req.rid for req in reqs],
                finished_reasons=[finish for _, _, finish in rows],
                decoded_texts=["" for _ in rows],
                decode_ids=new_ids,
                read_offsets=[0 for _ in rows],
                output_ids=new_ids,
                output_multi_ids=None,
                skip_special_tokens=[True for _ in rows],
                spaces_between_special_tokens=[True for _ in rows],
                no_stop_trim=[False for _ in rows],
                prompt_tokens=[len(req.prompt) for req in reqs],
                completion_tokens=[len(req.produced) for req in reqs],
                cached_tokens=[0 for _ in rows],
                spec_verify_ct=[0 for _ in rows],
                input_token_logprobs_val=empty,
                input_token_logprobs_idx=empty,
                output_token_logprobs_val=logprobs,
                output_token_logprobs_idx=logprob_ids,
                input_top_logprobs_val=empty,
                input_top_logprobs_idx=empty,
                output_top_logprobs_val=empty,
                output_top_logprobs_idx=empty,
                input_token_ids_logprobs_val=empty,
                input_token_ids_logprobs_idx=empty,
                output_token_ids_logprobs_val=empty,
                output_token_ids_logprobs_idx=empty,
                output_hidden_states=[],
                batch_accept_draft_tokens=[],
                output_extra_infos=[],
                generated_time=time.time(),
            )
        )

    def publish_load(self) -> None:
        used = sum(len(r.prompt) + len(r.produced) for r in self.running.values())
        load = (len(self.running), used)
        now = time.monotonic()
        if load == self.last_load and now - self.last_load_at < HEARTBEAT_S:
            return
        self.last_load, self.last_load_at = load, now
        if self.msgpack:  # the load rides on the next output batch
            self.sender.set_load_snapshot(
                len(self.running), 0, -(-used // BLOCK), KV_TOKENS // BLOCK
            )
            return
        self.sequence += 1
        snapshot = self.io.LoadSnapshot(
            self.epoch, self.sequence, 0, len(self.running), 0, used, used, KV_TOKENS,
            int(3 * HEARTBEAT_S * 1000),
        )  # fmt: skip
        frames = self.encoder.encode(snapshot)
        self.loads.send(frames[0], flags=self.zmq.NOBLOCK)


def append_entry(path: Path | None, entry: dict[str, Any]) -> None:
    if path is None:
        return
    with path.open("a") as fh:
        fh.write(json.dumps(entry) + "\n")


def run(server_args: Any, port_args: Any, pipe_writer: Any) -> None:
    """The scheduler process's entry point (TokenSpeed's ``run_event_loop`` signature)."""
    logging.basicConfig(level=logging.INFO)
    raw = setting_value(STANDIN)
    options: dict[str, Any] = raw if isinstance(raw, dict) else {}  # pyright: ignore[reportUnknownVariableType]
    mode = getattr(server_args, "disaggregation_mode", None)
    standin: StandIn
    if mode == "encode":
        epd = importlib.import_module("smg_servicer_tokenspeed.testing.epd")
        epd.run_encode(server_args, port_args, pipe_writer, options)  # sends the ready dict
        return
    if mode == "prefill" and options.get("epd_transfer"):
        standin = importlib.import_module("smg_servicer_tokenspeed.testing.epd").EpdPrefill(
            server_args, port_args, options
        )
    elif mode == "decode" and options.get("handoff_dir"):
        standin = importlib.import_module("smg_servicer_tokenspeed.testing.epd").HandoffDecode(
            server_args, port_args, options
        )
    else:
        standin = StandIn(server_args, port_args, options)
    pipe_writer.send(standin.ready())
    standin.serve()
