"""TokenSpeed's EPD embedding handoff (encode → prefill) on a CPU, for the scheduler stand-in.

Everything between the two GPU pieces is TokenSpeed's own and runs here: its encode loop
(``epd.encode_loop.run_encode_loop``), encode worker, scheduler, embedding cache and executor
(``DisaggEncodeExecutor``: the bounce ring, the per-request sender), the Mooncake embedding
manager and its bootstrap server on the encode side; on the prefill side its embedding manager,
receive job and admission (``epd.prefill_admission.make_epd_prefill_admission``:
``stage`` / ``drain``). The bytes move through Mooncake's transfer engine, over TCP.

What is stood in, and why:

- **The vision tower** (:class:`StandInTower`): the real one runs on TokenSpeed's CUDA model
  runner. Each item's embedding is ``[its post-merge token count, hidden]`` float32 rows drawn
  from a generator seeded by the CRC-32 of the item's pixels, so it depends on the picture;
  each is recorded (``{"type": "embedded", "hash", "rows", "digest"}``).
- **Mooncake's build**: TokenSpeed's own (``tokenspeed-mooncake``) links the CUDA driver and
  cannot load without a GPU. Mooncake's stock non-CUDA build moves the same bytes over TCP
  when there is no RDMA device, and lacks only ``batch_transfer_sync_write_pages``, the KV
  path's page-gathered write, which TokenSpeed's engine wrapper checks for at construction and
  this path never calls (:func:`mooncake_on_cpu` gives it one that raises).
- **The language model and the P→D KV transfer**: the prefill is the stand-in scheduler. A
  request whose items carry an ``encode_handshake`` is staged with TokenSpeed's admission and
  runs only once it is admitted; its embeddings' digest is recorded
  (``{"type": "embedding", ...}``) and salts its tokens. With ``handoff_dir`` the prefill writes
  that digest for the request's KV room, and the decode (:class:`HandoffDecode`) holds the
  request until it is there and salts its tokens with it: the answer depends on the embedding
  that crossed, as the KV of a real prefill would.

The encode role always runs here (:func:`run_encode`); options (``SMG_TS_STANDIN``):
``epd_transfer`` (true: a prefill receives with TokenSpeed's admission), ``handoff_dir`` (the P→D
stand-in's folder, on prefill and decode).
"""

from __future__ import annotations

import importlib
import json
import logging
import time
import zlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from smg_servicer_tokenspeed import _tokenspeed as ts
from smg_servicer_tokenspeed.testing.scheduler import StandIn, append_entry

logger = logging.getLogger(__name__)

#: The prefill's receive pool and the encode worker's bounce ring, sized for tiny embeddings
#: (TokenSpeed's defaults reserve 16 x 256 MiB and 64 x 256 MiB).
RECV_POOL = {"TOKENSPEED_EPD_RECV_POOL_SLOTS": 2, "TOKENSPEED_EPD_RECV_POOL_SLOT_MB": 1}
RING_SLOTS, RING_BYTES = 4, 1 << 20
#: How long the decode holds a request for its prefill's handoff before it aborts it.
HANDOFF_WAIT_S = 60.0


def mooncake_on_cpu() -> None:
    """Mooncake's stock non-CUDA ``TransferEngine``, with the one method TokenSpeed's wrapper
    checks for and the embedding path never calls."""
    engine: Any = importlib.import_module("mooncake.engine")
    base: Any = engine.TransferEngine
    if hasattr(base, "batch_transfer_sync_write_pages"):
        return

    class TransferEngine(base):
        def batch_transfer_sync_write_pages(self, *args: Any, **kwargs: Any) -> int:
            raise NotImplementedError(
                "the KV path's page-gathered write is not in Mooncake's non-CUDA build"
            )

    engine.TransferEngine = TransferEngine


def digest(tensor: Any) -> int:
    """CRC-32 of a tensor's bytes."""
    flat = tensor.detach().contiguous().reshape(-1)
    return zlib.crc32(flat.view(-1).cpu().numpy().view("uint8").tobytes())


def _spans(offsets: Any) -> list[list[int]]:
    pairs: list[Any] = list(offsets or [])
    return [[int(start), int(end)] for start, end in pairs]


def encode_entry(request: Any) -> dict[str, Any]:
    """The record of an ``EncodeRequest``: its bootstrap and its items."""
    received: list[Any] = list(request.items)
    items: list[dict[str, Any]] = [
        {
            "modality": item.modality.name,
            "shape": list(item.feature.shape),
            "dtype": str(item.feature.dtype).removeprefix("torch."),
            "offsets": _spans(item.offsets),
            "hash": item.hash,
            "pad_value": item.pad_value,
            "model_specific": sorted(item.model_specific_data),
        }
        for item in received
    ]
    return {
        "type": "encode",
        "request_id": request.request_id,
        "bootstrap": [request.bootstrap_host, request.bootstrap_port, request.bootstrap_room],
        "items": items,
    }


