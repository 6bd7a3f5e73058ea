"""The documentation is checked like code (docs/README.md, "These pages are tested").

README.md and every docs/*.md:
  - each `python launch.py ...` / `python -m lra.<module> ...` line of a fenced block
    parses: the module exists, and launch.py's `--config=configs/<file>.py:<args>` builds
    with that config's own get_config(<args>) (placeholders such as `<task>` or `...` and
    shell variables such as `$W` are skipped);
  - each relative link points at an existing file, and a `#fragment` at one of its
    headings (GitHub's anchors);
  - README.md is at most 200 lines;
  - the README's variant table is scripts/variant_table.py's output;
  - blocks whose info string is `bash runnable` or `python runnable` run (tiny sizes).
"""
from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# results/README.md is the index of the measured tables: its links are checked as the docs'.
PAGES = ([ROOT / "README.md", ROOT / "results" / "README.md"]
         + sorted((ROOT / "docs").glob("*.md")))
README_MAX_LINES = 200
RUN_TIMEOUT_S = 180

FENCE = re.compile(r"^\s*(```+|~~~+)(.*)$")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


@functools.cache
def fenced_blocks(path: Path) -> list[tuple[int, str, str]]:
    """(line number of the opening fence, info string, body) of every fenced block."""
    out, lines = [], path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info, start = m.group(1), m.group(2).strip(), i
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        out.append((start + 1, info, "\n".join(body)))
        i += 1
    return out


def _prose(path: Path, keep_code: bool = False) -> str:
    """The page without its fenced blocks (and inline code, unless keep_code)."""
    lines, keep, fence = path.read_text().splitlines(), [], None
    for line in lines:
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
            continue
        if fence is not None:
            if line.strip().startswith(fence):
                fence = None
            continue
        keep.append(line if keep_code else INLINE_CODE.sub("", line))
    return "\n".join(keep)


def logical_lines(body: str) -> list[str]:
    """Lines with backslash continuations joined."""
    out, cur = [], ""
    for line in body.splitlines():
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
        else:
            out.append(cur + line)
            cur = ""
    if cur:
        out.append(cur)
    return out


INLINE_CODE = re.compile(r"`[^`\n]*`")
COMMAND = re.compile(r"\bpython3?\s+(?:launch\.py\b|-m\s+(lra(?:\.[A-Za-z_]\w*)+))")
CONFIG_FLAG = re.compile(r"--config=([^\s\"']+)")


def _placeholder(text: str) -> bool:
    return any(s in text for s in ("<", ">", "...", "$", "{", "*"))


def commands() -> list[tuple[str, str]]:
    """(where, command line) of every launch.py / lra module command in a fenced block,
    and in inline code of the prose (one line each)."""
    out = []
    for page in PAGES:
        for lineno, _info, body in fenced_blocks(page):
            for line in logical_lines(body):
                if COMMAND.search(line):
                    out.append((f"{_rel(page)}:{lineno}", line.strip()))
        for code in INLINE_CODE.findall(_prose(page, keep_code=True)):
            if COMMAND.search(code):
                out.append((f"{_rel(page)}:inline", code.strip("`")))
    return out


ABSL_FLAGS = {"help", "helpfull", "helpshort", "helpxml", "flagfile"}  # absl's own


def _defined_flags(module: str) -> set[str]:
    """The flag names a command's source defines (flags.DEFINE_*("name", ...),
    config_flags.DEFINE_config_file("name", ...)): read, not run, since most commands
    define their absl flags only when run as a program."""
    path = importlib.util.find_spec(module).origin
    names = set()
    for node in ast.walk(ast.parse(Path(path).read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr.startswith("DEFINE") and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)):
            names.add(node.args[0].value)
            for kw in node.keywords:  # short_name="h"
                if kw.arg == "short_name" and isinstance(kw.value, ast.Constant):
                    names.add(kw.value.value)
    return names


