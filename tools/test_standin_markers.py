"""A test that reads what TokenSpeed's scheduler stand-in recorded carries the ``standin`` marker,
and the GPU check deselects those tests.

The stand-in (``smg_servicer_tokenspeed.testing.scheduler``) appends every message it receives to
a JSON-lines file; the tests read it through ``smg_it.tokenspeed_suite.Record`` (its public
methods: ``entries``, ``rids``). On a GPU machine ``tools/gpu/tokenspeed_check.sh`` runs the real
scheduler (``SMG_TS_REAL_SCHEDULER=1``: no stand-in, nothing recorded), so a test that reads the
records fails there unless it is marked ``standin``, which the script deselects.

Found statically (``ast``): a test reads the records when its body, a helper it calls (a function
of its module, or one it imports from the test kit), or a fixture it requests (its module's, a
``conftest.py``'s above it, ``smg_it.fixtures``'), transitively, calls one of ``Record``'s methods
on a ``Record``: a name annotated ``Record``, assigned ``Record(…)``, or a fixture returning one.
The marker counts on the test, its class or the module's ``pytestmark``.
"""

from __future__ import annotations

import ast
import shlex
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from smg_servicer_tokenspeed.testing import REAL_SCHEDULER

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
KIT = ROOT / "tests-integration"
SUITE = KIT / "smg_it" / "tokenspeed_suite.py"
GPU_CHECK = ROOT / "tools" / "gpu" / "tokenspeed_check.sh"
#: Where tests live.
TEST_ROOTS = (ROOT / "packages", KIT)
MARKER = "standin"
RECORD = "Record"

Function = ast.FunctionDef | ast.AsyncFunctionDef


def record_api(suite: Path = SUITE) -> frozenset[str]:
    """``Record``'s public methods: how a test reads the stand-in's records."""
    for node in ast.parse(suite.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == RECORD:
            return frozenset(
                f.name for f in node.body if isinstance(f, Function) and not f.name.startswith("_")
            )
    raise AssertionError(f"{suite}: no class {RECORD}")


def _mentions_record(annotation: ast.expr | None) -> bool:
    return annotation is not None and any(
        isinstance(n, ast.Name) and n.id == RECORD for n in ast.walk(annotation)
    )


def _is_fixture(function: Function) -> bool:
    for decorator in function.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Attribute) and target.attr == "fixture":
            return True
        if isinstance(target, ast.Name) and target.id == "fixture":
            return True
    return False


def _fixture_name(function: Function) -> str:
    for decorator in function.decorator_list:
        if isinstance(decorator, ast.Call):
            for keyword in decorator.keywords:
                if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
                    return str(keyword.value.value)
    return function.name


def _marked(decorators: list[ast.expr]) -> bool:
    """``@pytest.mark.standin`` (or ``mark.standin``) among ``decorators``."""
    for decorator in decorators:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Attribute) and target.attr == MARKER:
            return True
    return False


def _module_marked(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if not any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets):
            continue
        marks = value.elts if isinstance(value, ast.List | ast.Tuple) else [value]
        if _marked(marks):
            return True
    return False


@dataclass
class Scope:
    """What a test file's functions may call or request by name."""

    helpers: dict[str, Function] = field(default_factory=dict)
    fixtures: dict[str, Function] = field(default_factory=dict)


def _module_functions(tree: ast.Module) -> Iterator[Function]:
    yield from (node for node in tree.body if isinstance(node, Function))


def _kit_module(module: str) -> Path | None:
    """The test kit's file of ``module`` (``smg_it.lanes`` -> tests-integration/smg_it/lanes.py)."""
    path = KIT.joinpath(*module.split(".")).with_suffix(".py")
    return path if path.is_file() else None


def _imported_helpers(tree: ast.Module) -> dict[str, Function]:
    helpers: dict[str, Function] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            path = _kit_module(node.module)
            if path is None:
                continue
            functions = {f.name: f for f in _module_functions(ast.parse(path.read_text()))}
            for alias in node.names:
                if alias.name in functions:
                    helpers[alias.asname or alias.name] = functions[alias.name]
    return helpers


def scope_of(test_file: Path, tree: ast.Module) -> Scope:
    """The helpers and fixtures ``test_file``'s tests see (nearest first)."""
    scope = Scope()
    conftests = [d / "conftest.py" for d in [test_file.parent, *test_file.parent.parents]]
    layers = [tree]
    layers += [ast.parse(c.read_text()) for c in conftests if c.is_file() and c != test_file]
    layers.append(ast.parse((KIT / "smg_it" / "fixtures.py").read_text()))
    for layer in reversed(layers):  # a nearer definition wins
        for function in _module_functions(layer):
            if _is_fixture(function):
                scope.fixtures[_fixture_name(function)] = function
    scope.helpers.update(_imported_helpers(tree))
    scope.helpers.update({f.name: f for f in _module_functions(tree) if not _is_fixture(f)})
    return scope


