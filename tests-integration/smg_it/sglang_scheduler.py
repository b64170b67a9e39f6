"""A scripted stand-in for SGLang's scheduler at the IPC boundary, for faults the real one
cannot be made to show on demand (silence, a refused request, an unreadable frame).

It connects to the request manager's sockets exactly as a scheduler rank does and speaks
SGLang's own frames (``io_struct`` objects through ``async_sock_send``/``async_sock_recv``).
The engine tests prove the same paths against the real scheduler where it can show them.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from smg_servicer_sglang import _sglang as sg


@dataclass
class FakePortArgs:
    scheduler_input_ipc_name: str
    tokenizer_ipc_name: str
    detokenizer_ipc_name: str


def port_args() -> FakePortArgs:
    root = Path(tempfile.mkdtemp(prefix="smg-fake-sched-"))
    return FakePortArgs(
        scheduler_input_ipc_name=f"ipc://{root}/in",
        tokenizer_ipc_name=f"ipc://{root}/tok",
        detokenizer_ipc_name=f"ipc://{root}/detok",
    )


def token_output(rid: str, ids: list[int], completion: int, finish: dict[str, Any] | None,
                 prompt: int = 3) -> Any:  # fmt: skip
    """A one-request ``BatchTokenIDOutput`` with no logprobs (the installed release's struct)."""
    empty: list[Any] = []
    # SGLang 0.5.20 only (0.5.21 removed it): a required field.
    only_0520 = "output_token_sampling_logprobs"
    extra = {only_0520: None} if only_0520 in sg.BatchTokenIDOutput.__struct_fields__ else {}
    return sg.BatchTokenIDOutput(
        rids=[rid],
        finished_reasons=[finish],
        decoded_texts=[""],
        decode_ids=[array("q", ids)],
        read_offsets=[0],
        output_ids=[array("q", ids)],
        skip_special_tokens=[True],
        spaces_between_special_tokens=[True],
        no_stop_trim=[False],
        prompt_tokens=[prompt],
        reasoning_tokens=[0],
        completion_tokens=[completion],
        cached_tokens=[0],
        input_token_logprobs_val=empty, input_token_logprobs_idx=empty,
        output_token_logprobs_val=empty, output_token_logprobs_idx=empty,
        input_top_logprobs_val=empty, input_top_logprobs_idx=empty,
        output_top_logprobs_val=empty, output_top_logprobs_idx=empty,
        input_token_ids_logprobs_val=empty, input_token_ids_logprobs_idx=empty,
        output_token_ids_logprobs_val=empty, output_token_ids_logprobs_idx=empty,
        output_token_entropy_val=None, output_token_sampling_mask=None,
        output_hidden_states=None, routed_experts=None, indexer_topk=None,
        placeholder_tokens_idx=None, placeholder_tokens_val=None, **extra,
    )  # fmt: skip


class FakeScheduler:
    """Receives what the servicer sends; ``script(obj)`` decides the replies (a coroutine)."""

    def __init__(self, args: FakePortArgs) -> None:
        self.ctx = zmq.asyncio.Context()
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.connect(args.scheduler_input_ipc_name)
        self.out = self.ctx.socket(zmq.PUSH)
        self.out.connect(args.detokenizer_ipc_name)
        self.received: list[Any] = []
        self.mode = "echo"  # "echo": 3 tokens then length; "silent"; "refuse"; "garbage"
        self.refuse_status = 400
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.pull.close(linger=0)
        self.out.close(linger=0)
        self.ctx.term()

    async def send(self, obj: Any) -> None:
        await sg.async_sock_send(self.out, obj)

    async def _loop(self) -> None:
        while True:
            obj = await sg.async_sock_recv(self.pull)
            self.received.append(obj)
            if isinstance(obj, sg.TokenizedGenerateReqInput):
                await self._answer(obj)

    async def _answer(self, req: Any) -> None:
        if self.mode == "silent":
            return
        if self.mode == "garbage":
            await self.out.send(b"\xc1 not a frame")
            return
        if self.mode == "refuse":
            await self.send(
                sg.AbortReq(
                    rid=req.rid,
                    finished_reason={
                        "type": "abort",
                        "message": "the scheduler refused this request",
                        "status_code": self.refuse_status,
                    },
                )
            )
            return
        for step in range(1, 4):
            finish = {"type": "length", "length": 3} if step == 3 else None
            await self.send(token_output(req.rid, [10 + step], step, finish))