def _check_flags(module: str, rest: str) -> None:
    """Each --flag of a `python -m lra.<module>` line is one that the module defines."""
    known = _defined_flags(module)
    if not known:
        return  # no absl flags of its own (argparse or none): not checked here
    for name in re.findall(r"(?<![\w.-])--([A-Za-z_]\w*)(?![\w.])", rest):
        ok = (name in known | ABSL_FLAGS
              or (name.startswith("no") and name[2:] in known))
        assert ok, f"python -m {module}: no flag --{name} (it defines {sorted(known)})"


def check_command(line: str) -> None:
    matches = list(COMMAND.finditer(line))
    for n, m in enumerate(matches):
        end = matches[n + 1].start() if n + 1 < len(matches) else len(line)
        rest = re.split(r"&&|;|\s#", line[m.end():end])[0]
        module = m.group(1)
        if module is not None:  # python -m lra.<module>
            assert importlib.util.find_spec(module) is not None, f"no module {module}"
            _check_flags(module, rest)
        flag = CONFIG_FLAG.search(rest)
        if flag is None:
            # launch.py needs one; a mention (`python launch.py ...`) is not a command.
            assert module is not None or _placeholder(rest), f"launch.py without --config=: {line}"
            continue
        spec = flag.group(1)
        file, _, arg = spec.partition(":")
        if _placeholder(file):
            continue
        assert (ROOT / file).is_file(), f"no config file {file}"
        if _placeholder(arg):
            continue
        assert file.startswith("configs/") and file.endswith(".py"), file
        config_module = importlib.import_module(file[:-3].replace("/", "."))
        config = config_module.get_config(arg or None)
        # The first component of each --config.<field>=... override is a field of it.
        for field in re.findall(r"--config\.([A-Za-z_]\w*)", rest):
            assert field in config, f"--config.{field}: no such field in {spec}"


ALL_COMMANDS = commands()


def test_the_pages_hold_commands():
    assert len(ALL_COMMANDS) >= 30, ALL_COMMANDS


@pytest.mark.parametrize("where,line", ALL_COMMANDS, ids=[w for w, _ in ALL_COMMANDS])
def test_command_parses(where, line):
    check_command(line)


# Links ------------------------------------------------------------------------------

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def github_anchor(heading: str) -> str:
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@functools.cache
def _headings(path: Path) -> set[str]:
    out, seen = set(), {}
    in_fence = None
    for line in path.read_text().splitlines():
        m = FENCE.match(line)
        if in_fence is None and m:
            in_fence = m.group(1)
            continue
        if in_fence is not None:
            if line.strip().startswith(in_fence):
                in_fence = None
            continue
        h = re.match(r"^#{1,6}\s+(.*)$", line)
        if h:
            anchor = github_anchor(h.group(1))
            out.add(anchor if anchor not in seen else f"{anchor}-{seen[anchor]}")
            seen[anchor] = seen.get(anchor, 0) + 1
    return out


