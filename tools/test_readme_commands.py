"""The documentation's commands, flags and variables against the code (``tools/readme_facts.py``
reads and checks them): one test per document and kind of fact, a synthetic document whose every
wrong fact must be reported, and the allow-lists still needed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from readme_facts import (
    HELP_UNAVAILABLE,
    NOT_IN_WORKSPACE,
    ROOT,
    TABLE_COMMANDS,
    console_scripts,
    doc_id,
    documents,
    flag_problems,
    flag_table_command,
    module_exists,
    module_problems,
    script_problems,
    stated,
    stated_in,
    variable_problems,
)

pytestmark = pytest.mark.unit

DOCUMENTS = documents()


def _report(doc: Path, wrong: list[str]) -> str:
    return f"{doc_id(doc)}:\n  " + "\n  ".join(wrong)


@pytest.mark.parametrize("doc", DOCUMENTS, ids=doc_id)
def test_every_python_m_module_exists(doc: Path) -> None:
    wrong = module_problems(stated_in(doc))
    assert not wrong, _report(doc, wrong)


@pytest.mark.parametrize("doc", DOCUMENTS, ids=doc_id)
def test_every_command_of_ours_exists(doc: Path) -> None:
    wrong = script_problems(stated_in(doc))
    assert not wrong, _report(doc, wrong)


@pytest.mark.parametrize("doc", DOCUMENTS, ids=doc_id)
def test_every_flag_given_to_our_commands_is_in_their_help(doc: Path) -> None:
    wrong = flag_problems(stated_in(doc), flag_table_command(doc))
    assert not wrong, _report(doc, wrong)


@pytest.mark.parametrize("doc", DOCUMENTS, ids=doc_id)
def test_every_smg_variable_is_the_codes(doc: Path) -> None:
    wrong = variable_problems(stated_in(doc))
    assert not wrong, _report(doc, wrong)


def test_the_documents_give_the_checks_something_to_check() -> None:
    """The parsing still finds what the documents state (a change of form would otherwise pass
    every check above by finding nothing)."""
    every = [stated_in(doc) for doc in DOCUMENTS]
    commands = [c for s in every for c in s.commands]
    assert {c.name for c in commands if c.kind == "module" and c.flags} >= {
        "smg_grpc_servicer.mlx",
        "smg_servicer_tokenspeed",
        "smg_grpc_servicer.vllm.mm_sidecar",
    }
    assert any(c.kind == "vllm serve" and "--mm-processor" in c.flags for c in commands)
    assert sum(len(s.table_flags) for s in every) >= 20
    assert sum(len(s.variables) for s in every) >= 50


SYNTHETIC = """\
# A wrong README

Run `python -m smg_servicer_mlx --model M --made-up-flag 3`, or `python -m
smg_servicer_nothing --model M`.

```bash
SMG_TOKENSPEED_SERVICER_IMPL=rust python -m smg_grpc_servicer.tokenspeed --grace-perod 3 \\
    --model M --served-model-name x   # --not-a-flag: a comment
vllm serve M --grpc --mm-processor inprocess --mm-procesor redis
smg-servicer-mlx --model M --adapter-pth A
python -m smg_servicer_sglang --servicer-impl rust --lora-allowed-dir /x --model-path M
bash tools/test.sh --fast --fastest && python tools/no_such_tool.py
```

| flag | variable |
|---|---|
| `--max-queue` | `SMG_MLX_MAX_QUEUE` |
| `--max-queues` | `SMG_MLX_MAX_QUEUES` |

`SMG_SERVICER_SSL_*`, `SMG_<ENGINE>_SERVICER_METRICS_PORT`, `SMG_VLLM_MM_REDIS_{CA,CERT}_FILE`;
not `SMG_VLLM_MM_REDIS_{CA,PEM}_FILE`, `SMG_NOPE_*`, `SMG_<ENGINE>_NOPE` or `smg-servicer-nope
--help`.
"""


def test_the_checks_report_each_wrong_fact() -> None:
    """A made-up README: each wrong module, command, flag and variable is reported, by line; the
    right ones are not."""
    found = stated(SYNTHETIC, console_scripts())
    wrong = "\n".join(
        [
            *module_problems(found),
            *script_problems(found),
            *flag_problems(found, TABLE_COMMANDS["smg-servicer-mlx"]),
            *variable_problems(found),
        ]
    )
    expected = [
        "line 3: `python -m smg_servicer_nothing`: no such module",
        "line 3: `--made-up-flag` given to `smg_servicer_mlx`",
        "line 7: `--grace-perod` given to `smg_grpc_servicer.tokenspeed`",
        "line 7: `--served-model-name` given to `smg_grpc_servicer.tokenspeed`",
        "line 9: `--mm-procesor` given to `vllm serve`",
        "line 10: `--adapter-pth` given to `smg-servicer-mlx`",
        "line 11: `--lora-allowed-dir` given to `smg_servicer_sglang`",
        "line 12: `--fastest` given to `tools/test.sh`: not in its text",
        "line 12: `tools/no_such_tool.py`: no such file",
        "line 18: the flag table's `--max-queues`",
        "line 18: `SMG_MLX_MAX_QUEUES`: no source",
        "line 21: `SMG_VLLM_MM_REDIS_{CA,PEM}_FILE`: no source",
        "line 21: `SMG_NOPE_*`: no source",
        "line 21: `SMG_<ENGINE>_NOPE`: no source",
        "line 21: `smg-servicer-nope`: no package's [project.scripts]",
    ]
    missing = [fact for fact in expected if fact not in wrong]
    assert not missing, f"not reported: {missing}\nreported:\n{wrong}"
    assert len(wrong.splitlines()) == len(expected), wrong
    for right in ("--model`", "--grpc`", "--mm-processor`", "--fast`", "--servicer-impl`"):
        assert right not in wrong


def test_the_allow_lists_are_still_needed() -> None:
    """A module of NOT_IN_WORKSPACE that the workspace gained, or a launcher of HELP_UNAVAILABLE
    that prints its help here now, is checked like the rest instead."""
    assert not [m for m in NOT_IN_WORKSPACE if module_exists(m)]
    for module in HELP_UNAVAILABLE:
        done = subprocess.run(
            [sys.executable, "-m", module, "--help"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode != 0 and "usage:" not in done.stdout, module
