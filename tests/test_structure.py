"""The shape of the code, checked: the import graph, the layering, no provider or architecture branch outside
the providers, the type checker, and README tables that must match the code."""
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tpuctl.core import layout, state
from tpuctl.core.errors import ExitCode
from tpuctl.core.models import Arch, Phase, ProviderName

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "tpuctl"
README = (ROOT / "README.md").read_text()


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, known: set[str] = frozenset()) -> set[str]:
    """Every module imported anywhere in the file (function-level imports too), absolute names. `from P import m`
    of a module m in `known` imports m (P's __init__ is implied), of anything else imports P."""
    mod = _module(path)
    package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    return out


def _graph() -> dict[str, set[str]]:
    files = {_module(p): p for p in PKG.rglob("*.py")}
    return {m: {i for i in _imports(p, set(files)) if i in files and i != m} for m, p in files.items()}


def test_no_import_cycle_inside_tpuctl():
    graph = _graph()
    # Package __init__ modules are implied by importing their children; the edges that matter are module -> module.
    seen, stack, cycles = set(), [], []

    def visit(m):
        if m in stack:
            cycles.append(stack[stack.index(m):] + [m])
            return
        if m in seen:
            return
        seen.add(m)
        stack.append(m)
        for n in sorted(graph[m]):
            visit(n)
        stack.pop()
    for m in sorted(graph):
        visit(m)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_cycle_detector_sees_a_cycle():
    # The graph builder must resolve relative imports, or the test above proves nothing.
    graph = _graph()
    assert "tpuctl.core.layout" in graph["tpuctl.core.runs"]
    assert "tpuctl.providers.gcp.clients" in graph["tpuctl.providers.gcp.gcs_store"]
    assert "tpuctl.control.orchestrator" in graph["tpuctl.cli.common"]   # a function-level import counts


def test_google_and_grpc_are_imported_only_under_providers_gcp():
    offenders = []
    for p in PKG.rglob("*.py"):
        if (PKG / "providers" / "gcp") in p.parents:
            continue
        bad = [i for i in _imports(p) if i.split(".")[0] in ("google", "grpc")]
        if bad:
            offenders.append(f"{p.relative_to(ROOT)}: {sorted(bad)}")
    assert not offenders


_TOPOLOGY_WORDS = {p.value for p in ProviderName} | {a.value for a in Arch}


@pytest.mark.parametrize("name", [*(f"control/{p.name}" for p in sorted((PKG / "control").glob("*.py"))),
                                  *(f"cli/{p.name}" for p in sorted((PKG / "cli").glob("*.py")))])
def test_no_provider_or_architecture_branch(name):
    """The generic layers ask for capabilities; they never compare against a provider or architecture."""
    tree = ast.parse((PKG / name).read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                for sub in ast.walk(side):
                    if isinstance(sub, ast.Constant) and sub.value in _TOPOLOGY_WORDS:
                        found.append(f"line {node.lineno}: compares with {sub.value!r}")
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in ("ProviderName", "Arch"):
            found.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
    assert not found, found


def test_type_checker_passes():
    r = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr


def test_no_blanket_type_ignores():
    config = (ROOT / "pyproject.toml").read_text()
    assert "ignore_errors" not in config
    assert "disallow_untyped_defs = true" in config
    for p in PKG.rglob("*.py"):
        text = p.read_text()
        assert "mypy: ignore-errors" not in text and "type: ignore-file" not in text, p
        for line in text.splitlines():
            if "type: ignore" in line:
                # a line-level ignore names its error code and says why
                assert re.search(r"type: ignore\[[a-z-, ]+\]\s+#\s*\S", line), f"{p}: {line.strip()}"


def _readme_block(heading: str) -> str:
    section = README.split(heading, 1)[1]
    return section.split("```", 2)[1].strip("\n")


def test_readme_store_layout_is_the_layout_module():
    block = _readme_block("## The store")
    assert block.strip() == layout.describe().strip()


def test_readme_exit_codes_are_the_exit_code_enum():
    section = README.split("### Exit codes", 1)[1].split("\n\n", 2)[1]
    codes = {int(m) for m in re.findall(r"^\| (\d+) \|", section, re.M)}
    assert codes == {int(c) for c in ExitCode}


def test_a_first_version_state_file_still_loads(env):
    old = {"name": "bert", "provider": "gcp", "project": "test-proj", "arch": "node", "tpu_type": "v2-8",
           "zones": ["us-central1-b"], "zone": "us-central1-b", "runtime": "2.12.0", "spot": True,
           "tpu_name": "tpuctl-bert", "vm_name": "tpuctl-bert-vm", "vm_type": "n1-standard-2",
           "bucket": "test-proj-tpuctl-bert", "bucket_created": True, "service_accounts": ["a@b.iam"],
           "grants": [{"member": "serviceAccount:a@b.iam", "role": "roles/storage.objectAdmin"}],
           "tpu_ip": "10.0.0.2", "host_pid": 0, "phase": "ready", "created_at": 1.5}
    p = state.home() / "clusters" / "bert.json"
    p.parent.mkdir(parents=True)
    p.write_text(json.dumps(old))
    st = state.load("bert")
    assert st.spec.store == "gs://test-proj-tpuctl-bert" and st.spec.arch is Arch.NODE and st.spec.spot
    assert st.zone == "us-central1-b" and st.runtime == "2.12.0" and st.host.ip == "10.0.0.2"
    assert st.phase is Phase.READY and st.grants[0].role == "roles/storage.objectAdmin"
    state.save(st)
    assert state.load("bert") == st   # and the new format round-trips


@pytest.mark.parametrize("content", ["", "{", "[]", '{"spec": {"name": "x"}}'])
def test_an_unreadable_state_file_names_the_file_and_the_fix(env, cli, content):
    p = state.home() / "clusters" / "bad.json"
    p.parent.mkdir(parents=True)
    p.write_text(content)
    code, out, err = cli("status", "-c", "bad")
    assert code == 2, err
    assert str(p) in err and "delete" in err and "Traceback" not in err


def test_readmes_link_only_inside_the_repository():
    import re
    root = Path(__file__).resolve().parent.parent
    for md in [root / "README.md", *sorted(root.glob("jobs/*/README.md"))]:
        text = md.read_text()
        for target in re.findall(r"\]\(([^)#]+)\)", text):
            if target.startswith(("http://", "https://")):
                continue
            path = (md.parent / target).resolve()
            assert root in path.parents and path.exists(), f"{md.name} links {target}, outside the repository or absent"
        for ref in re.findall(r"(?<![\w.])\.\./[\w./-]+", text):
            path = (md.parent / ref).resolve()
            assert root in path.parents and path.exists(), f"{md.name} points at {ref}: outside the repository or absent"