class StandInTower:
    """The vision tower as TokenSpeed's executor calls it (``get_multimodal_encoder_specs``)."""

    num_deepstack_embeddings = 0

    def __init__(self, hidden: int, record: Path | None) -> None:
        self.hidden = hidden
        self.record = record

    def get_multimodal_encoder_specs(self) -> dict[Any, Any]:
        inputs = importlib.import_module("tokenspeed.runtime.multimodal.inputs")
        return {m: SimpleNamespace(fn=self.embed) for m in inputs.Modality}

    def embed(self, items: list[Any]) -> Any:
        import torch  # noqa: PLC0415

        count = importlib.import_module("tokenspeed.runtime.multimodal.embedder")._item_token_count  # pyright: ignore[reportPrivateUsage]
        rows: list[Any] = []
        for item in items:
            pixels = item.feature.detach().contiguous().reshape(-1).view(torch.uint8)
            seed = zlib.crc32(pixels.numpy().tobytes())
            generator = torch.Generator().manual_seed(seed)
            embedding = torch.randn(count(item), self.hidden, generator=generator)
            append_entry(
                self.record,
                {"type": "embedded", "hash": item.hash, "rows": int(embedding.shape[0]),
                 "digest": digest(embedding)},
            )  # fmt: skip
            rows.append(embedding)
        return torch.cat(rows)


def run_encode(server_args: Any, port_args: Any, pipe_writer: Any, options: dict[str, Any]) -> None:
    """TokenSpeed's encode loop, built as ``_build_encode_worker`` builds it but on the CPU with
    :class:`StandInTower`; each ``EncodeRequest`` is recorded as it is submitted."""
    mooncake_on_cpu()
    loop: Any = importlib.import_module("tokenspeed.runtime.epd.encode_loop")
    executor_mod = importlib.import_module("tokenspeed.runtime.epd.encode_executor")
    entities = importlib.import_module("tokenspeed.runtime.epd.entities")
    conn = importlib.import_module("tokenspeed.runtime.epd.mooncake.conn")
    encode = importlib.import_module("tokenspeed.runtime.epd.mooncake.encode")
    record = Path(options["record"]) if options.get("record") else None

    class RecordingEncodeWorker(loop.EncodeWorker):
        def submit(self, request: Any) -> None:
            append_entry(record, encode_entry(request))
            super().submit(request)  # pyright: ignore[reportUnknownMemberType]

    def build(server_args: Any, port_args: Any, gpu_id: int, global_rank: int) -> Any:
        config = ts.model_config(server_args)
        mapping = server_args.mapping
        if mapping.attn.tp_rank == 0:
            conn.MooncakeEmbeddingBootstrapServer(server_args.disaggregation_bootstrap_port)
        manager = encode.MooncakeEmbeddingManagerEncode(
            loop._build_manager_args(server_args, mapping),  # pyright: ignore[reportPrivateUsage]
            entities.EmbeddingArgs(
                engine_rank=global_rank, gpu_id=gpu_id,
                ib_device=server_args.disaggregation_ib_device,
                embedding_data_ptr=0, embedding_data_len=0,
            ),
        )  # fmt: skip
        executor = executor_mod.DisaggEncodeExecutor(
            manager, StandInTower(config.hidden_size, record), device="cpu",
            ring_slots=RING_SLOTS, ring_bytes=RING_BYTES,
        )  # fmt: skip
        cache = loop._make_embedding_cache(  # pyright: ignore[reportPrivateUsage]
            loop._embedding_cache_bytes(loop.envs.TOKENSPEED_EPD_ENCODE_EMBED_CACHE_MB),  # pyright: ignore[reportPrivateUsage]
            0,
            "cpu",
        )
        scheduler = loop.EncodeScheduler(
            max_tokens_per_batch=server_args.chunked_prefill_size or 8192,
            max_items_per_batch=server_args.max_num_seqs,
        )
        return RecordingEncodeWorker(executor, scheduler, cache), config, "bfloat16"

    loop._build_encode_worker = build  # pyright: ignore[reportPrivateUsage]
    # Marks the start of serving for TokenSpeed's GPU kernel-compile monitor, which the CPU
    # environment stubs (tools/envs/tokenspeed-cpu/stubs/tokenspeed_kernel).
    loop.mark_jit_compile_serving = lambda: None
    loop.run_encode_loop(server_args, port_args, pipe_writer, 0, 0)