class Reads:
    """Which functions read the stand-in's records, in one scope (memoised, cycle-safe)."""

    def __init__(self, scope: Scope, api: frozenset[str]) -> None:
        self.scope = scope
        self.api = api
        self.memo: dict[int, bool] = {}

    def record_fixtures(self) -> set[str]:
        return {
            name
            for name, fixture in self.scope.fixtures.items()
            if _mentions_record(fixture.returns)
            or any(isinstance(n, ast.Call) and self._is_record_call(n) for n in ast.walk(fixture))
        }

    def __call__(self, function: Function) -> bool:
        key = id(function)
        if key not in self.memo:
            self.memo[key] = False  # a cycle reads nothing more
            self.memo[key] = self._reads(function)
        return self.memo[key]

    def _reads(self, function: Function) -> bool:
        args = [*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs]
        fixtures = self.record_fixtures()
        records = {a.arg for a in args if _mentions_record(a.annotation) or a.arg in fixtures}
        for node in ast.walk(function):
            if isinstance(node, ast.Assign | ast.AnnAssign) and self._makes_record(node):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                records.update(t.id for t in targets if isinstance(t, ast.Name))
        for node in ast.walk(function):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in self.api:
                owner = func.value
                if isinstance(owner, ast.Name) and owner.id in records:
                    return True
                if isinstance(owner, ast.Call) and self._is_record_call(owner):
                    return True
            if isinstance(func, ast.Name):
                helper = self.scope.helpers.get(func.id)
                if helper is not None and helper is not function and self(helper):
                    return True
        requested = [a.arg for a in args if a.arg in self.scope.fixtures]
        return any(self(self.scope.fixtures[name]) for name in requested)

    @staticmethod
    def _is_record_call(node: ast.Call) -> bool:
        return isinstance(node.func, ast.Name) and node.func.id == RECORD

    def _makes_record(self, node: ast.Assign | ast.AnnAssign) -> bool:
        if isinstance(node, ast.AnnAssign) and _mentions_record(node.annotation):
            return True
        return isinstance(node.value, ast.Call) and self._is_record_call(node.value)


@dataclass(frozen=True)
class Found:
    test: str  # file::test (file relative to the checkout)
    marked: bool


def record_readers(path: Path, source: str, api: frozenset[str]) -> list[Found]:
    """The tests of ``source`` (the file at ``path``) that read the stand-in's records."""
    tree = ast.parse(source)
    reads = Reads(scope_of(path, tree), api)
    module_marked = _module_marked(tree)
    name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    found = []
    for node in tree.body:
        if isinstance(node, Function) and node.name.startswith("test"):
            tests = [(node.name, node, module_marked or _marked(node.decorator_list))]
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            around = module_marked or _marked(node.decorator_list)
            tests = [
                (f"{node.name}::{f.name}", f, around or _marked(f.decorator_list))
                for f in node.body
                if isinstance(f, Function) and f.name.startswith("test")
            ]
        else:
            continue
        found.extend(Found(f"{name}::{test}", marked) for test, f, marked in tests if reads(f))
    return found


def _test_files() -> list[Path]:
    files = []
    for root in TEST_ROOTS:
        for path in sorted(root.rglob("test_*.py")):
            if not any(part.startswith(".venv") for part in path.parts):
                files.append(path)
    return files


@pytest.fixture(scope="module")
def readers() -> list[Found]:
    api = record_api()
    found: list[Found] = []
    for path in _test_files():
        source = path.read_text()
        if RECORD in source:
            found.extend(record_readers(path, source, api))
    return found


def test_every_test_that_reads_the_standins_records_is_marked_standin(
    readers: list[Found],
) -> None:
    unmarked = [f.test for f in readers if not f.marked]
    assert not unmarked, (
        f"these read what the scheduler stand-in recorded (Record.{'/'.join(sorted(record_api()))}"
        f") without @pytest.mark.{MARKER}; on the real scheduler "
        f"(tools/gpu/tokenspeed_check.sh) they fail:\n  " + "\n  ".join(unmarked)
    )


def test_the_search_finds_the_readers_it_knows(readers: list[Found]) -> None:
    """The search still sees each way of reading: in the test's body, through a helper
    (``_until``), and in the lane tests."""
    tests = {f.test for f in readers}
    engine = "packages/smg-servicer-tokenspeed/tests/engine"
    assert {
        f"{engine}/test_engine.py::test_sampled_requests_carry_their_seed",
        f"{engine}/test_encode_role.py::test_an_encode_request_reaches_the_encode_loop_as_tokenspeeds_own",
        f"{engine}/test_zmq_lane.py::test_a_client_that_disconnects_stops_its_request",
        f"{engine}/test_rust_lane.py::test_logprobs_and_a_grammar_reach_the_scheduler",
    } <= tests, sorted(tests)