def links() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        for target in LINK.findall(_prose(page)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            out.append((_rel(page), target))
    return out


ALL_LINKS = links()


def test_the_pages_link_to_each_other():
    assert len(ALL_LINKS) > 30, ALL_LINKS


@pytest.mark.parametrize("page,target", ALL_LINKS, ids=[f"{p}->{t}" for p, t in ALL_LINKS])
def test_relative_link_resolves(page, target):
    path, _, fragment = target.partition("#")
    source = ROOT / page
    dest = (source.parent / path).resolve() if path else source
    assert dest.exists(), f"{page}: link to {target}: no such file {dest}"
    if fragment and dest.suffix == ".md":
        assert fragment in _headings(dest), (
            f"{page}: link to {target}: no heading with anchor #{fragment} in "
            f"{_rel(dest)} (has: {sorted(_headings(dest))})")


def test_anchor_rule():
    assert github_anchor("Efficiency: `lra.benchmark`") == "efficiency-lrabenchmark"
    assert github_anchor("Sizes at a config's length") == "sizes-at-a-configs-length"
    assert github_anchor("Pixel generation in bits/dim (MNIST, CIFAR-10 in colour)") == \
        "pixel-generation-in-bitsdim-mnist-cifar-10-in-colour"


# The README -----------------------------------------------------------------------

def test_readme_is_short():
    n = len((ROOT / "README.md").read_text().splitlines())
    assert n <= README_MAX_LINES, (
        f"README.md has {n} lines (at most {README_MAX_LINES}): move detail into docs/")


def test_readme_keeps_the_commands_ci_runs():
    """Every `make` target .ci/run runs is named in the README, in CI's order."""
    text = (ROOT / "README.md").read_text()
    assert "make demo" in text
    ci = re.findall(r"^make (\S+)$", (ROOT / ".ci" / "run").read_text(), re.M)
    assert ci[:2] == ["test", "test-exhaustive"], ci
    said = re.search(r"CI runs (`make [^`]+`(?:,\s+`make [^`]+`)*(?:,?\s+and\s+`make [^`]+`)?)",
                     text)
    assert said, "README.md does not say which make targets CI runs"
    assert re.findall(r"`make ([^`]+)`", said.group(1)) == ci, (said.group(0), ci)


def test_readme_variant_table_is_generated_from_the_registry():
    spec = importlib.util.spec_from_file_location("variant_table",
                                                  ROOT / "scripts" / "variant_table.py")
    variant_table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(variant_table)
    text = (ROOT / "README.md").read_text()
    assert variant_table.BEGIN in text and variant_table.END in text
    current = text.split(variant_table.BEGIN, 1)[1].split(variant_table.END, 1)[0]
    assert current.strip() == variant_table.table().strip(), (
        "README.md's variant table is stale: run `python scripts/variant_table.py --write`")


# Runnable blocks ------------------------------------------------------------------

def runnable_blocks() -> list[tuple[str, str, str]]:
    out = []
    for page in PAGES:
        for lineno, info, body in fenced_blocks(page):
            words = info.split()
            if "runnable" in words:
                assert words[0] in ("bash", "python"), f"{_rel(page)}:{lineno}: {info!r}"
                out.append((f"{_rel(page)}:{lineno}", words[0], body))
    return out


RUNNABLE = runnable_blocks()


def test_some_blocks_are_runnable():
    assert 2 <= len(RUNNABLE) <= 4, [w for w, _, _ in RUNNABLE]


@pytest.mark.parametrize("where,lang,body", RUNNABLE, ids=[w for w, _, _ in RUNNABLE])
def test_runnable_block_runs(where, lang, body, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("python", "python3"):  # a wrapper, not a link: a venv's python finds its
        wrapper = bin_dir / name         # packages by the path it is started from
        wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        wrapper.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
               PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               TMPDIR=str(tmp_path))
    cmd = (["bash", "-euo", "pipefail", "-c", body] if lang == "bash"
           else [sys.executable, "-c", body])
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, (
        f"{where}: exit {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n"
        f"--- stderr\n{proc.stderr[-3000:]}")


def test_counts_in_the_pages_are_the_registry_s():
    """The number of mixers (and of those taking rotary positions) wherever a page states
    it (README twice, docs/gpu_suite.md, docs/variants.md): stale once a variant is added
    (issue 74), so read from the registry here."""
    from models import registry

    names = registry.available()
    counts = {
        r"\b(\d+) token mixers\b": len(names),
        r"\| sequence mixers \| (\d+),": len(names),
        r"\ball (\d+) variants\b": len(names),
        r"\b(\d+) variants take it \(`Capabilities\.rotary`\)":
            sum(bool(registry.capabilities(n).rotary) for n in names),
    }
    seen = 0
    for page in PAGES:
        text = page.read_text()
        for pattern, expected in counts.items():
            for m in re.finditer(pattern, text):
                seen += 1
                assert int(m.group(1)) == expected, (
                    f"{_rel(page)}: {m.group(0)!r}, the registry has {expected}")
    assert seen >= 4