class HandoffDecode(StandIn):
    """A decode that continues from its prefill: a request with a KV room waits for the
    prefill's handoff (``handoff_dir/<room>.json``, the digest of what it received), and its
    tokens are salted with it. The tokens it sends for such a request are recorded when it
    finishes (``{"type": "answer", "rid", "tokens"}``: the router's reply carries them, though
    the tiny tokenizer may decode them to no text)."""

    def __init__(self, server_args: Any, port_args: Any, options: dict[str, Any]) -> None:
        super().__init__(server_args, port_args, options)
        self.handoff_dir = Path(str(options["handoff_dir"]))
        self.waiting: dict[str, tuple[Any, float]] = {}
        self.answers: dict[str, list[int]] = {}

    def emit(self, rows: list[tuple[Any, list[int], dict[str, Any] | None]]) -> None:
        for req, ids, finish in rows:
            if req.rid in self.answers:
                self.answers[req.rid].extend(ids)
                if finish is not None:
                    tokens = self.answers.pop(req.rid)
                    self._record({"type": "answer", "rid": req.rid, "tokens": tokens})
        super().emit(rows)

    def holding(self) -> bool:
        return bool(self.waiting)

    def generate(self, obj: Any) -> None:
        if obj.bootstrap_room is None:
            super().generate(obj)
            return
        self.waiting[str(obj.rid)] = (obj, time.monotonic() + HANDOFF_WAIT_S)

    def tick(self) -> None:
        for rid, (obj, deadline) in list(self.waiting.items()):
            path = self.handoff_dir / f"{obj.bootstrap_room}.json"
            if path.exists():
                del self.waiting[rid]
                salt = int(json.loads(path.read_text())["digest"])
                self._record({"type": "handoff", "rid": rid, "digest": salt})
                self.answers[rid] = []
                self.generate_salted(obj, salt)
            elif time.monotonic() > deadline:
                del self.waiting[rid]
                self.refuse_now(obj, "no KV came from the prefill")


class EpdPrefill(StandIn):
    """A prefill that receives its requests' embeddings with TokenSpeed's own admission."""

    def __init__(self, server_args: Any, port_args: Any, options: dict[str, Any]) -> None:
        super().__init__(server_args, port_args, options)
        import torch  # noqa: PLC0415

        envs = importlib.import_module("tokenspeed.runtime.utils.env").envs
        for name, value in RECV_POOL.items():  # unless the environment sizes it
            if not getattr(envs, name).is_set():
                getattr(envs, name).set(value)
        mooncake_on_cpu()
        admission = importlib.import_module("tokenspeed.runtime.epd.prefill_admission")
        config = ts.model_config(server_args)
        facts = SimpleNamespace(
            device="cpu", hidden=config.hidden_size, num_deepstack=0, dtype=torch.float32
        )
        self.admission: Any = admission.make_epd_prefill_admission(
            server_args, 0, model_config=config, encoder_model_facts=lambda: facts,
            mapping=server_args.mapping, attn_tp_rank=0, attn_tp_size=1,
            attn_tp_cpu_group=None, pg_manager=None,
        )  # fmt: skip
        handoff = options.get("handoff_dir")
        self.handoff_dir = Path(str(handoff)) if handoff else None
        self.staged: dict[str, tuple[Any, list[Any]]] = {}

    def holding(self) -> bool:
        return bool(self.staged)

    def generate(self, obj: Any) -> None:
        inputs: Any = obj.multimodal_inputs
        every: list[Any] = inputs.mm_items if inputs else []
        items = [i for i in every if i.encode_handshake]
        if not items or self.admission is None:
            self.hand_off(obj, 0)
            super().generate(obj)
            return
        rid = str(obj.rid)
        self._record(
            {"type": "staged", "rid": rid,
             "handshakes": [{k: i.encode_handshake[k] for k in sorted(i.encode_handshake)}
                            for i in items]}
        )  # fmt: skip
        self.admission.stage(rid, items)
        self.staged[rid] = (obj, items)

    def tick(self) -> None:
        if not self.staged:
            return
        admitted, failed = self.admission.drain()
        for rid in admitted:
            obj, items = self.staged.pop(rid)
            received = zlib.crc32(b"".join(digest(i.encoded).to_bytes(4, "little") for i in items))
            self._record(
                {"type": "embedding", "rid": rid,
                 "rooms": [i.encode_handshake["bootstrap_room"] for i in items],
                 "shapes": [list(i.encoded.shape) for i in items],
                 "dtype": str(items[0].encoded.dtype).removeprefix("torch."),
                 "digests": [digest(i.encoded) for i in items], "digest": received}
            )  # fmt: skip
            self.hand_off(obj, received)
            self.generate_salted(obj, received)
        for rid in failed:
            obj, _ = self.staged.pop(rid)
            self._record({"type": "embedding-failed", "rid": rid})
            self.refuse_now(obj, "the embedding transfer from the encode worker failed")

    def hand_off(self, obj: Any, received: int) -> None:
        if self.handoff_dir is None or obj.bootstrap_room is None:
            return
        path = self.handoff_dir / f"{obj.bootstrap_room}.json"
        path.with_suffix(".tmp").write_text(json.dumps({"digest": received}))
        path.with_suffix(".tmp").replace(path)