SYNTHETIC = """
import pytest
from smg_it.tokenspeed_suite import Record


@pytest.fixture
def record(tmp_path) -> Record:
    return Record(tmp_path / "record.jsonl")


@pytest.fixture
def aborted(record: Record) -> list[str]:
    return record.rids("abort")


def _last(rec: Record) -> dict:
    return rec.entries("generate")[-1]


def test_reads_directly(record: Record) -> None:
    assert record.entries()


def test_reads_through_a_helper(record: Record) -> None:
    assert _last(record)


def test_reads_through_a_fixture(aborted: list[str]) -> None:
    assert aborted


def test_reads_a_record_it_makes(tmp_path) -> None:
    assert Record(tmp_path / "r.jsonl").rids("generate") == []


@pytest.mark.standin
def test_marked(record: Record) -> None:
    assert record.entries()


def test_only_passes_the_record_on(record: Record) -> None:
    assert record.path.name == "record.jsonl"


@pytest.mark.standin
class TestMarkedClass:
    def test_inside(self, record: Record) -> None:
        assert record.entries()


class TestUnmarkedClass:
    def test_inside(self, record: Record) -> None:
        assert record.rids("abort")
"""


def test_the_search_reports_an_unmarked_reader(tmp_path: Path) -> None:
    """Every way of reading is found; marks on the test or its class count; a test that only
    hands the record on is no reader."""
    path = tmp_path / "test_synthetic.py"
    readers = record_readers(path, SYNTHETIC, record_api())
    found = {f.test.split("::", 1)[1]: f.marked for f in readers}
    assert found == {
        "test_reads_directly": False,
        "test_reads_through_a_helper": False,
        "test_reads_through_a_fixture": False,
        "test_reads_a_record_it_makes": False,
        "test_marked": True,
        "TestMarkedClass::test_inside": True,
        "TestUnmarkedClass::test_inside": False,
    }, found
    marked_module = "pytestmark = [pytest.mark.engine, pytest.mark.standin]\n" + SYNTHETIC
    assert all(f.marked for f in record_readers(path, marked_module, record_api()))


def test_the_standin_marker_is_registered() -> None:
    """``--strict-markers`` refuses an unregistered marker: the root pyproject declares it."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    markers = config["ini_options"]["markers"]
    assert any(m.split(":")[0].strip() == MARKER for m in markers), markers


def _pytest_runs(script: str) -> list[list[str]]:
    """The script's ``python -m pytest`` command lines, as arguments after ``pytest``."""
    lines: list[str] = []
    for raw in script.splitlines():
        if lines and lines[-1].endswith("\\"):
            lines[-1] = lines[-1][:-1] + " " + raw.strip()
        else:
            lines.append(raw.strip())
    runs = []
    for line in lines:
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words = list(lexer)
        for i in range(1, len(words)):
            if words[i - 1 : i + 1] == ["-m", "pytest"]:
                rest = words[i + 1 :]
                ends = [n for n, w in enumerate(rest) if set(w) <= set("&|;()")]
                runs.append(rest[: ends[0]] if ends else rest)
    return runs


def _selection(run: list[str]) -> tuple[list[str], str]:
    """A pytest command line's paths and its ``-m`` expression."""
    paths, expression, skip = [], "", False
    for i, word in enumerate(run):
        if skip:
            skip = False
        elif word in ("-m", "-k", "-p"):
            if word == "-m":
                expression = run[i + 1]
            skip = True
        elif not word.startswith("-") and "||" not in word:
            paths.append(word.split("::")[0])
    return paths, expression


def test_the_gpu_check_runs_the_real_scheduler_without_the_standin_tests(
    readers: list[Found],
) -> None:
    """tools/gpu/tokenspeed_check.sh: the real scheduler (the stand-in's variable set), pytest
    runs of paths that exist, and every run that covers a test marked ``standin`` (each test
    that reads the records) deselects the marker."""
    script = GPU_CHECK.read_text()
    assert f"{REAL_SCHEDULER.env}=1" in script
    runs = [_selection(run) for run in _pytest_runs(script)]
    assert runs, "the GPU check runs no pytest"
    for paths, _ in runs:
        assert paths and all((ROOT / p).exists() for p in paths), paths
    engine = "packages/smg-servicer-tokenspeed/tests/engine"
    assert any(engine in paths for paths, _ in runs), "the GPU check runs no engine test"
    for reader in readers:
        file = reader.test.split("::")[0]
        for paths, expression in runs:
            if any(file == p or file.startswith(p.rstrip("/") + "/") for p in paths):
                assert f"not {MARKER}" in expression, (paths, expression, reader.test)
